"""Every dimension the `sealed` family varies shows in the simulated traffic or its truth."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from prism_core.constants import CHECKPOINT_FLOW_BYTES
from prism_core.simulate import SCENARIOS, JobSpec, Scenario, write_scenario
from prism_core.simulate.cluster import Cluster, Placement
from prism_core.simulate.model import job_model
from prism_core.simulate.scenarios import FOREVER, FleetMix, allocate, scenario_jobs
from prism_core.simulate.traffic import DP, OTHER, PP, Condition, step_template
from prism_core.simulate.variation import (
    DIMENSIONS,
    THRESHOLD_FAULT_SIZES,
    Traits,
    Variation,
)

START = SCENARIOS["tiny"].start


def quiet(name: str, n_hosts: int, minutes: int, **options) -> Scenario:
    """A scenario whose exporters add no noise, so that flows are the simulator's own."""
    return Scenario(name=name, start=START, minutes=minutes, n_hosts=n_hosts, cross_job_transfers=0,
                    duplicate_rate=0.0, malformed_rate=0.0, sampled_leaves=0, clock_skew_ms=0.0, **options)


class Run:
    """A simulated scenario: its job flows (RoCE between GPU NICs, seconds from the start) and truth."""

    def __init__(self, scenario: Scenario, out: Path, seed: int = 1):
        write_scenario(scenario, out, seed)
        self.out = out
        origin = scenario.start_ns
        self.flows = duckdb.sql(f"""
            select src_addr, dst_addr, bytes, (time_flow_start_ns - {origin}) / 1e9 as t0,
                   (time_flow_end_ns - {origin}) / 1e9 as t1
            from read_parquet('{out}/flows/*.parquet') where dst_port = 4791 order by t0""").arrow().read_all()
        self.steps = duckdb.sql(f"""
            select job_id, step, checkpoint, (epoch_ns(start) - {origin}) / 1e9 as s0,
                   (epoch_ns("end") - {origin}) / 1e9 as s1
            from read_parquet('{out}/truth/steps.parquet') order by job_id, s0""").arrow().read_all()

    def truth(self, table: str):
        return pq.read_table(self.out / "truth" / f"{table}.parquet")

    def column(self, name: str) -> np.ndarray:
        return self.flows[name].to_numpy(zero_copy_only=False)

    def step_bounds(self, job_id: str = "sim-job-000") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start, end and checkpoint flag of the job's truth steps."""
        mine = self.steps.filter(np.asarray(self.steps["job_id"].to_pylist()) == job_id)
        return mine["s0"].to_numpy(), mine["s1"].to_numpy(), mine["checkpoint"].to_numpy(zero_copy_only=False)


def host_of(addrs: np.ndarray) -> np.ndarray:
    """Host index of simulated GPU NIC addresses (10.<pod+1>.<rail>.<slot+1>, one pod)."""
    return np.array([int(a.split(".")[3]) - 1 for a in addrs])


def template(traits: Traits, n_hosts: int, tp: int, pp: int, **spec):
    """The job model and its nominal step template, for a job on hosts 0..n_hosts-1."""
    job = JobSpec(n_hosts, tp=tp, pp=pp, start_s=0, end_s=FOREVER, step_s=spec.pop("step_s", 10.0),
                  hosts=tuple(range(n_hosts)), traits=traits, **spec)
    model = job_model(job, np.random.default_rng(0))
    placement = Placement.of(job.hosts, job.first_gpu, job.gpus_per_host)
    return model, step_template(model, placement, Cluster(n_hosts).gpu_nic, Condition(0), salt=1)


def test_optimizer_share_is_the_gap_between_the_dp_sync_and_the_next_step(tmp_path):
    gaps = {}
    for share in (0.02, 0.15):
        job = JobSpec(2, tp=8, pp=1, start_s=0, end_s=FOREVER, step_s=4.0, micro_batches=2, hosts=(0, 1),
                      traits=Traits(optimizer_share=share))
        run = Run(quiet("optimizer", 2, 2, jobs=(job,)), tmp_path / str(share))
        start, end, _ = run.step_bounds()
        t0, t1 = run.column("t0"), run.column("t1")
        # a data-parallel job sends only its gradient ring: the last flow of a step ends its sync
        last_sync = np.array([t1[(t0 >= a) & (t0 < b)].max() for a, b in zip(start[:-1], end[:-1])])
        gaps[share] = np.median((start[1:] - last_sync) / (end[:-1] - start[:-1]))
    assert gaps[0.02] == pytest.approx(0.02, abs=0.006)
    assert gaps[0.15] == pytest.approx(0.15, abs=0.01)


