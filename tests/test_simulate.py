"""The simulator writes hard, realistic traffic and truth that agrees with it."""

from __future__ import annotations

import gzip
import ipaddress
import json
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from prism_core.schema import TOPOLOGY
from prism_core.simulate import SCENARIOS, FaultSpec, JobSpec, write_scenario
from prism_core.simulate.export import FLOW_FILE, HUGE_BYTES
from prism_core.simulate.model import one_f_one_b
from prism_core.truth import TRUTH_FAULT_KINDS, TRUTH_TABLES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    write_scenario("tiny", out, seed=0)
    return out


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("small")
    write_scenario("small", out, seed=3)
    return out


def truth(out: Path, table: str) -> pa.Table:
    return pq.read_table(out / "truth" / f"{table}.parquet")


def noise(out: Path) -> dict:
    return json.loads((out / "truth" / "noise.json").read_text())


@pytest.fixture(scope="module")
def tiny_db(tiny) -> duckdb.DuckDBPyConnection:
    return flows_db(tiny)


@pytest.fixture(scope="module")
def small_db(small) -> duckdb.DuckDBPyConnection:
    return flows_db(small)


def flows_db(out: Path) -> duckdb.DuckDBPyConnection:
    """DuckDB with `raw` (every row written), `flows` (valid rows, once each, sampling undone, times
    in seconds from the scenario start), `steps` and `owner` (which job holds a host when)."""
    con = duckdb.connect()
    origin = SCENARIOS[noise(out)["scenario"]["name"]].start_ns
    con.create_function("bad_addr", _bad_pair, [str, str], bool, null_handling="special")
    con.execute(f"create view raw as select * from read_parquet('{out}/flows/*.parquet')")
    con.execute(f"""
        create table flows as select distinct
            src_addr, dst_addr, bytes * sampling_rate as size, src_port, dst_port, proto,
            (time_flow_start_ns - {origin}) / 1e9 as t0, (time_flow_end_ns - {origin}) / 1e9 as t1
        from raw
        where time_flow_start_ns is not null and time_flow_end_ns >= time_flow_start_ns
          and bytes > 0 and bytes < {HUGE_BYTES} and src_addr like '10.%' and dst_addr like '10.%'
          and src_addr not like '%:%' and dst_addr not like '%:%'""")
    con.execute(f"""
        create view steps as select job_id, step, checkpoint, attempt,
            (epoch_ns(start::timestamptz) - {origin}) / 1e9 as s0,
            (epoch_ns("end"::timestamptz) - {origin}) / 1e9 as s1
        from read_parquet('{out}/truth/steps.parquet')""")
    con.execute(f"""create view jobs as select job_id, dp, pp, tp, collective, hosts,
            (epoch_ns(start::timestamptz) - {origin}) / 1e9 as j0,
            (epoch_ns("end"::timestamptz) - {origin}) / 1e9 as j1
        from read_parquet('{out}/truth/jobs.parquet')""")
    con.execute(f"create view topo as select * from read_csv('{out}/topology.csv')")
    con.execute(f"create view pairs as select * from read_parquet('{out}/truth/pairs.parquet')")
    con.execute(f"create view gpus as select * from read_parquet('{out}/truth/job_gpus.parquet')")
    return con


def test_one_f_one_b_matches_the_operator_level_formula():
    for pp, m in [(1, 4), (2, 8), (4, 8), (8, 16)]:
        fwd, bwd, no_comm = np.full(pp, 0.1), np.full(pp, 0.2), np.zeros(pp - 1)
        fwd_start, bwd_start = one_f_one_b(fwd, bwd, no_comm, no_comm, m)
        assert (bwd_start[0, -1] + 0.2) == pytest.approx((m - 1 + pp) * 0.3)
        assert np.all(fwd_start[1:] >= fwd_start[:-1] + 0.1 - 1e-12)  # activations flow downstream
    # a slow stage holds its neighbours back
    fwd = np.array([0.1, 0.15, 0.1])
    _, bwd_start = one_f_one_b(fwd, 2 * fwd, np.zeros(2), np.zeros(2), 8)
    assert bwd_start[0, -1] + 0.2 > (8 - 1 + 3) * 0.3 + 0.5


