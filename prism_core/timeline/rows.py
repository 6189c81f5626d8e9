"""The job's flows of one kind in start order, indexed so that timing rules run over many ranges at once.

A rule such as "where are a step's first pipeline sends" reads, per pair, the first flow at or
after the start of a range. Looking those up in a per-pair ordering costs O(K log n) per range (K
pairs) instead of a pass over the range's flows, so a rule can ask about every quiet gap of an
hour without rescanning the flows after each. "When did the collective that opens these flows
start" reads only the flows of a short window after each range's start: those are read directly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prism_core.arrays import stable_order
from prism_core.timeline.params import TimelineParams

MAX_GRID_CELLS = 1 << 22  # ranges x pairs looked up (or window rows read) at once: bounds the memory of a batch


class RowIndex:
    """Rows of the job's traffic (one kind, or all) in start order; positions index into `rows`."""

    def __init__(self, rows: np.ndarray, start: np.ndarray, pair: np.ndarray, exporter: np.ndarray,
                 params: TimelineParams):
        self.rows = rows
        # every row (the index of all kinds, or of a job's one kind): the columns themselves, not copies
        whole = len(rows) == len(start)
        self.start = start if whole else start[rows]
        self.pair = pair if whole else pair[rows]
        self.exporter = exporter if whole else exporter[rows]
        self.params = params
        self._by_pair: _FirstOfEach | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def positions(self, times: np.ndarray | int, side: str = "left") -> np.ndarray:
        """Position of the first row starting at or after each of `times` (`side` as in searchsorted)."""
        return np.searchsorted(self.start, times, side=side)

    def at_or_after_rows(self, rows: np.ndarray | int) -> np.ndarray:
        """Position of the first of these rows at or after each traffic row number of `rows`."""
        return np.searchsorted(self.rows, rows)

    def cluster_starts(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """When the collective opening each range of rows [lo, hi) (non-empty) started: per exporter
        the first start within `cluster_ns` of the range's first, the median over exporters (clock
        skew cancels). The windows hold a few % of the rows: read directly, not through an ordering
        of every row by exporter."""
        if not len(lo):
            return np.empty(0, np.int64)
        window_end = np.minimum(hi, self.positions(self.start[lo] + self.params.cluster_ns, side="right"))
        starts = np.empty(len(lo), np.int64)
        for batch in _row_batches(window_end - lo):
            length = window_end[batch] - lo[batch]
            window = np.repeat(np.arange(len(length)), length)
            position = np.arange(len(window)) + np.repeat(lo[batch] - (np.cumsum(length) - length), length)
            exporter = self.exporter[position].astype(np.int64)
            # the first row of each exporter in each window (in position order within a window)
            first = np.unique(window * (int(exporter.max()) + 1) + exporter, return_index=True)[1]
            window, first_ns = window[first], self.start[position[first]]
            # the median over each window's exporters, as _masked_medians takes it (float64 keeps int order)
            ordered = first_ns[np.lexsort((first_ns, window))].astype(np.float64)
            count = np.bincount(window, minlength=len(length))
            offset = np.cumsum(count) - count
            starts[batch] = ((ordered[offset + (count - 1) // 2] + ordered[offset + count // 2]) / 2).astype(np.int64)
        return starts

    def first_sends(self, lo: np.ndarray, hi: np.ndarray,
                    link_of_pair: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t1, f, found) of steps whose pipeline traffic (rows of kind PP) starts with each range
        [lo, hi): the pairs that send first send their first two micro-batches one forward pass f
        apart, the first at t1; medians over those pairs (clock skew cancels in f). A pair counts if
        it sends again in the range after its first transfer (`transfer_ns`: its channels); found is
        False for a range where none does. The pairs that send first are those within reach of the
        lower median first send of the earliest pair's link (`link_of_pair`, per pair code): a
        stage's tensor-parallel ranks send each micro-batch together, each on its own rail, so a
        rail's leaf whose clock runs tens of ms ahead does not open every step alone, nor does a
        pair whose first record was lost (its next send a forward pass later) delay it."""
        t1 = np.zeros(len(lo), np.int64)
        forward = np.zeros(len(lo), np.int64)
        found = np.zeros(len(lo), bool)
        if not len(self):
            return t1, forward, found
        by_pair = self._pair_index()
        for batch in _batches(len(lo), len(by_pair.codes)):
            # searched pair by pair (a row of ranges per pair: each search lands near the last),
            # read range by range
            first = by_pair.first_at_or_after(lo[batch]).T
            again = self._next_sends(np.minimum(first, len(self) - 1))
            sends = (first < hi[batch, None]) & (again < hi[batch, None])
            first_ns = np.where(sends, self.start[np.where(sends, first, 0)], np.iinfo(np.int64).max)
            again_ns = np.where(sends, self.start[np.where(sends, again, 0)], 0)
            found[batch] = sends.any(axis=1)
            earliest = np.where(found[batch], first_ns.min(axis=1), 0)
            # the forward pass of the earliest pair (the lowest pair index of those tied) bounds
            # which other pairs lead with it
            leader = np.argmin(first_ns, axis=1)
            leader_forward = again_ns[np.arange(len(leader)), leader] - earliest
            reach = np.minimum(self.params.cluster_ns, leader_forward // 2)
            link = link_of_pair[by_pair.codes]
            anchor = _masked_medians(first_ns, sends & (link[None, :] == link[leader][:, None]), lower=True)
            leading = sends & (np.abs(np.where(sends, first_ns, 0) - anchor[:, None]) <= reach[:, None])
            t1[batch] = _masked_medians(first_ns, leading)
            # a lost record only lengthens the gap its pair shows: of two middle pairs, the shorter
            forward[batch] = _masked_medians(again_ns - first_ns, leading, lower=True)
        return t1, forward, found

    def last_before_reply(self, lo: np.ndarray, hi: np.ndarray, link_of_pair: np.ndarray,
                          reverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position in `lo`: the position of the last row on its row's link (`link_of_pair`)
        before the first row at or after it on the reverse link (`reverse`, per link), -1 where no
        row comes back; and whether the link sends again after that reply, before the matching
        position of `hi`. O(log n) per position."""
        if not len(self):
            return np.full(len(lo), -1, np.int64), np.zeros(len(lo), bool)
        link = link_of_pair[self.pair]
        by_link = _FirstOfEach(link)
        lo = np.minimum(lo, len(self) - 1)
        back = reverse[link[lo]]
        reply = by_link.first_at_or_after(lo, back)
        last = by_link.last_before(reply, link[lo])
        resumed = by_link.first_at_or_after(np.minimum(reply, len(self)), link[lo]) < hi
        return np.where((reply < len(self)) & (last >= lo), last, -1), resumed

    def first_of_pair(self, lo: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Per position in `lo`: the first position at or after it holding the pair of the row at
        the matching position of `positions` (len(self) where none)."""
        return self._pair_index().first_at_or_after(lo, self.pair[positions])

    def last_sending_before(self, position: int, until: int) -> int:
        """The last position before `position` whose pair sends again before position `until`
        (-1 where none)."""
        return last_where(lambda rows: self._next_sends(rows) < until, position)

    def _pair_index(self) -> _FirstOfEach:
        if self._by_pair is None:
            self._by_pair = _FirstOfEach(self.pair)
        return self._by_pair

    def _next_sends(self, positions: np.ndarray | slice) -> np.ndarray:
        """Per position, that of its pair's next send: the pair's first row starting more than
        `transfer_ns` after it (len(self) where none). Two searches per position asked, not one
        per row of the job: the rules ask about a few rows per quiet gap. Positions of ranges x
        pairs (each range's rows near each other) are searched in times range by range, in the
        pairs' rows pair by pair: each search near the last (~3x faster than both range by range)."""
        beyond = self.positions(self.start[positions] + self.params.transfer_ns, side="right")
        return self._pair_index().first_at_or_after(beyond.T, self.pair[positions].T).T


class _FirstOfEach:
    """For small-integer codes over positions 0..n-1: the first position at or after a given one
    holding a code (n where none), by binary search over (code, position) keys."""

    def __init__(self, codes: np.ndarray):
        self.n = len(codes)
        self.order = stable_order(codes)  # linear time for the few pairs or exporters of a job
        ordered = codes[self.order]
        self.codes = ordered[np.r_[True, ordered[1:] != ordered[:-1]][: self.n]]
        self.keys = ordered.astype(np.int64) * (self.n + 1) + self.order

    def first_at_or_after(self, positions: np.ndarray, codes: np.ndarray | None = None) -> np.ndarray:
        """Per position, the first at or after it holding `codes` (elementwise, broadcast); by
        default every code present, along a new first axis. The positions are searched in the
        order they come (numpy's searches are ~5x faster where each lands near the last)."""
        # codes x n overflow int32
        codes = np.asarray(self.codes[:, None] if codes is None else codes, np.int64)
        wanted = codes * (self.n + 1) + positions
        if not len(self.keys):
            return np.full(wanted.shape, self.n)
        # in place where it can be: positions for a job's every flow are ~80 MB an array
        at = np.searchsorted(self.keys, wanted)
        del wanted
        hit = at < len(self.keys)
        np.minimum(at, len(self.keys) - 1, out=at)
        key = self.keys[at]
        del at
        hit &= key // (self.n + 1) == codes
        key %= self.n + 1
        key[~hit] = self.n
        return key

    def last_before(self, positions: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Per position, the last before it holding `codes` (elementwise), -1 where none."""
        codes = np.asarray(codes, np.int64)
        at = np.searchsorted(self.keys, codes * (self.n + 1) + positions) - 1
        key = self.keys[np.maximum(at, 0)] if len(self.keys) else np.zeros_like(at)
        hit = (at >= 0) & (key // (self.n + 1) == codes)
        return np.where(hit, key % (self.n + 1), -1)


def last_where(test: Callable[[slice], np.ndarray], end: int) -> int:
    """The last index before `end` where `test` (a vectorized predicate over a slice of indexes)
    holds, -1 where none; looked for in blocks doubling backwards, so the cost is the distance."""
    size = 64
    while end > 0:
        lo = max(0, end - size)
        hits = np.flatnonzero(test(slice(lo, end)))
        if len(hits):
            return lo + int(hits[-1])
        end, size = lo, 2 * size
    return -1


def first_where(test: Callable[[slice], np.ndarray], begin: int, end: int) -> int:
    """The first index in [begin, end) where `test` holds, `end` where none; looked for in blocks
    doubling forwards, so the cost is the distance."""
    size = 64
    while begin < end:
        hi = min(end, begin + size)
        hits = np.flatnonzero(test(slice(begin, hi)))
        if len(hits):
            return begin + int(hits[0])
        begin, size = hi, 2 * size
    return end


def _batches(n_ranges: int, n_codes: int) -> list[slice]:
    """Slices of the ranges small enough that ranges x codes stays within MAX_GRID_CELLS."""
    size = max(1, MAX_GRID_CELLS // max(n_codes, 1))
    return [slice(lo, min(lo + size, n_ranges)) for lo in range(0, n_ranges, size)]


def _row_batches(lengths: np.ndarray) -> list[slice]:
    """Slices of the ranges (of `lengths` rows each) holding about MAX_GRID_CELLS rows each (one
    longer range alone)."""
    ends = np.cumsum(lengths)
    cut = np.flatnonzero(np.diff(ends // MAX_GRID_CELLS)) + 1
    bounds = np.r_[0, cut, len(lengths)]
    return [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _masked_medians(values: np.ndarray, mask: np.ndarray, lower: bool = False) -> np.ndarray:
    """Per row, int(np.median(values[row][mask[row]])) (0 for an empty row), computed the same way:
    the mean, in float64, of the middle one or two values (`lower`: the lower of the two)."""
    ordered = np.sort(np.where(mask, values.astype(np.float64), np.nan), axis=1)  # NaN sort last
    count = mask.sum(axis=1)
    row = np.arange(len(values))
    low, high = ordered[row, np.maximum(count - 1, 0) // 2], ordered[row, count // 2 - (count == 0)]
    return np.where(count > 0, low if lower else (low + high) / 2, 0.0).astype(np.int64)