def test_backward_forward_ratio_sets_the_first_gradient_send(tmp_path):
    for ratio in (1.5, 3.5):
        # stage 0 on host 0, stage 1 on host 1: the first activation leaves after one forward, its
        # gradient comes back after stage 1's forward and backward of that micro-batch
        job = JobSpec(2, tp=8, pp=2, start_s=0, end_s=FOREVER, step_s=6.0, micro_batches=4, hosts=(0, 1),
                      traits=Traits(backward_ratio=ratio))
        run = Run(quiet("backward", 2, 2, jobs=(job,)), tmp_path / str(ratio))
        start, end, _ = run.step_bounds()
        t0, src = run.column("t0"), host_of(run.column("src_addr"))
        estimates = []
        for a, b in zip(start, end):
            in_step = (t0 >= a) & (t0 < b)
            first_fwd = t0[in_step & (src == 0)].min() - a
            first_bwd = t0[in_step & (src == 1)].min() - a
            estimates.append((first_bwd - 2 * first_fwd) / first_fwd)
        assert np.median(estimates) == pytest.approx(ratio, rel=0.03)


def test_gpu_granular_jobs_share_hosts_and_keep_to_their_own_nics(tmp_path):
    jobs = tuple(JobSpec(2, tp=2, pp=1, start_s=0, end_s=FOREVER, step_s=3.0, micro_batches=2, gpus_per_host=4)
                 for _ in range(2))
    placed = allocate(jobs, quiet("shared", 2, 2))
    assert [(j.hosts, j.first_gpu) for j in placed] == [((0, 1), (0, 0)), ((0, 1), (4, 4))]
    run = Run(quiet("shared", 2, 2, jobs=placed), tmp_path)
    gpus = run.truth("job_gpus").to_pydict()
    by_job = {job: {(h, g) for j, h, g in zip(gpus["job_id"], gpus["host"], gpus["gpu"]) if j == job}
              for job in set(gpus["job_id"])}
    assert by_job["sim-job-000"] == {(h, g) for h in ("gpu0000", "gpu0001") for g in range(4)}
    assert by_job["sim-job-001"] == {(h, g) for h in ("gpu0000", "gpu0001") for g in range(4, 8)}
    pairs = run.truth("pairs").to_pydict()
    rails = {job: {int(a.split(".")[2]) for j, a in zip(pairs["job_id"], pairs["src_addr"]) if j == job}
             for job in by_job}
    assert rails["sim-job-000"] and rails["sim-job-000"] <= {0, 1, 2, 3}
    assert rails["sim-job-001"] and rails["sim-job-001"] <= {4, 5, 6, 7}


def test_four_nic_hosts_serve_two_gpus_per_nic(tmp_path):
    job = JobSpec(2, tp=1, pp=1, start_s=-60, end_s=FOREVER, step_s=3.0, micro_batches=2)
    scenario = quiet("four-nic", 2, 2, fleet=FleetMix(resident=(job,), arrivals=0, faults=()),
                     variation=Variation(("placement",), four_nic_share=1.0))
    run = Run(scenario, tmp_path)
    topology = duckdb.sql(f"select * from read_csv('{tmp_path}/topology.csv')").arrow().read_all().to_pydict()
    assert topology["gpu"] == [0, 2, 4, 6] * 2 and set(topology["gpus_per_nic"]) == {2}
    gpus = run.truth("job_gpus").to_pydict()
    assert len(gpus["addr"]) == 16 and len(set(gpus["addr"])) == 8  # two GPUs on each NIC
    endpoints = set(run.column("src_addr")) | set(run.column("dst_addr"))
    gpu_side = {a for a in endpoints if not a.startswith(("10.200.", "10.250."))}  # not storage, management
    assert gpu_side and gpu_side <= set(topology["addr"])


