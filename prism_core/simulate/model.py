"""What one training step of a job costs: message sizes and compute times, and the 1F1B schedule.

The step time follows the operator-level model of arXiv 2509.22832,
    step = (m - 1 + pp) x (stage forward + backward per micro-batch) + DP sync + optimizer,
read backwards: the scenario fixes the nominal step time, the model picks a plausible LLM (hidden
size, layers, sequence length) for the job's shape, derives the message sizes from it, and gives
the compute whatever time the communication leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism_core.simulate.scenarios import JobSpec
from prism_core import waste

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


def job_model(spec: JobSpec, rng: np.random.Generator) -> JobModel:
    tp, pp, dp, m, ch = spec.tp, spec.pp, spec.dp, spec.micro_batches, spec.channels
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
    opt_s = 0.04 * spec.step_s
    compute_s = spec.step_s - sync_s - opt_s - m * param / NIC_RATE
    fwd_bwd = compute_s / (m - 1 + pp)
    return JobModel(
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batches=m,
        channels=ch,
        collective=spec.collective,
        moe=spec.moe,
        tied_embeddings=spec.tied_embeddings,
        fwd_s=fwd_bwd / 3,
        bwd_s=2 * fwd_bwd / 3,
        opt_s=opt_s,
        act_bytes=int(act),
        bucket_bytes=buckets,
        param_bytes=int(param),
        a2a_bytes=int(align(act * 2 / max(dp, 1), ch)),
        emb_bytes=int(align(hidden * 32000 * 2 / tp, ch)),
        ckpt_every=max(2, round(spec.checkpoint_s / spec.step_s)),
        ckpt_save_s=float(spec.step_s * rng.uniform(1.0, 3.0)),
        ckpt_bytes=int(align(6 * params / (tp * pp), ch)),
        jitter_sigma=float(rng.uniform(0.01, 0.03)),
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
