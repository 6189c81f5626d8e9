"""The warehouse sink: the one Beam transform that writes warehouse tables and state files.

Processing steps only compute: each stage emits one `HourTables` element per hour (the rows of
each of its tables and its state files), and `WriteTables` replaces every partition atomically
(pipelines/warehouse.py), then, once all of an hour's partitions are in place, writes that hour's
state files in order. The last state file is what the next hour continues from, so an hour whose
write failed part-way is never continued from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import apache_beam as beam
import pyarrow as pa

from pipelines import warehouse


class LazyRows(Protocol):
    """Rows kept outside the element (staged for the shuffle) until their partition is written."""

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


class WritePartition(beam.DoFn):
    """(hour, table, pieces) -> the partition replaced; emits (hour key, table) once it is."""

    def __init__(self, root: str):
        self.root = root

    def process(self, partition: tuple[datetime, str, Sequence[pa.Table | LazyRows]]):
        hour, table, pieces = partition
        warehouse.write_partition_pieces(self.root, table, hour, map(read_piece, pieces))
        yield warehouse.hour_key(hour), table


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
    which a batch runner fires only once all of its inputs are complete."""

    def __init__(self, root: str):
        super().__init__()
        self.root = root

    def expand(self, hours):
        written = (
            hours
            | "Partitions" >> beam.FlatMap(lambda h: [(h.hour, name, pieces) for name, pieces in h.tables.items()])
            | "WritePartition" >> beam.ParDo(WritePartition(self.root))
        )
        states = hours | "States" >> beam.Map(lambda h: (warehouse.hour_key(h.hour), (h.hour, h.state)))
        return (
            {"written": written, "state": states}
            | "AfterPartitions" >> beam.CoGroupByKey()
            | "WriteState" >> beam.ParDo(WriteState(self.root))
        )