def test_rank_order_decides_which_traffic_crosses_hosts():
    # tp 4 x pp 2 x dp 2 on two hosts: Megatron's order puts a stage on each host (PP crosses,
    # DP stays on NVLink); tp-pp-dp puts a replica on each host (DP crosses, PP stays)
    kinds = {}
    for order in ("tp-dp-pp", "tp-pp-dp"):
        _, step = template(Traits(rank_order=order), 2, tp=4, pp=2)
        kinds[order] = set(step.kind.tolist())
    assert kinds == {"tp-dp-pp": {PP}, "tp-pp-dp": {DP}}



def test_rings_per_nic_cross_hosts_over_every_nic_the_group_holds():
    # tp 2 x dp 8 on 4 hosts of 4 GPUs: each DP group holds two GPUs a host. One ring crosses
    # between hosts over one NIC a host (rails 0 and 1 carry it all); a ring per NIC over both,
    # each lane with half the bytes, the collective twice as fast
    rails, sync = {}, {}
    for per_nic in (False, True):
        _, step = template(Traits(ring_per_nic=per_nic), 4, tp=2, pp=1, gpus_per_host=4)
        dp = step.kind == DP
        rails[per_nic] = set((step.src[dp] % 8).tolist()) | set((step.dst[dp] % 8).tolist())
        sync[per_nic] = (step.nbytes[dp].max(), (step.rel_end[dp] - step.rel_start[dp]).min())
    assert rails == {False: {0, 1}, True: {0, 1, 2, 3}}
    assert sync[True][0] == sync[False][0] // 2
    assert sync[True][1] == pytest.approx(sync[False][1] / 2, rel=0.01)

def test_distributed_optimizer_with_overlap_gathers_parameters_under_the_first_forward():
    spec = dict(n_hosts=4, tp=8, pp=2, collective="rs_ag")
    model, step = template(Traits(distributed_optimizer=True, overlap=True), **spec)
    first_pp = step.rel_start[step.kind == PP].min()
    gather = (step.kind == DP) & (step.rel_start < first_pp)
    assert step.rel_start[gather].min() == pytest.approx(0.0, abs=1e-9)
    # the first forward waits for the first bucket only
    bucket_ends = np.unique(step.rel_end[gather])
    assert first_pp - model.fwd_s == pytest.approx(bucket_ends[0], abs=1e-9)
    assert len(bucket_ends) > 1
    # the reduce-scatter ends the step, then the optimizer: nothing moves after it
    assert step.duration - step.rel_end.max() == pytest.approx(model.opt_s, rel=1e-6)
    # without overlap, the distributed optimizer's step is ZeRO-1/2's (the truth's convention): its
    # traffic starts after the first forward and the gather after the optimizer closes the step
    for traits in (Traits(distributed_optimizer=True), Traits()):
        model, step = template(traits, **spec)
        assert step.rel_start[step.kind == DP].min() > step.rel_start[step.kind == PP].min()
        assert step.duration == pytest.approx(step.rel_end.max(), abs=1e-3)


def test_overlap_starts_the_gradient_sync_during_the_last_backward():
    starts = {}
    for overlap in (False, True):
        model, step = template(Traits(overlap=overlap), 2, tp=1, pp=1, micro_batches=2)
        assert len(model.bucket_bytes) > 1
        starts[overlap] = np.sort(np.unique(step.rel_start[step.kind == DP]))
    compute_end = starts[False][0]
    assert starts[True][0] < compute_end - 0.5 * model.bwd_s  # the first bucket leaves early


def test_embedding_all_reduce_comes_before_the_first_and_last_stages_sync():
    for before in (False, True):
        _, step = template(Traits(embedding_before_sync=before), 4, tp=8, pp=2, tied_embeddings=True)
        embedding_end = step.rel_end[step.kind == OTHER].max()
        sync_start = step.rel_start[step.kind == DP].min()
        assert (sync_start >= embedding_end) == before


