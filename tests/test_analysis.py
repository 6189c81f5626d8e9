"""Which flows each job is analyzed with (prism_core.analysis)."""

from __future__ import annotations

import pyarrow as pa

from prism_core import jobs
from prism_core.analysis import open_membership, split_flows_by_job
from prism_core.minutes import HOUR_NS

HOUR = 10 * HOUR_NS
SECOND = 1_000_000_000


def _recognition(job_rows: list[tuple[str, int, str, str]], spans: list[tuple[str, str, int, int]],
                 gpus_per_host: int = 1) -> jobs.Recognition:
    """Jobs (id, first seen, status, host) and their members' traffic spans (job, host, first, last);
    a host's GPUs are addressed "<host>" (GPU 0), "<host>.1", ..."""
    spans = [(j, h if g == 0 else f"{h}.{g}", f, l, h) for j, h, f, l in spans for g in range(gpus_per_host)]
    job_table = pa.table({
        "job_id": [j for j, _, _, _ in job_rows],
        "first_seen": pa.array([t for _, t, _, _ in job_rows], pa.timestamp("ns", "UTC")),
        "status": [s for _, _, s, _ in job_rows],
        "hosts": [[h] for _, _, _, h in job_rows],
    })
    membership = pa.table({
        "job_id": [j for j, _, _, _, _ in spans], "addr": [a for _, a, _, _, _ in spans],
        "host": [h for _, _, _, _, h in spans], "gpu": pa.array([0] * len(spans), pa.int32()),
        "first_ns": pa.array([f for _, _, f, _, _ in spans], pa.int64()),
        "last_ns": pa.array([l for _, _, _, l, _ in spans], pa.int64()),
    }).cast(jobs.MEMBERSHIP)
    return jobs.Recognition(jobs=job_table, membership=membership, events=pa.table({}), state={})


def test_a_job_holds_its_hosts_from_the_hour_start_if_it_ran_then_and_to_the_end_if_it_still_runs():
    """Checkpoint writes before a running job's first sync of the hour and after its last are the
    job's; a host between two jobs belongs to neither, and a job that arrived mid-hour does not
    own what its host sent before it came."""
    recognition = _recognition(
        [("a", HOUR - HOUR_NS, "running", "h0"), ("b", HOUR + 100 * SECOND, "ended", "h1"),
         ("c", HOUR + 2000 * SECOND, "running", "h1")],
        [("a", "h0", HOUR + 10 * SECOND, HOUR + 3500 * SECOND), ("b", "h1", HOUR + 100 * SECOND, HOUR + 1000 * SECOND),
         ("c", "h1", HOUR + 2000 * SECOND, HOUR + 3500 * SECOND)],
        gpus_per_host=2,
    )
    sent = [("h0", 5), ("h0.1", 6), ("h0", 3550), ("h1", 50), ("h1", 500), ("h1", 1500), ("h1.1", 3590)]
    flows = pa.table({
        "time_flow_start_ns": pa.array([HOUR + t * SECOND for _, t in sent], pa.int64()),
        "time_flow_end_ns": pa.array([HOUR + t * SECOND + 1 for _, t in sent], pa.int64()),
        "src_addr": [h for h, _ in sent], "dst_addr": ["storage"] * len(sent),
        "bytes": pa.array([1 << 30] * len(sent), pa.int64()), "sampler_address": ["x"] * len(sent),
    })
    split = {job: (part["time_flow_start_ns"].to_numpy() - HOUR) // SECOND
             for job, part in split_flows_by_job(flows, open_membership(recognition, HOUR))}
    assert {job: times.tolist() for job, times in split.items()} == {"a": [5, 6, 3550], "b": [500], "c": [3590]}
    # by the traffic spans alone, only what was sent amid the job's own traffic
    plain = {job: len(part) for job, part in split_flows_by_job(flows, recognition.membership)}
    assert plain == {"b": 1}
