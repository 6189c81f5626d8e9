"""Parse, validate and type one flow file: bytes in, clean flows and quarantined records out.

Every record read ends in exactly one place: `rows_read == clean.num_rows + quarantine.num_rows`.

Containers and formats
- `.gz` / `.zst` payloads are decompressed, recognised by suffix or by magic bytes; a suffix that
  promises compression the bytes do not have, or a truncated/corrupt stream, rejects the file.
- Parquet is recognised by its `PAR1` magic or suffix; JSON lines by `.json`/`.jsonl`/`.ndjson`;
  CSV by `.csv`; otherwise text starting with `{` is JSON lines and any other text is CSV.
- Text is UTF-8; a UTF-8 BOM is skipped and a UTF-16/32 BOM transcodes the file. A line that is
  not valid UTF-8 is quarantined alone (`unparseable:encoding`); a text file holding NUL bytes is
  binary, not flow text, and is rejected whole.

Records and positions
- A record is a non-blank line of JSON lines, a non-blank line after the header of CSV (quoted
  fields cannot span lines), or a row of Parquet. `row` in the quarantine is the record's 0-based
  position among the file's records (blank lines are not counted).
- A file that cannot be read at all becomes one quarantine row with `row = -1` and counts as one
  record read: `corrupt_file:<stage>: <error>` with the file's first bytes as `raw`. So does a
  Parquet or CSV file whose schema/header lacks a required column (`missing_field:<col>`, `raw` =
  its column names): the defect belongs to the file, not to each of its records. In JSON lines
  every record carries its own fields, so a missing field quarantines that record only.
- An empty file (0 bytes, blank lines only, a bare CSV header, a Parquet file with no rows) reads
  0 records and quarantines nothing.
- A line that does not parse is quarantined alone with `unparseable:<json_syntax | not_an_object |
  csv_syntax | field_count | encoding>`; the rest of the file goes on.
- `raw` is the JSON or CSV line as it is, or a Parquet row rendered as JSON, cut at RAW_LIMIT
  bytes. `quarantine_start_ns` is the record's start time when it parses and is in range, else -1.
  Clean rows keep the order of the file.

Values
- Integer fields take integers, or text holding a decimal integer (`"1500"`, `" -7 "`), the same
  in JSON, CSV and Parquet string columns, since CSV is all text. Fractions (`1.5`, even `1500.0`),
  exponents, booleans, hex and anything that does not fit int64 are `bad_type:<col>`; so are
  Parquet columns of float, boolean, timestamp or nested types (times are int64 epoch ns).
- Null, absent, empty or blank text is missing: `missing_field:<col>` for required columns,
  null in the clean table for optional ones.
- Addresses (`src_addr`, `dst_addr`, and `sampler_address` when present) must be IPv4 or IPv6
  text. They are normalized to Python's canonical form (IPv6 compressed lowercase), and
  IPv4-mapped IPv6 (`::ffff:10.0.0.1`) becomes plain IPv4, so a NIC has one name whichever way an
  exporter writes it; both ends of a flow must then be of one family.
- `proto` is a number 0..255 or a name as goflow2 prints it (`UDP`, `TCP`, `ICMPv6`, ...,
  case-insensitive).
- `sampling_rate` 0 or absent means unsampled (goflow2 writes 0 when unknown) and is stored as 1;
  `bytes` and `packets` are multiplied by it when it is above 1, before the size bounds apply.
- Several problems on one record: the first in `CHECK_ORDER` is reported.

Speed: Parquet is read column-wise with addresses dictionary-encoded, so each distinct address is
validated once. Text is read by Arrow's streaming readers; only the lines Arrow stops at (and a few
after them) are parsed in Python, so a clean file costs one Arrow pass and a dirty one little more.
"""

from __future__ import annotations

import codecs
import csv
import functools
import ipaddress
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import zstandard

from prism_core.arrays import combination_ids
from prism_core.minutes import minute_of
from prism_core.schema import FLOW_OPTIONAL, FLOW_REQUIRED, FLOWS, QUARANTINE

FLOW_FIELDS = FLOW_REQUIRED + FLOW_OPTIONAL
INT_FIELDS = (
    "time_flow_start_ns",
    "time_flow_end_ns",
    "bytes",
    "packets",
    "src_port",
    "dst_port",
    "time_received_ns",
    "sampling_rate",
)
ADDRESS_FIELDS = ("src_addr", "dst_addr", "sampler_address")

RAW_LIMIT = 2048  # bytes of a rejected record kept in `raw`
MAX_FLOW_BYTES = 10**13  # 10 TB in one flow record is a counter bug, not traffic
MAX_FLOW_PACKETS = 10**13
MIN_TIME_NS = 946_684_800 * 10**9  # 2000-01-01
MAX_TIME_NS = 4_102_444_800 * 10**9  # 2100-01-01
INT64_MAX_DIGITS = str(np.iinfo(np.int64).max)
MAX_ADDRESS_TEXT = 64  # longest IPv6 text is 45 characters, plus a scope id

