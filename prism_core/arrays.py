"""Small vectorized helpers shared by the stages."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import fields
from functools import cached_property
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RADIX_SPAN = 1 << 16  # numpy sorts 16-bit integers stably with a radix sort, in linear time
BYTE_SPAN = 1 << 8  # ... and 8-bit ones in one pass of it
# a filter that drops at most this many rows returns slices of the table (zero copy); more
# slices would make later column reads (to_numpy concatenates chunks) cost more than the copy
MAX_SLICED_DROPS = 1024
# up to this many dropped rows, a filter leaves a table's text columns as slices (each row's text
# copied would be most of the table's bytes) and copies only its fixed-width columns
MAX_SLICED_STRING_DROPS = 1 << 16
# unique_inverse ranks integers through a table of their span up to this many entries per value
MAX_DENSE_SPAN_PER_VALUE = 4
# kth_within_groups counts values per run and magnitude bucket in a table of at most this many
# cells per value (else it sorts them all)
MAX_BUCKET_CELLS_PER_VALUE = 4
# group_medians sorts each group of a size class wider than this apart, not padded into rows
MIN_GROUP_SORTED_ALONE = 256
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation


class Columns:
    """Base of a dataclass of equal-length numpy columns; `dtypes` are the fields' types, in order."""

    dtypes: ClassVar[tuple]

    def __len__(self) -> int:
        return len(getattr(self, fields(self)[0].name))

    def take(self, index: np.ndarray):
        return type(self)(*(getattr(self, f.name)[index] for f in fields(self)))

    @classmethod
    def concat(cls, parts: list):
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    @classmethod
    def empty(cls):
        return cls(*(np.empty(0, t) for t in cls.dtypes))


def filter_rows(table: pa.Table, mask: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Table:
    """`table.filter(mask)` for a boolean mask; rows dropped here and there (the few flows a
    job's members did not send) leave slices of the table, not a copy of it (or of its text
    columns, where more are dropped). pyarrow filters a table by a chunked mask (what compute
    functions return for a table's column) ~8x slower than by one array."""
    if isinstance(mask, pa.ChunkedArray):
        mask = mask.combine_chunks()
    keep = mask if isinstance(mask, np.ndarray) else pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    dropped = np.flatnonzero(~keep)
    if len(dropped) > MAX_SLICED_STRING_DROPS or (
            len(dropped) > MAX_SLICED_DROPS and not any(_variable_width(field.type) for field in table.schema)):
        return table.filter(pa.array(keep))  # no text column left as slices: no slices made
    bounds = np.r_[-1, dropped, len(keep)]
    pieces = [table.slice(lo + 1, hi - lo - 1) for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()) if hi - lo > 1]
    sliced = pa.concat_tables(pieces) if pieces else table.slice(0, 0)
    if len(dropped) <= MAX_SLICED_DROPS:
        return sliced
    # the text columns (addresses: most of a table of flows' bytes) stay slices, the others are
    # copied into whole arrays, which numpy reads without a copy
    keep = pa.array(keep)
    return pa.Table.from_arrays([sliced[name] if _variable_width(field.type) else table[name].filter(keep)
                                 for name, field in zip(table.column_names, table.schema)], schema=table.schema)


CODES_SUFFIX = "_codes"  # a column's codes (`with_codes`): "src_addr" -> "src_addr_codes"


def uncoded_columns(names: list[str]) -> list[str]:
    """`names` less the columns whose codes (`with_codes`) are among them: a reader of those
    addresses takes their codes, so a copy need not carry their text (most of its bytes)."""
    return [name for name in names if name + CODES_SUFFIX not in names]