def test_same_seed_same_bytes_and_other_seed_other_bytes(tiny, tmp_path):
    write_scenario("tiny", tmp_path / "again", seed=0)
    write_scenario("tiny", tmp_path / "other", seed=1)
    files = sorted(p.relative_to(tiny) for p in tiny.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*")
                           if p.is_file())
    for rel in files:
        assert (tiny / rel).read_bytes() == (tmp_path / "again" / rel).read_bytes(), rel
    assert (tiny / "truth/steps.parquet").read_bytes() != (tmp_path / "other/truth/steps.parquet").read_bytes()


def test_layout_and_schemas(tiny, tiny_db):
    flow_files = sorted((tiny / "flows").iterdir())
    # 09:54-10:06 on one pod of 8 leaves: files of 09:50 and 10:00, one per leaf
    assert [p.name for p in flow_files[:2]] == ["2026-11-22T09-50_leaf-p00-r0.parquet",
                                                "2026-11-22T09-50_leaf-p00-r1.parquet"]
    assert len(flow_files) == 16
    for path in flow_files:
        assert pq.read_schema(path).equals(FLOW_FILE)
    for name, schema in TRUTH_TABLES.items():
        assert pq.read_schema(tiny / "truth" / f"{name}.parquet").equals(schema), name
    topology = pacsv.read_csv(tiny / "topology.csv")
    assert topology.column_names == TOPOLOGY.names
    assert topology.num_rows == 8 * 8
    # storage and management servers talk on the network but are not in the GPU inventory
    stored = set(noise(tiny)["storage_addrs"]) | set(noise(tiny)["management_addrs"])
    assert not stored & set(topology["addr"].to_pylist())
    con = tiny_db
    assert con.execute("select count(*) from flows where dst_addr like '10.200.%'").fetchone()[0] > 0


def test_job_gpus_follow_megatron_rank_order(small):
    jobs = {j["job_id"]: j for j in truth(small, "jobs").to_pylist()}
    ranks: dict[tuple[str, str], list[int]] = {}
    for row in truth(small, "job_gpus").to_pylist():
        job = jobs[row["job_id"]]
        rank = row["tp_rank"] + job["tp"] * (row["dp_rank"] + job["dp"] * row["pp_stage"])
        assert rank % 8 == row["gpu"] and rank < job["n_gpus"]
        ranks.setdefault((row["job_id"], row["host"]), []).append(rank)
    for (job_id, host), held in ranks.items():
        slot = held[0] // 8  # a host holds 8 consecutive ranks, in its slot of the job
        assert held == list(range(8 * slot, 8 * slot + 8))
        hosts = jobs[job_id]["hosts"]
        assert slot == hosts.index(host) or hosts.index(host) >= jobs[job_id]["n_hosts"]  # replacement
    assert sum(j["n_gpus"] for j in jobs.values()) + 8 == len(ranks) * 8  # one replaced host


def test_every_cross_host_flow_is_rail_aligned(small_db):
    con = small_db
    misaligned, aligned = con.execute("""
        select count(*) filter (where s.gpu <> d.gpu), count(*) filter (where s.gpu = d.gpu)
        from flows f join topo s on f.src_addr = s.addr join topo d on f.dst_addr = d.addr""").fetchone()
    assert misaligned == 0 and aligned > 100_000


