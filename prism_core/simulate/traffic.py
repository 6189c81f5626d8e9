"""The network traffic of one training step, as flow records.

A *template* is every flow of one step of one job under one condition (attempt, slowdowns), with
times relative to the start of the step's compute: PP activation and gradient sends at the times
the 1F1B schedule dictates, the DP gradient collective when each stage's replicas are ready, MoE
all-to-all inside forward and backward, ZeRO-3 parameter gathers; with the job's traits, gradient
buckets synced during the last backward, the distributed optimizer's parameter all-gather under the
first forward, interleaved pipeline chunks (the last stage sends on to the first). A step of the
plan is its template shifted to the step start and scaled by the step's jitter, plus per-flow
launch noise.

Where a step ends (the truth's convention): at the end of its optimizer, and after a reduce-scatter
sync (`rs_ag`) at the end of the all-gather of the updated shards that follows the optimizer:
ZeRO-1/2 and the distributed optimizer without overlap send the same traffic at the same moment,
and both take the gather as the end of the step that ran the optimizer (nothing else on the
network tells where the next step begins; Megatron's profiler, whose What-if traces start each
step with `params-all-gather`, would place the boundary one gather earlier). With overlap, the
distributed optimizer's gather runs under the next step's first forward: it opens that step.

Rank layout is Megatron's by default: rank = tp_rank + tp * (dp_rank + dp * pp_stage)
(`JobModel.rank`); rank r runs on the GPU of slot r of the job's `Placement` (GPU r % 8 of job
host r // 8 for a job of whole hosts). Sends between GPUs of one host ride NVLink and produce no
record. Cross-host sends are rail-aligned (NCCL PXN): GPU i on host A sending to GPU j on host B
goes through the NIC of A's GPU j to the NIC of B's GPU j, or through GPU i's own NIC where the job
does not hold A's GPU j. One record per transfer per queue pair (NCCL channel). A ring whose group
holds several GPUs on each host crosses between two hosts once per lap: over the NIC pair of one
GPU, or (`Traits.ring_per_nic`, NCCL's rings one per NIC) over the NIC pairs of all of them, the
i-th GPU of the one host to the i-th of the other, each lane with its share of the hop's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from prism_core.arrays import Columns
from prism_core.simulate.cluster import GPUS_PER_HOST, Placement
from prism_core.simulate.model import NIC_RATE, NVLINK_RATE, JobModel, align, interleaved_one_f_one_b, one_f_one_b

ROCE_PORT = 4791
UDP, TCP = 17, 6
DP, PP, OTHER, STORAGE = 0, 1, 2, 3
KIND_NAMES = {DP: "dp", PP: "pp", OTHER: "other"}  # kinds of GPU-to-GPU job traffic
LAUNCH_SKEW_S = 3e-4  # kernel launch / NCCL proxy delay spread between peers
MOE_LEVELS = np.array([0.5, 0.75, 1.0, 1.25, 1.5])  # expert load imbalance: several a2a sizes
CHECKPOINT_CHUNKS = 4  # a GPU's checkpoint shard moves to or from storage in this many flows
SLOW_RING_SLACK = 0.1  # in a collective throttled by one slow link, other links finish this much earlier


@dataclass
class FlowBatch(Columns):
    """Flow records as columns; times in seconds from the scenario start, endpoints as indices."""

    start: np.ndarray  # float64
    end: np.ndarray  # float64
    src: np.ndarray  # int32 endpoint
    dst: np.ndarray  # int32 endpoint
    nbytes: np.ndarray  # int64
    src_port: np.ndarray  # int32
    dst_port: np.ndarray  # int32
    proto: np.ndarray  # int16

    dtypes = (float, float, np.int32, np.int32, np.int64, np.int32, np.int32, np.int16)


def roce_port(src, dst, qp, salt: int):
    """RoCEv2 source port: a hash of the queue pair, as NICs derive it for ECMP entropy."""
    h = np.asarray(src, np.int64) * 7919 + np.asarray(dst, np.int64) * 104729
    return (49152 + (h + np.asarray(qp, np.int64) * 1299709 + salt * 15485863) % 16384).astype(np.int32)


class Condition(NamedTuple):
    """What shapes one step's traffic besides the job itself."""

    attempt: int
    compute_scale: float = 1.0  # warm-up, degradation
    straggler_host: int = -1  # job host index computing slower
    straggler_factor: float = 1.0
    slow_nic: int = -1  # endpoint running below line rate
    slow_fraction: float = 1.0


