"""Slow steps (Holmes' delta-irregular steps): longer than max(delta, 1 + k sigma) x baseline, not
warm-up and not inside a straggler or slow-link window. A checkpoint step is slow when it takes
longer than a step plus the usual saving time, by a wider margin (saving times vary more than
compute). No step is judged before the job has shown `min_steps` clean ones.
"""

from __future__ import annotations

import numpy as np

from prism_core import waste

from .baseline import Baseline
from .issues import Issue, confidence
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams


def find_slow_steps(job: JobHour, fit: Baseline, masks: StepMasks, params: DiagnosisParams) -> np.ndarray:
    """Per step: slow."""
    margin = np.where(masks.checkpoint, np.maximum(max(fit.limit - 1, params.checkpoint_margin) * fit.baseline,
                                                   fit.save_allowance), (fit.limit - 1) * fit.baseline)
    slow = (fit.judged - fit.expected > margin) & ~(masks.warmup | masks.windowed)
    return slow & (fit.clean_steps >= params.min_steps)  # too few steps to know what a normal one is


def slow_step_issues(job: JobHour, fit: Baseline, masks: StepMasks, slow: np.ndarray,
                     params: DiagnosisParams) -> list[Issue]:
    """An issue per slow step, costing its time over the expected one on the job's GPUs."""
    issues = []
    for i in np.flatnonzero(slow):
        share = (fit.judged[i] - fit.expected[i]) / fit.baseline[i]  # of a normal step
        n_gpus = job.gpus_active(job.step_start[i], job.step_end[i])
        cost = waste.excess_gpu_s(fit.judged[i:i + 1], fit.expected[i], n_gpus)
        evidence = {"step": int(job.number[i]), "duration_s": fit.judged[i], "expected_s": fit.expected[i],
                    "baseline_s": fit.baseline[i], "excess_share": share, "threshold": fit.limit,
                    "jitter_sigma": fit.sigma, "checkpoint": bool(masks.checkpoint[i])}
        issues.append(Issue.of(job.job_id, "slow_step", job.job_id, job.ns(job.step_start[i]), job.ns(job.step_end[i]),
                               share=share, confidence=confidence(share / (fit.limit - 1)), wasted_gpu_s=cost,
                               evidence=evidence, params=params))
    return issues
