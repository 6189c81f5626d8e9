"""How big Arrow tables cross a shuffle: by reference to a staged Arrow IPC file, not by value.

Pickling millions of flow rows into a `GroupByKey` costs more than the work around it: the runner
copies the bytes several times and the in-process runner keeps every shuffled PCollection in memory.
So a step writes its output tables to an uncompressed Arrow IPC file under the run's staging
directory (`<warehouse>/_staging/<run id>/`, on the warehouse's filesystem, which every worker
shares) and passes on `TableRef`s of a few dozen bytes; the next step memory-maps the file and
reads its rows without a copy. The directory lives as long as the run.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from pipelines.warehouse import ABANDONED_AFTER_S

STAGING_DIR = "_staging"
Key = TypeVar("Key")


@dataclass(frozen=True)
class TableRef:
    """Record batches [first_batch, first_batch + num_batches) of a staged Arrow IPC file, which
    hold `num_rows` rows."""

    path: str
    first_batch: int
    num_batches: int
    num_rows: int


@contextmanager
def staging_area(root: str | Path) -> Iterator[str]:
    """A new directory for one run's staged tables, removed when the run ends. Directories left
    by runs killed more than an hour ago are removed first; younger ones may be running."""
    base = Path(root) / STAGING_DIR
    if base.is_dir():
        for leftover in base.iterdir():
            try:
                if time.time() - leftover.stat().st_mtime > ABANDONED_AFTER_S:
                    shutil.rmtree(leftover, ignore_errors=True)
            except FileNotFoundError:
                pass
    directory = base / uuid.uuid4().hex
    directory.mkdir(parents=True)
    try:
        yield str(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def stage_tables(directory: str, parts: Iterable[tuple[Key, pa.Table]]) -> list[tuple[Key, TableRef]]:
    """Writes the tables (one schema) one after another into a new file under `directory`;
    returns a reference to each. A fresh name per call, so a retried bundle never clobbers the
    file of an attempt whose output the runner kept."""
    parts = list(parts)
    if not parts:
        return []
    path = str(Path(directory) / f"{uuid.uuid4().hex}.arrow")
    refs, written = [], 0
    with pa.ipc.new_file(path, parts[0][1].schema) as writer:
        for key, table in parts:
            batches = table.to_batches()
            for batch in batches:
                writer.write_batch(batch)
            refs.append((key, TableRef(path, written, len(batches), table.num_rows)))
            written += len(batches)
    return refs


def read_staged(refs: Sequence[TableRef]) -> list[pa.Table]:
    """The rows of each reference, memory-mapped (no copy; the mapping lives as long as its rows).
    Only the referenced batches are read: a file holds every minute of a flow file, and each
    minute's merge needs one of them."""
    readers = {path: pa.ipc.open_file(pa.memory_map(path)) for path in {ref.path for ref in refs}}
    schema = readers[refs[0].path].schema if refs else None
    return [
        pa.Table.from_batches(
            [readers[ref.path].get_batch(i) for i in range(ref.first_batch, ref.first_batch + ref.num_batches)],
            schema,
        )
        for ref in refs
    ]