# Reasons in the order they are checked: a record is reported under the first that applies.
CHECK_ORDER = (
    *(f"missing_field:{name}" for name in FLOW_REQUIRED),
    "bad_type:time_flow_start_ns",
    "bad_type:time_flow_end_ns",
    "bad_type:bytes",
    "bad_addr:src_addr",
    "bad_addr:dst_addr",
    "time_out_of_range",
    "end_before_start",
    "nonpositive_bytes",
    "mixed_family",
    "bad_type:packets",
    "bad_type:src_port",
    "bad_type:dst_port",
    "bad_type:time_received_ns",
    "bad_type:sampling_rate",
    "bad_proto",
    "bad_port:src_port",
    "bad_port:dst_port",
    "negative_packets",
    "negative_sampling_rate",
    "bad_addr:sampler_address",
    "bytes_too_large",
    "packets_too_large",
)

# IANA protocol numbers under the names goflow2 and common tools print.
PROTOCOL_NUMBERS = {
    "HOPOPT": 0,
    "ICMP": 1,
    "IGMP": 2,
    "IPIP": 4,
    "IPV4": 4,
    "TCP": 6,
    "EGP": 8,
    "UDP": 17,
    "IPV6": 41,
    "RSVP": 46,
    "GRE": 47,
    "ESP": 50,
    "AH": 51,
    "ICMPV6": 58,
    "IPV6-ICMP": 58,
    "OSPF": 89,
    "OSPFIGP": 89,
    "PIM": 103,
    "VRRP": 112,
    "L2TP": 115,
    "SCTP": 132,
    "UDPLITE": 136,
    "MPLS-IN-IP": 137,
    "ETHERNET": 143,
}

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PARQUET_MAGIC = b"PAR1"
COMPRESSION_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}
FORMAT_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".csv": "csv",
}
# Longest BOMs first: the UTF-32 LE BOM starts with the UTF-16 LE one.
TEXT_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# Errors that mean "these bytes are not a readable file"; anything else is a bug and propagates.
READ_ERRORS = (
    pa.ArrowException,
    OSError,
    EOFError,
    zlib.error,
    zstandard.ZstdError,
    UnicodeError,
    csv.Error,
)
# Arrow streams text in blocks this big: as fast as larger ones, and an error wastes less of a
# block (what the block read before the bad line is read again).
TEXT_BLOCK_BYTES = 256 << 10
FALLBACK_RECORDS = 16  # runs of text lines this short are parsed in Python, not by Arrow
# Lines that Arrow's readers split into several records: two JSON objects on one line (JSON
# white space includes \r); a bare \r, which ends a CSV row.
JSON_MULTI_RECORD = re.compile(rb"\}[ \t\r]*\{")
CSV_MULTI_RECORD = re.compile(rb"\r[^\n]")


@dataclass
class ParsedFile:
    clean: pa.Table  # schema FLOWS
    quarantine: pa.Table  # schema QUARANTINE, ordered by row
    quarantine_start_ns: np.ndarray  # per quarantine row: its valid start time, else -1
    rows_read: int