def test_pp_pairs_carry_steady_same_size_sends(small_db):
    con = small_db
    rows = con.execute("""
        with pp_only as (select job_id, src_addr, dst_addr from pairs group by all
                         having count(*) = 1 and any_value(kind) = 'pp')
        select p.job_id, p.src_addr, p.dst_addr, count(distinct f.size) sizes, count(*) n,
               count(distinct s.step) steps_hit,
               -- where in its step each send happens, as a share of the step
               quantile_cont((f.t0 - s.s0) / (s.s1 - s.s0), 0.1) early,
               quantile_cont((f.t0 - s.s0) / (s.s1 - s.s0), 0.9) late
        from pp_only p join flows f using (src_addr, dst_addr)
        join steps s on s.job_id = p.job_id and f.t0 between s.s0 and s.s1 and not s.checkpoint
        group by all""").fetchall()
    assert len(rows) > 300
    for job, src, dst, sizes, n, steps_hit, early, late in rows:
        assert sizes == 1, (job, src, dst)
        assert n >= 2 * steps_hit  # several micro-batches per step
        assert late - early > 0.4  # spread through the step, not a burst


def test_dp_pairs_burst_together_at_step_ends(tiny_db):
    con = tiny_db
    # ring (job 1) and rs_ag (job 2) DP traffic outside the straggler's span
    rows = con.execute("""
        with dp as (select distinct job_id, src_addr, dst_addr from pairs where kind = 'dp')
        select s.job_id, s.step, min(f.t1) - s.s1, max(f.t1) - s.s1, s.s1 - s.s0, count(distinct f.size)
        from dp join flows f using (src_addr, dst_addr)
        join steps s on s.job_id = dp.job_id and f.t0 between s.s0 and s.s1
        join jobs j on j.job_id = s.job_id
        where j.collective in ('ring', 'rs_ag') and not s.checkpoint and not (s.s0 between 230 and 370)
        group by s.job_id, s.step, s.s0, s.s1""").fetchall()
    assert len(rows) > 100
    for job, step, first_end, last_end, duration, sizes in rows:
        assert -0.2 * duration < first_end < last_end < 0.01 * duration, (job, step)
        assert sizes <= 4  # buckets (a smaller tail bucket), rs and ag shares


def test_straggler_peers_wait_in_the_sync(tiny, tiny_db):
    """In a straggler step, the peers' first sync flows start early and stretch; the straggler's
    flows start last and look normal."""
    con = tiny_db
    fault = truth(tiny, "faults").filter(pc.field("kind") == "straggler").to_pylist()[0]
    straggler_nics = [r["addr"] for r in truth(tiny, "job_gpus").to_pylist() if r["host"] == fault["subject"]]
    rows = con.execute(f"""
        with dp as (select distinct src_addr, dst_addr from pairs where kind = 'dp' and job_id = ?)
        select f.src_addr in ({",".join("?" * len(straggler_nics))}) as late, max(f.t1 - f.t0), min(f.t0)
        from dp join flows f using (src_addr, dst_addr)
        join steps s on s.job_id = ? and f.t0 between s.s0 and s.s1 and s.step = (
            select min(step) from steps where job_id = ? and s0 > 250) group by 1 order by 1""",
                       [fault["job_id"], *straggler_nics, fault["job_id"], fault["job_id"]]).fetchall()
    (peer_longest, peer_first), (straggler_longest, straggler_first) = [r[1:] for r in rows]
    assert straggler_first > peer_first + 0.5
    assert peer_longest > 10 * straggler_longest


def test_hung_job_goes_silent(tiny, tiny_db):
    con = tiny_db
    hang = truth(tiny, "faults").filter(pc.field("kind") == "hang").to_pylist()[0]
    origin = SCENARIOS["tiny"].start_ns / 1e9
    at = hang["start"].timestamp() - origin
    silent_until = hang["end"].timestamp() - origin
    job = hang["job_id"]
    last = dict(con.execute("""
        select g.addr, max(f.t0) from gpus g join flows f on f.src_addr = g.addr or f.dst_addr = g.addr
        join pairs p on p.job_id = g.job_id and p.src_addr = f.src_addr and p.dst_addr = f.dst_addr
        where g.job_id = ? and f.t0 < ? group by 1""", [job, silent_until]).fetchall())
    assert last[hang["subject"]] < at  # the hung GPU's NIC stops first
    assert max(last.values()) < at + 5  # its peers within seconds
    # nothing between the job's NICs until its allotment ends
    assert con.execute("""
        select count(*) from flows f join gpus a on f.src_addr = a.addr join gpus b on f.dst_addr = b.addr
        where a.job_id = ? and b.job_id = ? and f.t0 between ? and ?""",
                       [job, job, at + 5, silent_until]).fetchone()[0] == 0
    assert con.execute("select max(s1) from steps where job_id = ?", [job]).fetchone()[0] <= at