@dataclass
class Template:
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    rel_start: np.ndarray
    rel_end: np.ndarray
    kind: np.ndarray  # DP | PP | OTHER | STORAGE
    varsize: np.ndarray  # bool: size drawn per step around nbytes (MoE all-to-all)
    src_port: np.ndarray
    dst_port: int
    proto: int
    channels: int
    duration: float  # compute start -> step end, before jitter and checkpoint

    def expand(self, base: np.ndarray, jitter: np.ndarray, rng: np.random.Generator) -> FlowBatch:
        """The flows of steps whose compute starts at `base` (seconds), scaled by `jitter`."""
        n = len(base)
        shape = (n, len(self.src))
        start = base[:, None] + jitter[:, None] * self.rel_start
        end = base[:, None] + jitter[:, None] * self.rel_end
        launch = rng.uniform(0.0, LAUNCH_SKEW_S, shape)
        stretch = np.abs(rng.normal(0.0, 0.02, shape)) * (end - start)
        nbytes = np.broadcast_to(self.nbytes, shape)
        if self.varsize.any():
            # one level per transfer: NCCL splits a send evenly over its channels' queue pairs
            level = MOE_LEVELS[rng.integers(len(MOE_LEVELS), size=(n, len(self.src) // self.channels))]
            level = np.repeat(level, self.channels, axis=1)
            nbytes = np.where(self.varsize, align(nbytes * level, self.channels), nbytes)
        return FlowBatch(
            start=(start + launch).ravel(),
            end=(end + launch + stretch).ravel(),
            src=np.tile(self.src, n),
            dst=np.tile(self.dst, n),
            nbytes=nbytes.ravel(),
            src_port=np.tile(self.src_port, n),
            dst_port=np.full(n * shape[1], self.dst_port, np.int32),
            proto=np.full(n * shape[1], self.proto, np.int16),
        )


class Links:
    """Routes rank-to-rank sends of one job onto NIC pairs and collects the network transfers."""

    def __init__(self, placement: Placement, gpu_nic: np.ndarray, slow_nic: int, slow_fraction: float,
                 ring_per_nic: bool = False):
        self.gpus = placement.gpus
        self.ring_per_nic = ring_per_nic
        self.gpu_nic = gpu_nic
        self.held = np.zeros(len(gpu_nic), bool)
        self.held[self.gpus] = True
        self.slow_nic = slow_nic
        self.slow_fraction = slow_fraction
        self.parts: list[tuple[np.ndarray, ...]] = []

    def route(self, a: np.ndarray, b: np.ndarray):
        src_gpu, dst_gpu = self.gpus[a], self.gpus[b]
        relay = src_gpu - src_gpu % GPUS_PER_HOST + dst_gpu % GPUS_PER_HOST  # PXN: on the receiver's rail
        relay = np.where(self.held[relay], relay, src_gpu)
        return (self.gpu_nic[relay], self.gpu_nic[dst_gpu],
                (src_gpu // GPUS_PER_HOST) != (dst_gpu // GPUS_PER_HOST))

    def rate(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        src, dst, on_network = self.route(a, b)
        rate = np.where(on_network, NIC_RATE, NVLINK_RATE)
        slow = on_network & ((src == self.slow_nic) | (dst == self.slow_nic))
        return np.where(slow, rate * self.slow_fraction, rate)

    def waiting_on_slow_link(self, a: np.ndarray, b: np.ndarray, group_rate: np.ndarray) -> np.ndarray:
        """Sends of a collective throttled by a slow link elsewhere in its group: they move at the
        group's pace but drain SLOW_RING_SLACK earlier than the slow link itself."""
        src, dst, _ = self.route(a, b)
        return (group_rate < NIC_RATE)[:, None] & (src != self.slow_nic) & (dst != self.slow_nic)

    def add(self, a, b, start, nbytes, kind: int, end=None, varsize: bool = False) -> None:
        if end is None:
            end = start + nbytes / self.rate(a, b)
        a, b, start, end, nbytes = np.broadcast_arrays(a, b, start, end, nbytes)
        src, dst, on_network = self.route(a, b)
        keep = on_network.ravel()
        self.parts.append(
            (src.ravel()[keep], dst.ravel()[keep], nbytes.ravel()[keep], start.ravel()[keep],
             end.ravel()[keep], np.full(keep.sum(), kind, np.int8), np.full(keep.sum(), varsize))
        )

    def template(self, duration: float, channels: int, salt: int) -> Template:
        empty = (np.empty(0, np.int64),) * 3 + (np.empty(0),) * 2 + (np.empty(0, np.int8),
                                                                      np.empty(0, bool))
        src, dst, nbytes, start, end, kind, varsize = (
            np.concatenate(column) for column in zip(empty, *self.parts)
        )
        qp = np.tile(np.arange(channels), len(src))
        src, dst = np.repeat(src, channels).astype(np.int32), np.repeat(dst, channels).astype(np.int32)
        start = np.repeat(start, channels)
        return Template(
            src=src,
            dst=dst,
            nbytes=np.repeat(nbytes, channels).astype(np.int64) // channels,
            rel_start=start,
            rel_end=np.maximum(np.repeat(end, channels), start + 1e-6),
            kind=np.repeat(kind, channels).astype(np.int8),
            varsize=np.repeat(varsize, channels).astype(bool),
            src_port=roce_port(src, dst, qp, salt),
            dst_port=ROCE_PORT,
            proto=UDP,
            channels=channels,
            duration=duration,
        )


def step_template(model: JobModel, placement: Placement, gpu_nic: np.ndarray, cond: Condition,
                  salt: int) -> Template:
    """Every GPU-to-GPU flow of one step of a job (see module doc)."""
    tp, pp, dp, m, v = model.tp, model.pp, model.dp, model.micro_batches, model.virtual_stages
    rank = model.rank

    fwd = np.full((dp, pp), model.fwd_s * cond.compute_scale)
    bwd = np.full((dp, pp), model.bwd_s * cond.compute_scale)
    if model.traits.stage_factors:
        fwd, bwd = fwd * model.traits.stage_factors, bwd * model.traits.stage_factors
    if cond.straggler_host >= 0:
        # the TP group holding a slow GPU runs at its pace (TP all-reduces every layer)
        _, d, s = model.coords(placement.slots_on(cond.straggler_host))
        fwd[d, s] *= cond.straggler_factor
        bwd[d, s] *= cond.straggler_factor
    links = Links(placement, gpu_nic, cond.slow_nic, cond.slow_fraction, model.traits.ring_per_nic)
    buckets = np.asarray(model.bucket_bytes)
    # DP groups: one per (tp rank, stage), members ordered by dp rank; axes (group, member)
    t, s, d = (x.reshape(tp * pp, dp) for x in np.meshgrid(np.arange(tp), np.arange(pp), np.arange(dp), indexing="ij"))
    member, succ = rank(t, d, s), rank(t, (d + 1) % dp, s)

    # the distributed optimizer with overlap gathers the parameters under the first forward, which
    # waits for the first bucket; without overlap the gather follows the optimizer (below)
    gathers_at_start = model.traits.distributed_optimizer and model.traits.overlap
    lead = 0.0
    if dp > 1 and gathers_at_start:
        at_start = np.zeros((len(member), 1))
        lead = _ring(links, member, succ, align(buckets * (dp - 1) / dp, model.channels), at_start[:, :, None],
                     at_start)[:, 0].max()

    # Chunk c of stage s is virtual stage c * pp + s (one chunk per stage without interleaving);
    # hop k moves an activation from virtual stage k to k + 1.
    hop_from, hop_to = np.arange(pp * v - 1) % pp, np.arange(1, pp * v) % pp
    t, d, k = np.meshgrid(np.arange(tp), np.arange(dp), np.arange(pp * v - 1), indexing="ij")
    # Each DP replica runs its own pipeline; its PP hops take as long as the slowest TP rank's.
    comm_fwd = (model.act_bytes / links.rate(rank(t, d, hop_from[k]), rank(t, d, hop_to[k]))).max(axis=0, initial=0)
    comm_bwd = (model.act_bytes / links.rate(rank(t, d, hop_to[k]), rank(t, d, hop_from[k]))).max(axis=0, initial=0)
    chunk_fwd, chunk_bwd = np.tile(fwd, v) / v, np.tile(bwd, v) / v  # (dp, virtual stage)
    fwd_start, bwd_start = np.empty((dp, pp * v, m)), np.empty((dp, pp * v, m))
    schedules: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
    for replica in range(dp):
        inputs = (fwd[replica] / v, bwd[replica] / v, comm_fwd[replica], comm_bwd[replica])
        key = b"".join(x.tobytes() for x in inputs)
        if key not in schedules:
            schedules[key] = one_f_one_b(*inputs, m) if v == 1 else interleaved_one_f_one_b(*inputs, m, v)
        fwd_start[replica], bwd_start[replica] = schedules[key]
    fwd_start, bwd_start = fwd_start + lead, bwd_start + lead
    fwd_end = fwd_start + chunk_fwd[:, :, None]
    bwd_end = bwd_start + chunk_bwd[:, :, None]
    ready = bwd_end.reshape(dp, v, pp, m).max(axis=(1, 3))  # (dp, pp): the replica's stage has all its gradients

    if pp > 1:
        t, d, k, i = np.meshgrid(np.arange(tp), np.arange(dp), np.arange(pp * v - 1), np.arange(m), indexing="ij")
        links.add(rank(t, d, hop_from[k]), rank(t, d, hop_to[k]), fwd_end[d, k, i], model.act_bytes, PP)
        links.add(rank(t, d, hop_to[k]), rank(t, d, hop_from[k]), bwd_end[d, k + 1, i], model.act_bytes, PP)
        if model.tied_embeddings:
            t, d = np.meshgrid(np.arange(tp), np.arange(dp), indexing="ij")
            first, last = rank(t, d, 0), rank(t, d, pp - 1)
            both = np.maximum(ready[d, 0], ready[d, pp - 1])
            links.add(first, last, both, model.emb_bytes, OTHER)
            links.add(last, first, both, model.emb_bytes, OTHER)
            if model.traits.embedding_before_sync:
                # Megatron all-reduces the embedding before the first and last stage's DP sync
                took = model.emb_bytes / np.minimum(links.rate(first, last), links.rate(last, first))
                ready[:, [0, pp - 1]] = (both + took).max(axis=0)[:, None]

    sync_end = ready.max()
    if dp > 1:
        t, s, d = (x.reshape(tp * pp, dp) for x in np.meshgrid(
            np.arange(tp), np.arange(pp), np.arange(dp), indexing="ij"))
        member_ready = ready[d, s][:, :, None]  # (group, member, bucket)
        if model.traits.overlap:
            # the last backward finishes the buckets one after another and each syncs at once
            last_pass = chunk_bwd[d, s][:, :, None]
            member_ready = member_ready - last_pass * (1 - np.arange(1, len(buckets) + 1) / len(buckets))
        release = member_ready.max(axis=1)
        if model.collective == "tree":
            sync_end = _tree(links, t[:, 1:], s[:, 1:], d[:, 1:], rank, buckets, member_ready[:, 1:],
                             release).max()
        else:
            share = 2 * (dp - 1) / dp if model.collective == "ring" else (dp - 1) / dp
            sync_end = _ring(links, member, succ, align(buckets * share, model.channels),
                             member_ready, release)[:, -1].max()
        if model.collective == "zero":
            # ZeRO-3: parameters gathered again for every micro-batch's forward
            gather_start = fwd_start[d, s].transpose(2, 0, 1).reshape(m * tp * pp, dp)
            _ring(links, np.tile(member, (m, 1)), np.tile(succ, (m, 1)),
                  align([model.param_bytes * (dp - 1) / dp], model.channels), gather_start[:, :, None],
                  gather_start.max(axis=1)[:, None])
        if model.moe:
            _all_to_all(links, model, rank, fwd_start, bwd_start, chunk_fwd, chunk_bwd)
    step_end = sync_end + model.opt_s
    if dp > 1 and model.collective == "rs_ag" and not gathers_at_start:
        # ZeRO-1/2, the distributed optimizer without overlap: the updated shards all-gathered
        # after the optimizer close the step
        after = np.full((len(member), 1), step_end)
        step_end = _ring(links, member, succ, align(buckets * (dp - 1) / dp, model.channels),
                         after[:, :, None], after)[:, -1].max()
    return links.template(step_end, model.channels, salt)


def _bucket_done(release: np.ndarray, took: np.ndarray) -> np.ndarray:
    """When each bucket of a group's collective is done, (group, bucket): bucket k starts once it is
    released (`release`, (group, bucket) or (group, 1)) and bucket k - 1 is done."""
    moved = np.cumsum(took, axis=1)
    return np.maximum.accumulate(release - (moved - took), axis=1) + moved


def _ring(links: Links, member, succ, hop_bytes, first_start, release) -> np.ndarray:
    """Bucketed ring collective: every member sends each bucket's share to its successor.

    A member starts sending a bucket when it has it (`first_start`, (group, member, bucket) or
    (group, member, 1)), but the ring moves it only once every member has it (`release`, (group,
    bucket) or (group, 1)) and the bucket before is done: early members' flows stretch while they
    wait, the latecomer's look normal. The ring runs at its slowest hop's pace, a hop over several
    lanes (`_ring_lanes`) as fast as its slowest lane times their number. Returns when each group's
    buckets are done, (group, bucket).
    """
    senders, receivers = _ring_lanes(links, member, succ)
    lanes = (senders != receivers).sum(axis=0)
    lane_rate = links.rate(senders, receivers).min(axis=0)
    ring_rate = (np.maximum(lanes, 1) * lane_rate).min(axis=1)
    took = hop_bytes[None, :] / ring_rate[:, None]  # (group, bucket)
    done = _bucket_done(release, took)
    start = np.where(np.arange(len(hop_bytes)) == 0, first_start,
                     np.maximum(first_start, (done - took)[:, None, :]))
    slowest_lane = lane_rate.min(axis=1)
    lane_bytes = hop_bytes[None, None, :] // np.maximum(lanes, 1)[:, :, None]
    for a, b in zip(senders, receivers):
        slack = np.where(links.waiting_on_slow_link(a, b, slowest_lane)[:, :, None],
                         SLOW_RING_SLACK * took[:, None, :], 0.0)
        links.add(a[:, :, None], b[:, :, None], start, lane_bytes, DP, end=done[:, None, :] - slack)
    return done


def _ring_lanes(links: Links, member, succ) -> tuple[np.ndarray, np.ndarray]:
    """Senders and receivers of each ring hop's lanes, (lane, group, member): the hop itself, or
    (`links.ring_per_nic`) for a hop between hosts, the i-th of the group's GPUs on the one host to
    the i-th on the other, as many lanes as the fewer of them. An unused lane sends from a member to
    itself (no record)."""
    if not links.ring_per_nic:
        return member[None], succ[None]
    host = links.gpus[member] // GPUS_PER_HOST
    n = member.shape[1]
    # a group's members on one host are consecutive in ring order (dp rank): runs of one host
    index = np.broadcast_to(np.arange(n), member.shape)
    run_start = np.maximum.accumulate(np.where(np.c_[np.ones(len(member), bool), host[:, 1:] != host[:, :-1]],
                                               index, 0), axis=1)
    run_length = np.bincount((run_start + n * np.arange(len(member))[:, None]).ravel(),
                             minlength=member.size).reshape(member.shape)
    length = np.take_along_axis(run_length, run_start, axis=1)
    nxt = (index + 1) % n
    crossing = host != np.take_along_axis(host, nxt, axis=1)
    width = np.where(crossing, np.minimum(length, np.take_along_axis(length, nxt, axis=1)), 1)
    senders, receivers = [], []
    for lane in range(int(width.max())):
        spread = crossing & (width > 1) & (lane < width)
        senders.append(np.where(spread, np.take_along_axis(member, (run_start + lane) % n, axis=1), member))
        receivers.append(np.where(spread, np.take_along_axis(member, (nxt + lane) % n, axis=1),
                                  succ if lane == 0 else member))
    return np.stack(senders), np.stack(receivers)


def _tree(links: Links, t, s, d, rank, buckets, child_ready, release) -> np.ndarray:
    """NCCL tree all-reduce over the dp ranks of each group (binary tree, parent (d-1)//2).

    Each bucket goes up from child to parent (reduce) and comes back down (broadcast), pipelined
    half a bucket apart. `t, s, d` cover the non-root members, axes (group, member); `child_ready`
    and `release` as `_ring`'s `first_start` and `release`.
    """
    child, parent = rank(t, d, s), rank(t, (d - 1) // 2, s)
    tree_rate = links.rate(child, parent).min(axis=1)
    took = buckets[None, :] / tree_rate[:, None]
    done = _bucket_done(release, took)
    up_start = np.where(np.arange(len(buckets)) == 0, child_ready,
                        np.maximum(child_ready, (done - took)[:, None, :]))
    slack = np.where(links.waiting_on_slow_link(child, parent, tree_rate)[:, :, None],
                     SLOW_RING_SLACK * took[:, None, :], 0.0)
    links.add(child[:, :, None], parent[:, :, None], up_start, buckets, DP, end=done[:, None, :] - slack)
    down_start = (done - took / 2)[:, None, :]
    links.add(parent[:, :, None], child[:, :, None], down_start, buckets, DP,
              end=down_start + took[:, None, :] - slack)
    return done[:, -1] + took[:, -1] / 2


def _all_to_all(links: Links, model: JobModel, rank, fwd_start, bwd_start, fwd, bwd) -> None:
    """MoE expert all-to-all among the DP (= expert-parallel) group, inside every fwd and bwd of
    every virtual stage (`fwd`, `bwd`: (dp, virtual stage) pass times)."""
    tp, pp, dp, m = model.tp, model.pp, model.dp, model.micro_batches
    t, k, d1, d2, i = np.meshgrid(np.arange(tp), np.arange(pp * model.virtual_stages), np.arange(dp),
                                  np.arange(dp), np.arange(m), indexing="ij")
    peer = d1 != d2
    t, k, d1, d2, i = (x[peer] for x in (t, k, d1, d2, i))
    a, b = rank(t, d1, k % pp), rank(t, d2, k % pp)
    links.add(a, b, fwd_start[d1, k, i] + 0.25 * fwd[d1, k], model.a2a_bytes, OTHER, varsize=True)
    links.add(a, b, bwd_start[d1, k, i] + 0.25 * bwd[d1, k], model.a2a_bytes, OTHER, varsize=True)


def checkpoint_template(
    model: JobModel, placement: Placement, gpu_nic: np.ndarray, storage_base: int, n_storage: int, salt: int
) -> Template:
    """Checkpoint writes: every dp_rank-0 GPU streams its shard to a storage server over RDMA,
    in 4 chunks spread over the save time; times relative to the end of the step's compute.
    A resume reads the same shards back from the same servers at the same pace
    (`checkpoint_load_template`). Over a storage network the flow logs do not see, no record."""
    chunks = CHECKPOINT_CHUNKS
    writer = model.rank(np.arange(model.tp)[:, None], 0, np.arange(model.pp)[None, :]).ravel()
    if model.traits.storage_network:
        writer = writer[:0]
    nic = gpu_nic[placement.gpus[writer]]
    server = storage_base + (nic * 7 + salt) % n_storage
    chunk = np.tile(np.arange(chunks), len(nic))
    nic, server = np.repeat(nic, chunks).astype(np.int32), np.repeat(server, chunks).astype(np.int32)
    start = model.ckpt_save_s * (0.05 + 0.225 * chunk)
    return Template(
        src=nic,
        dst=server,
        nbytes=np.full(len(nic), align(model.ckpt_bytes / chunks, 1), np.int64),
        rel_start=start,
        rel_end=start + 0.2 * model.ckpt_save_s,
        kind=np.full(len(nic), STORAGE, np.int8),
        varsize=np.zeros(len(nic), bool),
        src_port=roce_port(nic, server, chunk, salt),
        dst_port=ROCE_PORT,
        proto=UDP,
        channels=1,
        duration=model.ckpt_save_s,
    )


def checkpoint_load_template(writes: Template, salt: int) -> Template:
    """Checkpoint load of a relaunched job: the saving GPUs read their shards back from the
    servers they wrote them to (the save's `writes` reversed); times relative to the load's
    start."""
    chunk = np.tile(np.arange(CHECKPOINT_CHUNKS), len(writes.src) // CHECKPOINT_CHUNKS)
    return replace(writes, src=writes.dst, dst=writes.src, src_port=roce_port(writes.dst, writes.src, chunk, salt))