class _FileRejected(Exception):
    """The file as a whole cannot yield records."""

    def __init__(self, reason: str, raw: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


def parse_flow_file(payload: bytes, source: str) -> ParsedFile:
    """Parse one flow file (Parquet, JSON lines or CSV; optionally gzip/zstd) into clean flows and
    quarantined records. Never raises on bad input: see the module docstring for the rules."""
    name = PurePosixPath(source).name.lower()
    try:
        records = _read_records(payload, name)
    except _FileRejected as rejected:
        raw = rejected.raw if rejected.raw is not None else _text(payload[:RAW_LIMIT])
        return _whole_file_rejected(source, rejected.reason, raw)
    return _validate(records, source)


# --- containers and formats ---------------------------------------------------------------------


def _read_records(payload: bytes, name: str) -> _Records:
    data, name = _decompress(payload, name)
    if not data:
        return _Records.empty()
    if data[:4] == PARQUET_MAGIC or FORMAT_SUFFIXES.get(PurePosixPath(name).suffix) == "parquet":
        return _read_parquet(data)
    data = _utf8_text(data)
    if not data:
        return _Records.empty()
    text_format = FORMAT_SUFFIXES.get(PurePosixPath(name).suffix)
    if text_format is None:
        text_format = "json" if data[:4096].lstrip()[:1] == b"{" else "csv"
    lines = _Lines(data)
    return _read_json_lines(lines) if text_format == "json" else _read_csv(lines)


def _decompress(payload: bytes, name: str) -> tuple[bytes, str]:
    """Decompressed bytes and the file name without its compression suffix."""
    path = PurePosixPath(name)
    promised = COMPRESSION_SUFFIXES.get(path.suffix)
    if promised:
        name = path.stem
    if not payload:
        return payload, name
    codec = "gzip" if payload[:2] == GZIP_MAGIC else "zstd" if payload[:4] == ZSTD_MAGIC else None
    if promised and codec != promised:
        raise _FileRejected(f"corrupt_file:{promised}: no {promised} magic bytes")
    try:
        if codec == "gzip":  # zlib directly: a third faster than the gzip module
            return _frames(payload, lambda: zlib.decompressobj(wbits=31), padding=True), name
        if codec == "zstd":
            return _frames(payload, lambda: zstandard.ZstdDecompressor().decompressobj()), name
    except READ_ERRORS as error:
        raise _FileRejected(_corrupt(codec, error)) from error
    return payload, name


def _frames(payload: bytes, decompressor: Callable, padding: bool = False) -> bytes:
    """Every frame (gzip member) of a compressed stream; a truncated one is an error, which the
    streaming readers would not report. gzip(1) accepts zero padding after a member: so do we."""
    parts = []
    rest = payload
    while rest:
        frame = decompressor()
        parts.append(frame.decompress(rest))
        if not frame.eof:
            raise EOFError("compressed stream ends in the middle of a frame")
        rest = frame.unused_data.lstrip(b"\x00") if padding else frame.unused_data
    return b"".join(parts)


def _utf8_text(data: bytes) -> bytes:
    for bom, encoding in TEXT_BOMS:
        if data.startswith(bom):
            try:
                data = data.decode(encoding).encode("utf-8")
            except UnicodeError as error:
                raise _FileRejected(_corrupt("encoding", error)) from error
            break
    if b"\x00" in data:
        raise _FileRejected("corrupt_file:encoding: NUL bytes in a text file")
    return data


def _corrupt(stage: str, error: Exception) -> str:
    message = " ".join(str(error).split())[:160] or type(error).__name__
    return f"corrupt_file:{stage}: {message}"


def _whole_file_rejected(source: str, reason: str, raw: str) -> ParsedFile:
    quarantine = pa.table(
        {"source": [source], "row": [-1], "reason": [reason], "raw": [raw]}, schema=QUARANTINE
    )
    return ParsedFile(FLOWS.empty_table(), quarantine, np.array([-1], dtype=np.int64), 1)


def _text(raw: bytes) -> str:
    return raw[:RAW_LIMIT].decode("utf-8", "backslashreplace")


# --- records: what the readers hand to validation -------------------------------------------------


@dataclass
class _Records:
    """Parsed records of one file, before validation."""

    # Flow fields the file has, one value per record, in chunks whose Arrow types may differ
    # (Arrow reads integers where Python reads the odd line as text).
    columns: dict[str, list[pa.Array]]
    positions: np.ndarray  # each record's 0-based position in the file
    render: Callable[[np.ndarray], list[str]]  # raw text of records, by index into `columns`
    unparseable: list[tuple[int, str, str]] = field(default_factory=list)  # position, reason, raw

    @staticmethod
    def empty() -> _Records:
        return _Records({}, np.zeros(0, dtype=np.int64), lambda rows: [])

    @property
    def num_parsed(self) -> int:
        return len(self.positions)


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
        table = parquet.read(columns=present, use_threads=True)
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


# --- text formats ---------------------------------------------------------------------------------


class _Lines:
    """The non-blank lines of a text file: the records of JSON lines, the header and records of
    CSV. Spans exclude the line end (`\\n` or `\\r\\n`)."""

    def __init__(self, data: bytes):
        self.data = data
        buffer = np.frombuffer(data, dtype=np.uint8)
        newlines = np.flatnonzero(buffer == ord("\n"))
        starts = np.concatenate(([0], newlines + 1))
        ends = np.concatenate((newlines, [len(data)]))
        has_cr = (ends > starts) & (buffer[np.maximum(ends - 1, 0)] == ord("\r"))
        ends = ends - has_cr
        # Blank: only JSON white space, as Arrow's readers skip. Only lines that are empty or
        # start with white space can be blank; check just those.
        first = buffer[np.minimum(starts, len(data) - 1)]
        maybe_blank = np.flatnonzero((ends <= starts) | np.isin(first, (9, 13, 32)))
        blank = [i for i in maybe_blank.tolist() if not data[starts[i] : ends[i]].strip(b" \t\r")]
        keep = np.ones(len(starts), dtype=bool)
        keep[blank] = False
        self.starts = starts[keep]
        self.ends = ends[keep]

    def __len__(self) -> int:
        return len(self.starts)

    def chunk(self, first: int, stop: int) -> memoryview:
        """Lines first..stop-1 with whatever blank lines lie between them, without copying."""
        return memoryview(self.data)[self.starts[first] : self.ends[stop - 1]]

    def line(self, index: int) -> bytes:
        return self.data[self.starts[index] : self.ends[index]]

    def raw(self, indices: np.ndarray) -> list[str]:
        return [
            _text(self.data[start : min(end, start + RAW_LIMIT)])
            for start, end in zip(self.starts[indices].tolist(), self.ends[indices].tolist())
        ]

    def matching(self, pattern: re.Pattern) -> set[int]:
        """Lines where `pattern` matches."""
        found = np.fromiter((m.start() for m in pattern.finditer(self.data)), dtype=np.int64)
        return set((np.searchsorted(self.starts, found, side="right") - 1).tolist())

    @cached_property
    def undecodable(self) -> set[int]:
        """Lines that are not valid UTF-8 (checked only on lines holding non-ASCII bytes)."""
        if self.data.isascii():
            return set()
        high = np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8) >= 0x80)
        candidates = np.unique(np.searchsorted(self.starts, high, side="right") - 1)
        bad = set()
        for index in candidates.tolist():
            try:
                self.line(index).decode("utf-8")
            except UnicodeDecodeError:
                bad.add(index)
        return bad


@dataclass
class _TextFormat:
    """How to read one text format: Arrow's streaming reader for runs of lines, a Python parser
    for one line (flow fields as text, or _Unparseable), and a pattern for the lines Arrow reads
    as several records."""

    open_stream: Callable[[memoryview], pa.RecordBatchReader]
    parse_line: Callable[[bytes], dict[str, str | None]]
    fields: tuple[str, ...]
    multi_record: re.Pattern


class _Unparseable(Exception):
    pass