def test_noise_counts_match_the_files(tiny, tiny_db):
    counts = noise(tiny)
    con = tiny_db
    total, malformed = con.execute("""
        select count(*), count(*) filter (where time_flow_start_ns is null or time_flow_end_ns is null
            or src_addr is null or dst_addr is null or bytes is null or bytes <= 0 or bytes >= ?
            or time_flow_end_ns < time_flow_start_ns or bad_addr(src_addr, dst_addr))
        from raw""", [HUGE_BYTES]).fetchone()
    duplicates = con.execute("""with good as (select * from raw where bytes > 0 and bytes < ?
        and time_flow_end_ns >= time_flow_start_ns and src_addr like '10.%' and dst_addr like '10.%')
        select (select count(*) from good) - (select count(*) from (select distinct * from good))""",
                             [HUGE_BYTES]).fetchone()[0]
    assert malformed == counts["malformed_total"] == sum(counts["malformed"].values())
    assert all(n > 0 for n in counts["malformed"].values())
    assert duplicates == counts["duplicates"]
    assert total == counts["rows_written"] == counts["records"] + duplicates + malformed
    assert 0.003 < duplicates / total < 0.008
    # some duplicates were re-sent in the exporter's next file
    per_file = con.execute("""select count(distinct filename) from (select *, count(*) over
        (partition by time_flow_start_ns, src_addr, dst_addr, src_port) n
        from read_parquet(?, filename = true)) where n > 1
        group by time_flow_start_ns, src_addr, dst_addr, src_port having count(distinct filename) > 1""",
                           [f"{tiny}/flows/*.parquet"]).fetchall()
    assert len(per_file) > 0


def _bad_pair(src: str | None, dst: str | None) -> bool:
    try:
        return ipaddress.ip_address(src).version != ipaddress.ip_address(dst).version
    except (TypeError, ValueError):
        return src is not None and dst is not None


def test_jsonl_gz_output(tmp_path):
    summary = write_scenario("tiny", tmp_path, seed=0, fmt="jsonl.gz")
    counts = noise(tmp_path)
    lines = [line for path in sorted((tmp_path / "flows").iterdir())
             for line in gzip.open(path, "rt").read().splitlines()]
    assert len(lines) == counts["rows_written"] == summary.records + summary.duplicates + summary.malformed
    parsed, broken = [], 0
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            broken += 1
    assert broken == counts["malformed"]["broken_json"] > 0
    wrong_type = sum(1 for r in parsed if any(isinstance(r.get(k), str) for k in
                                              ("bytes", "time_flow_start_ns", "src_port")))
    assert wrong_type == counts["malformed"]["wrong_type"] > 0
    first = parsed[0]
    assert first["type"] == "IPFIX" and first["proto"] in ("UDP", "TCP")
    assert {"time_flow_start_ns", "time_flow_end_ns", "src_addr", "dst_addr", "bytes", "sampler_address",
            "time_received_ns", "sampling_rate"} <= first.keys()


