"""CSV: the header names the columns (a required one missing rejects the file); every value is read
as text and typed by validation, as in the other formats."""

from __future__ import annotations

import csv
import re

import pyarrow as pa
import pyarrow.csv as pa_csv

from prism_core.ingest.records import (
    FLOW_FIELDS,
    RAW_LIMIT,
    _corrupt,
    _FileRejected,
    _Records,
)
from prism_core.ingest.text import (
    TEXT_BLOCK_BYTES,
    _Lines,
    _read_text,
    _TextFormat,
    _Unparseable,
)
from prism_core.schema import FLOW_REQUIRED

# Lines that Arrow's CSV reader splits into several records: a bare \r ends a CSV row.
CSV_MULTI_RECORD = re.compile(rb"\r[^\n]")


def _read_csv(lines: _Lines) -> _Records:
    if len(lines) < 2:  # nothing, or a bare header
        return _Records.empty()
    header_text = lines.line(0).decode("utf-8", "backslashreplace")
    try:
        header = [name.strip() for name in next(csv.reader([header_text], strict=True))]
    except csv.Error as error:
        raise _FileRejected(_corrupt("csv_header", error), header_text[:RAW_LIMIT]) from error
    missing = [name for name in FLOW_REQUIRED if name not in header]
    if missing:
        raise _FileRejected(f"missing_field:{missing[0]}", header_text[:RAW_LIMIT])
    # Arrow wants unique column names: the first column of a name wins, the rest are ignored.
    column_names = [
        name if name in FLOW_FIELDS and header.index(name) == i else f"_ignored_{i}"
        for i, name in enumerate(header)
    ]
    present = tuple(name for name in FLOW_FIELDS if name in column_names)
    read_options = pa_csv.ReadOptions(column_names=column_names, block_size=TEXT_BLOCK_BYTES)
    parse_options = pa_csv.ParseOptions(newlines_in_values=False)
    convert_options = pa_csv.ConvertOptions(
        include_columns=list(present), column_types={name: pa.string() for name in present}
    )

    def open_stream(chunk: memoryview) -> pa.RecordBatchReader:
        return pa_csv.open_csv(pa.BufferReader(chunk), read_options, parse_options, convert_options)

    def parse_line(line: bytes) -> dict[str, str | None]:
        try:
            values = next(csv.reader([line.decode("utf-8")], strict=True), [])
        except csv.Error as error:
            raise _Unparseable("csv_syntax") from error
        if len(values) != len(column_names):
            raise _Unparseable("field_count")
        return {name: value for name, value in zip(column_names, values) if name in present}

    text_format = _TextFormat(open_stream, parse_line, present, CSV_MULTI_RECORD)
    return _read_text(lines, 1, text_format)