def _read_text(lines: _Lines, first: int, text_format: _TextFormat) -> _Records:
    """Records of lines[first:]. Lines Arrow would merge (several records on one line) are found
    only when the counts disagree, then read alone; if Arrow still surprises, Python reads all."""
    records = _read_text_lines(lines, first, text_format, lines.undecodable)
    if records.num_parsed + len(records.unparseable) == len(lines) - first:
        return records
    merged = lines.undecodable | lines.matching(text_format.multi_record)
    records = _read_text_lines(lines, first, text_format, merged)
    if records.num_parsed + len(records.unparseable) == len(lines) - first:
        return records
    return _read_text_lines(lines, first, text_format, set(range(first, len(lines))))


def _read_text_lines(
    lines: _Lines, first: int, text_format: _TextFormat, python_lines: set[int]
) -> _Records:
    """Records of lines[first:]. Arrow streams each run of lines between `python_lines` and stops
    at the first line it cannot read: the batches before it are kept, and its error names the
    line ("in row N" of the current block), which goes to Python, with the next few lines when
    it is close (bad lines come in clusters); then Arrow resumes after it. An error that names no
    line halves the run until the bad line is found. A clean run is one pass of Arrow."""
    arrow_tables: list[pa.Table] = []
    arrow_positions: list[np.ndarray] = []
    python_rows: list[dict[str, str | None]] = []
    python_positions: list[int] = []
    unparseable: list[tuple[int, str, str]] = []

    def parse_in_python(start: int, stop: int) -> None:
        for index in range(start, stop):
            position = index - first
            if index in lines.undecodable:
                unparseable.append((position, "unparseable:encoding", lines.raw([index])[0]))
                continue
            try:
                python_rows.append(text_format.parse_line(lines.line(index)))
                python_positions.append(position)
            except _Unparseable as error:
                unparseable.append((position, f"unparseable:{error}", lines.raw([index])[0]))

    def keep(start: int, table: pa.Table) -> None:
        arrow_tables.append(table)
        arrow_positions.append(np.arange(start - first, start - first + table.num_rows))

    def read(start: int, stop: int) -> None:
        while stop - start > FALLBACK_RECORDS:
            batches, error = _stream(text_format.open_stream, lines.chunk(start, stop))
            if batches:
                keep(start, pa.Table.from_batches(batches))
                start += sum(batch.num_rows for batch in batches)
            if error is None:
                return
            row = _error_row(error)
            if row is None or start + row >= stop:
                middle = (start + stop) // 2
                read(start, middle)
                start = middle
            elif row >= FALLBACK_RECORDS:
                read(start, start + row)
                parse_in_python(start + row, start + row + 1)
                start += row + 1
            else:
                parse_in_python(start, start + FALLBACK_RECORDS)
                start += FALLBACK_RECORDS
        parse_in_python(start, stop)

    start = first
    for line in sorted(i for i in python_lines if i >= first):
        read(start, line)
        parse_in_python(line, line + 1)
        start = line + 1
    read(start, len(lines))

    # Up to two chunks per field: what Arrow read (typed), then what Python read (text);
    # `positions` keeps each record's place in the file.
    positions = np.concatenate([*arrow_positions, np.array(python_positions, dtype=np.int64)])
    tables = [pa.concat_tables(arrow_tables)] if arrow_tables else []
    if python_rows:
        texts = {name: [row.get(name) for row in python_rows] for name in text_format.fields}
        tables.append(pa.table({name: pa.array(texts[name], pa.string()) for name in texts}))
    columns = {
        name: [table[name].combine_chunks() for table in tables] for name in text_format.fields
    }
    unparseable.sort()

    def render(rows: np.ndarray) -> list[str]:
        return lines.raw(positions[rows] + first)

    return _Records(columns, positions, render, unparseable)


def _stream(
    open_stream: Callable[[memoryview], pa.RecordBatchReader], chunk: memoryview
) -> tuple[list[pa.RecordBatch], pa.ArrowException | None]:
    """The batches Arrow reads before its first error, and the error."""
    batches: list[pa.RecordBatch] = []
    try:
        with open_stream(chunk) as reader:  # closing joins its threads
            batches.extend(reader)
    except pa.ArrowException as error:
        return batches, error
    return batches, None


ERROR_ROW = re.compile(r"\bin row (\d+)")


def _error_row(error: Exception) -> int | None:
    """The row, within the block being read, that an Arrow reader error names, if any."""
    found = ERROR_ROW.search(str(error))
    return int(found.group(1)) if found else None


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


# --- typing: any Arrow column -> numpy values and masks -------------------------------------------


@dataclass
class _Column:
    """A flow field across records: `values` where `ok`; `present` = not null, not blank."""

    values: np.ndarray
    present: np.ndarray
    ok: np.ndarray

    @staticmethod
    def absent(n: int) -> _Column:
        return _Column(np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, bool))

    @staticmethod
    def concat(parts: list[_Column], n: int) -> _Column:
        if not parts:
            return _Column.absent(n)
        return _Column(
            np.concatenate([part.values for part in parts]),
            np.concatenate([part.present for part in parts]),
            np.concatenate([part.ok for part in parts]),
        )

    def slice(self, start: int, stop: int) -> _Column:
        return _Column(self.values[start:stop], self.present[start:stop], self.ok[start:stop])


def _mask(array: pa.Array) -> np.ndarray:
    return np.asarray(array.fill_null(False), dtype=bool)


