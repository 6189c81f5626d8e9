"""Arrow schemas of every table Prism reads or writes (see ../shared/CONTRACT.md).

One place defines the columns so that the simulator, the pipelines, the warehouse views and the
scorer cannot drift apart. Partition columns (`date`, `hour`) live in the directory names of the
warehouse, never inside the Parquet files.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("ns", tz="UTC")

# Required and optional input columns, with the type each is cast to after validation.
FLOW_REQUIRED = ("time_flow_start_ns", "time_flow_end_ns", "src_addr", "dst_addr", "bytes")
FLOW_OPTIONAL = (
    "packets",
    "src_port",
    "dst_port",
    "proto",
    "sampler_address",
    "time_received_ns",
    "sampling_rate",
)

FIVE_TUPLE = ("src_addr", "dst_addr", "src_port", "dst_port", "proto")  # the records of one flow share these

FLOWS = pa.schema(
    [
        ("time_flow_start_ns", pa.int64()),
        ("time_flow_end_ns", pa.int64()),
        ("src_addr", pa.string()),
        ("dst_addr", pa.string()),
        ("bytes", pa.int64()),  # scaled by sampling_rate
        ("packets", pa.int64()),  # scaled by sampling_rate; null when not exported
        ("src_port", pa.int32()),
        ("dst_port", pa.int32()),
        ("proto", pa.int16()),  # IP protocol number
        ("sampler_address", pa.string()),
        ("time_received_ns", pa.int64()),
        ("sampling_rate", pa.int64()),  # 1 when not sampled
        ("minute", TS),  # minute of time_flow_start_ns
    ]
)

QUARANTINE = pa.schema(
    [
        ("source", pa.string()),  # file the row came from
        ("row", pa.int64()),  # 0-based position in the file; -1 when the whole file is rejected
        ("reason", pa.string()),  # machine-readable code, e.g. "bad_addr:src_addr"
        ("raw", pa.string()),  # the rejected record as text (truncated for huge records)
    ]
)

FLOW_MINUTES = pa.schema(
    [
        ("minute", TS),
        ("src_addr", pa.string()),
        ("dst_addr", pa.string()),
        ("flows", pa.int64()),
        ("bytes", pa.int64()),
        ("distinct_sizes", pa.int64()),  # distinct flow byte counts seen on the pair this minute
        ("top_size", pa.int64()),  # the most frequent flow byte count (smallest on ties)
        ("top_size_flows", pa.int64()),  # how many flows had it
        ("first_start_ns", pa.int64()),
        ("last_end_ns", pa.int64()),
        # the highest sampling rate of its records (1: unsampled): a sampler's byte counts are
        # estimates (sampled packets x rate), so its sizes recur without being a transfer's
        ("sampling_rate", pa.int64()),
    ]
)

TOPOLOGY = pa.schema(
    [
        ("addr", pa.string()),
        ("host", pa.string()),
        ("gpu", pa.int32()),
        ("leaf", pa.string()),
        ("pod", pa.string()),
    ]
)

JOBS = pa.schema(
    [
        ("job_id", pa.string()),
        ("first_seen", TS),
        ("last_seen", TS),
        ("n_gpus", pa.int32()),
        ("n_hosts", pa.int32()),
        ("dp", pa.int32()),
        ("pp", pa.int32()),
        ("tp", pa.int32()),
        ("status", pa.string()),  # JOB_STATUSES
        ("restarts", pa.int32()),
        ("hosts", pa.list_(pa.string())),
        # what the hour's flow records could resolve (RESOLUTIONS; prism_core.resolution): steps
        # (the steps table has the job's steps), period (no step rows: only step_period_s) or
        # jobs_only (neither); null when the job's analysis failed
        ("resolution", pa.string()),
        # s; the median duration of the hour's steps where resolved, else the step period the
        # records' rhythm shows (an estimate; null when they show none)
        ("step_period_s", pa.float64()),
        # the issue kinds the hour's records let Prism judge for the job (ISSUE_KINDS, sorted;
        # prism_core.resolution.issue_kinds_shown): of the others none is reported, however the job
        # fared (no straggler or slow link without transfers timed one by one, no slow step
        # without resolved steps); null when the job's analysis failed
        ("issue_kinds_judged", pa.list_(pa.string())),
    ]
)

RESOLUTIONS = ("steps", "period", "jobs_only")

# A job's status at the end of an hour, decided in one place (prism_core.analysis.job_status) and
# read as is by every report: running (its GPUs talk), hung (silent in a hang that still holds its
# GPUs), ended (stopped; a restart may still resume it under the same id).
JOB_STATUSES = ("running", "hung", "ended")

JOB_GPUS = pa.schema(
    [
        ("job_id", pa.string()),
        ("addr", pa.string()),
        ("host", pa.string()),
        ("gpu", pa.int32()),
        ("pp_stage", pa.int32()),
        ("dp_rank", pa.int32()),
        # the address's first and last traffic for the job this hour: when a replacement host
        # joined, when a replaced one left
        ("first_seen", TS),
        ("last_seen", TS),
    ]
)

COMM_KINDS = ("dp", "pp", "other")

COMM_PAIRS = pa.schema(
    [
        ("job_id", pa.string()),
        ("src_addr", pa.string()),
        ("dst_addr", pa.string()),
        ("kind", pa.string()),  # dp | pp | other
        ("flows", pa.int64()),
        ("bytes", pa.int64()),
        ("distinct_sizes", pa.int64()),
    ]
)

STEPS = pa.schema(
    [
        ("job_id", pa.string()),
        ("step", pa.int64()),  # continues across hours and restarts
        ("start", TS),
        ("end", TS),
        ("duration_s", pa.float64()),
        ("sync_start", TS),  # start of the DP synchronization phase that closes the step
        ("sync_s", pa.float64()),
        ("attempt", pa.int32()),  # 0 before the first restart, +1 after each
    ]
)

ISSUE_KINDS = ("slow_step", "straggler", "slow_link", "hang", "degradation", "restart", "analysis_error")

ISSUES = pa.schema(
    [
        ("issue_id", pa.string()),  # deterministic: the same issue keeps its id on re-runs
        ("job_id", pa.string()),
        ("kind", pa.string()),
        ("subject", pa.string()),  # host, address, link "src->dst", or the job id
        ("start", TS),
        ("end", TS),
        ("severity", pa.string()),  # low | medium | high | critical (impact share of step time)
        ("confidence", pa.float64()),
        ("wasted_gpu_s", pa.float64()),
        ("evidence", pa.string()),  # JSON
    ]
)

# Warehouse tables in pipeline order, with their schemas.
TABLES: dict[str, pa.Schema] = {
    "flows": FLOWS,
    "quarantine": QUARANTINE,
    "flow_minutes": FLOW_MINUTES,
    "jobs": JOBS,
    "job_gpus": JOB_GPUS,
    "comm_pairs": COMM_PAIRS,
    "steps": STEPS,
    "issues": ISSUES,
}


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast `table` to `schema`, adding missing nullable columns as nulls."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table[field.name].cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)