def with_codes(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    """`table` with each column of `names` also dictionary-encoded (as name + CODES_SUFFIX), once:
    the stages that read it (`lookup`, `encoded`) then go through its integer codes and its few
    distinct values instead of hashing every row's text again (each pass over a large job's
    addresses is tens of ms). A filter of the table (`filter_rows`) keeps the codes in step. Codes
    the table carries already (its pieces' own dictionaries: prism_core.analysis.split_flows_by_job)
    are renumbered instead, through their integers, to the codes `dictionary_encode` gives."""
    for name in names:
        coded = name + CODES_SUFFIX
        if coded in table.column_names:
            table = table.set_column(table.schema.get_field_index(coded), coded, first_seen_codes(table[coded]))
        else:
            table = table.append_column(coded, table[name].combine_chunks().dictionary_encode())
    return table


def first_seen_codes(codes: pa.ChunkedArray) -> pa.DictionaryArray:
    """A dictionary-encoded column as `dictionary_encode` encodes its values: one dictionary of the
    values that show, in the order they first show, whatever dictionaries its chunks had."""
    codes = codes.combine_chunks()  # one dictionary for every chunk
    indices = codes.indices
    shown = pc.unique(indices).drop_null()
    renumbered = np.zeros(len(codes.dictionary), np.int32)
    renumbered[shown.to_numpy()] = np.arange(len(shown), dtype=np.int32)
    valid = indices.is_valid() if indices.null_count else None
    indices = pa.array(renumbered[pc.fill_null(indices, 0).to_numpy()], mask=None if valid is None else
                       pc.invert(valid).to_numpy(zero_copy_only=False))
    return pa.DictionaryArray.from_arrays(indices, codes.dictionary.take(shown))


def _carried_codes(table: pa.Table, name: str) -> tuple[np.ndarray, pa.Array] | None:
    """(code per row, -1 for null; the distinct values they index) of column `name` from its
    codes (`with_codes`), None where the table carries none (or its pieces' dictionaries differ)."""
    coded = name + CODES_SUFFIX
    if coded not in table.column_names:
        return None
    chunks = table[coded].chunks
    if not chunks:
        return np.zeros(0, np.int32), pa.array([], table.schema.field(coded).type.value_type)
    dictionary = chunks[0].dictionary
    if not all(chunk.dictionary.equals(dictionary) for chunk in chunks[1:]):
        return None
    indices = chunks[0].indices if len(chunks) == 1 else pa.concat_arrays([chunk.indices for chunk in chunks])
    return (pc.fill_null(indices, -1) if indices.null_count else indices).to_numpy(), dictionary


def lookup(table: pa.Table, name: str, value_set: pa.Array, fill=None) -> np.ndarray:
    """Per row, the index in `value_set` of column `name`'s value (`fill` where null), -1 where
    absent: `pc.index_in`, through the column's codes where the table carries them."""
    carried = _carried_codes(table, name)
    if carried is None:
        column = table[name] if fill is None else pc.fill_null(table[name], fill)
        return pc.fill_null(pc.index_in(column, value_set=value_set), -1).to_numpy()
    codes, dictionary = carried
    of_null = pa.array([fill], dictionary.type)  # code -1: the last entry
    found = pc.index_in(pa.concat_arrays([dictionary, of_null]), value_set=value_set)
    return pc.fill_null(found, -1).to_numpy()[codes]


def encoded(table: pa.Table, name: str, fill=None) -> tuple[np.ndarray, pa.Array]:
    """Column `name` (`fill` where null) dictionary-encoded as `dictionary_encode` does it: (code
    per row, int64, -1 for null; the distinct values, numbered in order of first appearance).
    Through the column's codes where the table carries them: of a filtered table, they are renumbered
    in the order its rows show them, dropping those no row shows."""
    carried = _carried_codes(table, name)
    if carried is None:
        column = table[name] if fill is None else pc.fill_null(table[name], fill)
        encoding = column.combine_chunks().dictionary_encode()
        return pc.fill_null(encoding.indices, -1).to_numpy().astype(np.int64), encoding.dictionary
    codes, dictionary = carried
    codes = codes.astype(np.int64)
    if fill is not None and (codes < 0).any():
        at = pc.index_in(pa.array([fill], dictionary.type), value_set=dictionary)[0].as_py()
        if at is None:
            dictionary, at = pa.concat_arrays([dictionary, pa.array([fill], dictionary.type)]), len(dictionary)
        codes[codes < 0] = at
    n = len(dictionary)
    # the codes rows show, in the order they first show (pc.unique keeps first appearances, as
    # dictionary_encode does: a hash pass, not a scatter of every row's index); a null's -1 left out
    in_order = pc.unique(pa.array(codes)).to_numpy()
    in_order = in_order[in_order >= 0]
    shown = len(in_order)
    if shown == n and np.all(in_order == np.arange(n)):
        return codes, dictionary
    renumbered = np.full(n + 1, -1, np.int64)
    renumbered[in_order] = np.arange(shown)
    return renumbered[codes], dictionary.take(pa.array(in_order))


def value_codes(table: pa.Table, name: str) -> tuple[np.ndarray, pa.Array]:
    """Column `name` as (code per row, int64, -1 for null; the values they index): equal codes for
    equal values, in no particular numbering, the values possibly with some no row shows. For
    grouping and hashing, where `encoded`'s numbering (as `dictionary_encode` gives it, renumbered
    from carried codes) is not needed. Through the column's codes where the table carries them."""
    carried = _carried_codes(table, name)
    if carried is None:
        encoding = table[name].combine_chunks().dictionary_encode()
        return pc.fill_null(encoding.indices, -1).to_numpy().astype(np.int64), encoding.dictionary
    codes, dictionary = carried
    return codes.astype(np.int64), dictionary


def row_hash(*columns: np.ndarray) -> np.ndarray:
    """One 64-bit hash per row of integer columns: equal rows hash alike, and one key sorts or
    groups much faster than several. Two rows that differ collide with odds ~2^-64 a pair."""
    hashed = np.zeros(len(columns[0]), np.uint64)
    with np.errstate(over="ignore"):
        for column in columns:
            # in place, an int64 column read as its bits: no temporary arrays but the other types' casts
            hashed ^= column.view(np.uint64) if column.dtype == np.int64 else column.astype(np.uint64)
            hashed *= np.uint64(0x9E3779B97F4A7C15)
    return hashed


def column_hash(table: pa.Table, names: tuple[str, ...]) -> np.ndarray:
    """`row_hash` of the table's columns `names`: integers as they are, text through its codes
    (`value_codes`: the table may carry them alone); null as -1."""
    return row_hash(*(pc.fill_null(table[name], -1).to_numpy()
                      if name in table.column_names and pa.types.is_integer(table.schema.field(name).type)
                      else value_codes(table, name)[0] for name in names))


def _variable_width(data_type: pa.DataType) -> bool:
    return any(test(data_type) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                            pa.types.is_large_binary))


