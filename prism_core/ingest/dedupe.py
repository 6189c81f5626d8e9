"""Deduplication: exact copies of a flow record, and one flow reported by two exporters on its path.

A duplicate needs a second report of the same observation: the collector delivering one record
twice (equal on every column, its receive time included), or another exporter (`sampler_address`)
reporting the same flow. Two records of one exporter that differ only in when they were received
are two transfers, however alike: at a millisecond clock, transfers on one queue pair within the
same millisecond with the same size give identical records, and both are kept."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import CODES_SUFFIX, column_hash, combination_ids, unique_inverse, value_codes
from prism_core.ingest.columns import _mask
from prism_core.schema import FIVE_TUPLE, FLOWS

SORT_KEYS = ("time_flow_start_ns", "src_addr", "dst_addr", "src_port", "dst_port", "bytes")
# A collector's re-delivery of one record repeats every column; exporter and receive time sort last.
REPORTER = ("time_received_ns", "sampler_address")
EXACT_COPY = FLOWS.names
FULL_SORT_ORDER = (*SORT_KEYS, *(name for name in FLOWS.names if name not in (*SORT_KEYS, *REPORTER)), *REPORTER)
# One flow from two switches on its path differs in the reporter, and in their clocks and header
# accounting: times within COPY_TIME_NS once the exporters' offset is taken out, bytes within
# COPY_BYTES_SHARE.
COPY_TIME_NS = 3_000_000
COPY_BYTES_SHARE = 0.02
MAX_CLOCK_OFFSET_NS = 1_000_000_000
# Rounds of pairing, each over the rows the rounds before left unpaired: the rows sorted within
# windows of COPY_TIME_NS by size (transfers of several sizes started within a tick, an
# all-to-all's), the windows shifted by half in the second round; then in time order (a row
# between a copy and its original in a window).
PAIRING_WINDOW_SHIFTS_NS = (0, COPY_TIME_NS // 2, None)


def dedupe(flows: pa.Table) -> tuple[pa.Table, int]:
    """Drop duplicate flows: exact copies (equal on every column, the receive time included), and
    one flow's records from two exporters (`copies_from_other_exporters`). The table is sorted by
    SORT_KEYS, then by every other column, so the copy kept (of two exporters, the first address)
    and the output bytes do not depend on the input order. Returns (table, number of rows dropped)."""
    if flows.num_rows < 2:
        return flows, 0
    kept = deduplicated_order(flows)
    return flows.take(kept), flows.num_rows - len(kept)


def deduplicated_order(flows: pa.Table, five_tuples: np.ndarray | None = None) -> np.ndarray:
    """The rows `dedupe` keeps, as indices into `flows` in its output order. `five_tuples`: the
    rows' `column_hash` of FIVE_TUPLE, where the caller has it (the exporters' tally of a
    minute's merge reads it too).

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
        tied_rows = _taken(flows, EXACT_COPY, order[positions])
        within = pc.sort_indices(
            tied_rows, sort_keys=[(name, "ascending", "at_end") for name in FULL_SORT_ORDER]
        ).to_numpy()
        order[positions] = order[positions][within]  # a run stays in place: start is the first key
        tied_rows = tied_rows.take(within)
        # neighbours within one run of equal start, then equal on every column
        repeat = same_start_as_next[positions[:-1]] & (np.diff(positions) == 1)
        for name in EXACT_COPY:
            column = tied_rows[name].combine_chunks()
            current, previous = column.slice(1), column.slice(0, len(column) - 1)
            both_null = _mask(pc.and_(current.is_null(), previous.is_null()))
            repeat &= _mask(pc.equal(current, previous)) | both_null
        duplicates = positions[1:][repeat]
    order = np.delete(order, duplicates)
    # exact copies repeat the 5-tuple and the exporter: whether any 5-tuple has two exporters
    # is the same question asked of every row, without taking the kept ones first
    if not _several_exporters(flows, column_hash(flows, FIVE_TUPLE) if five_tuples is None else five_tuples):
        return order
    compared = flows.select([*FIVE_TUPLE, "sampler_address", "time_flow_start_ns", "time_flow_end_ns", "bytes"])
    return np.delete(order, copies_from_other_exporters(compared.take(order)))


def _taken(flows: pa.Table, names: tuple[str, ...], rows: np.ndarray) -> pa.Table:
    """Columns `names` of `flows` at `rows`, text through its codes where the table carries them
    (`with_codes`: one chunk): a take of a minute's text, a chunk per file, copies every chunk into
    one first, and the tied rows are ~1% of a minute."""
    return pa.table({name: pc.cast(flows[name + CODES_SUFFIX].take(rows), flows.schema.field(name).type)
                     if name + CODES_SUFFIX in flows.column_names else flows[name].take(rows) for name in names})


