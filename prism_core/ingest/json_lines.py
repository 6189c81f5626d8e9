"""JSON lines (goflow2's output): an explicit Arrow schema for the flow fields, and a Python parser
for the lines Arrow cannot read."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.json as pa_json

from prism_core.ingest.records import FLOW_FIELDS, INT_FIELDS, _Records
from prism_core.ingest.text import (
    TEXT_BLOCK_BYTES,
    _Lines,
    _read_text,
    _TextFormat,
    _Unparseable,
)

# Lines that Arrow's JSON reader splits into several records: two JSON objects on one line (JSON
# white space includes \r).
JSON_MULTI_RECORD = re.compile(rb"\}[ \t\r]*\{")


def _read_json_lines(lines: _Lines) -> _Records:
    parse_options = pa_json.ParseOptions(
        explicit_schema=_json_schema(lines), unexpected_field_behavior="ignore"
    )
    read_options = pa_json.ReadOptions(block_size=TEXT_BLOCK_BYTES)

    def open_stream(chunk: memoryview) -> pa.RecordBatchReader:
        return pa_json.open_json(pa.BufferReader(chunk), read_options, parse_options)

    text_format = _TextFormat(open_stream, _parse_json_line, FLOW_FIELDS, JSON_MULTI_RECORD)
    return _read_text(lines, 0, text_format)


def _json_schema(lines: _Lines, sample_lines: int = 100) -> pa.Schema:
    """Arrow types for the flow fields, as the first lines write them (integer or text; text for
    an int field means numbers in quotes). An explicit schema lets Arrow skip the dozens of other
    goflow2 fields (about 1.4x faster) and keeps its types fixed from block to block; a line that
    differs stops the reader and is read in Python."""
    votes = {name: 0 for name in FLOW_FIELDS}  # > 0: integers, < 0: text
    for index in range(min(len(lines), sample_lines)):
        try:
            record = json.loads(lines.line(index))
        except ValueError:
            continue
        if isinstance(record, dict):
            for name, value in record.items():
                if name in votes and isinstance(value, (int, str)) and not isinstance(value, bool):
                    votes[name] += 1 if isinstance(value, int) else -1

    def arrow_type(name: str, vote: int) -> pa.DataType:
        if vote == 0:  # not in the sample: its natural type (goflow2 prints proto by name)
            return pa.int64() if name in INT_FIELDS else pa.string()
        return pa.int64() if vote > 0 else pa.string()

    return pa.schema([(name, arrow_type(name, vote)) for name, vote in votes.items()])


def _parse_json_line(line: bytes) -> dict[str, str | None]:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as error:
        raise _Unparseable("json_syntax") from error
    if not isinstance(record, dict):
        raise _Unparseable("not_an_object")
    return {name: _json_value_as_text(record[name]) for name in FLOW_FIELDS if name in record}


def _json_value_as_text(value: object) -> str | None:
    """A JSON value as the text validation parses: integers and strings keep their meaning, any
    other value (1.5, true, [..], a string with a lone surrogate) becomes its JSON text (ASCII),
    which no field accepts."""
    if value is None:
        return None
    if isinstance(value, str) and (value.isascii() or not SURROGATE.search(value)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value)


SURROGATE = re.compile("[\ud800-\udfff]")  # JSON may escape them; UTF-8 cannot hold them
