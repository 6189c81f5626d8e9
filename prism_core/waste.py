"""Wasted GPU-seconds: the one definition of what each issue costs (see docs/waste.md).

Two quantities cover every issue kind:

- *excess*: GPUs x (step duration - the baseline step duration), summed over the steps an issue
  stretched (slow steps, stragglers, slow links, degradation, warm-up after a restart). Steps
  that came out faster than the baseline inside a stretched window count negatively, so jitter
  averages out instead of adding up;
- *idle*: GPUs x a span of wall time in which the job made no progress that survives: a hang from
  the last checkpoint until its hosts are released, a restart from the last checkpoint until the
  job runs again.

A slow link carrying pipeline transfers only is an excess too, but one that step times cannot
resolve: each step's delay is the difference of its 1F1B schedule replayed with the transfers as
observed and as their peers took them (`one_f_one_b`, `pipeline_makespan`, `pipeline_delay_s`).

A restart costs idle(last checkpoint -> resume) + excess(warm-up steps after the resume); a
restart after a hang costs idle(kill -> resume) + excess(warm-up), the hang having counted the
work lost since the checkpoint and the silence until the watchdog killed the job.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

NS_PER_S = 1e9


def excess_gpu_s(durations_s: np.ndarray, baseline_s: np.ndarray | float, n_gpus: int) -> float:
    """GPUs x sum(duration - baseline) over the given steps; never below zero in total."""
    excess = np.asarray(durations_s, float) - baseline_s
    return max(float(np.sum(excess)), 0.0) * n_gpus


def window_excess_gpu_s(measured_s: np.ndarray, baseline_s: np.ndarray, n_steps: int, n_gpus: int) -> float:
    """Excess over a window of `n_steps` steps of which only `measured_s` could be measured (the
    others were checkpoints or separate issues): the measured mean excess stands for every step."""
    if not len(measured_s):
        return 0.0
    mean_excess = float(np.mean(np.asarray(measured_s, float) - baseline_s))
    return max(mean_excess, 0.0) * n_steps * n_gpus


def idle_gpu_s(n_gpus: int, from_ns: int, to_ns: int) -> float:
    """GPUs x the wall time from `from_ns` to `to_ns` (zero when the span is empty)."""
    return max(to_ns - from_ns, 0) / NS_PER_S * n_gpus


def restart_gpu_s(
    n_gpus: int, lost_from_ns: int, resume_ns: int, warmup_s: np.ndarray, baseline_s: float
) -> float:
    """Idle from `lost_from_ns` (the last checkpoint: the work lost and the downtime; after a hang,
    the kill) to the resume, and the slower warm-up steps."""
    return idle_gpu_s(n_gpus, lost_from_ns, resume_ns) + excess_gpu_s(warmup_s, baseline_s, n_gpus)


@lru_cache(maxsize=64)
def one_f_one_b_order(pp: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The operation order of each stage under 1F1B (PipeDream-Flush, Megatron's default
    schedule): stage s runs min(pp - 1 - s, m) warm-up forwards, then alternates one forward and
    one backward, then drains the remaining backwards. Returns (is_forward, micro_batch), each
    (pp, 2m), shared between callers: read only."""
    is_forward = np.zeros((pp, 2 * m), bool)
    micro_batch = np.zeros((pp, 2 * m), np.int64)
    for s in range(pp):
        warm = min(pp - 1 - s, m)
        ops = [(True, i) for i in range(warm)]
        for i in range(m - warm):
            ops += [(True, warm + i), (False, i)]
        ops += [(False, i) for i in range(m - warm, m)]
        is_forward[s], micro_batch[s] = zip(*ops)
    return is_forward, micro_batch


