"""Per-minute aggregates of the flows on each directed NIC pair (the `flow_minutes` table).

A pair's minute is one row, except where the pair falls silent for over PAIR_PAUSE_NS and the
flow sizes it carries after the silence are not those it carried before: then each side is a row
of its own. That is one job handing its hosts to the next within a minute (a job's own pauses,
such as a checkpoint save, resume with the sizes it used before), and one row spanning both jobs
would hide when each of them talked there."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import stable_order, time_segments, value_codes
from prism_core.schema import FLOW_MINUTES, FLOWS, conform

MINUTE_NS = 60_000_000_000
HOUR_NS = 60 * MINUTE_NS
PAIR_PAUSE_NS = 2_000_000_000


def minute_of(start_ns: pa.Array) -> pa.Array:
    """Event-time minute of each flow, as timestamp[ns, UTC]."""
    floored = pc.multiply(pc.divide(start_ns, MINUTE_NS), MINUTE_NS)
    return floored.cast(FLOWS.field("minute").type)


PAIR = ("minute", "src", "dst")  # a NIC pair's minute as `minute_aggregates` groups it: its addresses `_ranked`


def minute_aggregates(flows: pa.Table, counted: np.ndarray | None = None) -> pa.Table:
    """Group flows by (minute, src_addr, dst_addr), split where the pair's flow sizes change
    across a silence (see above). Flow sizes that repeat on a pair (one activation size per
    micro-batch, one bucket size per all-reduce) keep `distinct_sizes` small, which is what tells
    pipeline-parallel pairs from the rest later on.

    `counted` (a mask) leaves out the other rows, which must be exact copies of counted ones
    (duplicates): a copy can only change the flow counts of its (pair, size), so a minute's rows
    are aggregated as read, not copied without their duplicates first."""
    if flows.num_rows == 0:
        return FLOW_MINUTES.empty_table()
    weight = np.ones(flows.num_rows, np.int64) if counted is None else counted.astype(np.int64)
    src, src_names = _ranked(flows, "src_addr")
    dst, dst_names = _ranked(flows, "dst_addr")
    rows = pa.table({
        "minute": flows["minute"], "src": src, "dst": dst, "bytes": flows["bytes"],
        "time_flow_start_ns": flows["time_flow_start_ns"], "time_flow_end_ns": flows["time_flow_end_ns"],
        "sampling_rate": pc.fill_null(flows["sampling_rate"], 1), "flows": weight,
    })
    # One grouping by (pair, size), each pair's most frequent size first (the smallest on ties):
    # every column of a row follows from its sizes here.
    per_size = rows.group_by([*PAIR, "bytes"], use_threads=False).aggregate(
        [("flows", "sum"), ("time_flow_start_ns", "min"), ("time_flow_end_ns", "max"), ("sampling_rate", "max")]
    )
    per_size = per_size.sort_by(
        [*((key, "ascending") for key in PAIR), ("flows_sum", "descending"), ("bytes", "ascending")]
    )
    per_size, first = _split_at_size_changes(per_size, _pair_starts(per_size))
    size, count = per_size["bytes"].to_numpy(), per_size["flows_sum"].to_numpy()
    grouped = pa.table(
        {
            "minute": per_size["minute"].take(first),
            "src_addr": src_names.take(per_size["src"].take(first)),
            "dst_addr": dst_names.take(per_size["dst"].take(first)),
            "flows": np.add.reduceat(count, first),
            "bytes": np.add.reduceat(size * count, first),
            "distinct_sizes": np.diff(first, append=len(size)),
            "top_size": size[first],
            "top_size_flows": count[first],
            "first_start_ns": np.minimum.reduceat(per_size["time_flow_start_ns_min"].to_numpy(), first),
            "last_end_ns": np.maximum.reduceat(per_size["time_flow_end_ns_max"].to_numpy(), first),
            "sampling_rate": np.maximum.reduceat(per_size["sampling_rate_max"].to_numpy(), first),
        }
    )
    return conform(grouped, FLOW_MINUTES)


def _split_at_size_changes(per_size: pa.Table, pair_starts: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """`per_size` (sorted by pair) regrouped into each pair's stretches: its repeated flow sizes
    (job traffic) in runs separated by a silence, every other size with the stretch it falls in
    (or the first). Returns the rows in (pair, stretch) order, each stretch's rows in the order
    they had, and the first row of every stretch."""
    pair = np.repeat(np.arange(len(pair_starts)), np.diff(pair_starts, append=per_size.num_rows))
    start, end = per_size["time_flow_start_ns_min"].to_numpy(), per_size["time_flow_end_ns_max"].to_numpy()
    repeated = np.flatnonzero(per_size["flows_sum"].to_numpy() >= 2)
    if len(repeated) == 0:
        return per_size, pair_starts
    _, run_pair, run_start, _ = time_segments(pair[repeated], start[repeated], end[repeated], PAIR_PAUSE_NS)
    if len(run_pair) == len(np.unique(run_pair)):
        return per_size, pair_starts  # no pair changed its sizes across a silence
    # the latest run of the row's pair that starts by the row's start (runs are in (pair, start) order)
    base, width = int(start.min()), int(start.max() - start.min()) + 1
    run = np.searchsorted(run_pair * width + (run_start - base), pair * width + (start - base), side="right") - 1
    first_run = np.searchsorted(run_pair, pair)
    stretch = np.where((run >= 0) & (run_pair[np.maximum(run, 0)] == pair), run - first_run, 0)
    key = pair * (int(stretch.max()) + 1) + stretch
    order = stable_order(key)
    return per_size.take(order), np.flatnonzero(np.r_[True, np.diff(key[order]) != 0])


def _pair_starts(rows: pa.Table) -> np.ndarray:
    """Index of the first row of each (minute, src, dst) in rows sorted by it (keys never null)."""
    changed = np.zeros(rows.num_rows - 1, bool)
    for key in PAIR:
        column = rows[key].to_numpy()
        changed |= column[1:] != column[:-1]
    return np.flatnonzero(np.concatenate(([True], changed)))


def _ranked(flows: pa.Table, name: str) -> tuple[np.ndarray, pa.Array]:
    """Text column `name` as integers that order as its text sorts (equal for equal text; null
    last, as Arrow sorts it), and the distinct text (then null) in that order: grouping and
    sorting on these costs a fraction of hashing and comparing the text. Through the codes the
    table carries (`with_codes`) where it has them."""
    codes, names = value_codes(flows, name)
    by_text = pc.sort_indices(names).to_numpy()
    rank = np.empty(len(names) + 1, np.int64)  # code -1 (null): the last entry
    rank[by_text] = np.arange(len(names))
    rank[-1] = len(names)
    return rank[codes], pa.concat_arrays([names.take(pa.array(by_text)), pa.nulls(1, names.type)])
