"""A warehouse built from a simulated scenario's ground truth, for testing what reads the warehouse.

`flows` and `flow_minutes` come from the simulator's flow files through the ingest core (parse,
dedupe, minute aggregates), as the pipeline would write them. The analysis tables are the truth
itself mapped to the warehouse schemas, so report figures can be checked against values computed
independently from the truth, without depending on the accuracy of the inference stages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines import warehouse
from prism_core.ingest import dedupe, parse_flow_file
from prism_core.minutes import HOUR_NS, minute_aggregates
from prism_core.schema import TABLES, conform
from prism_core.truth import TRUTH_TABLES

# Steps start their DP synchronization in their second half: the first DP flow after the middle
# of a step stands in for the timeline stage's sync_start.
SYNC_SEARCH_FROM = 0.5


@dataclass
class TruthWarehouse:
    root: Path  # the warehouse
    topology: Path  # the scenario's topology.csv
    truth: dict[str, pa.Table]  # truth tables of the network-visible jobs
    flows: pa.Table  # deduplicated flows, as in the warehouse
    scenario_end: datetime


def build(scenario: Path, root: Path) -> TruthWarehouse:
    truth = {name: pq.read_table(scenario / "truth" / f"{name}.parquet") for name in TRUTH_TABLES}
    visible = truth["jobs"].filter(pc.field("has_network"))["job_id"]
    for name in ("jobs", "job_gpus", "pairs", "steps", "faults"):
        truth[name] = truth[name].filter(pc.is_in(truth[name]["job_id"], value_set=visible))
    noise = json.loads((scenario / "truth" / "noise.json").read_text())
    params = noise["scenario"]
    start = datetime.fromisoformat(str(params["start"])).astimezone(timezone.utc)
    scenario_end = start + timedelta(minutes=params["minutes"])

    flows = _ingest(sorted((scenario / "flows").iterdir()))
    steps = _with_sync(truth["steps"], truth["pairs"], flows)
    for hour_ns in np.unique(flows["time_flow_start_ns"].to_numpy() // HOUR_NS):
        in_hour = pc.equal(pc.divide(flows["time_flow_start_ns"], HOUR_NS), hour_ns)
        hour_flows = flows.filter(in_hour)
        hour = datetime.fromtimestamp(hour_ns * 3600, tz=timezone.utc)
        warehouse.write_partition(root, "flows", hour, hour_flows)
        warehouse.write_partition(root, "flow_minutes", hour, minute_aggregates(hour_flows))
    _write_analysis(root, truth, steps, scenario_end)
    warehouse.refresh_database(root)
    return TruthWarehouse(root, scenario / "topology.csv", truth | {"steps": steps}, flows, scenario_end)


def _ingest(paths: list[Path]) -> pa.Table:
    clean = [parse_flow_file(path.read_bytes(), str(path)).clean for path in paths]
    flows, _ = dedupe(pa.concat_tables(clean))
    return flows


def _with_sync(steps: pa.Table, pairs: pa.Table, flows: pa.Table) -> pa.Table:
    """Truth steps with duration_s, sync_start and sync_s (from the job's DP flows)."""
    with duckdb.connect() as con:
        con.execute("SET enable_progress_bar = false")
        con.register("truth_steps", steps)
        con.register("truth_pairs", pairs)
        con.register("all_flows", flows)
        return con.sql(
            f"""
            WITH dp AS (
                SELECT p.job_id, f.time_flow_start_ns AS s, f.time_flow_end_ns AS e
                FROM all_flows f JOIN truth_pairs p USING (src_addr, dst_addr) WHERE p.kind = 'dp'
            ),
            bounds AS (
                SELECT job_id, step, epoch_ns(start) AS s0, epoch_ns("end") AS e0 FROM truth_steps
            ),
            sync AS (
                SELECT b.job_id, b.step, min(dp.s) AS sync_ns,
                       least(max(dp.e), any_value(b.e0)) - min(dp.s) AS sync_len_ns
                FROM dp ASOF JOIN bounds b ON dp.job_id = b.job_id AND dp.s >= b.s0
                WHERE dp.s >= b.s0 + {SYNC_SEARCH_FROM} * (b.e0 - b.s0) AND dp.s < b.e0
                GROUP BY b.job_id, b.step
            )
            SELECT t.job_id, t.step, t.start, t."end",
                   (epoch_ns(t."end") - epoch_ns(t.start)) / 1e9 AS duration_s,
                   make_timestamp_ns(sync.sync_ns)::TIMESTAMPTZ AS sync_start,
                   sync.sync_len_ns / 1e9 AS sync_s,
                   t.attempt
            FROM truth_steps t LEFT JOIN sync USING (job_id, step)
            ORDER BY t.job_id, t.step
            """
        ).to_arrow_table()


def _hours(start_ns: int, end_ns: int) -> range:
    return range(start_ns // HOUR_NS, end_ns // HOUR_NS + 1)


def _write_analysis(root: Path, truth: dict[str, pa.Table], steps: pa.Table, scenario_end: datetime) -> None:
    """Each job's rows in every hour it lived, as the pipeline writes them."""
    end_ns = int(scenario_end.timestamp()) * 10**9
    hung = set(truth["faults"].filter(pc.equal(truth["faults"]["kind"], "hang"))["job_id"].to_pylist())
    rows: dict[str, dict[int, list[pa.Table]]] = {name: {} for name in ("jobs", "job_gpus", "comm_pairs", "steps", "issues")}

    def add(name: str, hour: int, table: pa.Table) -> None:
        rows[name].setdefault(hour, []).append(table)

    jobs = truth["jobs"]
    lives = zip(ns_list(jobs["start"]), ns_list(jobs["end"]))
    for job, (first, last) in zip(jobs.drop_columns(["start", "end"]).to_pylist(), lives):
        job_id = job["job_id"]
        gpus = truth["job_gpus"].filter(pc.equal(truth["job_gpus"]["job_id"], job_id))
        pairs = truth["pairs"].filter(pc.equal(truth["pairs"]["job_id"], job_id))
        for hour in _hours(first, last):
            seen_until = min(last, (hour + 1) * HOUR_NS)
            final = seen_until == last
            status = "running"
            if final and job_id in hung:
                status = "hung"
            elif final and last < end_ns:
                status = "ended"
            add("jobs", hour, pa.table({
                "job_id": [job_id], "first_seen": pa.array([first], pa.int64()).cast(pa.timestamp("ns", "UTC")),
                "last_seen": pa.array([seen_until], pa.int64()).cast(pa.timestamp("ns", "UTC")),
                "n_gpus": [job["n_gpus"]], "n_hosts": [job["n_hosts"]], "dp": [job["dp"]], "pp": [job["pp"]],
                "tp": [job["tp"]], "status": [status], "restarts": [job["restarts"]], "hosts": [job["hosts"]],
            }))
            add("job_gpus", hour, gpus)
            add("comm_pairs", hour, pairs)
    step_hours = pc.divide(steps["end"].cast(pa.int64()), HOUR_NS).to_numpy()
    for hour in np.unique(step_hours):
        add("steps", int(hour), steps.filter(pa.array(step_hours == hour)))
    for hour, issues in _issue_rows(truth["faults"], steps).items():
        add("issues", hour, issues)
    for name, by_hour in rows.items():
        for hour, parts in by_hour.items():
            table = pa.concat_tables(parts, promote_options="permissive")
            when = datetime.fromtimestamp(hour * 3600, tz=timezone.utc)
            warehouse.write_partition(root, name, when, conform(table, TABLES[name]))


def _issue_rows(faults: pa.Table, steps: pa.Table) -> dict[int, pa.Table]:
    """Issues as the diagnosis writes them: an issue spanning hours has one row per hour, with its
    start, the end as known in that hour, and the waste of that hour (the fault's waste in
    proportion to its time in the hour). A straggler's evidence counts the job's steps that
    started in its interval that hour (`late_steps`, as the diagnosis reports them)."""
    rows: dict[int, list[dict]] = {}
    starts, ends = ns_list(faults["start"]), ns_list(faults["end"])
    step_job, step_start = steps["job_id"].to_pylist(), ns_list(steps["start"])
    for fault, start, end in zip(faults.drop_columns(["start", "end"]).to_pylist(), starts, ends):
        for hour in _hours(start, max(end - 1, start)):
            since, until = max(start, hour * HOUR_NS), min(end, (hour + 1) * HOUR_NS)
            share = (until - since) / (end - start) if end > start else 1.0
            evidence = json.loads(fault["params"])
            if fault["kind"] == "straggler":
                evidence["late_steps"] = sum(
                    j == fault["job_id"] and since <= t < until for j, t in zip(step_job, step_start)
                )
            rows.setdefault(hour, []).append({
                "issue_id": fault["fault_id"], "job_id": fault["job_id"], "kind": fault["kind"],
                "subject": fault["subject"], "start": start, "end": until, "severity": "high",
                "confidence": 1.0, "wasted_gpu_s": fault["wasted_gpu_s"] * share,
                "evidence": json.dumps(evidence, sort_keys=True),
            })
    return {hour: pa.Table.from_pylist(hour_rows) for hour, hour_rows in rows.items()}


def ns_list(column: pa.ChunkedArray) -> list[int]:
    return column.cast(pa.int64()).to_pylist()