def searchsorted_many(a: np.ndarray, v: np.ndarray, side: str = "left") -> np.ndarray:
    """`np.searchsorted(a, v, side)` (`a` sorted) for many values `v`: where `v` is sorted too
    (a job's flows by start against its few steps' edges), `a` is placed among `v` instead, len(a)
    binary searches rather than len(v), and each value's place follows from those (the same
    integers, ~10x faster); else numpy's."""
    if len(v) < 2 * len(a) or not np.all(v[1:] >= v[:-1]):
        return np.searchsorted(a, v, side)
    # the entries of `a` below each value (side="left"; at or below, "right") are those placed
    # among `v` at or before it (after the values at or below them; below them, "right")
    placed = np.searchsorted(v, a, "right" if side == "left" else "left")
    return np.repeat(np.arange(len(a) + 1), np.diff(np.r_[0, placed, len(v)]))


def nearest_within(values: np.ndarray, reference: np.ndarray, share: float) -> np.ndarray:
    """Per value: the index of the nearest entry of `reference` (sorted) when that lies within
    `share` of the value, else -1. Exporters that count header bytes per packet, or estimate a
    flow's bytes, report one transfer size a few bytes apart each time: sizes are compared so."""
    if not len(reference) or not len(values):
        return np.full(len(values), -1, np.int64)
    place = np.searchsorted(reference, values)
    below, above = np.maximum(place - 1, 0), np.minimum(place, len(reference) - 1)
    distance_below, distance_above = np.abs(values - reference[below]), np.abs(reference[above] - values)
    nearest = np.where(distance_below <= distance_above, below, above)
    return np.where(np.minimum(distance_below, distance_above) <= share * np.abs(values), nearest, -1)