def _valid(array: pa.Array) -> np.ndarray:
    return np.ones(len(array), bool) if array.null_count == 0 else _mask(array.is_valid())


def _is_text(data_type: pa.DataType) -> bool:
    return pa.types.is_string(data_type) or pa.types.is_large_string(data_type)


def _decoded(array: pa.Array) -> pa.Array:
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _holds_text(array: pa.Array) -> bool:
    data_type = array.type
    return _is_text(data_type.value_type if pa.types.is_dictionary(data_type) else data_type)


def _dictionary(array: pa.Array) -> pa.DictionaryArray:
    return array if pa.types.is_dictionary(array.type) else pc.dictionary_encode(array)


def _int_columns(columns: dict[str, list[pa.Array]], n: int) -> dict[str, _Column]:
    """The integer fields. Their text chunks are parsed together: one round of Arrow calls per
    file instead of one per field, which is most of the cost of a small file."""
    text = [
        (name, i)
        for name in INT_FIELDS
        for i, chunk in enumerate(columns.get(name, []))
        if _holds_text(chunk)
    ]
    parsed = {}
    if text:
        texts = [_decoded(columns[name][i]).cast(pa.large_string()) for name, i in text]
        joined = _parse_int_text(pa.concat_arrays(texts))
        bounds = np.cumsum([0] + [len(chunk) for chunk in texts])
        parsed = {key: joined.slice(a, b) for key, a, b in zip(text, bounds[:-1], bounds[1:])}
    return {
        name: _Column.concat(
            [
                parsed[name, i] if (name, i) in parsed else _int_chunk(chunk)
                for i, chunk in enumerate(columns.get(name, []))
            ],
            n,
        )
        for name in INT_FIELDS
    }


def _int_chunk(array: pa.Array) -> _Column:
    n = len(array)
    array = _decoded(array)
    if _is_text(array.type):
        return _parse_int_text(array)
    present = _valid(array)
    if not pa.types.is_integer(array.type):
        return _Column(np.zeros(n, np.int64), present, np.zeros(n, bool))
    if array.type == pa.uint64():  # values above int64 do not fit: make them null, then cast
        small = pc.less_equal(array, pa.scalar(np.iinfo(np.int64).max, pa.uint64()))
        array = pc.if_else(small, array, pa.scalar(None, array.type))
    # Most columns are int64 without nulls already: skip the no-op Arrow calls (~20 per file).
    values = array if array.type == pa.int64() else pc.cast(array, pa.int64())
    values = values if values.null_count == 0 else values.fill_null(0)
    return _Column(values.to_numpy(), present, _valid(array))


def _parse_int_text(text: pa.Array) -> _Column:
    """Decimal integer text -> int64, element by element, without raising on bad elements (and
    stricter than Arrow's cast, which takes hex)."""
    text = pc.utf8_trim_whitespace(text)
    present = _mask(pc.greater(pc.utf8_length(text), 0))
    # Up to 19 significant digits; the few 19-digit numbers beyond int64 fail the cast below.
    ok = present & _mask(pc.match_substring_regex(text, r"^-?0*[0-9]{1,19}$"))
    try:
        parsed = pc.cast(_where(ok, text), pa.int64())
    except pa.ArrowInvalid:
        magnitude = pc.utf8_ltrim(_where(ok, text), "-0")  # digits without sign, leading zeros
        below_19_digits = pc.less(pc.utf8_length(magnitude), len(INT64_MAX_DIGITS))
        ok &= _mask(pc.or_(below_19_digits, pc.less_equal(magnitude, INT64_MAX_DIGITS)))
        parsed = pc.cast(_where(ok, text), pa.int64())
    return _Column(parsed.fill_null(0).to_numpy(), present, ok)


def _where(mask: np.ndarray, array: pa.Array) -> pa.Array:
    """`array` where `mask`, null elsewhere."""
    return pc.if_else(pa.array(mask), array, pa.scalar(None, array.type))


PROTO_ABSENT, PROTO_UNKNOWN = -2, -1


def _protocol_column(chunks: list[pa.Array], n: int) -> _Column:
    return _Column.concat([_protocol_chunk(chunk) for chunk in chunks], n)


def _protocol_chunk(array: pa.Array) -> _Column:
    if not _holds_text(array):
        column = _int_chunk(array)
        column.ok &= (column.values >= 0) & (column.values <= 255)
        return column
    encoded = _dictionary(array)
    distinct = encoded.dictionary.to_pylist()
    numbers = np.array([_protocol_number(text) for text in distinct] + [PROTO_ABSENT])
    proto = numbers[encoded.indices.fill_null(len(distinct)).to_numpy()]
    return _Column(np.maximum(proto, 0), proto != PROTO_ABSENT, proto >= 0)


def _protocol_number(text: str) -> int:
    text = text.strip()
    if not text:
        return PROTO_ABSENT
    if text.isascii() and text.isdigit():
        digits = text.lstrip("0") or "0"
        return int(digits) if len(digits) <= 3 and int(digits) <= 255 else PROTO_UNKNOWN
    return PROTOCOL_NUMBERS.get(text.upper(), PROTO_UNKNOWN)


@dataclass
class _Addresses:
    normalized: pa.ChunkedArray  # dictionary-encoded text, null where absent or invalid
    family: np.ndarray  # 4 or 6; 0 absent; -1 invalid

    @property
    def present(self) -> np.ndarray:
        return self.family != 0

    @property
    def ok(self) -> np.ndarray:
        return self.family > 0


