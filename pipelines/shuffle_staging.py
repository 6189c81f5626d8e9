"""Shuffle staging: how big Arrow tables cross a shuffle, by reference to a staged Arrow IPC file.

Pickling millions of flow rows into a `GroupByKey` costs more than the work around it: the runner
copies the bytes several times and the in-process runner keeps every shuffled PCollection in memory.
So a step writes its output tables to an uncompressed Arrow IPC file under the run's shuffle
staging directory and passes on `TableRef`s of a few dozen bytes; the next step memory-maps the
file and reads its rows without a copy. The directory is `<warehouse>/_shuffle_staging/<run id>/`
for a local warehouse, on the warehouse's filesystem, which every worker shares; for a warehouse on
an object store, where files cannot be memory-mapped, it is under this machine's temporary
directory, so such a run's workers must share this machine (as the local runners' do). These files
are intermediate data of one run, never part of the warehouse (pipelines/sink.py writes that): the
directory is removed when the run ends, whether it succeeded or failed.
"""

from __future__ import annotations

import mmap
import pickle
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from pipelines import storage

SHUFFLE_STAGING_DIR = "_shuffle_staging"
WRITE_BUFFER_BYTES = 1 << 20
Key = TypeVar("Key")


@dataclass(frozen=True)
class TableRef:
    """Record batches [first_batch, first_batch + num_batches) of a staged Arrow IPC file, which
    hold `num_rows` rows."""

    path: str
    first_batch: int
    num_batches: int
    num_rows: int

    def read(self) -> pa.Table:
        """The referenced rows (`read_staged`): a reference is rows the sink reads only when it
        writes them (pipelines/sink.LazyRows)."""
        [table] = read_staged([self])
        return table


@contextmanager
def shuffle_staging_area(root: str | Path) -> Iterator[str]:
    """A new directory for one run's staged tables, removed when the run ends or fails. Directories
    left by runs killed more than an hour ago are removed first; younger ones may be running."""
    base = (Path(root) if storage.is_local(root) else Path(tempfile.gettempdir()) / "prism") / SHUFFLE_STAGING_DIR
    if base.is_dir():
        for leftover in base.iterdir():
            try:
                if time.time() - leftover.stat().st_mtime > storage.ABANDONED_AFTER_S:
                    shutil.rmtree(leftover, ignore_errors=True)
            except FileNotFoundError:
                pass
    directory = base / uuid.uuid4().hex
    directory.mkdir(parents=True)
    try:
        yield str(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class StagingFile:
    """Tables of one schema appended to a new staged file, which is created with the first table.
    Its references can be read once `close()` has written the file's footer: the parse of a batch
    of flow files closes it before the batch's references leave it, so one file serves the whole
    batch (one open, one footer and one removal instead of one per file). A fresh name per file,
    so a retried element never clobbers the file of an attempt whose output the runner kept."""

    def __init__(self, directory: str):
        self.path = str(Path(directory) / f"{uuid.uuid4().hex}.arrow")
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._batches = 0

    def append(self, table: pa.Table) -> TableRef:
        if self._writer is None:
            # Buffered: the writer issues a write per buffer of each batch (~20 system calls).
            self._sink = pa.output_stream(self.path, compression=None, buffer_size=WRITE_BUFFER_BYTES)
            self._writer = pa.ipc.new_file(self._sink, table.schema)
        batches = table.to_batches()
        for batch in batches:
            self._writer.write_batch(batch)
        ref = TableRef(self.path, self._batches, len(batches), table.num_rows)
        self._batches += len(batches)
        return ref

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None


def stage_tables(directory: str, parts: Iterable[tuple[Key, pa.Table]]) -> list[tuple[Key, TableRef]]:
    """Writes the tables (one schema) one after another into a new file under `directory`;
    returns a reference to each."""
    staged = StagingFile(directory)
    try:
        return [(key, staged.append(table)) for key, table in parts]
    finally:
        staged.close()


def read_staged(refs: Sequence[TableRef]) -> list[pa.Table]:
    """The rows of each reference, memory-mapped (no copy; the mapping lives as long as its rows).
    Only the referenced batches are read: a file holds every minute of a batch of flow files,
    and each minute's merge needs a few of them. Each file is opened once per call."""
    readers = {path: pa.ipc.open_file(pa.memory_map(path)) for path in {ref.path for ref in refs}}
    return _tables(readers, refs)


def read_staged_evictable(refs: Sequence[TableRef]) -> tuple[list[pa.Table], Callable[[], None]]:
    """`read_staged`'s tables, and a function that evicts their pages from this process's memory:
    the pages of a memory-mapped file that were read stay resident while it is mapped, though the
    reader is done with them for a while (a job's flows between the first stages of its analysis
    and its diagnosis); evicted, they are read again from the page cache when next touched."""
    mappings = {}
    for path in {ref.path for ref in refs}:
        with open(path, "rb") as file:
            mappings[path] = mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)
    readers = {path: pa.ipc.open_file(pa.py_buffer(mapping)) for path, mapping in mappings.items()}

    def evict() -> None:
        if hasattr(mmap, "MADV_DONTNEED"):  # Linux; elsewhere the pages stay as they were
            for mapping in mappings.values():
                mapping.madvise(mmap.MADV_DONTNEED)

    return _tables(readers, refs), evict


def _tables(readers: dict[str, pa.ipc.RecordBatchFileReader], refs: Sequence[TableRef]) -> list[pa.Table]:
    schema = readers[refs[0].path].schema if refs else None
    return [
        pa.Table.from_batches(
            [readers[ref.path].get_batch(i) for i in range(ref.first_batch, ref.first_batch + ref.num_batches)],
            schema,
        )
        for ref in refs
    ]


@dataclass(frozen=True)
class StagedObject:
    """A Python object (an hour's recognition, its previous state) pickled once into a staged file,
    for the steps that all need it: a DoFn that held the object itself would be pickled with it,
    and compressed, every time the runner serializes or copies the DoFn (several times per bundle
    with the in-process runner), and so would each task handed to the local workers. `get()`
    reads the file once per process (the launcher keeps the object it staged)."""

    path: str

    def get(self):
        global _last_loaded
        if _last_loaded is None or _last_loaded[0] != self.path:
            with open(self.path, "rb") as file:
                _last_loaded = (self.path, pickle.load(file))
        return _last_loaded[1]


_last_loaded: tuple[str, object] | None = None  # the StagedObject this process read last, and its object


def stage_object(directory: str, value) -> StagedObject:
    """`value` pickled into a new file under `directory` (a shuffle staging area)."""
    global _last_loaded
    path = str(Path(directory) / f"{uuid.uuid4().hex}.pickle")
    with open(path, "wb") as file:
        pickle.dump(value, file, protocol=pickle.HIGHEST_PROTOCOL)
    _last_loaded = (path, value)
    return StagedObject(path)
