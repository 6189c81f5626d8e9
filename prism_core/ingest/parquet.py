"""Parquet: records read column-wise (addresses dictionary-encoded), and a file's time bounds from
its footer so a run can skip files outside its hours."""

from __future__ import annotations

import json
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prism_core.ingest.columns import _is_text
from prism_core.ingest.records import (
    ADDRESS_FIELDS,
    FLOW_FIELDS,
    RAW_LIMIT,
    READ_ERRORS,
    _corrupt,
    _FileRejected,
    _Records,
)
from prism_core.ingest.validate import MAX_TIME_NS, MIN_TIME_NS
from prism_core.schema import FLOW_REQUIRED


def _read_parquet(data: bytes) -> _Records:
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        schema = parquet.schema_arrow
        if parquet.metadata.num_rows == 0:
            return _Records.empty()
        missing = [name for name in FLOW_REQUIRED if name not in schema.names]
        if missing:
            raise _FileRejected(f"missing_field:{missing[0]}", json.dumps(schema.names)[:RAW_LIMIT])
        present = [name for name in FLOW_FIELDS if name in schema.names]
        # Addresses repeat a lot: read them dictionary-encoded and validate each distinct one once.
        dictionary = [
            name
            for name in ADDRESS_FIELDS
            if name in present and _is_text(schema.field(name).type)
        ]
        parquet = pq.ParquetFile(
            pa.BufferReader(data), metadata=parquet.metadata, read_dictionary=dictionary
        )
        # one thread: a flow file is small (~20 k rows, a row group), so a thread per column costs more
        # CPU than it saves wall (~6% of the read), and the files are parsed on every core already
        table = parquet.read(columns=present, use_threads=False).combine_chunks()
        table.validate(full=True)  # corrupt pages can decode to invalid UTF-8
    except READ_ERRORS as error:
        raise _FileRejected(_corrupt("parquet", error)) from error

    def render(rows: np.ndarray) -> list[str]:
        return [
            json.dumps(row, default=str, ensure_ascii=False)[:RAW_LIMIT]
            for row in _python_rows(table.take(rows))
        ]

    columns = {name: table[name].chunks for name in present}
    return _Records(columns, np.arange(table.num_rows, dtype=np.int64), render)


def _python_rows(table: pa.Table) -> list[dict]:
    """Rows as Python values; times as Arrow's text: Python's datetime has no nanoseconds."""
    for i, data_type in enumerate(table.schema.types):
        if pa.types.is_temporal(data_type) and not pa.types.is_interval(data_type):
            table = table.set_column(i, table.field(i).name, table.column(i).cast(pa.string()))
    return table.to_pylist()


def parquet_time_bounds(file: BinaryIO | pa.NativeFile) -> tuple[int, int] | None:
    """(min, max) time_flow_start_ns of a Parquet file from its footer statistics, reading no data,
    so a run can skip files outside its hours. `file` is seekable; its position is left anywhere.
    None when it cannot tell: not Parquet, no such int64 column, a row group without statistics,
    or statistics outside the valid time range (invalid rows; parse the file to learn the bounds
    of its valid ones)."""
    try:
        metadata = pq.ParquetFile(file).metadata
    except READ_ERRORS:
        return None
    columns = [
        i
        for i in range(metadata.num_columns)
        if metadata.schema.column(i).path == "time_flow_start_ns"
        and metadata.schema.column(i).physical_type == "INT64"
        and metadata.schema.column(i).logical_type.type in ("NONE", "INT")
    ]
    if not columns or metadata.num_row_groups == 0:
        return None
    lows, highs = [], []
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(columns[0]).statistics
        if statistics is None or not statistics.has_min_max:
            return None
        lows.append(statistics.min)
        highs.append(statistics.max)
    low, high = min(lows), max(highs)
    if low < MIN_TIME_NS or high >= MAX_TIME_NS:
        return None
    return int(low), int(high)