def _address_column(chunks: list[pa.Array], n: int) -> _Addresses:
    if not chunks:
        return _address_chunk(pa.nulls(n))
    parts = [_address_chunk(chunk) for chunk in chunks]
    return _Addresses(
        pa.chunked_array([c for p in parts for c in p.normalized.chunks], ADDRESS_TYPE),
        np.concatenate([p.family for p in parts]),
    )


ADDRESS_TYPE = pa.dictionary(pa.int32(), pa.string())
NO_ADDRESSES = pa.array([], pa.string())


def _address_chunk(array: pa.Array) -> _Addresses:
    """Validate and normalize each distinct address once (dictionary encoding), not each row."""
    if not _holds_text(array):
        no_text = pa.DictionaryArray.from_arrays(pa.nulls(len(array), pa.int32()), NO_ADDRESSES)
        invalid = np.where(_valid(array), -1, 0).astype(np.int8)
        return _Addresses(pa.chunked_array([no_text]), invalid)
    encoded = _dictionary(array)
    checked = [_normalize_address(text) for text in encoded.dictionary.to_pylist()]
    normalized = pa.array([text for text, _ in checked], pa.string())
    families = np.array([family for _, family in checked] + [0], dtype=np.int8)
    indices = encoded.indices.cast(pa.int32())
    absent_as_last = indices if indices.null_count == 0 else indices.fill_null(len(checked))
    return _Addresses(
        pa.chunked_array([pa.DictionaryArray.from_arrays(indices, normalized)]),
        families[absent_as_last.to_numpy()],
    )


def _normalize_address(text: str) -> tuple[str | None, int]:
    text = text.strip()
    if not text:
        return None, 0
    if len(text) > MAX_ADDRESS_TEXT:  # and keep junk out of the cache
        return None, -1
    return _parse_address(text)


def canonical_address(text: str) -> str | None:
    """The one spelling of an address that flows are stored with (compressed lowercase IPv6,
    IPv4-mapped IPv6 as IPv4), or None when it is not an address: for inventories to match."""
    return _normalize_address(text)[0]


# Flow files of one cluster repeat the same few thousand addresses: remember them across files.
@functools.lru_cache(maxsize=1 << 16)
def _parse_address(text: str) -> tuple[str | None, int]:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None, -1
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address), address.version


# --- validation -----------------------------------------------------------------------------------


def _validate(records: _Records, source: str) -> ParsedFile:
    n = records.num_parsed
    columns = records.columns
    ints = _int_columns(columns, n)
    addresses = {name: _address_column(columns.get(name, []), n) for name in ADDRESS_FIELDS}
    proto = _protocol_column(columns.get("proto", []), n)

    start, end, size = ints["time_flow_start_ns"], ints["time_flow_end_ns"], ints["bytes"]
    packets, rate = ints["packets"], ints["sampling_rate"]
    src, dst = addresses["src_addr"], addresses["dst_addr"]
    scale = np.where(rate.ok & (rate.values > 1), rate.values, 1)
    start_in_range = (start.values >= MIN_TIME_NS) & (start.values < MAX_TIME_NS)
    end_in_range = (end.values >= MIN_TIME_NS) & (end.values < MAX_TIME_NS)
    failures = {
        **{f"missing_field:{name}": ~_present(name, ints, addresses) for name in FLOW_REQUIRED},
        **{f"bad_type:{name}": ints[name].present & ~ints[name].ok for name in INT_FIELDS},
        **{f"bad_addr:{name}": a.present & ~a.ok for name, a in addresses.items()},
        "time_out_of_range": ~(start_in_range & end_in_range),
        "end_before_start": end.values < start.values,
        "nonpositive_bytes": size.values <= 0,
        "mixed_family": src.family != dst.family,
        "bad_proto": proto.present & ~proto.ok,
        **{
            f"bad_port:{name}": _out_of_port_range(ints[name])
            for name in ("src_port", "dst_port")
        },
        "negative_packets": packets.ok & (packets.values < 0),
        "negative_sampling_rate": rate.ok & (rate.values < 0),
        "bytes_too_large": size.values * scale.astype(np.float64) > MAX_FLOW_BYTES,
        "packets_too_large": packets.values * scale.astype(np.float64) > MAX_FLOW_PACKETS,
    }
    reason = np.full(n, -1, dtype=np.int16)
    for code in reversed(range(len(CHECK_ORDER))):  # last to first: the first failed check wins
        reason[failures[CHECK_ORDER[code]]] = code

    good = reason < 0
    bad = np.flatnonzero(~good)
    clean = _clean_table(good, ints, addresses, proto, scale)
    clean_positions = records.positions[good]
    if np.any(np.diff(clean_positions) < 0):  # lines read in Python come last: restore file order
        clean = clean.take(np.argsort(clean_positions, kind="stable"))
    quarantine_starts = np.where(start.ok & start_in_range, start.values, -1)[bad]
    reasons = np.array(CHECK_ORDER, dtype=object)[reason[bad]]
    quarantine = _quarantine_table(source, records, bad, reasons)
    starts = np.concatenate([quarantine_starts, np.full(len(records.unparseable), -1, np.int64)])
    order = np.argsort(quarantine["row"].to_numpy(), kind="stable")
    return ParsedFile(
        clean,
        quarantine.take(order),
        starts[order],
        n + len(records.unparseable),
    )


