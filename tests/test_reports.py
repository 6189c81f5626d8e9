"""The report queries of sql/reports/ against values computed independently from simulator truth.

The warehouse is the `small` scenario's flows through the ingest core plus its truth tables as the
analysis tables (tests/truth_warehouse.py), so every expected figure below is computed in Python
from the truth and the flows, not from the warehouse's SQL.
"""

import json
import shutil
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest

import truth_warehouse
from pipelines import reports, trace, warehouse
from prism_core.minutes import HOUR_NS, MINUTE_NS

HOUR_10 = datetime(2026, 11, 22, 10, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def small(scenario_dir, tmp_path_factory):
    return truth_warehouse.build(scenario_dir("small"), tmp_path_factory.mktemp("small-truth-warehouse"))


@pytest.fixture
def con(small):
    with reports.connect(small.root, topology=small.topology) as connection:
        yield connection


def epoch_ns(column):
    return column.cast(pa.timestamp("ns", "UTC")).cast(pa.int64())


def ns(column) -> np.ndarray:
    return epoch_ns(column).to_numpy()


def rows_by(table: pa.Table, *keys: str) -> dict:
    return {tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]: row for row in _pylist(table)}


def _pylist(table: pa.Table) -> list[dict]:
    """Rows with instants as epoch nanoseconds (Python datetimes stop at microseconds)."""
    columns = [
        epoch_ns(table[name]) if pa.types.is_timestamp(table.schema.field(name).type) else table[name]
        for name in table.column_names
    ]
    return pa.table(columns, names=table.column_names).to_pylist()


def job_lives(small) -> dict[str, tuple[int, int]]:
    """job_id -> (first traffic, end of GPU holding) in ns: a hung job holds its GPUs to the end
    of its hang."""
    jobs = small.truth["jobs"]
    faults = small.truth["faults"]
    lives = {j: (s, e) for j, s, e in zip(jobs["job_id"].to_pylist(), ns(jobs["start"]), ns(jobs["end"]))}
    for job_id, kind, end in zip(faults["job_id"].to_pylist(), faults["kind"].to_pylist(), ns(faults["end"])):
        if kind == "hang":
            lives[job_id] = (lives[job_id][0], max(lives[job_id][1], end))
    return lives


def overlap(a0: int, a1: int, b0: int, b1: int) -> float:
    return max(0, min(a1, b1) - max(a0, b0)) / 1e9