def stable_order(keys: np.ndarray, scattered: bool = False) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` for integer keys; in linear time when they span fewer
    than RADIX_SPAN values (host pairs, job codes), which is most calls. `scattered`: the keys
    come in no order (numpy's timsort finds no runs to merge, ~2x slower than on nearly sorted
    keys), so two linear passes (low 16 bits, then high) do better where they span fewer than
    RADIX_SPAN^2 values (group codes)."""
    if len(keys) and np.issubdtype(keys.dtype, np.integer):
        low = keys.min()
        span = int(keys.max()) - int(low)
        if span < BYTE_SPAN:  # one pass of numpy's radix sort, not two (~15% faster)
            return np.argsort(keys.astype(np.uint8) - np.uint8(low.astype(np.uint8)), kind="stable")
        if span < RADIX_SPAN:
            # offsets from the minimum, taken modulo 2^16 (2^8 above): exact whatever the integer type
            return np.argsort(keys.astype(np.uint16) - np.uint16(low.astype(np.uint16)), kind="stable")
        if scattered and span < RADIX_SPAN * RADIX_SPAN:
            offset = keys.astype(np.int64) - int(low)
            by_low = np.argsort(offset.astype(np.uint16), kind="stable")  # the low 16 bits
            return by_low[np.argsort((offset[by_low] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(keys, kind="stable")


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` for a 1-d numeric array, by hashing instead of
    sorting every value: only the distinct values are sorted (flow sizes and groups repeat).
    Integers spanning few values (group keys, codes) are ranked through a table of the span
    instead, without hashing: 1.5-5x faster."""
    if len(values) and np.issubdtype(values.dtype, np.integer) and np.can_cast(values.dtype, np.int64):
        low = int(values.min())
        span = int(values.max()) - low + 1
        if span <= MAX_DENSE_SPAN_PER_VALUE * len(values):
            # values from 0 up to twice the span index a table from 0 themselves: no array of
            # offsets from the lowest to make (~25% faster)
            base = 0 if 0 <= low <= span else low
            index = values if base == 0 else values.astype(np.int64, copy=False) - base
            present = np.zeros(low + span - base, bool)
            present[index] = True
            rank = np.cumsum(present) - 1
            return (np.flatnonzero(present) + base).astype(values.dtype), rank[index]
    encoded = pc.dictionary_encode(pa.array(values))
    distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
    order = np.argsort(distinct)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[encoded.indices.to_numpy(zero_copy_only=False)]


def first_seen_ids(values: np.ndarray) -> np.ndarray:
    """An id per value (1-d numeric), equal for equal values, numbered in the order the values first
    show: `unique_inverse` without sorting the distinct values, for groupings whose order does not
    matter."""
    return pc.dictionary_encode(pa.array(values)).indices.to_numpy()


def unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_counts=True)` for a 1-d numeric array, by hashing: only the
    distinct values are sorted. Integers spanning few values are counted in a table of the span."""
    if len(values) and np.issubdtype(values.dtype, np.integer) and np.can_cast(values.dtype, np.int64):
        low = int(values.min())
        span = int(values.max()) - low + 1
        if span <= MAX_DENSE_SPAN_PER_VALUE * len(values):
            counts = np.bincount(values.astype(np.int64, copy=False) - low, minlength=span)
            present = np.flatnonzero(counts)
            return (present + low).astype(values.dtype), counts[present]
    counted = pc.value_counts(pa.array(values))
    distinct = counted.field("values").to_numpy(zero_copy_only=False)
    order = np.argsort(distinct)
    return distinct[order], counted.field("counts").to_numpy(zero_copy_only=False)[order]


def combination_ids(*columns: np.ndarray) -> np.ndarray:
    """An id per row, the same for rows equal in every column; ids count up in the order of
    `np.lexsort(columns)` (last column first)."""
    packed = _packed_key(columns[::-1])
    if packed is not None:  # the distinct combinations hashed and ranked, not every row sorted
        return unique_inverse(packed)[1]
    order = np.lexsort(columns)
    changes = np.zeros(len(order), bool)
    for column in columns:
        ordered = column[order]
        changes[1:] |= ordered[1:] != ordered[:-1]
    ids = np.empty(len(order), np.int64)
    ids[order] = np.cumsum(changes)
    return ids