def _out_of_port_range(port: _Column) -> np.ndarray:
    return port.ok & ((port.values < 0) | (port.values > 65535))


def _present(name: str, ints: dict[str, _Column], addresses: dict[str, _Addresses]) -> np.ndarray:
    return ints[name].present if name in ints else addresses[name].present


def _clean_table(
    good: np.ndarray,
    ints: dict[str, _Column],
    addresses: dict[str, _Addresses],
    proto: _Column,
    scale: np.ndarray,
) -> pa.Table:
    everything = bool(good.all())  # the common case: skip the copies that selection makes

    def kept(values: np.ndarray) -> np.ndarray:
        return values if everything else values[good]

    def optional(column: _Column, values: np.ndarray, data_type: pa.DataType) -> pa.Array:
        absent = ~kept(column.present)
        return pa.array(kept(values), type=data_type, mask=absent if absent.any() else None)

    def address(name: str) -> pa.Array:
        normalized = addresses[name].normalized
        return normalized if everything else normalized.filter(pa.array(good))

    start = kept(ints["time_flow_start_ns"].values)
    packets, received = ints["packets"], ints["time_received_ns"]
    # Built at FLOWS' types, so only the addresses are cast (decoded), not every column.
    return pa.table(
        {
            "time_flow_start_ns": start,
            "time_flow_end_ns": kept(ints["time_flow_end_ns"].values),
            "src_addr": address("src_addr"),
            "dst_addr": address("dst_addr"),
            "bytes": kept(ints["bytes"].values * scale),
            "packets": optional(packets, packets.values * scale, pa.int64()),
            "src_port": optional(ints["src_port"], ints["src_port"].values, pa.int32()),
            "dst_port": optional(ints["dst_port"], ints["dst_port"].values, pa.int32()),
            "proto": optional(proto, proto.values, pa.int16()),
            "sampler_address": address("sampler_address"),
            "time_received_ns": optional(received, received.values, pa.int64()),
            "sampling_rate": kept(scale),
            "minute": minute_of(pa.array(start, pa.int64())),
        },
        schema=FLOWS,
    )


def _quarantine_table(
    source: str, records: _Records, bad: np.ndarray, reasons: np.ndarray
) -> pa.Table:
    unparseable = records.unparseable
    rows = np.concatenate([records.positions[bad], np.array([u[0] for u in unparseable], np.int64)])
    return pa.table(
        {
            "source": pa.array([source] * len(rows), pa.string()),
            "row": rows,
            "reason": reasons.tolist() + [u[1] for u in unparseable],
            "raw": records.render(bad) + [u[2] for u in unparseable],
        },
        schema=QUARANTINE,
    )


# --- duplicates and footers -----------------------------------------------------------------------

SORT_KEYS = ("time_flow_start_ns", "src_addr", "dst_addr", "src_port", "dst_port", "bytes")
# Two exporters that report one flow differ only in who sent it and when it arrived.
REPORTER = ("time_received_ns", "sampler_address")
IDENTITY = tuple(name for name in FLOWS.names if name not in REPORTER)
FULL_SORT_ORDER = (*SORT_KEYS, *(name for name in IDENTITY if name not in SORT_KEYS), *REPORTER)
# ... or, from two switches on the flow's path, also in their clocks and header accounting: times
# within COPY_TIME_NS once the exporters' offset is taken out, bytes within COPY_BYTES_SHARE.
COPY_TIME_NS = 3_000_000
COPY_BYTES_SHARE = 0.02
MAX_CLOCK_OFFSET_NS = 1_000_000_000
FIVE_TUPLE = ("src_addr", "dst_addr", "src_port", "dst_port", "proto")


def dedupe(flows: pa.Table) -> tuple[pa.Table, int]:
    """Drop duplicate flows: exact copies (equal on IDENTITY), and one flow's records from two
    exporters (`copies_from_other_exporters`). The table is sorted by SORT_KEYS, then by every
    other column, so the copy kept (earliest received; of two exporters, the first address) and
    the output bytes do not depend on the input order. Returns (table, number of rows dropped)."""
    if flows.num_rows < 2:
        return flows, 0
    kept = deduplicated_order(flows)
    return flows.take(kept), flows.num_rows - len(kept)


def deduplicated_order(flows: pa.Table) -> np.ndarray:
    """The rows `dedupe` keeps, as indices into `flows` in its output order.

    Start times rarely tie, and duplicates share theirs: one integer argsort by start orders
    nearly every row, and only the rows whose start is shared are sorted on every column and
    compared (a full multi-column sort of the minute cost ~3x more)."""
    start = flows["time_flow_start_ns"].to_numpy()
    order = np.argsort(start, kind="stable")
    starts = start[order]
    same_start_as_next = starts[1:] == starts[:-1]
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= same_start_as_next
    tied[:-1] |= same_start_as_next
    positions = np.flatnonzero(tied)  # runs of equal start, in start order
    duplicates = np.zeros(0, dtype=np.int64)
    if len(positions):
        tied_rows = flows.take(order[positions])
        within = pc.sort_indices(
            tied_rows, sort_keys=[(name, "ascending", "at_end") for name in FULL_SORT_ORDER]
        ).to_numpy()
        order[positions] = order[positions][within]  # a run stays in place: start is the first key
        tied_rows = tied_rows.take(within)
        # neighbours within one run of equal start, then equal on every IDENTITY column
        repeat = same_start_as_next[positions[:-1]] & (np.diff(positions) == 1)
        for name in IDENTITY:
            column = tied_rows[name].combine_chunks()
            current, previous = column.slice(1), column.slice(0, len(column) - 1)
            both_null = _mask(pc.and_(current.is_null(), previous.is_null()))
            repeat &= _mask(pc.equal(current, previous)) | both_null
        duplicates = positions[1:][repeat]
    order = np.delete(order, duplicates)
    compared = flows.select([*FIVE_TUPLE, "sampler_address", "time_flow_start_ns", "time_flow_end_ns", "bytes"])
    return np.delete(order, copies_from_other_exporters(compared.take(order)))


