"""Parallelism identification (prism_core.parallelism): pair kinds, stages, dp/pp/tp."""

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from prism_core import parallelism
from prism_core.analysis import split_flows_by_job
from prism_core.constants import FLOW_FAMILY_BYTES, FLOW_KIND, KIND_CODES, OTHER
from prism_core.evaluate import jobs as job_scores
from prism_core.minutes import HOUR_NS
from prism_core.resolution import MS_NS
from prism_core.simulate.cluster import GPUS_PER_HOST, Cluster, Placement
from prism_core.simulate.exporters import FlowCache, Records
from prism_core.simulate.scenarios import FaultSpec, JobSpec
from prism_core.simulate.schedule import plan_job
from prism_core.simulate.traffic import KIND_NAMES
from prism_core.simulate.variation import Traits
from test_recognition import HOUR0, recognize_hours, scenario_flows

SECONDS = 150.0
CACHE = "172.31.0.1"  # the exporter of simulated_job's records through a flow cache
UNCACHED = "172.31.0.2"  # and of its records of transfers one by one beside it


def simulated_job(spec: JobSpec, seed: int = 0, four_nic_hosts: tuple[int, ...] = (),
                  flow_cache: tuple[float, float] | None = None, seconds: float = SECONDS,
                  cached_rails: tuple[int, ...] | None = None):
    """(flows, members, truth pairs by kind) of one job alone on a cluster, `seconds` long; the
    `four_nic_hosts` have a NIC for every two GPUs (the membership's `gpus` says so);
    `flow_cache`: (idle, active) timeouts, s, of a flow cache (the simulator's,
    prism_core.simulate.exporters.FlowCache) kept by the exporter of the `cached_rails` (CACHE;
    all rails when None), the other rails' exporter (UNCACHED) reporting transfers one by one."""
    cluster = Cluster(max(spec.hosts) + 1, four_nic_hosts=four_nic_hosts)
    plan = plan_job(0, spec, cluster, seconds, seed)
    batch = plan.flows(-np.inf, seconds, np.random.default_rng(seed))
    if flow_cache is not None:
        idle, active = flow_cache
        uncached = np.zeros(len(batch.start), bool) if cached_rails is None else ~np.isin(
            batch.src % GPUS_PER_HOST, cached_rails)
        records = Records.of_transfers(batch, uncached.astype(np.int32))
        cache = FlowCache(np.array([idle]), np.array([active]))
        batch = Records.concat([cache.update(records.take(~uncached), np.inf), records.take(uncached)])

    def ns(seconds):
        return HOUR0 + np.round(seconds * 1e9).astype(np.int64)

    flows = pa.table(
        {
            "time_flow_start_ns": ns(batch.start),
            "time_flow_end_ns": ns(batch.end),
            "src_addr": cluster.addrs.take(pa.array(batch.src)),
            "dst_addr": cluster.addrs.take(pa.array(batch.dst)),
            "bytes": batch.nbytes,
        }
    )
    if flow_cache is not None:
        flows = flows.append_column("sampler_address", pa.array(np.array([CACHE, UNCACHED])[batch.exporter], pa.string()))
    nics = np.unique(cluster.gpu_nic[Placement.of(spec.hosts, spec.first_gpu, spec.gpus_per_host).gpus])
    members = pa.table(
        {
            "job_id": ["job"] * nics.size,
            "addr": cluster.addrs.take(pa.array(nics)),
            "host": [cluster.host_name(h) for h in nics // GPUS_PER_HOST],
            "gpu": pa.array(nics % GPUS_PER_HOST, pa.int32()),
            "first_ns": np.full(nics.size, HOUR0),
            "last_ns": np.full(nics.size, ns(np.array(seconds + 60.0))),
        }
    )
    if four_nic_hosts:
        members = members.append_column("gpus", pa.array(cluster.gpus_per_nic[nics // GPUS_PER_HOST], pa.int32()))
    truth: dict[str, set] = {kind: set() for kind in KIND_NAMES.values()}
    for template in plan.templates:
        for src, dst, kind in zip(template.src.tolist(), template.dst.tolist(), template.kind.tolist()):
            if kind in KIND_NAMES:
                truth[KIND_NAMES[kind]].add((cluster.addrs[src].as_py(), cluster.addrs[dst].as_py()))
    return flows, members, truth


def pairs_of(found: parallelism.Parallelism, kind: str) -> set:
    chosen = found.comm_pairs.filter(pc.equal(found.comm_pairs["kind"], kind))
    return set(zip(chosen["src_addr"].to_pylist(), chosen["dst_addr"].to_pylist()))


SHAPES = {
    "ring, tied embeddings": JobSpec(4, tp=8, pp=2, start_s=0, end_s=SECONDS, step_s=3.0, tied_embeddings=True, hosts=(0, 1, 2, 3)),
    "tree": JobSpec(8, tp=4, pp=2, start_s=0, end_s=SECONDS, step_s=3.0, collective="tree", hosts=tuple(range(8))),
    "rs_ag, tp 1": JobSpec(8, tp=1, pp=2, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=4, collective="rs_ag", hosts=tuple(range(8))),
    "zero on two hosts": JobSpec(2, tp=8, pp=1, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=4, collective="zero", hosts=(0, 1)),
    "moe": JobSpec(4, tp=2, pp=2, start_s=0, end_s=SECONDS, step_s=4.0, moe=True, hosts=(0, 1, 2, 3)),
    "stages inside a host": JobSpec(2, tp=2, pp=8, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=16, channels=1, hosts=(0, 1)),
    "deep pipeline, 16 micro-batches": JobSpec(8, tp=8, pp=8, start_s=0, end_s=SECONDS, step_s=4.0, micro_batches=16, channels=1, hosts=tuple(range(8))),
    # DP stays on NVLink (a stage is one host), or a tree crosses twice between two hosts: only
    # the checkpoint writers tell tp from dp
    "dp inside a host, checkpoint": JobSpec(2, tp=4, pp=2, start_s=0, end_s=SECONDS, step_s=3.0, checkpoint_s=30, hosts=(0, 1)),
    "tree over two-host stages, checkpoint": JobSpec(4, tp=4, pp=2, start_s=0, end_s=SECONDS, step_s=3.0, collective="tree", checkpoint_s=30, hosts=(0, 1, 2, 3)),
}


def identified_as_simulated(spec: JobSpec) -> tuple[parallelism.Parallelism, dict]:
    """Parallelism of a simulated job, its degrees and its PP and DP pairs checked against the
    truth; the result and the truth's pairs, for further checks."""
    flows, members, truth = simulated_job(spec)
    found = parallelism.identify_parallelism("job", flows, members)
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]
    return found, truth


@pytest.mark.parametrize("shape", list(SHAPES))
def test_pairs_stages_and_degrees(shape):
    spec = SHAPES[shape]
    found, truth = identified_as_simulated(spec)
    assert pairs_of(found, "other") >= truth["other"]
    # Megatron order: rank = slot * 8 + gpu = tp_rank + tp * (dp_rank + dp * pp_stage)
    gpus = found.job_gpus.to_pylist()
    rank = np.array([spec.hosts.index(int(g["host"][3:])) * GPUS_PER_HOST + g["gpu"] for g in gpus])
    assert [g["pp_stage"] for g in gpus] == (rank // (spec.tp * spec.dp)).tolist()
    assert [g["dp_rank"] for g in gpus] == ((rank // spec.tp) % spec.dp).tolist()


@pytest.mark.parametrize("tp, pp", [(1, 4), (2, 2)])
def test_a_job_on_two_gpus_of_each_host_has_its_own_gpus_and_degrees(tp, pp):
    # 8 GPUs, two on each of four hosts whose other GPUs other jobs hold: dp * pp * tp = 8, not the
    # hosts' 32 GPUs (pp 4: a stage per host, its DP on NVLink, told from TP by the checkpoint
    # writers; tp 2: TP fills the job's part of each host, DP crosses hosts)
    spec = JobSpec(4, tp=tp, pp=pp, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=8, hosts=(0, 1, 2, 3),
                   gpus_per_host=2, first_gpu=(2, 2, 2, 2), checkpoint_s=30)
    flows, members, truth = simulated_job(spec)
    assert members.num_rows == 8
    found = parallelism.identify_parallelism("job", flows, members)
    assert (found.dp, found.pp, found.tp) == (8 // (tp * pp), pp, tp)
    assert found.job_gpus.num_rows == 8
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]


# Pipelines side by side (tp-pp-dp order: a replica's stages on consecutive ranks), as the
# `sealed` family places them
PIPELINES_SIDE_BY_SIDE = {
    # two stages of a replica on each host, a replica on each two hosts: a forward send crossing
    # hosts reaches one TP group, and the chains are the replicas, not the job's hosts
    "two stages a host, two replicas": JobSpec(4, tp=4, pp=4, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=8,
                                              traits=Traits(rank_order="tp-pp-dp"), hosts=(0, 1, 2, 3)),
    # a stage per host, four replicas of four hosts each in a scheduler's shuffled host order, the
    # embedding all-reduced between each replica's first and last stage, imbalanced stages and
    # backward 3x the forward: a chain's warm-up votes may not tell its direction (sends too short
    # to overlap the reverse direction's), and the DP sync lines the chains' stages up
    "a stage a host, four shuffled replicas, tied embeddings": JobSpec(
        16, tp=8, pp=4, start_s=0, end_s=SECONDS, step_s=5.0, micro_batches=16, tied_embeddings=True,
        traits=Traits(rank_order="tp-pp-dp", optimizer_share=0.1298, backward_ratio=3.047, overlap=True,
                      embedding_before_sync=True, stage_factors=(1.0429, 0.9552, 0.8862, 1.1156),
                      jitter_sigma=0.0249, tail_alpha=2.724, tail_scale=0.0345, storage_network=True),
        hosts=(9, 2, 5, 4, 6, 0, 7, 12, 10, 1, 3, 13, 8, 15, 11, 14)),
    # interleaved, four model chunks a stage: each replica's chain closes into a ring (its last
    # stage sends back to the first), numbered from a host its warm-ups pick, and the DP sync
    # turns the other ring to line up with it
    "interleaved, two shuffled replicas of eight stages": JobSpec(
        16, tp=8, pp=8, start_s=0, end_s=SECONDS, step_s=5.0, micro_batches=8, tied_embeddings=True,
        traits=Traits(rank_order="tp-pp-dp", optimizer_share=0.0614, backward_ratio=2.752, overlap=True,
                      embedding_before_sync=True, virtual_stages=4,
                      stage_factors=(0.9431, 0.962, 1.004, 0.8999, 0.9436, 0.9318, 0.9215, 1.394),
                      jitter_sigma=0.0258, tail_alpha=1.846, tail_scale=0.0214, storage_network=True),
        hosts=(15, 5, 1, 11, 8, 12, 3, 9, 0, 14, 13, 2, 10, 7, 4, 6)),
}


@pytest.mark.parametrize("shape", list(PIPELINES_SIDE_BY_SIDE))
def test_pipelines_side_by_side_keep_their_stages_and_degrees(shape):
    identified_as_simulated(PIPELINES_SIDE_BY_SIDE[shape])


def test_a_checkpoint_writer_on_a_nic_of_two_gpus_leaves_tp_to_the_rails():
    # pure DP over four hosts, the first (the checkpoint writer's) with a NIC for every two GPUs:
    # its one writing NIC may be one shard or two, and the DP ring's crossings onto the hosts with
    # a NIC per GPU say one TP rank
    spec = JobSpec(4, tp=1, pp=1, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=2, collective="rs_ag",
                   checkpoint_s=30, hosts=(0, 1, 2, 3))
    flows, members, truth = simulated_job(spec, four_nic_hosts=(0,))
    found = parallelism.identify_parallelism("job", flows, members)
    assert (found.dp, found.pp, found.tp) == (32, 1, 1)
    assert pairs_of(found, "dp") == truth["dp"]


def test_one_checkpoint_writer_says_tp_1_and_later_hours_remember_it():
    # pure DP over four hosts, NCCL spreading each ring crossing over every rail of the host pair:
    # the rails say nothing of tp, DP rank 0 writing the checkpoint alone says tp = pp = 1
    spec = JobSpec(4, tp=1, pp=1, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=2, collective="ring",
                   checkpoint_s=30, traits=Traits(ring_per_nic=True), hosts=(0, 1, 2, 3))
    flows, members, truth = simulated_job(spec)
    saving = parallelism.identify_parallelism("job", flows, members)
    assert (saving.dp, saving.pp, saving.tp) == (32, 1, 1)
    assert saving.state["checkpoint_writers"] == [1, 1]
    # an hour without a save: the rails alone would give the host to TP
    between_members = flows.filter(pc.is_in(flows["dst_addr"], value_set=members["addr"]))
    unsaved = parallelism.identify_parallelism("job", between_members, members)
    assert (unsaved.dp, unsaved.tp) == (4, 8) and "checkpoint_writers" not in unsaved.state
    remembered = parallelism.identify_parallelism("job", between_members, members, previous=unsaved.state | {
        "checkpoint_writers": [1, 1]})
    assert (remembered.dp, remembered.pp, remembered.tp) == (32, 1, 1)
    assert remembered.state["checkpoint_writers"] == [1, 1]
    assert pairs_of(remembered, "dp") == truth["dp"]


def test_an_hour_that_shows_a_job_for_seconds_keeps_the_degrees_an_earlier_hour_read():
    spec = SHAPES["deep pipeline, 16 micro-batches"]
    flows, members, _ = simulated_job(spec)
    earlier = parallelism.identify_parallelism("job", flows, members)
    assert (earlier.dp, earlier.pp, earlier.tp) == (1, 8, 8)
    # the job ends four seconds into the next hour: too few of its pipeline's sends to find it
    seconds = flows.filter(pc.less(flows["time_flow_start_ns"], HOUR0 + 4 * 10**9))
    alone = parallelism.identify_parallelism("job", seconds, members)
    assert (alone.dp, alone.pp, alone.tp) != (1, 8, 8)
    last = parallelism.identify_parallelism("job", seconds, members, previous=earlier.state)
    assert (last.dp, last.pp, last.tp) == (1, 8, 8) and last.state == earlier.state
    # the earlier hour's degrees no longer hold once the job runs on another number of GPUs
    fewer = members.slice(0, members.num_rows // 2)
    relaunched = parallelism.identify_parallelism("job", flows, fewer, previous={"degrees": [1, 8, 8], "flows": 10**9})
    assert relaunched.dp * relaunched.pp * relaunched.tp == 32


def test_a_small_size_repeated_to_a_non_member_is_no_checkpoint_writer():
    # stages of four hosts (DP crosses hosts on tp rails), checkpoints over a storage network the
    # records do not see, the first host with a NIC for every two GPUs; its NIC answers two
    # monitoring scrapes with replies of one size: not a checkpoint shard written by two GPUs
    spec = JobSpec(8, tp=4, pp=2, start_s=0, end_s=SECONDS, step_s=3.0, micro_batches=8, collective="rs_ag",
                   traits=Traits(storage_network=True), hosts=tuple(range(8)))
    flows, members, truth = simulated_job(spec, four_nic_hosts=(0,))
    nic = members["addr"][0].as_py()
    replies = pa.table({"time_flow_start_ns": [HOUR0 + 15 * 10**9, HOUR0 + 30 * 10**9],
                        "time_flow_end_ns": [HOUR0 + 15 * 10**9 + 10**6, HOUR0 + 30 * 10**9 + 10**6],
                        "src_addr": [nic, nic], "dst_addr": ["10.250.0.2"] * 2, "bytes": [49_810, 49_810]})
    found = parallelism.identify_parallelism("job", pa.concat_tables([flows, replies.cast(flows.schema)]), members)
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)
    assert pairs_of(found, "dp") == truth["dp"]


# Megatron as the replays run it: 32 micro-batches (fewer lone warm-up sends per step than the old
# prior allowed), the embedding all-reduce between the first and last stage, and the distributed
# optimizer's reduce-scatter at the step end and all-gather at the next start over the DP pairs
MEGATRON = JobSpec(8, tp=4, pp=4, start_s=0, end_s=SECONDS, step_s=6.0, micro_batches=32, collective="rs_ag",
                   tied_embeddings=True, traits=Traits(distributed_optimizer=True), hosts=tuple(range(8)))
LIKE_MEGATRON = {
    "distributed optimizer, embedding, 32 micro-batches": MEGATRON,
    "the same with overlapped syncs": replace(MEGATRON, traits=Traits(distributed_optimizer=True, overlap=True)),
    "interleaved, two chunks per stage": replace(MEGATRON, traits=Traits(distributed_optimizer=True, virtual_stages=2)),
}


@pytest.mark.parametrize("shape", list(LIKE_MEGATRON))
def test_megatron_like_jobs_keep_embedding_and_optimizer_traffic_out_of_dp(shape):
    spec = LIKE_MEGATRON[shape]
    flows, members, truth = simulated_job(spec)
    found = parallelism.identify_parallelism("job", flows, members)
    assert (found.dp, found.pp, found.tp) == (4, 4, 4)
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]
    # the embedding group (stage 0 with stage 3; interleaved, on the pipeline's hop back to
    # stage 0) is neither
    assert truth["other"] and truth["other"] <= pairs_of(found, "other")


def with_header_bytes(flows: pa.Table, seed: int = 0) -> pa.Table:
    """Bytes as exporters count them: 0-64 header bytes more on every record, and the sends of
    every other host counted with frame headers (0.4% more)."""
    rng = np.random.default_rng(seed)
    sent = flows["bytes"].to_numpy()
    odd_host = np.array([int(a.split(".")[-1]) % 2 == 1 for a in flows["src_addr"].to_pylist()])
    counted = np.round(sent * np.where(odd_host, 1.004, 1.0)).astype(np.int64) + rng.integers(0, 65, len(sent))
    return flows.set_column(flows.schema.get_field_index("bytes"), "bytes", pa.array(counted))


@pytest.mark.parametrize("shape", ["ring, tied embeddings", "tree", "rs_ag, tp 1", "dp inside a host, checkpoint"])
def test_header_bytes_keep_pairs_and_degrees(shape):
    # no two records of one transfer size agree to the byte, and the two directions of a pair differ
    spec = SHAPES[shape]
    flows, members, truth = simulated_job(spec)
    noisy = with_header_bytes(flows)
    assert len(np.unique(noisy["bytes"].to_numpy())) > 100 * len(np.unique(flows["bytes"].to_numpy()))
    found = parallelism.identify_parallelism("job", noisy, members)
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]


def test_nics_serving_two_gpus_count_both():
    # four NICs for eight GPUs on each host (the membership says so): the job has 16 GPUs
    spec = SHAPES["dp inside a host, checkpoint"]
    flows, members, _ = simulated_job(spec)
    first_of_pair = pc.equal(pc.bit_wise_and(members["gpu"], 1), 0)
    halved = members.filter(first_of_pair).append_column("gpus", pa.array([2] * 8, pa.int32()))
    paired = {a: b for a, b in zip(members["addr"].to_pylist()[1::2], members["addr"].to_pylist()[::2])}
    flows = flows.set_column(2, "src_addr", pa.array([paired.get(a, a) for a in flows["src_addr"].to_pylist()]))
    flows = flows.set_column(3, "dst_addr", pa.array([paired.get(a, a) for a in flows["dst_addr"].to_pylist()]))
    found = parallelism.identify_parallelism("job", flows, halved)
    assert found.job_gpus.num_rows == 8
    assert found.dp * found.pp * found.tp == 16
    assert (found.pp, found.tp) == (spec.pp, spec.tp)


def through_a_flow_cache(flows: pa.Table, every: int) -> pa.Table:
    """Records as a flow cache on the odd hosts' leaves reports them: the transfers of each NIC
    pair those hosts send on merge `every` at a time (first start, last end, summed bytes)."""
    on_odd = np.array([int(a.split(".")[-1]) % 2 == 1 for a in flows["src_addr"].to_pylist()])
    keys = [("src_addr", "ascending"), ("dst_addr", "ascending"), ("time_flow_start_ns", "ascending")]
    cached = flows.filter(pa.array(on_odd)).sort_by(keys)
    pair = pc.binary_join_element_wise(cached["src_addr"], cached["dst_addr"], "-").to_numpy(zero_copy_only=False)
    opens = np.r_[True, pair[1:] != pair[:-1]]
    position = np.arange(len(pair)) - np.maximum.accumulate(np.where(opens, np.arange(len(pair)), 0))
    record = np.cumsum(opens | (position % every == 0)) - 1
    merged = pa.table({"record": record, **{c: cached[c] for c in cached.column_names}}).group_by(
        ["record", "src_addr", "dst_addr"], use_threads=False).aggregate(
        [("time_flow_start_ns", "min"), ("time_flow_end_ns", "max"), ("bytes", "sum")])
    merged = pa.table({"time_flow_start_ns": merged["time_flow_start_ns_min"],
                       "time_flow_end_ns": merged["time_flow_end_ns_max"],
                       "src_addr": merged["src_addr"], "dst_addr": merged["dst_addr"], "bytes": merged["bytes_sum"]})
    return pa.concat_tables([flows.filter(pa.array(~on_odd)), merged.cast(flows.schema)])


def test_merged_pipeline_sends_keep_their_pairs():
    # half the hosts' exporters merge four transfers a record: their PP pairs carry no transfer size
    spec = SHAPES["deep pipeline, 16 micro-batches"]
    flows, members, truth = simulated_job(spec)
    found = parallelism.identify_parallelism("job", through_a_flow_cache(flows, 4), members)
    assert (found.dp, found.pp) == (spec.dp, spec.pp)
    assert pairs_of(found, "pp") == truth["pp"]


@pytest.mark.parametrize("shape", ["tree", "ring, tied embeddings", "stages inside a host",
                                   "deep pipeline, 16 micro-batches", "zero on two hosts"])
def test_a_flow_cache_longer_than_the_quiet_in_a_step_keeps_pp_and_dp_pairs(shape):
    # every exporter keeps a flow cache with a 1 s idle and a 60 s active timeout (issue #18):
    # a pipeline's sends merge into records spanning the step's compute, or running on to the
    # active timeout, that overlap any reverse traffic; a DP sync's records sit at the step's end,
    # and ZeRO's gathers on two hosts run on both ways at once
    spec = SHAPES[shape]
    flows, members, truth = simulated_job(spec, flow_cache=(1.0, 60.0))
    found = parallelism.identify_parallelism("job", flows, members, cached_exporters={CACHE})
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]


def test_an_all_to_all_behind_a_flow_cache_stays_out_of_the_dp_pairs():
    # behind a 1 s / 60 s cache an MoE job's all-to-all over every rail of a stage's two hosts
    # merges with the DP sync of the rails its ring crosses into sums of one family; the sync's
    # NIC pairs carry many times the bytes of the all-to-all's alone. (Its degrees are not asserted:
    # dp and tp inside a host are told by checkpoint writers, which this job has none of.)
    flows, members, truth = simulated_job(SHAPES["moe"], flow_cache=(1.0, 60.0))
    found = parallelism.identify_parallelism("job", flows, members, cached_exporters={CACHE})
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]
    assert pairs_of(found, "other") >= truth["other"] - truth["dp"]


@pytest.mark.parametrize("shape", ["tree", "tree over two-host stages, checkpoint"])
def test_transfers_reported_one_by_one_decide_beside_one_rails_merged_records(shape):
    # one rail's cache idles out after 15 s, longer than the 3 s steps: its records run from
    # step to step, DP syncs and pipeline sends alike (a tree's reduce opens before its broadcast
    # and the broadcast closes after it, as a pipeline's forward and backward records do); the
    # other rails report each transfer, and their groups decide each host pair's kind
    spec = SHAPES[shape]
    flows, members, truth = simulated_job(spec, flow_cache=(15.0, 60.0), cached_rails=(0,))
    found = parallelism.identify_parallelism("job", flows, members, cached_exporters={CACHE})
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]


def through_sflow(flows: pa.Table, rate: int, seed: int = 0) -> pa.Table:
    """Records as an sFlow agent samples them, 1 in `rate` 4 KiB packets: start = end = the time
    of a sampled packet, bytes the sampled packets' scaled back; a transfer none fell on is gone."""
    rng = np.random.default_rng(seed)
    packets = np.maximum(flows["bytes"].to_numpy() // 4096, 1)
    sampled = rng.binomial(packets, 1 / rate)
    start, end = flows["time_flow_start_ns"].to_numpy(), flows["time_flow_end_ns"].to_numpy()
    at = start + np.round((end - start) * rng.random(len(start))).astype(np.int64)
    kept = sampled > 0
    chosen = pa.array(kept)
    return pa.table({"time_flow_start_ns": at[kept], "time_flow_end_ns": at[kept],
                     "src_addr": flows["src_addr"].filter(chosen), "dst_addr": flows["dst_addr"].filter(chosen),
                     "bytes": sampled[kept] * 4096 * rate, "sampling_rate": np.full(int(kept.sum()), rate)})


@pytest.mark.parametrize("shape", ["ring, tied embeddings", "rs_ag, tp 1"])
def test_sampled_records_keep_dp_and_pp_pairs(shape):
    # bytes count sampled packets: a DP sync's sizes look like an all-to-all's family of sizes
    spec = SHAPES[shape]
    flows, members, truth = simulated_job(spec)
    found = parallelism.identify_parallelism("job", through_sflow(flows, 64), members)
    assert pairs_of(found, "pp") == truth["pp"]
    assert pairs_of(found, "dp") == truth["dp"]


@pytest.mark.parametrize("shape", ["deep pipeline, 16 micro-batches", "dp inside a host, checkpoint"])
def test_a_samplers_estimates_of_checkpoint_shards_count_their_writers(shape):
    # every record sampled, the checkpoint's shards too: their bytes are estimates that a shard
    # size repeats only by chance, so a writer is a NIC whose samples hold two checkpoint-sized
    # sends or more (tp * pp of them: DP rank 0 of every stage and TP rank)
    spec = replace(SHAPES[shape], checkpoint_s=30)
    flows, members, _ = simulated_job(spec)
    found = parallelism.identify_parallelism("job", through_sflow(flows, 1024), members)
    assert found.state["checkpoint_writers"] == [spec.tp * spec.pp] * 2
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)


@pytest.mark.parametrize("tree_samples", [1400, 4100])
def test_transfers_reported_one_by_one_decide_beside_sampled_rails(tree_samples):
    """Groups of three host pairs as `_group_flows` makes them: (0, 1) a tree's DP sync, reported
    one by one on some rails, whose sampled rails' packets (one record per transfer, at its first
    sampled packet: a reduce's opens before its broadcast comes back) go 5% unanswered one way;
    (0, 2) a pipeline, reported and sampled; (0, 3) a pipeline on sampled rails alone. Where a
    pair has enough transfer-sized records to judge, they decide it and its samples follow, also
    where half its rails sample and the samples are as many (`tree_samples`)."""
    src = np.array([0, 1, 0, 1, 0, 2, 0, 2, 0, 3])
    dst = np.array([1, 0, 1, 0, 2, 0, 2, 0, 3, 0])
    flows = np.array([4000, 4000, tree_samples, tree_samples, 8000, 8000, 2800, 2800, 2800, 2800])
    unmatched = np.array([0, 0, 0, 70, 2000, 2000, 700, 700, 700, 700])
    sampled = np.array([False, False, True, True] * 2 + [True, True])
    groups = parallelism._Groups(
        src_host=src, dst_host=dst, size=np.where(sampled, 25e6, np.r_[[8e8] * 4, [1.6e7] * 4, [0] * 2]),
        flows=flows, unmatched=unmatched, reverse=np.arange(10) ^ 1, of_flow=np.empty(0, np.int64),
        answered=np.empty(0, bool), continuous=np.empty(0, bool), lumped=np.zeros(10, bool), sampled=sampled,
        sampled_bytes=np.zeros(10), reverse_sampled_bytes=np.zeros(10), unanswered_spread=np.full(10, 0.8),
        span_ns=np.full(10, 600 * 10**9))
    pipeline = parallelism._is_pipeline(groups, parallelism.DEFAULT_PARAMS, np.zeros(10, bool))
    assert pipeline.tolist() == [False] * 4 + [True] * 6


def test_an_all_to_alls_samples_do_not_follow_it_into_a_pipeline():
    """An MoE all-to-all on host pair (0, 1): four sizes each way, reported one by one, 2% of
    their sends unanswered where 1% of the records are lost (above the pipeline's 1/128), and the
    pair's sampled rails' packets. The all-to-all is no pipeline, and the samples, which follow
    the pair's transfer-sized groups, follow it as such."""
    src, dst = np.repeat([0, 1], 5), np.repeat([1, 0], 5)
    sampled = np.tile([False] * 4 + [True], 2)
    groups = parallelism._Groups(
        src_host=src, dst_host=dst, size=np.tile([5e5, 8e5, 1e6, 1.3e6, 4.2e6], 2),
        flows=np.where(sampled, 1700, 11000), unmatched=np.where(sampled, 0, 220), reverse=(np.arange(10) + 5) % 10,
        of_flow=np.empty(0, np.int64), answered=np.empty(0, bool), continuous=np.empty(0, bool),
        lumped=np.zeros(10, bool), sampled=sampled, sampled_bytes=np.zeros(10), reverse_sampled_bytes=np.zeros(10),
        unanswered_spread=np.full(10, 0.6), span_ns=np.full(10, 600 * 10**9))
    all_to_all = ~sampled
    assert not parallelism._is_pipeline(groups, parallelism.DEFAULT_PARAMS, all_to_all).any()
    assert parallelism._is_pipeline(groups, parallelism.DEFAULT_PARAMS, np.zeros(10, bool))[sampled].all()


@pytest.mark.parametrize(("flows", "sampled_bytes"), [((2742, 688), 6.4e11), ((2056, 1358), 0.0)])
@pytest.mark.parametrize(("spread", "span_s", "pipeline"), [(0.6, 600, True), (0.3, 600, False), (0.3, 20, True)])
def test_sends_unanswered_in_one_stretch_of_the_hour_make_no_pipeline(flows, sampled_bytes, spread, span_s, pipeline):
    """A tree's host pair, one way 2742 transfers and 688 back, balanced by the reverse
    direction's sampled bytes (or 2056 and 1358, balanced without them): a slow NIC held back one
    direction for three of its ten minutes, and 124 sends went unanswered then. A pipeline leaves
    its warm-up sends unanswered in every step, over the whole span of its traffic; a job's last
    20 s in an hour cannot show it."""
    groups = parallelism._Groups(
        src_host=np.array([0, 2]), dst_host=np.array([2, 0]), size=np.array([3.1e8, 3.1e8]),
        flows=np.array(flows), unmatched=np.array([124, 0]), reverse=np.array([1, 0]),
        of_flow=np.empty(0, np.int64), answered=np.empty(0, bool), continuous=np.empty(0, bool),
        lumped=np.zeros(2, bool), sampled=np.zeros(2, bool), sampled_bytes=np.array([0.0, sampled_bytes]),
        reverse_sampled_bytes=np.array([sampled_bytes, 0.0]), unanswered_spread=np.array([spread, 0.0]),
        span_ns=np.array([span_s, span_s]) * 10**9)
    assert parallelism._is_pipeline(groups, parallelism.DEFAULT_PARAMS, np.zeros(2, bool)).tolist() == [pipeline, False]


def test_unanswered_spread_is_the_middle_of_the_unanswered_starts_over_that_of_all_starts():
    # group 0: 11 flows over 0-100 s, unanswered at 10-20 s; group 1: unanswered every tenth, and
    # idle from 100 to 1000 s but for one last flow (a hang): its flows' own spread is the measure;
    # group 2: one unanswered flow, under the 2 asked
    of_flow = np.array([0] * 11 + [1] * 12 + [2] * 3)
    start = np.r_[np.arange(11) * 10, np.arange(11) * 10, 1000, 0, 10, 20] * 10**9
    answered = np.r_[[True, False, False] + [True] * 8, [False] * 12, [False, True, True]]
    found = parallelism._unanswered_spread(of_flow, 3, start, answered, 2)
    spread = found["unanswered_spread"]
    assert spread[0] < 0.2 and spread[1] == pytest.approx(1.0) and spread[2] == 0.0
    assert found["span_ns"].tolist() == [100 * 10**9, 1000 * 10**9, 20 * 10**9]


def test_a_pipeline_whose_backward_sends_cross_half_on_a_sampled_rail_keeps_its_balance():
    # eight stages on two hosts cross between them once: with PXN the forward sends leave on the
    # rails of the receiving GPUs (0, 1), the backward ones on rails 6 and 7, and rail 6's leaf
    # samples packets. The timed backward records are half the forward ones, fewer still where
    # rail 7's exporter loses some (5% here); the sampled rail's estimated bytes make up the rest
    spec = SHAPES["stages inside a host"]
    flows, members, truth = simulated_job(spec)
    rail = members["gpu"].to_numpy()[pc.index_in(flows["dst_addr"], value_set=members["addr"]).to_numpy()]
    lost = (rail == 7) & (np.random.default_rng(1).random(flows.num_rows) < 0.05)
    timed = flows.filter(pa.array((rail != 6) & ~lost))
    timed = timed.append_column("sampling_rate", pa.array(np.ones(timed.num_rows, np.int64)))
    mixed = pa.concat_tables([timed, through_sflow(flows.filter(pa.array(rail == 6)), 1024)]).sort_by(
        "time_flow_start_ns")
    found = parallelism.identify_parallelism("job", mixed, members)
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)
    assert pairs_of(found, "pp") == truth["pp"]