def unique_rows(*columns: np.ndarray, return_index: bool = False, return_inverse: bool = False):
    """`np.unique(np.stack(columns, axis=1), axis=0, ...)` (the distinct rows in lexicographic
    order, each one's first row, each row's distinct row) with a 1-d inverse. Signed integer
    columns whose combinations fit in int64 are packed into one key and hashed: numpy sorts the
    rows themselves as structured values, ~15x slower (recognition, in the launching process
    while the workers wait, called it on each hour's edges and NIC pairs)."""
    packed = _packed_key(columns)
    if packed is None:
        found = np.unique(np.stack(columns, axis=1), axis=0, return_index=return_index, return_inverse=return_inverse)
        if not return_inverse:
            return found
        return (*found[:-1], found[-1].ravel())
    distinct, inverse = unique_inverse(packed)
    first = np.full(len(distinct), len(packed), np.int64)
    np.minimum.at(first, inverse, np.arange(len(packed)))
    rows = np.stack([column[first] for column in columns], axis=1)
    found = (rows, *([first] if return_index else []), *([inverse] if return_inverse else []))
    return found if len(found) > 1 else rows


def _packed_key(columns) -> np.ndarray | None:
    """One int64 per row that orders rows as their integer columns do (the first column most
    significant), or None when a column is not integer or the combinations do not fit in int64."""
    if not len(columns[0]) or not all(np.issubdtype(c.dtype, np.signedinteger) for c in columns):
        return None
    lows = [int(c.min()) for c in columns]
    spans = [int(c.max()) - low + 1 for c, low in zip(columns, lows)]
    if math.prod(spans) >= 1 << 62:
        return None
    key = np.zeros(len(columns[0]), np.int64)
    for column, low, span in zip(columns, lows, spans):
        key *= span
        key += column.astype(np.int64, copy=False) - low
    return key


