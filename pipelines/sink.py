"""The warehouse sink: the one Beam transform that writes warehouse tables and state files.

Processing steps only compute: each stage emits one `HourTables` element per hour (the rows of
each of its tables and its state files), and `WriteTables` replaces every partition atomically
(pipelines/warehouse.py), then, once all of an hour's partitions are in place, writes that hour's
state files in order. The last state file is what the next hour continues from, so an hour whose
write failed part-way is never continued from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import apache_beam as beam
import pyarrow as pa

from pipelines import warehouse
from pipelines.local_workers import PooledDoFn

log = logging.getLogger(__name__)


class LazyRows(Protocol):
    """Rows kept outside the element (staged for the shuffle) until their partition is written."""

    num_rows: int

    def read(self) -> pa.Table: ...


@dataclass(frozen=True)
class HourTables:
    """What a stage writes for one hour: for each table, its rows in order as Arrow tables or
    `LazyRows`, so that a partition larger than memory streams through one piece at a time; and
    the stage's state files (name -> JSON payload), written in this order after every table."""

    hour: datetime
    tables: dict[str, Sequence[pa.Table | LazyRows]]
    state: dict[str, dict]


def read_piece(piece: pa.Table | LazyRows) -> pa.Table:
    return piece if isinstance(piece, pa.Table) else piece.read()


def read_ahead(pieces: Sequence[pa.Table | LazyRows]) -> Iterator[pa.Table]:
    """The rows of each piece in order, the next piece read (from staging: a concatenation and a
    take, which release the GIL) while the writer encodes this one, on another core."""
    if not pieces:
        return
    with ThreadPoolExecutor(1) as reader:
        upcoming = reader.submit(read_piece, pieces[0])
        for following in pieces[1:]:
            rows, upcoming = upcoming.result(), reader.submit(read_piece, following)
            yield rows
        yield upcoming.result()


@dataclass(frozen=True)
class PartitionWritten:
    hour: datetime
    table: str
    rows: int
    wall_s: float
    cpu_s: float


def write_partition(root: str, hour: datetime, table: str, pieces: Sequence[pa.Table | LazyRows],
                    encoders: int) -> PartitionWritten:
    started, started_cpu = time.perf_counter(), time.process_time()
    warehouse.write_partition_pieces(root, table, hour, read_ahead(pieces), encoders)
    return PartitionWritten(hour, table, sum(piece.num_rows for piece in pieces),
                            time.perf_counter() - started, time.process_time() - started_cpu)


class WritePartition(PooledDoFn):
    """(hour, table, pieces) -> the partition replaced, on the local workers (several partitions at
    once), each encoded on as many threads as there are workers: the hour's `flows` file is most
    of the sink and is written while the other workers have little else left; emits (hour key,
    table) once it is, and logs how long the write took."""

    def __init__(self, root: str, workers: int = 1):
        super().__init__(workers)
        self.root = root

    def process(self, partition: tuple[datetime, str, Sequence[pa.Table | LazyRows]],
                window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        hour, table, pieces = partition
        yield from self.defer(write_partition, (self.root, hour, table, pieces, self.workers), window, timestamp,
                              cost=sum(piece.num_rows for piece in pieces))

    def outputs(self, written: PartitionWritten):
        log.info(WRITE_LOG, written.table, warehouse.hour_key(written.hour), written.rows, written.wall_s,
                 written.cpu_s)
        yield warehouse.hour_key(written.hour), written.table


WRITE_LOG = "wrote %s for %s: %d rows in %.3f s, %.3f s CPU"


class WriteState(beam.DoFn):
    """An hour's state files, in order; reached only after every partition of the hour is written."""

    def __init__(self, root: str):
        self.root = root

    def process(self, element):
        _, grouped = element
        for hour, state in grouped["state"]:
            for stage, payload in state.items():
                warehouse.write_json(warehouse.stats_path(self.root, hour, stage), payload)
            yield hour


class WriteTables(beam.PTransform):
    """HourTables -> every partition written, then each hour's state files; outputs the hours
    whose state was written. The state waits for the hour's partitions through a CoGroupByKey,
    which a batch runner fires only once all of its inputs are complete. Partitions are written on
    `workers` local worker processes (pipelines/local_workers.py)."""

    def __init__(self, root: str, workers: int = 1):
        super().__init__()
        self.root, self.workers = root, workers

    def expand(self, hours):
        written = (
            hours
            | "Partitions" >> beam.FlatMap(lambda h: [(h.hour, name, pieces) for name, pieces in h.tables.items()])
            | "WritePartition" >> beam.ParDo(WritePartition(self.root, self.workers))
        )
        states = hours | "States" >> beam.Map(lambda h: (warehouse.hour_key(h.hour), (h.hour, h.state)))
        return (
            {"written": written, "state": states}
            | "AfterPartitions" >> beam.CoGroupByKey()
            | "WriteState" >> beam.ParDo(WriteState(self.root))
        )