def test_only_injected_transfers_cross_between_jobs(small, small_db):
    con = small_db
    injected = {(t["src_addr"], t["dst_addr"]) for t in noise(small)["cross_job_transfers"]}
    assert len(injected) == 3
    crossing = con.execute("""
        with owner as (select job_id, unnest(hosts) host, j0, j1 from jobs)
        select distinct f.src_addr, f.dst_addr from flows f
        join topo s on f.src_addr = s.addr join topo d on f.dst_addr = d.addr
        where not exists (select 1 from owner a join owner b using (job_id)
                          where a.host = s.host and b.host = d.host and f.t0 between a.j0 - 1 and a.j1 + 5)
    """).fetchall()
    assert set(crossing) == injected


def test_small_has_every_shape_and_fault(small, small_db):
    jobs = truth(small, "jobs")
    assert {1, 2, 4, 8} <= set(jobs["tp"].to_pylist())
    assert max(jobs["pp"].to_pylist()) == 8 and max(jobs["dp"].to_pylist()) >= 16
    assert {"ring", "tree", "rs_ag", "zero"} <= set(jobs["collective"].to_pylist())
    assert any(jobs["moe"].to_pylist()) and not all(jobs["has_network"].to_pylist())
    faults = truth(small, "faults")
    assert set(faults["kind"].to_pylist()) == set(TRUTH_FAULT_KINDS)
    assert all(w > 0 for w in faults["wasted_gpu_s"].to_pylist())
    restart = faults.filter(pc.field("kind") == "restart").to_pylist()[0]
    assert json.loads(restart["params"])["replaced_host"] == {"old": "gpu0026", "new": "gpu0028"}
    steps = truth(small, "steps").filter(pc.field("job_id") == restart["job_id"])
    numbers, attempts = steps["step"].to_numpy(), steps["attempt"].to_numpy()
    assert np.all(np.diff(numbers) == 1) and set(attempts) == {0, 1}
    # the one-host job and the drained hosts put nothing on the GPU fabric
    con = small_db
    one_host = jobs.filter(pc.invert(pc.field("has_network"))).to_pylist()[0]["hosts"][0]
    assert con.execute("""select count(*) from flows f join topo s on f.src_addr = s.addr
        join topo d on f.dst_addr = d.addr where s.host = ? or d.host = ?""",
                       [one_host, one_host]).fetchone()[0] == 0
    assert con.execute("""select count(*) from flows f join topo t on t.addr in (f.src_addr, f.dst_addr)
        where t.host in ('gpu0062', 'gpu0063')""").fetchone()[0] == 0
    # a job starts on the hosts another left less than a minute before
    lives = con.execute("select j0, j1, hosts from jobs").fetchall()
    assert any(hosts_a == hosts_b and 0 < start_b - end_a < 60
               for _, end_a, hosts_a in lives for start_b, _, hosts_b in lives)


def test_step_times_follow_the_nominal_step(tiny_db):
    spec = SCENARIOS["tiny"].jobs[0]
    con = tiny_db
    durations = np.array([d for (d,) in con.execute("""
        select s1 - s0 from steps join jobs using (job_id)
        where not checkpoint and len(hosts) = 4 and s0 < 230""").fetchall()])
    assert np.median(durations) == pytest.approx(spec.step_s, rel=0.08)
    assert 0.005 < np.std(durations) / np.mean(durations) < 0.05  # jitter, not a metronome


