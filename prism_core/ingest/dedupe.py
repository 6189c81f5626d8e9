"""Deduplication: exact copies of a flow, and one flow reported by two exporters on its path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import combination_ids
from prism_core.ingest.columns import _mask
from prism_core.schema import FLOWS

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
