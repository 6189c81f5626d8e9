"""Replayed real traces: the steps are the trace's, the truth names its slow ranks, the flows follow
its operations."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism_core.analysis import analyze_hour
from prism_core.diagnosis import DEFAULT_PARAMS as DIAGNOSIS_PARAMS
from prism_core.diagnosis import stragglers
from prism_core.diagnosis.job_hour import JobHour
from prism_core.evaluate.steps import score
from prism_core.ingest import dedupe, parse_flow_file
from prism_core.minutes import HOUR_NS, minute_aggregates
from prism_core.recognition import recognize_hour
from prism_core.simulate import SCENARIOS, write_scenario
from prism_core.simulate.replay import DEFAULT_WHATIF, Trace, TraceError
from prism_core.topology import Topology

WHATIF = Path(os.environ.get("PRISM_WHATIF", DEFAULT_WHATIF))
pytestmark = pytest.mark.skipif(not (WHATIF / "README.md").exists(),
                                reason=f"no What-if traces at {WHATIF} (set PRISM_WHATIF)")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """replayed(name) -> directory of a short run of scenario `name`, made once."""
    made: dict[str, Path] = {}

    def make(name: str, minutes: int = 4) -> Path:
        if name not in made:
            out = tmp_path_factory.mktemp(name)
            write_scenario(replace(SCENARIOS[name], minutes=minutes), out, seed=0, whatif_dir=WHATIF)
            made[name] = out
        return made[name]

    return make


def truth(out: Path, table: str) -> dict:
    return pq.read_table(out / "truth" / f"{table}.parquet").to_pydict()


def clean_flows(out: Path) -> pa.Table:
    """The replay's flow records as ingest keeps them: parsed, without duplicates."""
    files = sorted((out / "flows").iterdir())
    return dedupe(pa.concat_tables([parse_flow_file(f.read_bytes(), f.name).clean for f in files]))[0]


@pytest.mark.parametrize("name, trace", [("replay-ar", "AR"), ("replay-st", "ST")])
def test_replayed_steps_are_the_traces_step_times(replayed, name, trace):
    out = replayed(name, minutes=4 if trace == "ST" else 12)
    durations = Trace(WHATIF, trace).durations
    steps = truth(out, "steps")
    seconds = np.array([(e - s).total_seconds() for s, e in zip(steps["start"], steps["end"])])
    expected = durations[np.asarray(steps["step"]) % len(durations)]
    assert len(seconds) >= 10
    np.testing.assert_allclose(seconds, expected, atol=2e-6)  # truth times are whole microseconds
    starts = [s.timestamp() for s in steps["start"]]
    ends = [e.timestamp() for e in steps["end"]]
    assert np.allclose(starts[1:], ends[:-1], atol=2e-6)  # back to back


def test_the_slow_worker_and_the_slow_stage_are_faults_with_their_hosts(replayed):
    ar, st = truth(replayed("replay-ar", minutes=12), "faults"), truth(replayed("replay-st"), "faults")
    assert ar["kind"] == ["straggler"] and ar["subject"] == ["gpu0000"]  # dp rank 0, stage 0: ranks 0-3
    ar_params = json.loads(ar["params"][0])
    assert ar_params["cause"] == "slow worker" and 2.0 < ar_params["factor"] < 2.8
    assert ar_params["slow_ranks"] == [{"dp_rank": 0, "stage": 0}]
    # ST in tp-pp-dp order, 2 GPUs per host: stage 3 is rank 3 (host 1) and rank 7 (host 3)
    assert st["kind"] == ["straggler"] and st["subject"] == ["gpu0001,gpu0003"]
    st_params = json.loads(st["params"][0])
    assert st_params["cause"] == "slow stage" and 1.4 < st_params["factor"] < 1.9
    assert ar["wasted_gpu_s"][0] > 0 and st["wasted_gpu_s"][0] > 0


def test_job_gpus_and_flows_follow_the_placement(replayed):
    out = replayed("replay-st")
    gpus = truth(out, "job_gpus")
    assert len(gpus["addr"]) == 8 and set(gpus["host"]) == {"gpu0000", "gpu0001", "gpu0002", "gpu0003"}
    coords = {(h, g): (s, d) for h, g, s, d in zip(gpus["host"], gpus["gpu"], gpus["pp_stage"], gpus["dp_rank"])}
    assert coords[("gpu0001", 1)] == (3, 0) and coords[("gpu0003", 1)] == (3, 1)
    flows = duckdb.sql(f"""select distinct src_addr, dst_addr from read_parquet('{out}/flows/*.parquet')
                          where dst_port = 4791 and src_addr like '10.1.%' and dst_addr like '10.1.%'""").fetchall()
    pairs = truth(out, "pairs")
    assert {(s, d) for s, d in zip(pairs["src_addr"], pairs["dst_addr"])} <= set(flows)
    assert set(pairs["kind"]) == {"dp", "pp", "other"}


