"""Step division on the `fleet` hour: every job's `divide_steps`, timed, and scored against truth.

    python -m benchmarks.timeline_bench [--seed 0]

Generates (and caches, with benchmarks.fleet) the 2,880-GPU scenario, ingests and deduplicates
its flows once (cached as one Parquet file), then gives each network-visible job its own flows
(sent by its GPUs while it ran) and its truth pairs, so the timing and accuracy are those of
step division alone, independent of job recognition and parallelism inference. Figures go to
benchmarks/results/timeline.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.fleet import scenario
from prism_core.evaluate.steps import score
from prism_core.ingest import dedupe, parse_flow_file
from prism_core.minutes import HOUR_NS
from prism_core.timeline import divide_steps
from prism_core.truth import TRUTH_TABLES

RESULTS = Path(__file__).resolve().parent / "results" / "timeline.json"
MEMBER_SLACK_NS = 5_000_000_000  # a job's flows may end a little after its last step


def clean_flows(scenario_dir: Path) -> pa.Table:
    # kept inside the scenario's directory, so a scenario generated again drops it too
    cached = scenario_dir / "clean-flows.parquet"
    if not cached.exists():
        files = sorted((scenario_dir / "flows").iterdir())
        parts = [parse_flow_file(path.read_bytes(), path.name).clean for path in files]
        flows, _ = dedupe(pa.concat_tables(parts))
        pq.write_table(flows, cached)
    return pq.read_table(cached)


def job_inputs(flows: pa.Table, truth: dict[str, pa.Table], job_id: str) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The flows the job's GPUs sent while it ran, its truth pairs and its truth GPUs."""
    job = truth["jobs"].filter(pc.equal(truth["jobs"]["job_id"], job_id))
    lo = pc.cast(job["start"], pa.int64())[0].as_py() - MEMBER_SLACK_NS
    hi = pc.cast(job["end"], pa.int64())[0].as_py() + MEMBER_SLACK_NS
    gpus = truth["job_gpus"].filter(pc.equal(truth["job_gpus"]["job_id"], job_id))
    start = flows["time_flow_start_ns"]
    mine = pc.and_(pc.is_in(flows["src_addr"], value_set=gpus["addr"]),
                   pc.and_(pc.greater_equal(start, lo), pc.less(start, hi)))
    return flows.filter(mine), truth["pairs"].filter(pc.equal(truth["pairs"]["job_id"], job_id)), gpus


def restarts_of(truth: dict[str, pa.Table], job_flows: pa.Table, job_id: str) -> list[int]:
    """What the job tracker reports: the job's first flow after each downtime."""
    steps = truth["steps"].filter(pc.equal(truth["steps"]["job_id"], job_id))
    attempt = steps["attempt"].to_numpy()
    first_of_attempt = pc.cast(steps["start"], pa.int64()).to_numpy()
    starts = np.sort(job_flows["time_flow_start_ns"].to_numpy())
    return [int(starts[min(np.searchsorted(starts, first_of_attempt[np.argmax(attempt == a)]), len(starts) - 1)])
            for a in range(1, int(attempt.max(initial=0)) + 1) if np.any(attempt == a)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    scenario_dir = scenario(args.seed)
    truth = {name: pq.read_table(scenario_dir / "truth" / f"{name}.parquet") for name in TRUTH_TABLES}
    visible = truth["jobs"].filter(pc.field("has_network"))["job_id"]
    truth = {name: table.filter(pc.is_in(table["job_id"], value_set=visible)) for name, table in truth.items()}
    noise = json.loads((scenario_dir / "truth" / "noise.json").read_text())
    began = time.perf_counter()
    flows = clean_flows(scenario_dir)
    load_s = time.perf_counter() - began

    hour_start = int(datetime.fromisoformat(noise["scenario"]["start"]).timestamp()) * 10**9 // HOUR_NS * HOUR_NS
    timings, steps, carry_bytes, job_flow_rows = {}, [], [], []
    for job_id in visible.to_pylist():
        job_flows, pairs, gpus = job_inputs(flows, truth, job_id)
        restarts = restarts_of(truth, job_flows, job_id)
        started = time.perf_counter()
        timeline = divide_steps(job_id, job_flows, pairs, None, hour_start, hour_start + HOUR_NS, restarts, gpus)
        timings[job_id] = time.perf_counter() - started
        carry_bytes.append(len(json.dumps(timeline.state)))
        # the next hour, where the job has no flows, decides the steps that closed the hour
        after = divide_steps(job_id, job_flows.slice(0, 0), pairs, timeline.state, hour_start + HOUR_NS,
                             hour_start + 2 * HOUR_NS)
        steps += [timeline.steps, after.steps]
        job_flow_rows.append(job_flows.num_rows)
        print(f"{job_id}: {job_flows.num_rows:>9,} flows {timeline.steps.num_rows:>5} steps "
              f"{timings[job_id]:6.2f} s", flush=True)

    figures = score(truth, {"steps": pa.concat_tables(steps), "job_gpus": truth["job_gpus"]}, noise)
    seconds = np.array(list(timings.values()))
    result = {
        "scenario": f"fleet seed {args.seed}",
        "machine": {"python": platform.python_version(), "cpus": 2},
        "jobs": len(timings),
        "flows": int(sum(job_flow_rows)),
        "load_and_dedupe_s": round(load_s, 1),
        "divide_steps_total_s": round(float(seconds.sum()), 2),
        "divide_steps_s": {"median": round(float(np.median(seconds)), 3), "max": round(float(seconds.max()), 2),
                           "slowest_job": max(timings, key=timings.get)},
        "flows_per_s": round(sum(job_flow_rows) / seconds.sum()),
        "state_json_bytes": {"median": int(np.median(carry_bytes)), "max": int(max(carry_bytes))},
        "accuracy": {name: figure.as_dict() for name, figure in figures.items()},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