def test_interleaved_stages_send_from_the_last_stage_back_to_the_first(tmp_path):
    job = JobSpec(4, tp=8, pp=4, start_s=0, end_s=FOREVER, step_s=6.0, micro_batches=4, hosts=(0, 1, 2, 3),
                  traits=Traits(virtual_stages=2))
    run = Run(quiet("interleaved", 4, 2, jobs=(job,)), tmp_path)
    pairs = run.truth("pairs").to_pydict()
    hops = {(int(s.split(".")[3]) - 1, int(d.split(".")[3]) - 1) for s, d, k in
            zip(pairs["src_addr"], pairs["dst_addr"], pairs["kind"]) if k == "pp"}
    assert (3, 0) in hops and (0, 3) in hops  # chunk 0 of the last stage feeds chunk 1 of the first
    model, step = template(Traits(virtual_stages=2), 4, tp=8, pp=4, micro_batches=4)
    # every micro-batch crosses pp * v - 1 hops forward and back, on every tensor rank
    assert (step.kind == PP).sum() == 2 * (4 * 2 - 1) * 4 * 8 * model.channels


def test_stage_imbalance_slows_the_heavy_stage():
    gaps = {}
    for factors in ((), (0.8, 0.8, 0.8, 1.6)):
        _, step = template(Traits(stage_factors=factors), 4, tp=8, pp=4, micro_batches=8)
        host_src, host_dst = step.src // 8, step.dst // 8
        into_last = step.rel_start[(step.kind == PP) & (host_src == 2) & (host_dst == 3)].min()
        out_of_last = step.rel_start[(step.kind == PP) & (host_src == 3) & (host_dst == 2)].min()
        gaps[factors] = out_of_last - into_last  # the last stage's forward and backward of micro-batch 0
    assert gaps[(0.8, 0.8, 0.8, 1.6)] / gaps[()] == pytest.approx(1.6, rel=0.02)


def test_heavy_tails_make_rare_long_steps(tmp_path):
    ratios = {}
    for name, traits in (("textbook", Traits()), ("tail", Traits(jitter_sigma=0.02, tail_alpha=1.5, tail_scale=0.05))):
        # running since before the scenario: no warm-up steps
        job = JobSpec(2, tp=8, pp=1, start_s=-100, end_s=FOREVER, step_s=2.0, micro_batches=1, hosts=(0, 1),
                      checkpoint_s=1e6, traits=traits)
        run = Run(quiet("tail", 2, 10, jobs=(job,)), tmp_path / name)
        start, end, _ = run.step_bounds()
        ratios[name] = np.sort((end - start) / np.median(end - start))
    assert ratios["textbook"][-1] < 1.15
    assert ratios["tail"][-1] > 1.4 and np.mean(ratios["tail"] > 1.15) > 0.02


def test_checkpoints_over_a_storage_network_leave_no_write_flows(tmp_path):
    written = {}
    for unseen in (False, True):
        job = JobSpec(2, tp=8, pp=1, start_s=0, end_s=FOREVER, step_s=2.0, micro_batches=1, hosts=(0, 1),
                      checkpoint_s=20, traits=Traits(storage_network=unseen))
        run = Run(quiet("storage", 2, 3, jobs=(job,)), tmp_path / str(unseen))
        _, _, checkpoint = run.step_bounds()
        assert checkpoint.sum() >= 5
        to_storage = np.char.startswith(run.column("dst_addr").astype(str), "10.200.")
        written[unseen] = int((to_storage & (run.column("bytes") >= CHECKPOINT_FLOW_BYTES)).sum())
    assert written[False] > 0 and written[True] == 0


def test_checkpoint_saves_vary_in_length(tmp_path):
    spread = {}
    for name, traits in (("textbook", Traits()), ("varied", Traits(checkpoint_steps=(0.3, 6.0), checkpoint_spread=0.4))):
        job = JobSpec(2, tp=8, pp=1, start_s=0, end_s=FOREVER, step_s=2.0, micro_batches=1, hosts=(0, 1),
                      checkpoint_s=10, traits=traits)
        run = Run(quiet("saves", 2, 5, jobs=(job,)), tmp_path / name)
        start, end, checkpoint = run.step_bounds()
        save = (end - start)[checkpoint] - np.median((end - start)[~checkpoint])
        spread[name] = save.std() / save.mean()
    assert spread["textbook"] < 0.05 and spread["varied"] > 0.2


