"""Small vectorized helpers shared by the stages."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RADIX_SPAN = 1 << 16  # numpy sorts 16-bit integers stably with a radix sort, in linear time


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


def stable_order(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` for integer keys; in linear time when they span fewer
    than RADIX_SPAN values (host pairs, job codes), which is most calls."""
    if len(keys) and np.issubdtype(keys.dtype, np.integer):
        low = keys.min()
        if int(keys.max()) - int(low) < RADIX_SPAN:
            # offsets from the minimum, taken modulo 2^16: exact whatever the integer type
            return np.argsort(keys.astype(np.uint16) - np.uint16(low.astype(np.uint16)), kind="stable")
    return np.argsort(keys, kind="stable")


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` for a 1-d numeric array, by hashing instead of
    sorting every value: only the distinct values are sorted (flow sizes and groups repeat)."""
    encoded = pc.dictionary_encode(pa.array(values))
    distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
    order = np.argsort(distinct)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[encoded.indices.to_numpy(zero_copy_only=False)]


def combination_ids(*columns: np.ndarray) -> np.ndarray:
    """An id per row, the same for rows equal in every column; ids count up in the order of
    `np.lexsort(columns)` (last column first)."""
    order = np.lexsort(columns)
    changes = np.zeros(len(order), bool)
    for column in columns:
        ordered = column[order]
        changes[1:] |= ordered[1:] != ordered[:-1]
    ids = np.empty(len(order), np.int64)
    ids[order] = np.cumsum(changes)
    return ids


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
    order = np.lexsort((start, key))
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