def one_f_one_b(
    fwd: np.ndarray, bwd: np.ndarray, comm_fwd: np.ndarray, comm_bwd: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Start times of every forward and backward pass of 1F1B pipelines, (..., pp, m) each.

    fwd, bwd: (..., pp) compute time of one micro-batch's forward / backward on each stage;
    comm_fwd, comm_bwd: (..., pp - 1, m) time to move micro-batch i's activation from stage s to
    s + 1 / its gradient back. A pass starts when its stage is done with the previous pass in its
    order and its input has arrived: the start times are the longest paths through that
    dependency graph, found by relaxing the stages in turn (a stage's chain is a running maximum)
    until no start moves.
    """
    fwd, bwd = np.asarray(fwd, float), np.asarray(bwd, float)
    batch, pp = fwd.shape[:-1], fwd.shape[-1]
    m = np.shape(comm_fwd)[-1]
    n = int(np.prod(batch))
    fwd, bwd = fwd.reshape(n, pp), bwd.reshape(n, pp)
    comm_fwd = np.asarray(comm_fwd, float).reshape(n, pp - 1, m)
    comm_bwd = np.asarray(comm_bwd, float).reshape(n, pp - 1, m)
    is_forward, micro_batch = one_f_one_b_order(pp, m)
    duration = np.where(is_forward[None], fwd[:, :, None], bwd[:, :, None])  # (n, pp, 2m)
    offset = np.cumsum(duration, axis=2) - duration  # start of each pass with no waiting
    # where in its stage's order the forward / backward of micro-batch i runs
    position = np.empty((pp, 2, m), np.int64)
    stage = np.arange(pp)[:, None]
    position[stage, (~is_forward).astype(int), micro_batch] = np.arange(2 * m)[None, :]
    start = offset.copy()
    while True:
        before = start.copy()
        for s in list(range(pp)) + list(range(pp - 2, -1, -1)):
            ready = np.zeros((n, 2 * m))
            if s > 0:  # a forward needs the previous stage's forward of its micro-batch
                sent = start[:, s - 1, position[s - 1, 0]] + fwd[:, s - 1, None] + comm_fwd[:, s - 1]
                ready[:, is_forward[s]] = sent[:, micro_batch[s][is_forward[s]]]
            if s < pp - 1:  # a backward needs the next stage's backward of its micro-batch
                sent = start[:, s + 1, position[s + 1, 1]] + bwd[:, s + 1, None] + comm_bwd[:, s]
                ready[:, ~is_forward[s]] = sent[:, micro_batch[s][~is_forward[s]]]
            start[:, s] = np.maximum.accumulate(ready - offset[:, s], axis=1) + offset[:, s]
        if np.array_equal(start, before):
            break
    fwd_start, bwd_start = start[:, stage, position[:, 0]], start[:, stage, position[:, 1]]
    return fwd_start.reshape(*batch, pp, m), bwd_start.reshape(*batch, pp, m)


def pipeline_makespan(fwd: np.ndarray, bwd: np.ndarray, comm_fwd: np.ndarray, comm_bwd: np.ndarray) -> np.ndarray:
    """How long 1F1B pipelines take from their first forward to their last backward (shapes as
    `one_f_one_b`; returns (...)): every stage ends with the backward of the last micro-batch.
    With equal stages and free communication it is (m - 1 + pp) x (fwd + bwd), the
    operator-level model's pipeline term."""
    _, bwd_start = one_f_one_b(fwd, bwd, comm_fwd, comm_bwd)
    return (bwd_start[..., -1] + np.asarray(bwd, float)).max(axis=-1)


def pipeline_delay_s(fwd: np.ndarray, bwd: np.ndarray, comm_fwd: np.ndarray, comm_bwd: np.ndarray,
                     usual_fwd: np.ndarray, usual_bwd: np.ndarray) -> np.ndarray:
    """Per step, how much later its pipelines finish because their transfers took `comm_fwd`,
    `comm_bwd` instead of `usual_fwd`, `usual_bwd` (each (steps, replicas, pp - 1, m); `fwd`,
    `bwd` (steps, replicas, pp)). Every data-parallel replica runs its own pipeline and the step
    goes on (gradient synchronization, optimizer) when the last one is done: the delay of the
    slowest replica."""
    late = pipeline_makespan(fwd, bwd, comm_fwd, comm_bwd).max(axis=-1)
    usual = pipeline_makespan(fwd, bwd, usual_fwd, usual_bwd).max(axis=-1)
    return late - usual