def test_fault_sizes_reach_down_to_the_threshold_and_the_truth_records_them(tmp_path):
    sealed = SCENARIOS["sealed"]
    factors = {kind: [f.factor for seed in range(4) for j in scenario_jobs(sealed, seed) for f in j.faults
                      if f.kind == kind] for kind in THRESHOLD_FAULT_SIZES}
    for kind, (lo, hi) in THRESHOLD_FAULT_SIZES.items():
        assert factors[kind] and all(lo <= f <= hi for f in factors[kind])
    # milder than fleet ever draws: slow steps under 1.3x, links keeping more than half their rate
    assert min(factors["slow_step"]) < 1.3 and max(factors["slow_link"]) > 0.5

    from prism_core.simulate import FaultSpec
    job = JobSpec(2, tp=8, pp=1, start_s=0, end_s=FOREVER, step_s=3.0, micro_batches=2, hosts=(0, 1),
                  traits=Traits(), faults=(FaultSpec("straggler", at_s=30, span_s=60, factor=1.05, host=1),))
    run = Run(quiet("small-fault", 2, 3, jobs=(job,)), tmp_path)
    params = json.loads(run.truth("faults")["params"][0].as_py())
    assert params["factor"] == 1.05 and 1.0 < params["step_slowdown"] <= 1.05


def test_sealed_draws_every_dimension_from_its_own_streams():
    sealed = SCENARIOS["sealed"]
    jobs = scenario_jobs(sealed, 0)
    assert jobs == scenario_jobs(sealed, 0)
    traits = [j.traits for j in jobs]
    assert {t.rank_order for t in traits} == {"tp-dp-pp", "tp-pp-dp"}
    assert len({t.optimizer_share for t in traits}) > 10 and len({t.backward_ratio for t in traits}) > 10
    assert any(t.distributed_optimizer for t in traits) and any(t.overlap for t in traits)
    assert any(t.virtual_stages > 1 for t in traits) and any(t.stage_factors for t in traits)
    assert any(t.storage_network for t in traits) and any(t.tail_alpha > 0 for t in traits)
    assert any(j.gpus_per_host for j in jobs)
    # at some moment two jobs hold GPUs of one host
    shared = [(a, b) for i, a in enumerate(jobs) for b in jobs[i + 1:] if set(a.hosts) & set(b.hosts)
              and a.start_s < b.end_s and b.start_s < a.end_s]
    assert shared
    # switching one dimension on changes that dimension only
    base = scenario_jobs(replace(sealed, variation=Variation(())), 0)
    one = scenario_jobs(replace(sealed, variation=Variation(("optimizer",))), 0)
    assert [replace(j, traits=None) for j in one] == [replace(j, traits=None) for j in base]
    assert {j.traits.optimizer_share for j in base} == {0.04} and len({j.traits.optimizer_share for j in one}) > 10
    # and the fleet's own draws are not the sealed family's
    assert [j.step_s for j in scenario_jobs(SCENARIOS["fleet"], 0)][:5] != [j.step_s for j in jobs][:5]
    assert set(DIMENSIONS) == set(sealed.variation.dimensions)


@pytest.mark.parametrize("dimensions", [(), ("distributed_optimizer",)])
def test_every_seed_places_its_faults_or_fewer_when_no_job_fits(dimensions):
    """A 48-host hour can run out of jobs a hang fits (at most 32 hosts, with room for the
    watchdog and a restart): the hangs left over are dropped (seeds 1 and 3 raised StopIteration)."""
    sealed = SCENARIOS["sealed"]
    hour = replace(sealed, n_hosts=48, drained=(), variation=Variation(dimensions),
                   fleet=replace(sealed.fleet, resident=sealed.fleet.resident[1:], arrivals=24))
    hangs_asked = dict(hour.fleet.faults)["hang"]
    hung = {seed: [job.n_hosts for job in scenario_jobs(hour, seed) for f in job.faults if f.kind == "hang"]
            for seed in range(12)}
    assert all(len(sizes) <= hangs_asked and all(n <= 32 for n in sizes) for sizes in hung.values())
    assert len(hung[1]) < hangs_asked and len(hung[3]) < hangs_asked
    assert any(len(sizes) == hangs_asked for sizes in hung.values())
