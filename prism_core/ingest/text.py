"""Reading text formats: Arrow's streaming readers over runs of lines, Python for the lines Arrow
stops at, so a clean file costs one Arrow pass and a dirty one little more."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from prism_core.ingest.records import RAW_LIMIT, _Records, _text

# Arrow streams text in blocks this big: as fast as larger ones, and an error wastes less of a
# block (what the block read before the bad line is read again).
TEXT_BLOCK_BYTES = 256 << 10
FALLBACK_RECORDS = 16  # runs of text lines this short are parsed in Python, not by Arrow


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