def test_a_netflow_exporter_sampling_one_in_four_on_a_millisecond_clock_reports_transfers():
    # its records carry their transfers' spans, but on a millisecond clock an all-to-all's chunks
    # (shorter than a tick) start and end on one tick: the exporter's profile (per transfer, no
    # sampler) says they are transfers, not an sFlow agent's instants
    spec = SHAPES["moe"]
    flows, members, truth = simulated_job(spec)
    on_ms = {c: pa.array(flows[c].to_numpy() // MS_NS * MS_NS) for c in ("time_flow_start_ns", "time_flow_end_ns")}
    for column, ticks in on_ms.items():
        flows = flows.set_column(flows.schema.get_field_index(column), column, ticks)
    flows = flows.append_column("sampling_rate", pa.array(np.full(flows.num_rows, 4)))
    flows = flows.append_column("sampler_address", pa.array([UNCACHED] * flows.num_rows))
    assert pc.mean(pc.equal(flows["time_flow_start_ns"], flows["time_flow_end_ns"])).as_py() > 0.5
    found = parallelism.identify_parallelism("job", flows, members, samplers=frozenset())
    assert (found.dp, found.pp, found.tp) == (spec.dp, spec.pp, spec.tp)
    assert pairs_of(found, "pp") == truth["pp"]


def test_size_families_cut_where_neighbouring_sizes_part():
    sizes = np.array([1000, 1004, 1009, 1013, 2000, 2010, 1_000_000, 1_009_000, 1_030_000])
    smallest, family = parallelism.size_families(sizes, 0.01, min_flows=1)
    assert smallest.tolist() == [1000, 2000, 1_000_000, 1_030_000]
    assert family.tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 3]


def test_sizes_that_do_not_recur_chain_no_families():
    # pieces of cut transfers at every size between two recurring ones, each 0.5% above the last
    pieces = np.round(5_000_000 * 1.005 ** np.arange(1, 600)).astype(np.int64)
    recurring = np.repeat([5_000_000, 100_000_000], 50)
    sizes = np.r_[recurring, pieces]
    _, family = parallelism.size_families(sizes, 0.01, min_flows=8)
    assert family[0] != family[50] and len(set(family[:50])) == len(set(family[50:100])) == 1
    widest = max(sizes[family == f].max() / sizes[family == f].min() for f in np.unique(family))
    assert widest <= 1.02


def test_family_codes_number_families_by_their_smallest_size():
    """Recurring sizes, lone ones between and below them (whose families come first by size, not by
    where the recurring ones are numbered): the families' smallest sizes ranked, as np.unique would."""
    rng = np.random.default_rng(3)
    sizes = np.r_[rng.choice([4_000, 4_020, 90_000, 90_500], 400), rng.integers(1_000, 200_000, 50)]
    rng.shuffle(sizes)
    codes = parallelism.family_codes(sizes)
    assert np.array_equal(codes, np.unique(parallelism.family_sizes(sizes), return_inverse=True)[1])
    assert codes[sizes == 4_000][0] == codes[sizes == 4_020][0] and len(np.unique(codes)) > 4
    assert len(parallelism.family_codes(sizes[:0])) == 0


@pytest.mark.parametrize("in_order", [True, False])
def test_warm_up_votes_weigh_the_nearest_exchanges_of_the_pair(in_order):
    """Lone flows among exchanges of a few pairs, starts often tied: each lone flow votes by which of
    its pair's nearest exchanges is closer (one at its own start follows it), as a flow-by-flow
    search says."""
    rng = np.random.default_rng(8)
    pair, start = rng.integers(0, 4, 3_000), rng.integers(0, 400, 3_000)
    start = np.sort(start) if in_order else start
    answered = rng.random(len(pair)) < 0.6
    expected = np.zeros(len(pair))
    for i in np.flatnonzero(~answered):
        mine = start[answered & (pair == pair[i])]
        before, after = mine[mine < start[i]], mine[mine >= start[i]]
        since = start[i] - before.max() if len(before) else 1 << 40
        until = after.min() - start[i] if len(after) else 1 << 40
        expected[i] = np.sign(since - until)
    votes = parallelism.warm_up_votes(pair, start, answered)
    assert np.array_equal(votes, expected) and (votes > 0).any() and (votes < 0).any()


def test_flows_sent_outside_membership_are_ignored():
    spec = SHAPES["ring, tied embeddings"]
    flows, members, _ = simulated_job(spec)
    alone = parallelism.identify_parallelism("job", flows, members)
    # the same hosts ran a tree job just before this one joined: its flows must not count
    earlier, _, _ = simulated_job(JobSpec(4, tp=2, pp=1, start_s=0, end_s=SECONDS, step_s=2.0, collective="tree", hosts=(0, 1, 2, 3)))
    shifted = earlier.set_column(0, "time_flow_start_ns", pc.subtract(earlier["time_flow_start_ns"], 200 * 10**9))
    mixed = pa.concat_tables([shifted, flows])
    found = parallelism.identify_parallelism("job", mixed, members)
    assert found.comm_pairs.equals(alone.comm_pairs)
    assert (found.dp, found.pp, found.tp) == (alone.dp, alone.pp, alone.tp)


def test_no_traffic_between_members_leaves_degrees_unknown():
    flows, members, _ = simulated_job(SHAPES["ring, tied embeddings"])
    to_storage = flows.slice(0, 3).set_column(3, "dst_addr", pa.array(["10.200.0.1"] * 3))
    found = parallelism.identify_parallelism("job", to_storage, members)
    assert (found.dp, found.pp, found.tp) == (None, None, None)
    assert found.job_gpus.num_rows == 32 and found.job_gpus["pp_stage"].null_count == 32
    assert found.comm_pairs["kind"].to_pylist() == ["other"] * found.comm_pairs.num_rows


def test_dp_inside_a_host_without_checkpoint_keeps_pp_and_the_stage_size():
    spec = JobSpec(2, tp=4, pp=2, start_s=0, end_s=SECONDS, step_s=3.0, hosts=(0, 1))
    flows, members, truth = simulated_job(spec)
    found = parallelism.identify_parallelism("job", flows, members)
    # NVLink hides how the stage splits into tp x dp: the prior gives TP the whole host
    assert (found.pp, found.tp * found.dp) == (2, 8)
    assert pairs_of(found, "pp") == truth["pp"]


def test_moe_all_to_all_with_a_straggler_is_not_a_pipeline():
    # pp 1, the expert all-to-all on the same rail-aligned NIC pairs as the DP ring. While one host
    # computes late its peers' all-to-all sends go out alone, as warm-up forwards would; its
    # family of sizes still says all-to-all, and the ring keeps its 'dp' label
    straggler = FaultSpec("straggler", at_s=30.0, span_s=90.0, factor=1.1, host=0)
    spec = JobSpec(2, tp=4, pp=1, start_s=0, end_s=SECONDS, step_s=6.0, micro_batches=2, moe=True, hosts=(0, 1),
                   faults=(straggler,))
    flows, members, truth = simulated_job(spec)
    found = parallelism.identify_parallelism("job", flows, members)
    assert (found.dp, found.pp, found.tp) == (4, 1, 4)
    assert pairs_of(found, "pp") == set()
    assert pairs_of(found, "dp") == truth["dp"]
    assert pairs_of(found, "other") >= truth["other"]


def test_an_all_to_all_behind_a_flow_cache_takes_its_rarer_sizes_too():
    # a flow cache's records of an all-to-all sum a few transfers each: on hosts 0 -> 1 the sizes
    # spread 10-31 MB in a bell (as measured behind `flow_cache`), whose tails come up too seldom
    # to agree with the middle's counts but belong to it; an 8.8 GB merged DP sync on the pair,
    # a 37 MB size of the run that recurs more than the family's middle, and a pipeline's one
    # activation size on hosts 0 -> 2 are no all-to-all
    from types import SimpleNamespace

    bell = [10, 45, 120, 250, 452, 629, 862, 982, 1031, 999, 823, 638, 463, 250, 132, 53, 10]
    sizes = [10_485_760 + 1_310_720 * k for k in range(len(bell))]
    groups = SimpleNamespace(
        src_host=np.array([0] * (len(bell) + 2) + [0]),
        dst_host=np.array([1] * (len(bell) + 2) + [2]),
        size=np.array([*sizes, 36_700_160, 8_808_038_400, 20_971_520], np.float64),
        flows=np.array([*bell, 2000, 120, 4590]),
    )
    found = parallelism._is_all_to_all(groups, parallelism.DEFAULT_PARAMS)
    assert found[:len(bell)].all()
    assert not found[len(bell):].any()


def test_a_pipeline_asymmetry_above_every_groups_finds_no_pipeline():
    # a pipeline's groups have warm-up and cool-down flows without reverse traffic in flight, but
    # never only those
    spec = SHAPES["ring, tied embeddings"]
    flows, members, truth = simulated_job(spec)
    strict = replace(parallelism.DEFAULT_PARAMS, pipeline_asymmetry=1.01)
    found = parallelism.identify_parallelism("job", flows, members, params=strict)
    assert truth["pp"] and pairs_of(found, "pp") == set()
    assert (found.pp, found.dp * found.tp) == (1, spec.dp * spec.tp * spec.pp)


# --- on simulated scenarios -----------------------------------------------------------------------


def analyze_scenario(flows: pa.Table, flow_minutes: pa.Table, topology) -> dict[str, pa.Table]:
    """Recognition, then parallelism per job, hour after hour: the warehouse tables of this stage."""
    start = flows["time_flow_start_ns"].to_numpy()
    tables: dict[str, list[pa.Table]] = {"jobs": [], "job_gpus": [], "comm_pairs": []}
    for hour, recognition in recognize_hours(flow_minutes, topology):
        members = recognition.membership
        in_hour = pa.array((start >= hour) & (start < hour + HOUR_NS))
        degrees = {}
        for job_id, job_flows in split_flows_by_job(flows.filter(in_hour), members):
            found = parallelism.identify_parallelism(job_id, job_flows, members.filter(pc.equal(members["job_id"], job_id)))
            tables["job_gpus"].append(found.job_gpus)
            tables["comm_pairs"].append(found.comm_pairs)
            degrees[job_id] = (found.dp, found.pp, found.tp)
        jobs = recognition.jobs
        for i, name in enumerate(("dp", "pp", "tp")):
            values = pa.array([degrees.get(j, (None,) * 3)[i] for j in jobs["job_id"].to_pylist()], pa.int32())
            jobs = jobs.set_column(jobs.schema.get_field_index(name), name, values)
        tables["jobs"].append(jobs)
    return {name: pa.concat_tables(parts) for name, parts in tables.items()}


def check_figures(figures, degrees_at_least):
    for name in ("jobs_matched_exactly", "jobs_split_or_merged", "pp_pair_precision", "pp_pair_recall",
                 "dp_pair_precision", "dp_pair_recall"):
        assert figures[name].ok, (name, figures[name])
    assert figures["degrees_exact"].value >= degrees_at_least
    assert figures["prism_jobs"].value == figures["true_jobs"].value  # no job seen twice or made up


def test_tiny_scenario_scores(scenario_dir):
    flows, flow_minutes, topology, truth = scenario_flows(scenario_dir("tiny"))
    figures = job_scores.score(truth, analyze_scenario(flows, flow_minutes, topology), {})
    check_figures(figures, degrees_at_least=1.0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_small_scenario_scores(scenario_dir, seed):
    flows, flow_minutes, topology, truth = scenario_flows(scenario_dir("small", seed))
    figures = job_scores.score(truth, analyze_scenario(flows, flow_minutes, topology), {})
    check_figures(figures, degrees_at_least=1.0)


@pytest.mark.slow
def test_fleet_scenario_scores(scenario_dir):
    flows, flow_minutes, topology, truth = scenario_flows(scenario_dir("fleet"))
    figures = job_scores.score(truth, analyze_scenario(flows, flow_minutes, topology), {})
    check_figures(figures, degrees_at_least=0.95)


@pytest.mark.parametrize("shape, shared", [("ring, tied embeddings", "pp"), ("moe", "dp")])
def test_each_flow_keeps_the_kind_of_its_own_size_family_on_a_shared_pair(shape, shared):
    # the tied embedding all-reduce rides the pipeline's pairs between the first and the last
    # stage, a MoE all-to-all the DP ring's: the pair is PP or DP, its other flows are OTHER
    flows, members, truth = simulated_job(SHAPES[shape])
    found = parallelism.identify_parallelism("job", flows, members)
    labelled = found.labelled(flows)
    pair = pa.array([f"{s}>{d}" for s, d in zip(flows["src_addr"].to_pylist(), flows["dst_addr"].to_pylist())])
    on_shared = pc.is_in(pair, value_set=pa.array([f"{s}>{d}" for s, d in truth[shared]])).to_numpy(zero_copy_only=False)
    kind, size = labelled[FLOW_KIND].to_numpy()[on_shared], flows["bytes"].to_numpy()[on_shared]
    family = labelled[FLOW_FAMILY_BYTES].to_numpy()[on_shared]
    own, other = kind == KIND_CODES[shared], kind == OTHER
    assert own.any() and other.any() and (own | other).all()
    assert set(size[other].tolist()).isdisjoint(size[own].tolist())
    # one family per transfer size, named by its smallest size
    assert (family <= size).all() and (family[own] >= size[own].min()).all()
    if shared == "pp":  # one activation size per micro-batch
        assert len(np.unique(family[own])) == 1