def test_custom_scenario_with_a_replaced_host_restart(tmp_path):
    scenario = replace(SCENARIOS["tiny"], name="tiny", minutes=6, jobs=(
        JobSpec(2, tp=8, pp=1, start_s=10, end_s=1e9, step_s=3.0, checkpoint_s=60, hosts=(0, 1),
                faults=(FaultSpec("restart", at_s=150, gap_s=60, host=1, replace_host=5),)),))
    write_scenario(scenario, tmp_path, seed=0)
    fault = truth(tmp_path, "faults").to_pylist()[0]
    params = json.loads(fault["params"])
    assert params["replaced_host"]["new"] == "gpu0005" and params["gap_s"] == 60
    steps = truth(tmp_path, "steps")
    first_after = steps.filter(pc.field("attempt") == 1).to_pylist()[0]
    assert (first_after["start"] - fault["start"]).total_seconds() == pytest.approx(60, abs=0.01)
    # training restarts from the last checkpoint: the lost work is at most one checkpoint interval
    assert 0 < params["lost_since_checkpoint_s"] <= 60 + 3.5
    assert fault["wasted_gpu_s"] > 16 * (60 + params["lost_since_checkpoint_s"])
    gpus = truth(tmp_path, "job_gpus")
    assert sorted(set(gpus["host"].to_pylist())) == ["gpu0000", "gpu0001", "gpu0005"]
    # the replaced host leaves at the failure, its replacement joins at the resume
    job = truth(tmp_path, "jobs").to_pylist()[0]
    spans = {(r["host"], r["start"], r["end"]) for r in gpus.to_pylist()}
    assert spans == {("gpu0000", job["start"], job["end"]), ("gpu0001", job["start"], fault["start"]),
                     ("gpu0005", first_after["start"], job["end"])}


def test_a_restarted_job_connects_anew_on_new_queue_pairs(tmp_path):
    scenario = replace(SCENARIOS["tiny"], name="tiny", minutes=6, jobs=(
        JobSpec(2, tp=8, pp=1, start_s=10, end_s=1e9, step_s=3.0, checkpoint_s=60, hosts=(0, 1),
                faults=(FaultSpec("restart", at_s=150, gap_s=60, host=1),)),))
    write_scenario(scenario, tmp_path, seed=0)
    resumed_ns = truth(tmp_path, "steps").filter(pc.field("attempt") == 1)["start"].cast(pa.int64())[0].as_py()
    ports = duckdb.sql(f"""
        select src_addr, dst_addr, time_flow_start_ns >= {resumed_ns} as resumed, list(distinct src_port) as ports
        from read_parquet('{tmp_path}/flows/*.parquet')
        where src_addr like '10.1.%' and dst_addr like '10.1.%' group by all""").fetchall()  # GPU to GPU
    by_pair = {}
    for src, dst, resumed, used in ports:
        by_pair.setdefault((src, dst), {})[resumed] = set(used)
    both = [sides for sides in by_pair.values() if len(sides) == 2]
    assert len(both) >= 8  # the job's pairs of both attempts: each on new source ports after the restart
    assert all(not sides[False] & sides[True] for sides in both)


