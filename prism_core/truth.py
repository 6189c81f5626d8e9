"""Schemas of the simulator's ground truth (`<scenario dir>/truth/<table>.parquet`).

The scorer (`prism_core.evaluate`) compares the warehouse with these tables. Truth job ids are the
simulator's own (`sim-job-NNN`); the scorer matches them to Prism's ids by address sets.
"""

from __future__ import annotations

import pyarrow as pa

from prism_core.schema import TS

TRUTH_JOBS = pa.schema(
    [
        ("job_id", pa.string()),
        ("hosts", pa.list_(pa.string())),
        ("n_hosts", pa.int32()),
        ("n_gpus", pa.int32()),
        ("dp", pa.int32()),
        ("pp", pa.int32()),
        ("tp", pa.int32()),
        ("start", TS),  # first step starts
        ("end", TS),  # last traffic (end of run, failure or hang onset)
        ("collective", pa.string()),  # ring | rs_ag | tree | zero
        ("moe", pa.bool_()),
        ("micro_batches", pa.int32()),
        ("has_network", pa.bool_()),  # False for one-host jobs (all traffic on NVLink)
        ("restarts", pa.int32()),
    ]
)

TRUTH_JOB_GPUS = pa.schema(
    [
        ("job_id", pa.string()),
        ("addr", pa.string()),
        ("host", pa.string()),
        ("gpu", pa.int32()),
        ("pp_stage", pa.int32()),
        ("dp_rank", pa.int32()),
        ("tp_rank", pa.int32()),
        ("start", TS),  # the address joined the job (its start, or a restart onto this host)
        ("end", TS),  # the address left it (its end, or the failure after which it was replaced)
    ]
)

# Directed NIC pairs that carry a job's traffic, one row per (pair, kind).
TRUTH_PAIRS = pa.schema(
    [
        ("job_id", pa.string()),
        ("src_addr", pa.string()),
        ("dst_addr", pa.string()),
        ("kind", pa.string()),  # dp | pp | other
    ]
)

TRUTH_STEPS = pa.schema(
    [
        ("job_id", pa.string()),
        ("step", pa.int64()),  # 0-based over the job's life, continuing across restarts
        ("start", TS),
        ("end", TS),
        ("attempt", pa.int32()),
        ("checkpoint", pa.bool_()),
    ]
)

TRUTH_FAULT_KINDS = ("straggler", "slow_link", "hang", "restart", "degradation", "slow_step")

TRUTH_FAULTS = pa.schema(
    [
        ("fault_id", pa.string()),
        ("job_id", pa.string()),
        ("kind", pa.string()),
        ("subject", pa.string()),  # host name, NIC address, "src->dst" link, or the job id
        ("start", TS),
        ("end", TS),
        ("wasted_gpu_s", pa.float64()),  # GPU-seconds lost against the fault-free run
        ("params", pa.string()),  # JSON: slowdown factor, replaced host, ...
    ]
)

TRUTH_TABLES: dict[str, pa.Schema] = {
    "jobs": TRUTH_JOBS,
    "job_gpus": TRUTH_JOB_GPUS,
    "pairs": TRUTH_PAIRS,
    "steps": TRUTH_STEPS,
    "faults": TRUTH_FAULTS,
}
