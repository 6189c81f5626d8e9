"""Wasted GPU-seconds: the one definition of what each issue costs (see docs/waste.md).

Two quantities cover every issue kind:

- *excess*: GPUs x (step duration - the baseline step duration), summed over the steps an issue
  stretched (slow steps, stragglers, slow links, degradation, warm-up after a restart). Steps
  that came out faster than the baseline inside a stretched window count negatively, so jitter
  averages out instead of adding up;
- *idle*: GPUs x a span of wall time in which the job made no progress that survives: a hang from
  the last checkpoint until its hosts are released, a restart from the last checkpoint until the
  job runs again.

A restart costs idle(last checkpoint -> resume) + excess(warm-up steps after the resume); a
restart after a hang costs idle(kill -> resume) + excess(warm-up), the hang having counted the
work lost since the checkpoint and the silence until the watchdog killed the job.
"""

from __future__ import annotations

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