def test_a_hang_holds_the_hosts_until_the_watchdog_kills_it(tmp_path):
    """Two data-parallel jobs hang at 100 s; the watchdog kills them 120 s later. One is restarted
    from its checkpoint 40 s after the kill, the other ends."""
    def job(hosts, resume):
        return JobSpec(2, tp=8, pp=1, start_s=10, end_s=1e9, step_s=3.0, checkpoint_s=60, hosts=hosts,
                       faults=(FaultSpec("hang", at_s=100, host=1, rail=2, resume=resume, gap_s=40),))
    scenario = replace(SCENARIOS["tiny"], name="tiny", minutes=6, hang_watchdog_s=120.0,
                       jobs=(job((0, 1), True), job((2, 3), False)))
    write_scenario(scenario, tmp_path, seed=1)
    con = flows_db(tmp_path)
    faults = {(f["job_id"], f["kind"]): f for f in truth(tmp_path, "faults").to_pylist()}
    assert sorted(faults) == [("sim-job-000", "hang"), ("sim-job-000", "restart"), ("sim-job-001", "hang")]
    for job_id in ("sim-job-000", "sim-job-001"):
        hang = faults[(job_id, "hang")]
        params = json.loads(hang["params"])
        assert (hang["end"] - hang["start"]).total_seconds() == pytest.approx(120, abs=1e-3)
        assert params["killed_at_s"] == pytest.approx(220, abs=1e-3)
        # the work since the checkpoint and the silence until the kill are lost
        assert hang["wasted_gpu_s"] == pytest.approx(16 * (120 + params["lost_since_checkpoint_s"]), abs=0.02)
        # the hung NIC misses the collective its peers began at the end of the step, then all block
        last_step_end = con.execute("select max(s1) from steps where job_id = ? and s1 < 100", [job_id]).fetchone()[0]
        unfinished = con.execute("""select count(*), count(*) filter (where ? in (src_addr, dst_addr))
            from flows f join topo s on f.src_addr = s.addr join topo d on f.dst_addr = d.addr
            join jobs j on j.job_id = ? and list_contains(j.hosts, s.host) and list_contains(j.hosts, d.host)
            where f.t0 between ? and 105""", [hang["subject"], job_id, last_step_end]).fetchone()
        assert unfinished[0] > 0 and unfinished[1] == 0
    restart = faults[("sim-job-000", "restart")]
    assert json.loads(restart["params"])["after_hang"] and restart["start"] == faults[("sim-job-000", "hang")]["end"]
    resumed = con.execute("select min(s0) from steps where job_id = 'sim-job-000' and attempt = 1").fetchone()[0]
    assert resumed == pytest.approx(260, abs=0.01)
    assert restart["wasted_gpu_s"] > 16 * 40  # the downtime, and the warm-up after it
    # before it resumes, the restarted job reads its checkpoint back: the saving GPUs (dp rank 0,
    # host 0) each read the 4 chunks they wrote, from storage, in the seconds before the resume
    load = con.execute("""
        with saved as (select max(size) chunk from flows w join topo s on w.src_addr = s.addr
                       where s.host = 'gpu0000' and w.dst_addr not in (select addr from topo))
        select count(*), count(distinct dst_addr), min(t0), max(t1) from flows f join topo d on f.dst_addr = d.addr
        where d.host in ('gpu0000', 'gpu0001') and f.src_addr not in (select addr from topo)
          and f.size = (select chunk from saved) and f.t0 > 105""").fetchone()
    assert load[:2] == (32, 8) and 220 < load[2] and load[3] <= 260 + 0.1
    silent = """select count(*) from flows f join topo s on f.src_addr = s.addr join topo d on f.dst_addr = d.addr
        where s.host in ('gpu0002', 'gpu0003') and d.host in ('gpu0002', 'gpu0003') and f.t0 > 105"""
    assert con.execute(silent).fetchone()[0] == 0  # the job that ended never comes back


def test_slow_link_shows_as_the_slowest_nic(small, small_db):
    con = small_db
    fault = truth(small, "faults").filter(pc.field("kind") == "slow_link").to_pylist()[0]
    origin = SCENARIOS["small"].start_ns / 1e9
    lo, hi = fault["start"].timestamp() - origin, fault["end"].timestamp() - origin
    throughput = dict(con.execute("""
        with x as (select f.* from flows f join (select distinct src_addr, dst_addr from pairs
                   where job_id = ?) using (src_addr, dst_addr) where f.t0 between ? and ?),
        per_nic as (select src_addr addr, size / (t1 - t0) rate from x
                    union all select dst_addr, size / (t1 - t0) from x)
        select addr, median(rate) from per_nic group by 1""", [fault["job_id"], lo, hi]).fetchall())
    slowest = sorted(throughput, key=throughput.get)
    assert fault["subject"] in slowest[:2]
    assert throughput[fault["subject"]] < 0.5 * np.median(list(throughput.values()))


def test_moe_all_to_all_has_several_sizes(small, small_db):
    con = small_db
    sizes = con.execute("""select count(distinct f.size) from pairs p join jobs j using (job_id)
        join flows f using (src_addr, dst_addr) where p.kind = 'other' and j.collective = 'ring'
        and p.job_id in (select job_id from read_parquet(?) where moe) group by p.src_addr, p.dst_addr""",
                        [f"{small}/truth/jobs.parquet"]).fetchall()
    assert len(sizes) > 10 and min(n for (n,) in sizes) >= 3