def _several_exporters(flows: pa.Table, five_tuples: np.ndarray) -> bool:
    """Whether some 5-tuple of `flows` (`five_tuples`: their hashes) was reported by two exporters
    (most minutes: none), in one pass over integers (the addresses' codes carried by the table,
    `with_codes`, where it has them): each row's exporter against the first exporter of its
    5-tuple's hash. A collision of two 5-tuples' hashes can only answer yes where the answer is
    no, and `copies_from_other_exporters` then finds no copy: the rows kept are the same."""
    exporter = value_codes(flows, "sampler_address")[0]
    reported = np.flatnonzero(exporter >= 0)  # records without an exporter count for none
    if not len(reported):
        return False
    five_tuple = unique_inverse(five_tuples[reported])[1]
    exporter = exporter[reported]
    first_exporter = np.empty(five_tuple.max() + 1, np.int64)
    first_exporter[five_tuple[::-1]] = exporter[::-1]  # the last assignment of an index holds
    return bool(np.any(exporter != first_exporter[five_tuple]))


def copies_from_other_exporters(flows: pa.Table) -> np.ndarray:
    """Rows that repeat a flow another exporter reported (a second switch on its path): same
    5-tuple, another `sampler_address`, times within COPY_TIME_NS once the two exporters' clock
    offset is taken out, bytes within COPY_BYTES_SHARE. Of such a pair the row of the exporter
    with the first address is kept.

    The offset of each pair of exporters is the median, over the 5-tuples both report, of the
    difference of their first starts (pairs more than MAX_CLOCK_OFFSET_NS apart are not
    corrected). Rows are then sorted by 5-tuple and corrected time and neighbours compared
    (`_nearest_pairs`, in rounds over the rows still unpaired: PAIRING_WINDOW_SHIFTS_NS); a row
    pairs once. A record whose copy was lost can still pair with a neighbouring transfer's copy
    when transfers on one 5-tuple are closer than COPY_TIME_NS. Rows without an exporter are
    never copies. Asked only where some 5-tuple has two exporters (`deduplicated_order` checks
    first: most minutes have none)."""
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

    corrected_start, corrected_end = start - shift, end - shift
    # alike records (millisecond clocks) interleave across exporters: the k-th of one exporter's
    # identical records sorts beside the k-th of the other's
    alike = np.lexsort((size, corrected_start, exporter, five_tuple))
    keys = np.stack([five_tuple, exporter, corrected_start, size])[:, alike]
    opens = np.r_[True, np.any(keys[:, 1:] != keys[:, :-1], axis=0)]
    first = np.flatnonzero(opens)
    occurrence = np.empty(len(rows), np.int64)
    occurrence[alike] = np.arange(len(rows)) - first[np.cumsum(opens) - 1]
    paired = np.zeros(len(rows), bool)
    copies = []
    for shift in PAIRING_WINDOW_SHIFTS_NS:
        candidates = np.flatnonzero(~paired)
        keys = (exporter, occurrence, size, corrected_start, five_tuple) if shift is None else (
            exporter, occurrence, corrected_start, size, (corrected_start + shift) // COPY_TIME_NS, five_tuple)
        order = candidates[np.lexsort(tuple(key[candidates] for key in keys))]
        a, b = _nearest_pairs(order, five_tuple, exporter, corrected_start, corrected_end, size)
        if not len(a):
            break
        paired[a] = paired[b] = True
        copies.append(np.where(exporter[a] > exporter[b], a, b))
    return np.sort(rows[np.concatenate(copies)]) if copies else np.zeros(0, np.int64)


def _nearest_pairs(order: np.ndarray, five_tuple: np.ndarray, exporter: np.ndarray, start: np.ndarray,
                   end: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Copies among neighbours of `order` (rows sorted by 5-tuple and corrected time): same
    5-tuple, other exporter, times within COPY_TIME_NS, bytes within COPY_BYTES_SHARE. A row pairs
    with the nearer of its matching neighbours; a run of equally near matches (two exporters'
    millisecond records of transfers alike) pairs its first, third, ... edges, so no row pairs
    twice. Rows left unpaired (a row sorted between a copy and its original) pair in the next
    round."""
    a, b = order[:-1], order[1:]
    if not len(a):
        return a, b
    start_gap = np.abs(start[b] - start[a])
    end_gap = np.abs(end[b] - end[a])
    match = (
        (five_tuple[a] == five_tuple[b])
        & (exporter[a] != exporter[b])
        & (start_gap <= COPY_TIME_NS)
        & (end_gap <= COPY_TIME_NS)
        & (np.abs(size[b] - size[a]) <= COPY_BYTES_SHARE * np.maximum(size[a], size[b]))
    )
    far = np.iinfo(np.int64).max
    distance = np.where(match, start_gap + end_gap, far)
    # runs of consecutive edges equally near; a run is taken when nearer than the edges around it
    opens = np.r_[True, distance[1:] != distance[:-1]]
    run = np.cumsum(opens) - 1
    run_first = np.flatnonzero(opens)
    run_last = np.r_[run_first[1:], len(distance)] - 1
    before = np.r_[far, distance[:-1]][run_first]
    after = np.r_[distance[1:], far][run_last]
    taken_run = (distance[run_first] < far) & (distance[run_first] < before) & (distance[run_first] < after)
    taken = taken_run[run] & ((np.arange(len(distance)) - run_first[run]) % 2 == 0)
    return a[taken], b[taken]


def _ids(column: pa.ChunkedArray) -> np.ndarray:
    """Integer codes of a column's values (nulls are one more value), for grouping."""
    encoded = column.combine_chunks().dictionary_encode()
    return pc.fill_null(encoded.indices, -1).to_numpy().astype(np.int64)