def report_hours(small) -> dict[int, tuple[int, int]]:
    """Hour -> the part of it the default report range covers: the minutes that have flows."""
    starts = small.flows["time_flow_start_ns"].to_numpy()
    first, end = starts.min() // MINUTE_NS * MINUTE_NS, starts.max() // MINUTE_NS * MINUTE_NS + MINUTE_NS
    hours = range(first // HOUR_NS * HOUR_NS, (end - 1) // HOUR_NS * HOUR_NS + 1, HOUR_NS)
    return {hour: (max(hour, first), min(hour + HOUR_NS, end)) for hour in hours}


# --- fleet capacity -----------------------------------------------------------------------------


def test_fleet_capacity_per_hour_and_pod_matches_truth(small, con):
    inventory = pacsv.read_csv(small.topology).to_pylist()
    pod_of = {row["addr"]: row["pod"] for row in inventory}
    lives = job_lives(small)
    gpus = small.truth["job_gpus"]
    members = defaultdict(set)
    for job_id, addr in zip(gpus["job_id"].to_pylist(), gpus["addr"].to_pylist()):
        members[addr].add(job_id)

    # minutes in which each inventory NIC sent or received a flow, outside every job holding it
    flows = small.flows
    minute = flows["time_flow_start_ns"].to_numpy() // MINUTE_NS * MINUTE_NS
    active = set()
    for column in ("src_addr", "dst_addr"):
        active |= set(zip(minute.tolist(), flows[column].to_pylist()))
    outside = defaultdict(float)  # (hour, addr) -> seconds
    for m, addr in active:
        if addr in pod_of and not any(
            m < lives[j][1] and m + MINUTE_NS > lives[j][0] for j in members[addr]
        ):
            outside[(m // HOUR_NS * HOUR_NS, addr)] += 60

    expected = {}
    hours = report_hours(small)
    for hour, (lo, hi) in hours.items():
        covered_s = (hi - lo) / 1e9
        for pod in sorted(set(pod_of.values())):
            addrs = [a for a, p in pod_of.items() if p == pod]
            busy = {a: min(covered_s, sum(overlap(*lives[j], lo, hi) for j in members[a])) for a in addrs}
            traffic = sum(min(outside[(hour, a)], covered_s - busy[a]) for a in addrs)
            expected[(hour, pod)] = (len(addrs), sum(busy.values()) / covered_s, traffic / covered_s)

    table = reports.run_report(con, "fleet_capacity")
    got = {(r["hour"], r["pod"]): r for r in _pylist(table)}
    assert {k for k in got if k[0] is not None and k[1] != "(all)"} == set(expected)
    for key, (inventory_gpus, busy, traffic) in expected.items():
        row = got[key]
        assert row["inventory_gpus"] == inventory_gpus
        assert row["busy_gpus"] == pytest.approx(busy, abs=1e-6)
        assert row["traffic_only_gpus"] == pytest.approx(traffic, abs=1e-6)
        assert row["no_traffic_gpus"] == pytest.approx(inventory_gpus - busy - traffic, abs=1e-6)
    assert sum(v[1] for v in expected.values()) > 100  # the jobs hold a real share of the fleet
    assert sum(v[2] for v in expected.values()) > 0  # one-host jobs' checkpoint writes, transfers

    fleet_total = got[(None, "(all)")]
    assert fleet_total["hours"] == len(hours)
    assert fleet_total["inventory_gpus"] == len(inventory)
    # over the range, each hour weighs by the time it covers: a few minutes of an edge hour count little
    covered = {hour: (hi - lo) / 1e9 for hour, (lo, hi) in hours.items()}
    mean_busy = sum(v[1] * covered[h] for (h, pod), v in expected.items()) / sum(covered.values())
    assert fleet_total["busy_gpus"] == pytest.approx(mean_busy, abs=1e-6)
    assert fleet_total["busy_share"] == pytest.approx(mean_busy / len(inventory), abs=1e-9)


def test_reports_do_not_depend_on_the_session_time_zone(con):
    utc = _pylist(reports.run_report(con, "fleet_capacity"))
    con.execute("SET TimeZone = 'Asia/Kolkata'")  # +05:30: local hours are not UTC hours
    assert _pylist(reports.run_report(con, "fleet_capacity")) == [pytest.approx(row) for row in utc]


def test_without_an_inventory_every_address_is_its_own_gpu(small):
    with reports.connect(small.root) as con:
        capacity = reports.run_report(con, "fleet_capacity")
    addrs = pc.unique(pa.concat_arrays([small.flows["src_addr"].combine_chunks(), small.flows["dst_addr"].combine_chunks()]))
    total = capacity.filter(pc.and_(pc.is_null(capacity["hour"]), pc.equal(capacity["pod"], "(all)")))
    assert total["inventory_gpus"].to_pylist() == [len(addrs)]


# --- waste and issues ---------------------------------------------------------------------------


def expected_waste(small, hours: list[int]) -> dict[tuple[int, str, str], float]:
    """(hour, kind, job_id) -> GPU-hours: each fault's waste spread evenly over its interval."""
    faults = small.truth["faults"]
    waste = defaultdict(float)
    for job_id, kind, start, end, wasted in zip(
        faults["job_id"].to_pylist(), faults["kind"].to_pylist(), ns(faults["start"]), ns(faults["end"]),
        faults["wasted_gpu_s"].to_pylist(),
    ):
        for hour in hours:
            if end > start:
                share = overlap(start, end, hour, hour + HOUR_NS) / ((end - start) / 1e9)
            else:
                share = float(hour <= start < hour + HOUR_NS)
            if share:
                waste[(hour, kind, job_id)] += wasted * share / 3600
    return waste


def test_waste_per_hour_by_kind_and_job_matches_truth_faults(small, con):
    hours = report_hours(small)
    expected = expected_waste(small, hours)
    got = {(r["period"], r["kind"], r["job_id"]): r["wasted_gpu_h"] for r in _pylist(reports.run_report(con, "waste"))}
    for (hour, kind, job_id), value in expected.items():
        assert got[(hour, kind, job_id)] == pytest.approx(value, rel=1e-9)
    by_kind, by_job, total = defaultdict(float), defaultdict(float), defaultdict(float)
    for (hour, kind, job_id), value in expected.items():
        by_kind[(hour, kind)] += value
        by_job[(hour, job_id)] += value
        total[hour] += value
    for (hour, kind), value in by_kind.items():
        assert got[(hour, kind, "(all)")] == pytest.approx(value, rel=1e-9)
    for (hour, job_id), value in by_job.items():
        assert got[(hour, "(all)", job_id)] == pytest.approx(value, rel=1e-9)
    for hour, value in total.items():
        assert got[(hour, "(all)", "(all)")] == pytest.approx(value, rel=1e-9)
    assert len(got) == len(expected) + len(by_kind) + len(by_job) + len(total)
    # the restart of `small` crosses 10:00: one row per hour in the warehouse, one in the log
    assert con.execute("SELECT count(*) FROM issues WHERE kind = 'restart'").fetchall() == [(2,)]
    log = rows_by(reports.run_report(con, "issue_log"), "issue_id")
    faults = rows_by(small.truth["faults"], "fault_id")
    assert set(log) == set(faults)
    for issue_id, fault in faults.items():
        assert log[issue_id]["wasted_gpu_h"] == pytest.approx(fault["wasted_gpu_s"] / 3600, rel=1e-9)
        assert (log[issue_id]["started"], log[issue_id]["ended"]) == (fault["start"], fault["end"])


def test_waste_per_day_totals_every_fault(small, con):
    days = reports.run_report(con, "waste", waste_period="day")
    total = days.filter(pc.and_(pc.equal(days["kind"], "(all)"), pc.equal(days["job_id"], "(all)")))
    assert total.num_rows == 1
    expected = pc.sum(small.truth["faults"]["wasted_gpu_s"]).as_py() / 3600
    assert total["wasted_gpu_h"][0].as_py() == pytest.approx(expected, rel=1e-9)
    assert reports.run_report(con, "waste").num_rows > days.num_rows  # the variable was reset


def test_reports_read_only_the_partitions_of_their_range(small, tmp_path):
    """With the range set, flows and flow_minutes partitions outside it are never opened: here
    they are not even Parquet."""
    root = tmp_path / "warehouse"
    shutil.copytree(small.root, root)
    warehouse.refresh_database(root)  # views of the copy
    for table in ("flows", "flow_minutes"):
        Path(warehouse.partition_file(root, table, HOUR_10)).write_bytes(b"not parquet")
    with reports.connect(root, HOUR_10 - timedelta(hours=1), HOUR_10, small.topology) as con:
        results = {name: reports.run_report(con, name) for name in reports.report_names()}
    assert results["traffic_rollup"].num_rows == 2  # 09:50 and 09:55
    assert results["host_stragglers"].num_rows > 0


def test_report_range_clips_waste_and_steps_to_it(small):
    hour = int(HOUR_10.timestamp()) * 10**9
    with reports.connect(small.root, HOUR_10, None, small.topology) as con:
        waste = reports.run_report(con, "waste")
        steps = reports.run_report(con, "step_times")
    assert set(ns(waste["period"]).tolist()) == {hour}
    expected = expected_waste(small, [hour])
    got = {(r["kind"], r["job_id"]): r["wasted_gpu_h"] for r in _pylist(waste)}
    for (_, kind, job_id), value in expected.items():
        assert got[(kind, job_id)] == pytest.approx(value, rel=1e-9)
    assert steps.num_rows == int((ns(small.truth["steps"]["end"]) >= hour).sum())


# --- jobs ---------------------------------------------------------------------------------------


def test_job_summary_matches_truth(small, con):
    table = reports.run_report(con, "job_summary")
    got = rows_by(table, "job_id")
    truth_jobs = rows_by(small.truth["jobs"].drop_columns(["hosts"]), "job_id")
    assert set(got) == set(truth_jobs)
    lives = job_lives(small)
    steps, faults = small.truth["steps"], small.truth["faults"]
    for job_id, job in truth_jobs.items():
        row = got[job_id]
        assert (row["n_gpus"], row["dp"], row["pp"], row["tp"], row["restarts"]) == (
            job["n_gpus"], job["dp"], job["pp"], job["tp"], job["restarts"]
        )
        durations = ((ns(steps["end"]) - ns(steps["start"])) / 1e9)[pc.equal(steps["job_id"], job_id).to_numpy(zero_copy_only=False)]
        assert row["steps"] == len(durations)
        assert row["median_step_s"] == pytest.approx(np.percentile(durations, 50), rel=1e-9)
        assert row["p99_step_s"] == pytest.approx(np.percentile(durations, 99), rel=1e-9)
        mine = faults.filter(pc.equal(faults["job_id"], job_id))
        assert row["issues"] == mine.num_rows
        assert row["issue_kinds"] == ", ".join(sorted(set(mine["kind"].to_pylist())))
        assert row["wasted_gpu_h"] == pytest.approx(sum(mine["wasted_gpu_s"].to_pylist()) / 3600, rel=1e-9)
        first, held = lives[job_id]
        assert row["gpu_h"] == pytest.approx(job["n_gpus"] * (held - first) / 1e9 / 3600, rel=1e-9)
        assert row["held_until"] == held
    assert got["sim-job-007"]["status"] == "hung"
    wasted = table["wasted_gpu_h"].to_pylist()
    assert wasted == sorted(wasted, reverse=True)


def test_fleet_characterization_matches_truth(small, con):
    lives = job_lives(small)
    jobs = rows_by(small.truth["jobs"].drop_columns(["hosts"]), "job_id")
    gpu_h = {j: jobs[j]["n_gpus"] * (lives[j][1] - lives[j][0]) / 1e9 / 3600 for j in jobs}
    total_gpu_h = sum(gpu_h.values())

    sizes = rows_by(reports.run_report(con, "fleet_gpu_time_by_size"), "size_class")
    classes = defaultdict(list)
    for j, job in jobs.items():
        n = job["n_gpus"]
        classes["1-8" if n <= 8 else "9-32" if n <= 32 else "33-128" if n <= 128 else "129-512" if n <= 512 else "513+"].append(j)
    assert set(sizes) == set(classes)
    for name, members in classes.items():
        assert sizes[name]["jobs"] == len(members)
        assert sizes[name]["gpu_time_share"] == pytest.approx(sum(gpu_h[j] for j in members) / total_gpu_h, rel=1e-9)

    durations = rows_by(reports.run_report(con, "fleet_job_durations"), "duration_class")
    minutes = {j: (job["end"] - job["start"]) / 60e9 for j, job in jobs.items()}
    assert durations["< 10 min"]["jobs"] == sum(m < 10 for m in minutes.values())
    assert durations["10-30 min"]["jobs"] == sum(10 <= m < 30 for m in minutes.values())
    assert durations["10-30 min"]["cumulative_job_share"] == pytest.approx(1.0)

    outcomes = rows_by(reports.run_report(con, "fleet_outcomes"), "outcome")
    faults = small.truth["faults"]
    lost = {kind: pc.sum(faults.filter(pc.equal(faults["kind"], kind))["wasted_gpu_s"]).as_py() / 3600
            for kind in ("restart", "hang")}
    assert outcomes["hung"]["jobs"] == 1 and outcomes["restarted"]["jobs"] == 1
    assert outcomes["hung"]["hang_lost_gpu_h"] == pytest.approx(lost["hang"], rel=1e-9)
    assert outcomes["restarted"]["restart_lost_gpu_h"] == pytest.approx(lost["restart"], rel=1e-9)
    assert outcomes["(all)"]["jobs"] == len(jobs)
    assert outcomes["(all)"]["gpu_h"] == pytest.approx(total_gpu_h, rel=1e-9)
    assert outcomes["(all)"]["restarts"] == sum(job["restarts"] for job in jobs.values())


# --- stragglers ---------------------------------------------------------------------------------


def expected_stragglers(small) -> dict[str, dict]:
    """Per host, from the flows: DP groups (job, step, stage) it synchronized in, how often it was
    the last to send its first DP flow after the step's sync_start, and the GPU-seconds its peers
    waited for it then."""
    gpus = small.truth["job_gpus"]
    host_of = {(j, a): h for j, a, h in zip(gpus["job_id"].to_pylist(), gpus["addr"].to_pylist(), gpus["host"].to_pylist())}
    stage, gpu_count = {}, defaultdict(int)
    for j, h, s in zip(gpus["job_id"].to_pylist(), gpus["host"].to_pylist(), gpus["pp_stage"].to_pylist()):
        stage[(j, h)] = min(stage.get((j, h), s), s)
        gpu_count[(j, h)] += 1
    pairs = small.truth["pairs"].filter(pc.equal(small.truth["pairs"]["kind"], "dp"))
    dp_flows = small.flows.select(["src_addr", "dst_addr", "time_flow_start_ns"]).join(
        pairs.select(["job_id", "src_addr", "dst_addr"]), ["src_addr", "dst_addr"], join_type="inner"
    )
    steps = small.truth["steps"].filter(pc.is_valid(small.truth["steps"]["sync_start"]))
    stats = defaultdict(lambda: {"syncs": 0, "times_last": 0, "wait": 0.0})
    for job_id in set(dp_flows["job_id"].to_pylist()):
        mine = dp_flows.filter(pc.equal(dp_flows["job_id"], job_id)).sort_by("time_flow_start_ns")
        hosts = np.array([host_of.get((job_id, a), "") for a in mine["src_addr"].to_pylist()], dtype=object)
        names, codes = np.unique(hosts, return_inverse=True)
        sent = mine["time_flow_start_ns"].to_numpy()
        job_steps = steps.filter(pc.equal(steps["job_id"], job_id))
        for sync, end in zip(ns(job_steps["sync_start"]), ns(job_steps["end"])):
            lo, hi = np.searchsorted(sent, sync, "left"), np.searchsorted(sent, end, "right")
            present, first = np.unique(codes[lo:hi], return_index=True)  # flows are in time order
            groups = defaultdict(dict)
            for code, index in zip(present, first):
                if names[code]:  # a member of the job
                    groups[stage[(job_id, names[code])]][names[code]] = sent[lo + index]
            for members in groups.values():
                if len(members) < 2:
                    continue
                last = max(members, key=members.get)
                for host in members:
                    stats[host]["syncs"] += 1
                stats[last]["times_last"] += 1
                stats[last]["wait"] += sum(
                    (members[last] - t) / 1e9 * gpu_count[(job_id, h)] for h, t in members.items()
                )
    return stats


def test_host_stragglers_match_the_flows_and_rank_the_blamed_host_first(small, con):
    table = reports.run_report(con, "host_stragglers")
    got = rows_by(table, "host")
    expected = expected_stragglers(small)
    assert set(got) == set(expected)
    total_wait = sum(s["wait"] for s in expected.values())
    for host, figures in expected.items():
        row = got[host]
        assert (row["syncs"], row["times_last"]) == (figures["syncs"], figures["times_last"]), host
        assert row["wait_caused_gpu_s"] == pytest.approx(figures["wait"], rel=1e-4, abs=0.5)
        assert row["wait_share"] == pytest.approx(figures["wait"] / total_wait, rel=1e-4, abs=1e-6)

    faults = small.truth["faults"]
    straggler = _pylist(faults.filter(pc.equal(faults["kind"], "straggler")))[0]
    first = table.slice(0, 1).to_pylist()[0]
    assert first["host"] == straggler["subject"] and first["straggler_issues"] == 1
    assert first["straggler_wasted_gpu_h"] == pytest.approx(straggler["wasted_gpu_s"] / 3600)
    steps = small.truth["steps"]
    start = ns(steps["start"])
    in_window = pc.equal(steps["job_id"], straggler["job_id"]).to_numpy(zero_copy_only=False) & (
        (start >= straggler["start"]) & (start < straggler["end"])
    )
    assert first["diagnosed_late_steps"] == in_window.sum() > 10
    # the straggler's replica (every pipeline stage of it) holds up most of the job's syncs
    assert first["wait_share"] > 0.2 and first["times_last"] >= 20


# --- traffic ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bucket_minutes", [5, 60])
def test_traffic_rollup_matches_the_flows(small, con, bucket_minutes):
    flows = small.flows
    start = flows["time_flow_start_ns"].to_numpy()
    minute = start // MINUTE_NS * MINUTE_NS
    bucket = start // (bucket_minutes * MINUTE_NS) * (bucket_minutes * MINUTE_NS)
    got = rows_by(reports.run_report(con, "traffic_rollup", bucket_minutes=bucket_minutes), "bucket")
    assert sorted(got) == sorted(set(bucket.tolist()))
    nbytes = flows["bytes"].to_numpy()
    for b, row in got.items():
        inside = bucket == b
        per_minute = np.bincount(np.unique(minute[inside], return_inverse=True)[1], weights=nbytes[inside])
        assert row["flows"] == int(inside.sum())
        assert row["bytes"] == int(nbytes[inside].sum())
        in_bucket = flows.filter(pa.array(inside))
        assert row["pairs"] == in_bucket.group_by(["src_addr", "dst_addr"]).aggregate([]).num_rows
        assert row["senders"] == pc.count_distinct(in_bucket["src_addr"]).as_py()
        assert row["minutes_with_flows"] == len(per_minute)
        assert row["peak_minute_gbit_s"] == pytest.approx(per_minute.max() * 8 / 60 / 1e9, rel=1e-12)
        assert row["mean_gbit_s"] == pytest.approx(nbytes[inside].sum() * 8 / (60 * bucket_minutes) / 1e9, rel=1e-12)


def test_top_talkers_with_an_other_row(small, con):
    host_of = {row["addr"]: row["host"] for row in pacsv.read_csv(small.topology).to_pylist()}
    sent = defaultdict(int)
    for addr, nbytes in zip(small.flows["src_addr"].to_pylist(), small.flows["bytes"].to_pylist()):
        sent[host_of.get(addr, addr)] += nbytes
    ranking = sorted(sent.items(), key=lambda item: (-item[1], item[0]))
    table = reports.run_report(con, "top_talkers", top_n=3)
    rows = table.to_pylist()
    assert [(r["rank"], r["talker"], r["bytes"]) for r in rows[:3]] == [(n + 1, h, b) for n, (h, b) in enumerate(ranking[:3])]
    other = rows[3]
    assert (other["rank"], other["talker"], other["hosts"]) == (None, "other", len(ranking) - 3)
    assert other["bytes"] == sum(b for _, b in ranking[3:])
    assert sum(r["byte_share"] for r in rows) == pytest.approx(1.0)
    assert "10.200.0.1" in sent  # storage servers outside the inventory are talkers of their own


# --- trace export -------------------------------------------------------------------------------


def test_exported_trace_of_a_restarted_job(small, tmp_path):
    job_id = "sim-job-002"  # restarted once in `small`
    path = trace.export_trace(small.root, job_id, tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    process = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    complete = [e for e in events if e["ph"] == "X"]
    assert process == [f"{job_id} (32 GPUs, dp 4 x pp 1 x tp 8)"]
    for event in complete:
        assert {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(event)
        assert event["dur"] >= 0 and event["tid"] in names

    steps = small.truth["steps"].filter(pc.equal(small.truth["steps"]["job_id"], job_id)).sort_by("step")
    traced = [e for e in complete if e["cat"] == "step"]
    assert [e["args"]["step"] for e in traced] == steps["step"].to_pylist()
    assert [e["ts"] for e in traced] == pytest.approx((ns(steps["start"]) / 1000).tolist(), abs=0.5)
    assert [e["ts"] + e["dur"] for e in traced] == pytest.approx((ns(steps["end"]) / 1000).tolist(), abs=0.5)
    assert all(names[e["tid"]] == "steps" for e in traced)

    syncs = [e for e in complete if e["cat"] == "sync"]
    with_sync = steps.filter(pc.is_valid(steps["sync_start"]))
    assert [e["ts"] for e in syncs] == pytest.approx((ns(with_sync["sync_start"]) / 1000).tolist(), abs=0.5)
    assert [e["dur"] for e in syncs] == pytest.approx((with_sync["sync_s"].to_numpy() * 1e6).tolist(), abs=1e-6)
    assert [e["dur"] for e in traced] == pytest.approx(((ns(steps["end"]) - ns(steps["start"])) / 1000).tolist(), abs=1e-6)

    attempts = sorted((e["args"]["attempt"], e["ts"]) for e in complete if e["cat"] == "attempt")
    resumed = steps.filter(pc.equal(steps["attempt"], 1))
    assert [a for a, _ in attempts] == [0, 1]
    assert attempts[1][1] == pytest.approx(ns(resumed["start"]).min() / 1000, abs=0.5)

    fault = small.truth["faults"].filter(pc.equal(small.truth["faults"]["job_id"], job_id))
    issue = [e for e in complete if e["cat"] == "issue"]
    assert [(e["name"], names[e["tid"]]) for e in issue] == [("restart", "issues: restart")]
    assert issue[0]["ts"] == pytest.approx(ns(fault["start"])[0] / 1000, abs=0.5)
    assert issue[0]["args"]["wasted_gpu_h"] == pytest.approx(fault["wasted_gpu_s"][0].as_py() / 3600)
    assert issue[0]["args"]["evidence"]["replaced_host"] == {"new": "gpu0028", "old": "gpu0026"}


def test_unknown_job_and_missing_warehouse_are_report_errors(small, tmp_path):
    with pytest.raises(reports.ReportError, match="no job 'nope'"):
        trace.export_trace(small.root, "nope", tmp_path / "t.json")
    with pytest.raises(reports.ReportError, match="run the pipeline"):
        reports.connect(tmp_path / "empty")
    shutil.copytree(small.root / "issues", tmp_path / "no-flows" / "issues")
    warehouse.refresh_database(tmp_path / "no-flows")
    with pytest.raises(reports.ReportError, match="no flow_minutes"):
        reports.connect(tmp_path / "no-flows")
    with reports.connect(small.root) as con, pytest.raises(reports.ReportError, match="no report"):
        reports.run_report(con, "base")
