"""What one training step of a job costs: message sizes and compute times, and the 1F1B schedule.

The step time follows the operator-level model of arXiv 2509.22832,
    step = (m - 1 + pp) x (stage forward + backward per micro-batch) + DP sync + optimizer,
read backwards: the scenario fixes the nominal step time, the model picks a plausible LLM (hidden
size, layers, sequence length) for the job's shape, derives the message sizes from it, and gives
the compute whatever time the communication leaves. The job's `Traits` set what the textbook job
fixes: the optimizer's share, backward / forward, rank order, interleaving, stage imbalance, the
jitter's tail, where checkpoints go and how long they take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prism_core import waste
from prism_core.simulate.scenarios import JobSpec
from prism_core.simulate.variation import PARETO_CAP, Traits

NIC_RATE = 40e9  # bytes/s one 400 Gb/s RoCE NIC sustains
NVLINK_RATE = 300e9  # bytes/s between GPUs of a host (never on the network)
MIB = 1 << 20
BUCKET_TARGET = 512 * MIB  # DP gradient bucket size
MAX_SYNC_SHARE = 0.15  # DP sync time share of the step above which gradients are shrunk
WARMUP_AT_START = (1.8, 1.35, 1.1)  # compute slowdown of the first steps (compile, cache, allocator)
WARMUP_AFTER_RESTART = (2.2, 1.6, 1.2)


def align(nbytes, channels: int):
    """Round message sizes to whole 1 KiB units per channel (NCCL splits them evenly)."""
    unit = 1024 * channels
    return np.maximum(np.round(np.asarray(nbytes) / unit), 1).astype(np.int64) * unit


@dataclass(frozen=True)
class JobModel:
    tp: int
    pp: int
    dp: int
    micro_batches: int
    channels: int
    collective: str
    moe: bool
    tied_embeddings: bool
    fwd_s: float  # one stage, one micro-batch
    bwd_s: float
    opt_s: float
    act_bytes: int  # activation (and its gradient) per TP rank per micro-batch
    bucket_bytes: tuple[int, ...]  # DP gradient buckets of one GPU
    param_bytes: int  # ZeRO-3 parameters gathered per micro-batch
    a2a_bytes: int  # MoE all-to-all, per peer per micro-batch (varies around this)
    emb_bytes: int  # tied embedding gradient
    ckpt_every: int  # steps between checkpoints
    ckpt_save_s: float  # extra time of a checkpoint step
    ckpt_bytes: int  # written by each dp_rank-0 GPU per checkpoint
    jitter_sigma: float  # lognormal step-to-step jitter
    traits: Traits = field(default_factory=Traits)

    @property
    def virtual_stages(self) -> int:
        return self.traits.virtual_stages

    def rank(self, t, d, s):
        """Global rank of tensor rank t, data-parallel rank d, pipeline stage s."""
        if self.traits.rank_order == "tp-pp-dp":
            return t + self.tp * (s + self.pp * d)
        return t + self.tp * (d + self.dp * s)

    def coords(self, rank) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tp rank, dp rank, pipeline stage) of global ranks."""
        rest, t = np.divmod(np.asarray(rank), self.tp)
        if self.traits.rank_order == "tp-pp-dp":
            return t, rest // self.pp, rest % self.pp
        return t, rest % self.dp, rest // self.dp

    def jitter(self, rng: np.random.Generator) -> float:
        """One step's time scale: lognormal jitter, times a capped Pareto stall with a tail."""
        jitter = float(rng.lognormal(0.0, self.jitter_sigma))
        if self.traits.tail_alpha > 0:
            jitter *= 1.0 + self.traits.tail_scale * min(float(rng.pareto(self.traits.tail_alpha)), PARETO_CAP)
        return jitter

    def save_time(self, rng: np.random.Generator) -> float:
        """How long one checkpoint save takes."""
        if self.traits.checkpoint_spread > 0:
            return self.ckpt_save_s * float(rng.lognormal(0.0, self.traits.checkpoint_spread))
        return self.ckpt_save_s


