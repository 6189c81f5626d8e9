"""One Parquet file assembled from row groups encoded apart, so that a partition's row groups can
be encoded on several cores (pyarrow's writer encodes one column chunk after another on one) and
still land in one file, in order.

Each row group is written by pyarrow as a whole Parquet file of its own in memory ("a part"):
`PAR1`, its column chunks, its footer. The assembled file is `PAR1`, every part's column chunks in
order, and one footer: the first part's (schema, key-value metadata with the Arrow schema, writer)
with every part's row groups, their file offsets moved to where their chunks now lie. A footer is
Thrift's compact protocol (parquet.thrift, FileMetaData), decoded and encoded here in full: only
the few offset fields and the row count change; every other field is carried over as it was read.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

MAGIC = b"PAR1"
_FOOTER_TAIL = 8  # footer length (4 bytes, little-endian) and the closing magic

# Thrift compact protocol type codes.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)

# Field ids in parquet.thrift.
_FILE_NUM_ROWS, _FILE_ROW_GROUPS = 3, 4
_GROUP_COLUMNS, _GROUP_FILE_OFFSET, _GROUP_ORDINAL = 1, 5, 7
_CHUNK_OFFSETS = (2, 4, 6)  # file_offset, offset_index_offset, column_index_offset
_CHUNK_META_DATA = 3
_COLUMN_OFFSETS = (9, 10, 11, 14)  # data page, index page, dictionary page, bloom filter


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def byte(self) -> int:
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def take(self, size: int) -> bytes:
        self.at += size
        return self.data[self.at - size:self.at]


def _read_value(reader: _Reader, kind: int):
    if kind in (_TRUE, _FALSE):  # a boolean inside a list: one byte
        return reader.byte() == _TRUE
    if kind == _BYTE:
        return reader.byte()
    if kind in (_I16, _I32, _I64):
        return reader.zigzag()
    if kind == _DOUBLE:
        return reader.take(8)
    if kind == _BINARY:
        return reader.take(reader.varint())
    if kind in (_LIST, _SET):
        header = reader.byte()
        size, element = header >> 4, header & 0x0F
        if size == 15:
            size = reader.varint()
        return element, [_read_value(reader, element) for _ in range(size)]
    if kind == _STRUCT:
        return _read_struct(reader)
    raise ValueError(f"unexpected Thrift type {kind} in a Parquet footer")


def _read_struct(reader: _Reader) -> dict[int, tuple[int, object]]:
    """Field id -> (type, value), in the order the fields were written."""
    fields, last = {}, 0
    while True:
        header = reader.byte()
        if header == 0:
            return fields
        kind, delta = header & 0x0F, header >> 4
        last = last + delta if delta else reader.zigzag()
        fields[last] = (kind, kind == _TRUE) if kind in (_TRUE, _FALSE) else (kind, _read_value(reader, kind))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _zigzag(value: int) -> bytes:
    return _varint((value << 1) ^ (value >> 63))


def _write_value(out: bytearray, kind: int, value) -> None:
    if kind in (_TRUE, _FALSE):
        out.append(_TRUE if value else _FALSE)
    elif kind == _BYTE:
        out.append(value)
    elif kind in (_I16, _I32, _I64):
        out += _zigzag(value)
    elif kind == _DOUBLE:
        out += value
    elif kind == _BINARY:
        out += _varint(len(value)) + value
    elif kind in (_LIST, _SET):
        element, items = value
        out += bytes([len(items) << 4 | element]) if len(items) < 15 else bytes([0xF0 | element]) + _varint(len(items))
        for item in items:
            _write_value(out, element, item)
    elif kind == _STRUCT:
        _write_struct(out, value)
    else:
        raise ValueError(f"unexpected Thrift type {kind} in a Parquet footer")


def _write_struct(out: bytearray, fields: dict[int, tuple[int, object]]) -> None:
    last = 0
    for field, (kind, value) in fields.items():
        wire_kind = (_TRUE if value else _FALSE) if kind in (_TRUE, _FALSE) else kind
        delta = field - last
        out += bytes([delta << 4 | wire_kind]) if 0 < delta <= 15 else bytes([wire_kind]) + _zigzag(field)
        if kind not in (_TRUE, _FALSE):
            _write_value(out, kind, value)
        last = field
    out.append(0)


def _moved(fields: dict, ids: tuple[int, ...], by: int) -> None:
    """Offsets in `fields` moved by `by`; 0 means unset (a file's first bytes are its magic)."""
    for field in ids:
        if field in fields and fields[field][1]:
            fields[field] = (fields[field][0], fields[field][1] + by)


def _footer_length(part: memoryview) -> int:
    if part[:4] != MAGIC or part[-4:] != MAGIC:
        raise ValueError("not a Parquet file")
    return struct.unpack("<I", part[-_FOOTER_TAIL:-4])[0]


class PartsFile:
    """Writes parts' row groups, in the order they are added, into one Parquet file on `out`
    (a binary file positioned at its start); `close` writes the footer."""

    def __init__(self, out: BinaryIO):
        self.out, self.position = out, len(MAGIC)
        self.metadata: dict | None = None  # the first part's footer
        self.row_groups: list[dict] = []
        self.rows = 0
        out.write(MAGIC)

    def add(self, part) -> None:
        """Append the row groups of `part`, a whole Parquet file in a bytes-like object."""
        part = memoryview(part)
        length = _footer_length(part)
        footer = _read_struct(_Reader(bytes(part[-_FOOTER_TAIL - length:-_FOOTER_TAIL])))
        chunks = part[len(MAGIC):len(part) - _FOOTER_TAIL - length]
        moved_by = self.position - len(MAGIC)
        for group in footer[_FILE_ROW_GROUPS][1][1]:
            _moved(group, (_GROUP_FILE_OFFSET,), moved_by)
            for chunk in group[_GROUP_COLUMNS][1][1]:
                _moved(chunk, _CHUNK_OFFSETS, moved_by)
                _moved(chunk[_CHUNK_META_DATA][1], _COLUMN_OFFSETS, moved_by)
            if _GROUP_ORDINAL in group:
                group[_GROUP_ORDINAL] = (_I16, len(self.row_groups))
            self.row_groups.append(group)
        self.rows += footer[_FILE_NUM_ROWS][1]
        self.metadata = self.metadata or footer
        self.out.write(chunks)
        self.position += len(chunks)

    def close(self) -> None:
        if self.metadata is None:
            raise ValueError("a Parquet file needs at least one part (its schema)")
        self.metadata[_FILE_NUM_ROWS] = (_I64, self.rows)
        self.metadata[_FILE_ROW_GROUPS] = (_LIST, (_STRUCT, self.row_groups))
        footer = bytearray()
        _write_struct(footer, self.metadata)
        self.out.write(bytes(footer) + struct.pack("<I", len(footer)) + MAGIC)