def sorted_within_groups(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` (integers) sorted within each run of equal `group` codes (`group` sorted: the
    runs stay where they are); the values of `np.lexsort((values, group))`, without sorting indices."""
    packed = _packed_key((group, values))
    if packed is None:
        return values[np.lexsort((values, group))]
    low = int(values.min())
    return np.sort(packed) % (int(values.max()) - low + 1) + low


def kth_within_groups(group: np.ndarray, values: np.ndarray, kth: np.ndarray) -> np.ndarray:
    """Per run of equal `group` codes (`group` sorted), the `kth` (per run, 0-based) smallest of
    its `values` (integers): `sorted_within_groups(group, values)[run start + kth]`, without sorting
    every value. Values fall in buckets by magnitude (eighths of octaves: an order that rounding to
    float may merge but never reverses); only the values in the bucket that holds each run's kth
    are sorted (most of a pair's quiets, its micro-batch sends, lie below its long ones)."""
    starts = _group_starts(group)
    run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(group)]))
    low = int(values.min())
    offset = values.astype(np.int64) - low
    # a positive float's bits order as it does: its exponent and first three mantissa bits
    bucket = (offset.astype(np.float64) + 1.0).view(np.int64) >> 48
    bucket -= bucket.min()
    n_buckets = int(bucket.max()) + 1
    if len(starts) * n_buckets > MAX_BUCKET_CELLS_PER_VALUE * len(values):  # too many runs to count apart
        return sorted_within_groups(group, values)[starts + kth]
    counts = np.bincount(run * n_buckets + bucket, minlength=len(starts) * n_buckets).reshape(len(starts), n_buckets)
    up_to = np.cumsum(counts, axis=1)
    target = (up_to <= kth[:, None]).sum(axis=1)  # the first bucket holding more than kth values
    in_target = bucket == target[run]
    del bucket
    picked = sorted_within_groups(run[in_target], offset[in_target])
    runs = np.arange(len(starts))
    in_bucket = counts[runs, target]
    first_picked = np.cumsum(in_bucket) - in_bucket
    return picked[first_picked + kth - (up_to[runs, target] - in_bucket)] + low


def group_indices(keys: np.ndarray) -> Iterator[tuple[object, np.ndarray]]:
    """(key, row indices) for each distinct key, in key order; rows keep their order."""
    order = stable_order(keys)
    distinct, starts = np.unique(keys[order], return_index=True)
    return zip(distinct.tolist(), np.split(order, starts[1:]))


def time_segments(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, gap: int | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split each key's [start, end] intervals into segments of overlapping intervals, bridging
    pauses up to `gap` (one for all, or the pause each interval may follow). Returns the segment
    of every interval, and the key, first start and last end of every segment; segments are
    numbered in (key, first start) order."""
    order = _by_key_then_time(key, start)
    key_sorted, start, end = key[order], start[order], end[order]
    gap = np.broadcast_to(gap, order.shape)[order]
    # Running max of ends within each key: offset every key by more than the widest time span.
    base = start.min()
    width = int(max(end.max(), start.max()) - base) + gap.max().item() + 1
    dense_key = np.r_[0, np.cumsum(key_sorted[1:] != key_sorted[:-1])]
    if (int(dense_key[-1]) + 1) * width >= np.iinfo(np.int64).max:
        raise OverflowError(f"too many keys ({int(dense_key[-1]) + 1}) for intervals this long to segment")
    offset = dense_key.astype(np.int64) * width
    reach = np.maximum.accumulate(offset + (end - base))
    opens = np.r_[True, (dense_key[1:] != dense_key[:-1]) | (offset[1:] + start[1:] - base > reach[:-1] + gap[1:])]
    segment_sorted = np.cumsum(opens) - 1
    segment = np.empty_like(segment_sorted)
    segment[order] = segment_sorted
    first_of_segment = np.flatnonzero(opens)
    last_of_segment = np.r_[first_of_segment[1:] - 1, len(opens) - 1]
    last_end = reach[last_of_segment] - offset[last_of_segment] + base
    return segment, key_sorted[opens], start[first_of_segment], last_end


def _by_key_then_time(key: np.ndarray, times: np.ndarray) -> np.ndarray:
    """`np.lexsort((times, key))`. For integer columns whose (key rank, time offset) pairs fit in
    one int64, one stable sort of that (~2x faster than lexsort's two: recognition segments an
    hour's ~700 k (minute, address) ends so, in the launching process while the workers wait)."""
    if len(key) and np.issubdtype(key.dtype, np.integer) and np.can_cast(times.dtype, np.int64):
        rank = unique_inverse(key)[1]
        base = int(times.min())
        width = int(times.max()) - base + 1
        if (int(rank.max()) + 1) * width <= np.iinfo(np.int64).max:
            return np.argsort(rank * width + (times.astype(np.int64, copy=False) - base), kind="stable")
    return np.lexsort((times, key))


def combined_key(*columns: np.ndarray) -> np.ndarray:
    """One int64 per row identifying the combination of integer columns (each at least -1, the
    code of an unknown), in the lexicographic order of the columns."""
    # built in place: each temporary would be another array the length of a job's flows
    key = None
    for column in columns:
        column = np.asarray(column)
        if not np.can_cast(column.dtype, np.int64):
            column = column.astype(np.int64)
        if key is None:
            key = column.astype(np.int64)
        else:
            key *= int(column.max(initial=0)) + 2
            key += column
        key += 1
    return key


def _group_starts(sorted_key: np.ndarray) -> np.ndarray:
    """Index of the first row of each group of a sorted key array (none when it is empty)."""
    return np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) if len(sorted_key) else np.zeros(0, np.int64)


def group_first_index(sorted_key: np.ndarray) -> np.ndarray:
    """For a sorted key array: the index of each row's group's first row."""
    starts = _group_starts(sorted_key)
    return np.repeat(starts, np.diff(np.r_[starts, len(sorted_key)]))


class KeyGroups:
    """A key column hashed once (`unique_inverse`: its distinct values, sorted, and each row's
    group, their rank) for several group reductions over the same key (`group_reduce`,
    `group_median` take one in place of the key)."""

    def __init__(self, key: np.ndarray):
        self.key = key
        self.distinct, self.group = unique_inverse(key)

    def __len__(self) -> int:
        return len(self.key)

    @cached_property
    def order(self) -> np.ndarray:
        """The rows stably by group (by key): one sort for every reduction that needs it."""
        return stable_order(self.group, scattered=True)

    @cached_property
    def counts(self) -> np.ndarray:
        """The rows of each group, in key order."""
        return np.bincount(self.group, minlength=len(self.distinct))

    def reduce(self, values: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
        """ufunc.reduce of `values` over each group, in key order: in place where the result does
        not depend on the order of reduction, else (a float sum) over each group's rows in order."""
        if not _order_free(ufunc, values):
            return ufunc.reduceat(values[self.order], np.cumsum(self.counts) - self.counts)
        reduced = np.zeros(len(self.distinct), values.dtype)
        if ufunc is not np.add:
            reduced[self.group] = values  # any of the group's values starts its minimum or maximum
        ufunc.at(reduced, self.group, values)
        return reduced

    def first_rows(self) -> np.ndarray:
        """The first row of each group, in key order: `np.unique(key, return_index=True)[1]`. Where
        the rows were put in their stable order by group already, read off it (it leads each group)."""
        if "order" in self.__dict__:  # the cached_property's value
            return self.order[np.cumsum(self.counts) - self.counts]
        first = np.full(len(self.distinct), len(self.key), np.int64)
        np.minimum.at(first, self.group, np.arange(len(self.key)))
        return first


def _key_groups(key: np.ndarray | KeyGroups) -> KeyGroups:
    return key if isinstance(key, KeyGroups) else KeyGroups(key)


def _order_free(ufunc: np.ufunc, values: np.ndarray) -> bool:
    """Whether reducing `values` with `ufunc` gives the same result in any order (a minimum, a
    maximum, an integer sum; not a float sum)."""
    return ufunc in (np.minimum, np.maximum) or (ufunc is np.add and np.issubdtype(values.dtype, np.integer))


def group_reduce(key: np.ndarray | KeyGroups, values: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """ufunc.reduce of `values` over each key group, broadcast back to the rows."""
    if not len(key):
        return np.empty(0, values.dtype)
    if isinstance(key, KeyGroups) or _order_free(ufunc, values):
        # results that do not depend on the order of reduction: groups hashed, reduced in place
        # (~6x faster than sorting the rows by group); a float sum keeps its order (below, or
        # by the groups' ranks, which order the rows as the key does)
        groups = _key_groups(key)
        return groups.reduce(values, ufunc)[groups.group]
    order = stable_order(key)
    starts = _group_starts(key[order])
    reduced = ufunc.reduceat(values[order], starts)
    out = np.empty(len(key), reduced.dtype)
    out[order] = np.repeat(reduced, np.diff(np.r_[starts, len(key)]))
    return out


def group_spans(group: np.ndarray, n_groups: int, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group index 0..n_groups-1: the earliest of `first` and the latest of `last` of its rows
    (int64 max and min for a group without rows)."""
    earliest = np.full(n_groups, np.iinfo(np.int64).max)
    latest = np.full(n_groups, np.iinfo(np.int64).min)
    np.minimum.at(earliest, group, first)
    np.maximum.at(latest, group, last)
    return earliest, latest


def group_mode(key: np.ndarray | KeyGroups, values: np.ndarray) -> np.ndarray:
    """Most frequent value of each key group (the smallest on ties), broadcast back to the rows;
    values are non-negative integers."""
    if not len(key):
        return np.empty(0, values.dtype)
    group = _key_groups(key).group
    radix = int(values.max(initial=0)) + 1
    # the groups' ranks in place of the key: (rank, value) pairs span few codes, counted without a sort
    pairs, counts = unique_counts(group * radix + values)
    pair_group, pair_value = np.divmod(pairs, radix)
    order = np.lexsort((-counts, pair_group))
    first = order[np.r_[True, pair_group[order][1:] != pair_group[order][:-1]]]
    return pair_value[first][group]


def group_median(key: np.ndarray | KeyGroups, values: np.ndarray) -> np.ndarray:
    """Median of `values` over each key group, broadcast back to the rows."""
    if not len(key):
        return np.empty(0)
    groups = _key_groups(key)
    return group_medians(groups, values)[groups.group]


def group_medians(key: np.ndarray | KeyGroups, values: np.ndarray) -> np.ndarray:
    """Median of `values` over each key group, one per group in key order (`group_median` without
    broadcasting it back to the rows)."""
    if not len(key):
        return np.empty(0)
    groups = _key_groups(key)
    group = groups.group
    counts = groups.counts
    n = len(values)
    # Only the values matter, so ties may come in any order.
    if np.issubdtype(values.dtype, np.floating):
        # the rows by group; then the groups of like sizes (within a factor of two) one row each,
        # padded with NaN (which sorts last) to at most twice their values, each row sorted
        # apart: no sort of all the values together
        by_group = values[groups.order]
        first = np.cumsum(counts) - counts
        median = np.empty(len(counts), values.dtype)
        size_class = np.log2(counts).astype(np.int64)
        for width_class in np.unique(size_class).tolist():
            members = np.flatnonzero(size_class == width_class)
            count = counts[members]
            width = int(count.max())
            if count.min() == width and members[-1] - members[0] == len(members) - 1:
                # groups of one size side by side (one large group, a step's flows each step):
                # sorted where they lie, without gathering or padding their rows
                lo = int(first[members[0]])
                rows = by_group[lo:lo + len(members) * width].reshape(len(members), width)
            elif width > MIN_GROUP_SORTED_ALONE:
                # large groups of sizes that differ: each sorted where it lies, one call per
                # group costing less than gathering and padding its rows (~2x faster)
                for group_first, group_count, member in zip(first[members].tolist(), count.tolist(), members.tolist()):
                    rows = by_group[group_first:group_first + group_count]
                    rows.sort()
                    median[member] = (rows[(group_count - 1) // 2] + rows[group_count // 2]) / 2
                continue
            else:
                column = np.arange(width)
                rows = by_group[np.minimum(first[members, None] + column, n - 1)]
                rows[column >= count[:, None]] = np.nan
            median[members] = row_medians(rows, count)
        return median
    # the values sorted once, then stably by group (linear passes over the group codes)
    by_value = np.argsort(values)
    ordered = values[by_value[stable_order(group[by_value], scattered=True)]]
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    return (ordered[starts + (counts - 1) // 2] + ordered[starts + counts // 2]) / 2


def row_medians(rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per row of `rows` (2-d; its first `counts` values once sorted, then padding that sorts after
    them: NaN or inf), sorted in place: the median of its values (the padding for a row of none)."""
    rows.sort(axis=1)
    at = np.arange(len(counts))
    return (rows[at, np.maximum(counts - 1, 0) // 2] + rows[at, counts // 2]) / 2


def rolling_median(values: np.ndarray, valid: np.ndarray, segment: np.ndarray, half: int) -> np.ndarray:
    """Median of the valid values within `half` positions and the same segment; positions with no
    such neighbour take the median of their segment's valid values (or of all valid values)."""
    n = len(values)
    index = np.arange(n)[:, None] + np.arange(-half, half + 1)[None, :]
    inside = (index >= 0) & (index < n)
    index = np.clip(index, 0, n - 1)
    usable = inside & valid[index] & (segment[index] == segment[:, None])
    count = usable.sum(axis=1)
    median = row_medians(np.where(usable, values[index], np.inf), count)
    return np.where(count > 0, median, segment_median(values, valid, segment))


def segment_median(values: np.ndarray, valid: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Median of the valid values of each position's segment (of all valid values when its
    segment has none; of all values when none is valid)."""
    if not len(values):
        return np.zeros(0)
    medians = np.full(len(values), np.median(values[valid]) if valid.any() else np.median(values))
    for s in np.unique(segment):
        mine = valid & (segment == s)
        if mine.any():
            medians[segment == s] = np.median(values[mine])
    return medians