def job_model(spec: JobSpec, rng: np.random.Generator) -> JobModel:
    tp, pp, dp, m, ch = spec.tp, spec.pp, spec.dp, spec.micro_batches, spec.channels
    traits = spec.traits or Traits()
    hidden = int(rng.choice([4096, 5120, 6144, 8192]))
    seq = int(rng.choice([2048, 4096, 8192]))
    layers = int(rng.choice([32, 40, 48, 64, 80]))
    params = 12 * layers * hidden**2
    grad = 2 * params / (tp * pp)  # bf16 gradients of one GPU's shard
    ring_factor = 2 * (dp - 1) / dp
    if dp > 1:
        grad = min(grad, MAX_SYNC_SHARE * spec.step_s * NIC_RATE / ring_factor)
    n_buckets = int(np.clip(np.ceil(grad / BUCKET_TARGET), 1, 4))
    bucket = align(grad / n_buckets, ch)
    last = align(max(grad - bucket * (n_buckets - 1), 0.3 * bucket), ch)  # a smaller tail bucket
    buckets = tuple(int(b) for b in [bucket] * (n_buckets - 1) + [last])
    sync_s = sum(buckets) * ring_factor / NIC_RATE if dp > 1 else 0.0
    act = align(seq * hidden * 2 / tp, ch)
    # ZeRO-3 gathers the parameters again for every micro-batch: keep that under 5% of the step
    param = align(min(grad, 0.05 * spec.step_s * NIC_RATE / m), ch) if spec.collective == "zero" else 0
    opt_s = traits.optimizer_share * spec.step_s
    compute_s = spec.step_s - sync_s - opt_s - m * param / NIC_RATE
    fwd_bwd = compute_s / (m + (pp - 1) / traits.virtual_stages)  # interleaving shrinks the bubble
    return JobModel(
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batches=m,
        channels=ch,
        collective=spec.collective,
        moe=spec.moe,
        tied_embeddings=spec.tied_embeddings,
        fwd_s=fwd_bwd / (1 + traits.backward_ratio),
        bwd_s=traits.backward_ratio * fwd_bwd / (1 + traits.backward_ratio),
        opt_s=opt_s,
        act_bytes=int(act),
        bucket_bytes=buckets,
        param_bytes=int(param),
        a2a_bytes=int(align(act * 2 / max(dp, 1), ch)),
        emb_bytes=int(align(hidden * 32000 * 2 / tp, ch)),
        ckpt_every=max(2, round(spec.checkpoint_s / spec.step_s)),
        ckpt_save_s=float(spec.step_s * rng.uniform(*traits.checkpoint_steps)),
        ckpt_bytes=int(align(6 * params / (tp * pp), ch)),
        jitter_sigma=float(rng.uniform(0.01, 0.03)) if traits.jitter_sigma is None else traits.jitter_sigma,
        traits=traits,
    )


def one_f_one_b(
    fwd: np.ndarray, bwd: np.ndarray, comm_fwd: np.ndarray, comm_bwd: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """Start times of every forward and backward pass of one pipeline replica under 1F1B, by the
    schedule diagnosis replays (`prism_core.waste.one_f_one_b`).

    fwd, bwd: (pp,) compute time per micro-batch of each stage; comm_fwd[s] / comm_bwd[s]: time to
    move an activation from stage s to s+1 / its gradient back, (pp-1,), the same for every
    micro-batch. Returns (fwd_start, bwd_start), each (pp, m). With equal stages and no
    communication the step is (m - 1 + pp) x (fwd + bwd).
    """
    per_micro_batch = (len(fwd) - 1, m)
    return waste.one_f_one_b(fwd, bwd, np.broadcast_to(np.asarray(comm_fwd, float)[:, None], per_micro_batch),
                             np.broadcast_to(np.asarray(comm_bwd, float)[:, None], per_micro_batch))


def interleaved_one_f_one_b(
    fwd: np.ndarray, bwd: np.ndarray, comm_fwd: np.ndarray, comm_bwd: np.ndarray, m: int, v: int
) -> tuple[np.ndarray, np.ndarray]:
    """Start times of every pass of one pipeline replica under Megatron's interleaved 1F1B.

    Stage s holds model chunks s, s + pp, ..., s + (v - 1) pp (virtual stages), so a micro-batch
    passes every stage v times. fwd, bwd: (pp,) compute time of one chunk per micro-batch;
    comm_fwd[k] / comm_bwd[k]: time to move an activation from virtual stage k to k + 1 / its
    gradient back, (pp v - 1,). Each stage runs Megatron's order (warm-up forwards, one forward one
    backward, cool-down backwards; micro-batches in rounds of pp, chunk by chunk), and a pass starts
    when its stage is free and its input has arrived. Returns (fwd_start, bwd_start), each
    (pp v, m), by virtual stage; m must be a multiple of pp.
    """
    pp = len(fwd)
    last, passes = pp * v - 1, m * v
    start = {True: np.full((pp * v, m), np.nan), False: np.full((pp * v, m), np.nan)}

    def nth(k: int, forward: bool) -> tuple[int, int]:
        """Virtual stage offset (chunk) and micro-batch of a stage's k-th forward or backward."""
        chunk = (k // pp) % v
        return (chunk if forward else v - 1 - chunk), (k // (pp * v)) * pp + k % pp

    orders = []
    for s in range(pp):
        warm = min((pp - s - 1) * 2 + (v - 1) * pp, passes)
        order = [(True, k) for k in range(warm)]
        for k in range(passes - warm):
            order += [(True, warm + k), (False, k)]
        order += [(False, k) for k in range(passes - warm, passes)]
        orders.append([(forward, s + pp * chunk, i) for forward, k in order for chunk, i in [nth(k, forward)]])

    position, free = [0] * pp, [0.0] * pp
    while any(position[s] < len(orders[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while position[s] < len(orders[s]):
                forward, vs, i = orders[s][position[s]]
                if forward:
                    ready = 0.0 if vs == 0 else start[True][vs - 1, i] + fwd[(vs - 1) % pp] + comm_fwd[vs - 1]
                elif vs == last:
                    ready = start[True][vs, i] + fwd[s]
                else:
                    ready = start[False][vs + 1, i] + bwd[(vs + 1) % pp] + comm_bwd[vs]
                if np.isnan(ready):
                    break  # its input is not computed yet: go on with the next stage
                start[forward][vs, i] = max(free[s], ready)
                free[s] = start[forward][vs, i] + (fwd[s] if forward else bwd[s])
                position[s] += 1
                moved = True
        if not moved:
            raise ValueError(f"interleaved schedule deadlocks (pp={pp}, m={m}, v={v})")
    return start[True], start[False]