def copies_from_other_exporters(flows: pa.Table) -> np.ndarray:
    """Rows that repeat a flow another exporter reported (a second switch on its path): same
    5-tuple, another `sampler_address`, times within COPY_TIME_NS once the two exporters' clock
    offset is taken out, bytes within COPY_BYTES_SHARE. Of such a pair the row of the exporter
    with the first address is kept.

    The offset of each pair of exporters is the median, over the 5-tuples both report, of the
    difference of their first starts (pairs more than MAX_CLOCK_OFFSET_NS apart are not
    corrected). Rows are then sorted by (5-tuple, corrected start) and neighbours compared; a row
    pairs with the nearer of two matching neighbours, so it pairs once. A record whose copy was
    lost can still pair with a neighbouring transfer's copy when transfers on one 5-tuple are
    closer than COPY_TIME_NS. Rows without an exporter are never copies."""
    # most minutes have none: one hash aggregation says so
    exporters_per_tuple = flows.group_by(list(FIVE_TUPLE), use_threads=False).aggregate(
        [("sampler_address", "count_distinct")])["sampler_address_count_distinct"]
    if (pc.max(exporters_per_tuple).as_py() or 0) < 2:
        return np.zeros(0, np.int64)
    reported = _mask(pc.is_valid(flows["sampler_address"]))
    rows = np.flatnonzero(reported)
    exporters = flows["sampler_address"].take(rows).combine_chunks().dictionary_encode()
    rank = np.argsort(np.argsort(exporters.dictionary.to_numpy(zero_copy_only=False)))
    exporter = rank[exporters.indices.to_numpy()]
    five_tuple = combination_ids(*(_ids(flows[name].take(rows)) for name in reversed(FIVE_TUPLE)))
    start = flows["time_flow_start_ns"].to_numpy()[rows]
    end = flows["time_flow_end_ns"].to_numpy()[rows]
    size = flows["bytes"].to_numpy()[rows]

    # first start of each (5-tuple, exporter); the 5-tuple's first exporter is its reference
    order = np.lexsort((start, exporter, five_tuple))
    firsts = order[np.r_[True, (np.diff(five_tuple[order]) != 0) | (np.diff(exporter[order]) != 0)]]
    reference = firsts[np.r_[True, np.diff(five_tuple[firsts]) != 0]]
    reference_of_tuple = np.zeros(five_tuple.max() + 1, np.int64)
    reference_of_tuple[five_tuple[reference]] = reference
    others = firsts[exporter[firsts] != exporter[reference_of_tuple[five_tuple[firsts]]]]
    # each row's pair (its 5-tuple's reference exporter, its own exporter)
    pair_codes, pair = np.unique(exporter[reference_of_tuple[five_tuple]] * len(rank) + exporter, return_inverse=True)
    offsets = start[others] - start[reference_of_tuple[five_tuple[others]]]
    offset_of_pair = np.zeros(len(pair_codes), np.int64)
    by_pair = np.lexsort((offsets, pair[others]))
    pairs, first_of_pair, count = np.unique(pair[others][by_pair], return_index=True, return_counts=True)
    median = offsets[by_pair][first_of_pair + count // 2]
    offset_of_pair[pairs] = np.where(np.abs(median) <= MAX_CLOCK_OFFSET_NS, median, 0)
    shift = offset_of_pair[pair]  # zero for the reference exporter's rows

    order = np.lexsort((exporter, start - shift, five_tuple))
    a, b = order[:-1], order[1:]
    start_gap = np.abs((start[b] - shift[b]) - (start[a] - shift[a]))
    end_gap = np.abs((end[b] - shift[b]) - (end[a] - shift[a]))
    match = (
        (five_tuple[a] == five_tuple[b])
        & (exporter[a] != exporter[b])
        & (start_gap <= COPY_TIME_NS)
        & (end_gap <= COPY_TIME_NS)
        & (np.abs(size[b] - size[a]) <= COPY_BYTES_SHARE * np.maximum(size[a], size[b]))
    )
    # a row pairs with the nearer of its matching neighbours: a matching pair closer than the
    # one before it and at least as close as the one after
    far = np.iinfo(np.int64).max
    distance = np.where(match, start_gap + end_gap, far)
    paired = match & (distance < np.r_[far, distance[:-1]]) & (distance <= np.r_[distance[1:], far])
    copy = np.where(exporter[a] > exporter[b], a, b)[paired]
    return np.sort(rows[copy])


def _ids(column: pa.ChunkedArray) -> np.ndarray:
    """Integer codes of a column's values (nulls are one more value), for grouping."""
    encoded = column.combine_chunks().dictionary_encode()
    return pc.fill_null(encoded.indices, -1).to_numpy().astype(np.int64)


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
