"""Typing: any Arrow column of a flow field (integer, text or other) -> numpy values with masks of
what is present and what is valid; integers and protocols here, addresses in `addresses`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.ingest.records import INT_FIELDS

INT64_MAX_DIGITS = str(np.iinfo(np.int64).max)


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
