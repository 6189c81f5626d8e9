"""Where Prism reads and writes: a location is a local path or a URI of an object store
(`s3://bucket/prefix`, `gs://bucket/prefix`), resolved to a `pyarrow.fs` filesystem. Flows,
shuffle staging and the warehouse go through these few operations, so each can live on either.

Object stores are reached with the standard variables of their SDKs: for S3 and S3-compatible
servers AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION and AWS_ENDPOINT_URL (e.g.
http://127.0.0.1:9000 for a local server); for GCS the application default credentials.

What `publish` guarantees, the same for every file Prism writes (one `data.parquet` per table
partition, one JSON file per hour and stage, the topology, the DuckDB catalog):

- Locally, the file is written under a hidden temporary name in its final directory, synced and
  `os.replace`d into place: readers see the previous file or the new one, never a part of one.
- On an object store, the file is written to a local temporary file and then uploaded under its
  final key as one object (a PUT, or a multipart upload above the store's part size). The store
  makes an object visible only when its upload completes, whole, atomically replacing the previous
  object under that key; a writer killed before that leaves the previous object in place (and, for
  a multipart upload, parts that no reader sees, which a bucket lifecycle rule for incomplete
  multipart uploads removes). No rename is needed, so none is relied on.
- Across files the order of writes is the guarantee, as locally: an hour's state files are
  published after all of its partitions, its last state file marks it complete (pipelines/sink.py),
  and S3 and GCS are strongly consistent, so a reader that sees that file sees every partition.

One difference remains: a local reader that has opened a partition keeps reading the file it
opened when a re-run replaces it; a reader of an object that is replaced while it reads may fetch
ranges of both versions. Re-run an hour while nothing reads it (the Dagster instance runs one run at
a time, orchestration/dagster.yaml).
"""

from __future__ import annotations

import functools
import glob
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

# A local temporary file this old belongs to a writer that was killed.
ABANDONED_AFTER_S = 3600


def is_local(location: str | os.PathLike) -> bool:
    return "://" not in str(location)


def join(location: str | os.PathLike, *parts: str) -> str:
    """`location` / parts, for local paths and URIs alike."""
    return "/".join([str(location).rstrip("/"), *parts])


def base_name(location: str | os.PathLike) -> str:
    return str(location).rstrip("/").rsplit("/", 1)[-1]


@functools.lru_cache(maxsize=None)
def _object_store(scheme: str, bucket: str, endpoint: str | None) -> pafs.FileSystem:
    """One filesystem per bucket and endpoint: creating one may ask the store for the bucket's
    region."""
    return pafs.FileSystem.from_uri(f"{scheme}://{bucket}")[0]


def resolve(location: str | os.PathLike) -> tuple[pafs.FileSystem, str]:
    """The filesystem of `location` and the path of `location` on it."""
    if is_local(location):
        return pafs.LocalFileSystem(), os.path.abspath(location)
    parts = urlsplit(str(location))
    filesystem = _object_store(parts.scheme, parts.netloc, os.environ.get("AWS_ENDPOINT_URL"))
    return filesystem, f"{parts.netloc}{parts.path}".rstrip("/")


def exists(location: str | os.PathLike) -> bool:
    """Whether a file is at `location`."""
    filesystem, path = resolve(location)
    return filesystem.get_file_info(path).type == pafs.FileType.File


def modified_ns(location: str | os.PathLike) -> int:
    """When the file at `location` was last written, in epoch nanoseconds."""
    filesystem, path = resolve(location)
    return filesystem.get_file_info(path).mtime_ns


def open_input(location: str | os.PathLike) -> pa.NativeFile:
    """The file at `location`, seekable (on an object store, read by ranges as needed)."""
    filesystem, path = resolve(location)
    return filesystem.open_input_file(path)


def read_bytes(location: str | os.PathLike) -> bytes:
    with open_input(location) as handle:
        return handle.read()


def _files_below(location: str | os.PathLike) -> list[tuple[str, str]]:
    """(path relative to `location`, location) of every file below `location`, at any depth, the
    location in the form of `location`: relative when it is, a URI when it is one."""
    filesystem, path = resolve(location)
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    relative = [info.path[len(path) + 1:] for info in filesystem.get_file_info(selector)
                if info.type == pafs.FileType.File]
    return [(name, join(location, name)) for name in relative]


def files_below(location: str | os.PathLike) -> list[str]:
    """Every file below `location`, at any depth, sorted; none when it does not exist."""
    return sorted(found for _, found in _files_below(location))


def files_matching(location: str | os.PathLike, pattern: str) -> list[str]:
    """Files below `location` whose path relative to it matches `pattern` ("*/*/data.parquet"),
    one `*` per directory level, sorted."""
    levels = pattern.split("/")
    if is_local(location):  # a glob reads only the levels it needs, not every file below
        return sorted(glob.glob(os.path.join(str(location), *levels)))
    return sorted(found for name, found in _files_below(location) if _matches(name.split("/"), levels))


def _matches(parts: list[str], levels: list[str]) -> bool:
    return len(parts) == len(levels) and all(fnmatchcase(part, level) for part, level in zip(parts, levels))


def make_dirs(location: str | os.PathLike) -> None:
    """The directory at `location` and its parents; object stores have no directories to make."""
    if is_local(location):
        os.makedirs(location, exist_ok=True)


def delete(location: str | os.PathLike) -> None:
    """Removes the file at `location`, if there is one."""
    filesystem, path = resolve(location)
    try:
        filesystem.delete_file(path)
    except FileNotFoundError:
        pass


def publish(final: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Replace the file at `final` with what `write(local path)` writes, atomically (see the module
    docstring for what readers can rely on)."""
    if is_local(final):
        _replace_locally(str(final), write)
        return
    filesystem, path = resolve(final)
    with tempfile.TemporaryDirectory(prefix="prism-publish-") as directory:
        written = os.path.join(directory, base_name(final))
        write(written)
        pafs.copy_files(written, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)


def _remove_abandoned(final: str) -> None:
    """Temporary files of writers killed mid-write; younger ones may be a concurrent writer's."""
    directory, name = os.path.split(final)
    for leftover in os.scandir(directory):
        if leftover.name.startswith(f".{name}.") and leftover.name.endswith(".tmp"):
            try:
                if time.time() - leftover.stat().st_mtime > ABANDONED_AFTER_S:
                    os.unlink(leftover.path)
            except FileNotFoundError:
                pass


def _replace_locally(final: str, write: Callable[[str], None]) -> None:
    directory, name = os.path.split(final)
    os.makedirs(directory, exist_ok=True)
    _remove_abandoned(final)
    temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        write(temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def duckdb_filesystem(location: str | os.PathLike):
    """For a location on an object store, an fsspec filesystem that serves its URIs to DuckDB
    (`con.register_filesystem`) through pyarrow, with the credentials above: DuckDB's own httpfs
    extension is downloaded on first use, which not every machine can. None for a local path."""
    if is_local(location):
        return None
    from fsspec.implementations.arrow import ArrowFSWrapper

    scheme = urlsplit(str(location)).scheme
    wrapper = type(f"{scheme.upper()}ThroughArrow", (ArrowFSWrapper,), {"protocol": scheme, "cachable": False})
    return wrapper(resolve(location)[0])