def test_the_eight_gpu_replay_is_recognized_as_its_eight_gpus(replayed):
    """ST holds GPUs 0-1 of four otherwise idle hosts: its DP ring shows the rails a job of whole
    hosts would, but its pipeline hops show where its GPUs on each host end."""
    out = replayed("replay-st")
    flows = clean_flows(out)
    topology = Topology.from_csv_bytes((out / "topology.csv").read_bytes())
    found = recognize_hour(minute_aggregates(flows), topology, None, SCENARIOS["replay-st"].start_ns)
    assert found.jobs["n_gpus"].to_pylist() == [8]
    members = {(row["host"], row["gpu"]) for row in found.membership.to_pylist()}
    assert members == {(f"gpu000{h}", g) for h in range(4) for g in (0, 1)}


def test_the_slow_worker_is_the_straggler_its_stage_peers_wait_for(replayed):
    """AR's slow worker (dp rank 0 of stage 0, on gpu0000) is slow in every step: on the true
    steps and pairs, the straggler detector names its host in most steps, as far behind its stage
    peer as the what-if analysis says it costs (half of each step: 46.3 s measured, 23.4 s without it)."""
    out = replayed("replay-ar", minutes=12)
    flows = clean_flows(out)
    tables = {name: pq.read_table(out / "truth" / f"{name}.parquet") for name in ("job_gpus", "pairs", "steps")}
    start_ns = SCENARIOS["replay-ar"].start_ns
    job = JobHour.build("sim-job-000", flows, tables["job_gpus"], tables["pairs"], tables["steps"], None, None,
                        start_ns, start_ns + HOUR_NS, DIAGNOSIS_PARAMS)
    everything = np.zeros(job.n_steps, bool)
    culprit, behind_s = stragglers.straggler_steps(job, everything, DIAGNOSIS_PARAMS)
    named = culprit == list(job.hosts).index("gpu0000")
    assert named.mean() >= 0.6
    assert 0.4 < np.median(behind_s[named] / job.duration[named]) < 0.6
    longest = max(stragglers.straggler_windows(job, everything, None, DIAGNOSIS_PARAMS), key=lambda w: len(w.run))
    assert job.hosts[longest.code] == "gpu0000"


def test_the_parameter_gather_opening_each_ar_step_dates_it(replayed):
    """AR's distributed optimizer gathers its parameters (bf16: other transfer sizes than the fp32
    gradients' reduce-scatter) at each step's start while the rings waiting on the slow rank still
    reduce-scatter: no quiet parts the two collectives, yet the gather dates every step (each was
    0.6-1.1% late while the gather was read as the end of the sync)."""
    out = replayed("replay-ar", minutes=12)
    flows = clean_flows(out)
    topology = Topology.from_csv_bytes((out / "topology.csv").read_bytes())
    hour = analyze_hour(flows, minute_aggregates(flows), topology, None, SCENARIOS["replay-ar"].start_ns)
    truth = {name: pq.read_table(out / "truth" / f"{name}.parquet") for name in ("steps", "job_gpus")}
    figures = score(truth, hour.tables, {})
    assert figures["truth_steps"].value >= 12
    assert figures["steps_within_1pct"].value >= 0.95


def test_a_pipeline_send_starts_when_the_receiver_is_ready(replayed):
    """The first activation from stage 1 to stage 2 of replica 0 in the first replayed step leaves
    at the later of the send and the receive the trace shows."""
    trace = Trace(WHATIF, "ST")
    send, recv = trace.ops["forward-send"][0][0, 0, 1, 0], trace.ops["forward-recv"][0][0, 0, 2, 0]
    assert abs(send - recv) > 1e-3  # the two sides do start apart
    out = replayed("replay-st")
    origin = SCENARIOS["replay-st"].start_ns / 1e9
    first_step = truth(out, "steps")["start"][0].timestamp() - origin
    # stage 1 of replica 0 is rank 1 (host 0, GPU 1), stage 2 rank 2 (host 1, GPU 0): PXN relays
    # through host 0's GPU 0, so the flow goes NIC 0 of host 0 to NIC 0 of host 1
    start = duckdb.sql(f"""select min(time_flow_start_ns) / 1e9 - {origin} from read_parquet('{out}/flows/*.parquet')
                          where src_addr = '10.1.0.1' and dst_addr = '10.1.0.2'""").fetchall()[0][0]
    skew = json.loads((out / "truth" / "noise.json").read_text())["exporters"]["leaf-p00-r0"]["clock_skew_ns"] / 1e9
    assert start - skew - first_step == pytest.approx(max(send, recv), abs=5e-4)  # launch skew: 0.3 ms


def test_mix_puts_simulated_jobs_beside_the_replays(replayed):
    out = replayed("replay-mix", minutes=6)
    jobs = truth(out, "jobs")
    assert jobs["job_id"][:2] == ["sim-job-000", "sim-job-001"] and jobs["n_gpus"][:2] == [64, 8]
    replay_hosts = set(jobs["hosts"][0]) | set(jobs["hosts"][1])
    others = [set(h) for h in jobs["hosts"][2:]]
    assert others and all(not (h & replay_hosts) for h in others)
    assert {f for f in truth(out, "faults")["subject"]} >= {"gpu0000", "gpu0009,gpu0011"}


def test_missing_traces_say_where_they_were_looked_for(tmp_path):
    with pytest.raises(TraceError, match=str(tmp_path)):
        write_scenario(replace(SCENARIOS["replay-st"], minutes=1), tmp_path / "out", whatif_dir=tmp_path)
