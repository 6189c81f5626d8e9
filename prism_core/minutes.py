"""Per-minute aggregates of the flows on each directed NIC pair (the `flow_minutes` table)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.schema import FLOW_MINUTES, FLOWS, conform

MINUTE_NS = 60_000_000_000
HOUR_NS = 60 * MINUTE_NS


def minute_of(start_ns: pa.Array) -> pa.Array:
    """Event-time minute of each flow, as timestamp[ns, UTC]."""
    floored = pc.multiply(pc.divide(start_ns, MINUTE_NS), MINUTE_NS)
    return floored.cast(FLOWS.field("minute").type)


def minute_aggregates(flows: pa.Table) -> pa.Table:
    """Group flows by (minute, src_addr, dst_addr). Flow sizes that repeat on a pair (one
    activation size per micro-batch, one bucket size per all-reduce) keep `distinct_sizes` small,
    which is what tells pipeline-parallel pairs from the rest later on."""
    if flows.num_rows == 0:
        return FLOW_MINUTES.empty_table()
    grouped = flows.group_by(["minute", "src_addr", "dst_addr"], use_threads=False).aggregate(
        [
            ("bytes", "count"),
            ("bytes", "sum"),
            ("bytes", "count_distinct"),
            ("time_flow_start_ns", "min"),
            ("time_flow_end_ns", "max"),
        ]
    )
    grouped = grouped.rename_columns(
        {
            "bytes_count": "flows",
            "bytes_sum": "bytes",
            "bytes_count_distinct": "distinct_sizes",
            "time_flow_start_ns_min": "first_start_ns",
            "time_flow_end_ns_max": "last_end_ns",
        }
    )
    keys = [("minute", "ascending"), ("src_addr", "ascending"), ("dst_addr", "ascending")]
    grouped = grouped.sort_by(keys)
    top = _top_sizes(flows)
    grouped = grouped.append_column("top_size", top["top_size"]).append_column(
        "top_size_flows", top["top_size_flows"]
    )
    return conform(grouped, FLOW_MINUTES)


def _top_sizes(flows: pa.Table) -> pa.Table:
    """Per (minute, src, dst), sorted like minute_aggregates: the most frequent flow size."""
    per_size = flows.group_by(["minute", "src_addr", "dst_addr", "bytes"], use_threads=False).aggregate(
        [("bytes", "count")]
    )
    # Sort so the first row of each pair is its most frequent size, the smallest on ties.
    per_size = per_size.sort_by(
        [("minute", "ascending"), ("src_addr", "ascending"), ("dst_addr", "ascending"),
         ("bytes_count", "descending"), ("bytes", "ascending")]
    )
    pair = pc.binary_join_element_wise(
        per_size["minute"].cast(pa.int64()).cast(pa.string()), per_size["src_addr"], per_size["dst_addr"], "|"
    ).to_numpy(zero_copy_only=False)
    first = np.ones(len(pair), bool)
    first[1:] = pair[1:] != pair[:-1]
    rows = np.flatnonzero(first)
    return pa.table({"top_size": per_size["bytes"].take(rows), "top_size_flows": per_size["bytes_count"].take(rows)})
