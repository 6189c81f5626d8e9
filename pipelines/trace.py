"""A job's reconstructed timeline as Chrome / Perfetto trace-event JSON.

One process per job; threads (tracks) for its attempts (restarts split them), its training steps,
the DP synchronization phase that closes each step, and one track per issue kind. Every interval
is a complete event (`"ph": "X"`, times in microseconds since the epoch), so the trace lines up
with wall-clock time in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.reports import ReportError, connect, run_report

JOB_PID = 1
TRACKS = {"attempts": 1, "steps": 2, "DP sync": 3}
FIRST_ISSUE_TRACK = 10  # issue kinds get tracks from here, in kind order


def export_trace(root: str | Path, job_id: str, out: str | Path) -> Path:
    """Write the timeline of `job_id` in the warehouse at `root` to `out` as trace-event JSON."""
    with connect(root) as con:
        jobs = run_report(con, "job_summary")
        job = jobs.filter(pc.equal(jobs["job_id"], job_id))
        if not job.num_rows:
            known = ", ".join(sorted(jobs["job_id"].to_pylist())[:10])
            raise ReportError(f"no job {job_id!r} in {root} (jobs include: {known or 'none'})")
        steps = run_report(con, "step_times", job_id=job_id)
        issues = run_report(con, "issue_log", job_id=job_id)
    trace = trace_events(job.drop_columns(["started", "ended", "held_until"]).to_pylist()[0], steps, issues)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace, separators=(",", ":")), encoding="utf-8")
    return out


def trace_events(job: dict, steps: pa.Table, issues: pa.Table) -> dict:
    """The trace of one job from its job_summary row and its step_times and issue_log rows."""
    shape = " x ".join(f"{name} {job.get(name) or '?'}" for name in ("dp", "pp", "tp"))
    events = [_meta("process_name", tid=0, name=f"{job['job_id']} ({job['n_gpus']} GPUs, {shape})")]
    issue_kinds = sorted(set(issues["kind"].to_pylist()))
    tracks = TRACKS | {f"issues: {kind}": FIRST_ISSUE_TRACK + n for n, kind in enumerate(issue_kinds)}
    for name, tid in tracks.items():
        events += [_meta("thread_name", tid, name=name), _meta("thread_sort_index", tid, sort_index=tid)]

    step_start, step_end = _nanos(steps["started"]), _nanos(steps["ended"])
    sync_start = _nanos(steps["sync_started"])
    attempts: dict[int, list[int]] = {}
    for n, row in enumerate(steps.select(["step", "attempt", "duration_s", "sync_s"]).to_pylist()):
        events.append(_complete(f"step {row['step']}", "step", TRACKS["steps"], step_start[n],
                                step_end[n] - step_start[n], step=row["step"], attempt=row["attempt"],
                                duration_s=row["duration_s"]))
        if sync_start[n] is not None and row["sync_s"] is not None:
            events.append(_complete("DP sync", "sync", TRACKS["DP sync"], sync_start[n], row["sync_s"] * 1e9,
                                    step=row["step"], sync_s=row["sync_s"]))
        span = attempts.setdefault(row["attempt"] or 0, [step_start[n], step_end[n]])
        span[0], span[1] = min(span[0], step_start[n]), max(span[1], step_end[n])
    for attempt, (first, last) in sorted(attempts.items()):
        events.append(_complete(f"attempt {attempt}", "attempt", TRACKS["attempts"], first, last - first,
                                attempt=attempt))

    issue_start, issue_end = _nanos(issues["started"]), _nanos(issues["ended"])
    columns = ["issue_id", "kind", "subject", "severity", "confidence", "wasted_gpu_h", "evidence"]
    for n, row in enumerate(issues.select(columns).to_pylist()):
        events.append(_complete(
            row["kind"], "issue", tracks[f"issues: {row['kind']}"], issue_start[n], issue_end[n] - issue_start[n],
            issue_id=row["issue_id"], subject=row["subject"], severity=row["severity"],
            confidence=row["confidence"], wasted_gpu_h=row["wasted_gpu_h"], evidence=_parsed(row["evidence"]),
        ))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"job_id": job["job_id"], "source": "prism", "job": job},
    }


def _meta(kind: str, tid: int, **args) -> dict:
    return {"name": kind, "ph": "M", "pid": JOB_PID, "tid": tid, "args": args}


def _complete(name: str, category: str, tid: int, start_ns: int, duration_ns: float, **args) -> dict:
    """A complete event; trace times are microseconds (fractions allowed), given here in ns so
    that durations are not differences of two rounded epoch times."""
    return {
        "name": name, "cat": category, "ph": "X", "pid": JOB_PID, "tid": tid,
        "ts": start_ns / 1000, "dur": max(duration_ns, 0) / 1000, "args": args,
    }


def _nanos(column: pa.ChunkedArray) -> list[int | None]:
    return column.cast(pa.timestamp("ns", "UTC")).cast(pa.int64()).to_pylist()


def _parsed(evidence: str | None):
    """Evidence JSON as an object for the viewer's args panel; text that is not JSON as is."""
    try:
        return json.loads(evidence) if evidence else None
    except json.JSONDecodeError:
        return evidence
