"""Slow steps (Holmes' delta-irregular steps): longer than max(delta, 1 + k sigma) x baseline, not
warm-up and not inside a straggler or slow-link window. A checkpoint step is slow when it takes
longer than a step plus the usual saving time, by a wider margin (saving times vary more than
compute). No step is judged before the job has shown `min_steps` clean ones. A long step that
carries the traffic of two is two steps whose boundary the records did not show (its DP sync lost
with an export datagram, say), not a slow one (`merged_steps`).
"""

from __future__ import annotations

import numpy as np

from prism_core import waste

from .baseline import Baseline
from .issues import Issue, confidence
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams


def merged_steps(job: JobHour, params: DiagnosisParams) -> np.ndarray:
    """Per step: it carries at least `merged_step_traffic` x the bytes between members of the
    hour's median step. A slow step moves the usual bytes, later; two steps the timeline could
    not divide move twice as many. Only flows that start and end in one step count (a flow
    cache's record spanning a boundary says nothing of either step's share), and steps the hour's
    edges cut are no measure of the usual traffic."""
    inside = job.step >= 0
    inside[inside] = job.end[inside] < job.step_end[job.step[inside]] + params.boundary_slack_s
    traffic = np.bincount(job.step[inside], weights=job.nbytes[inside], minlength=job.n_steps)
    whole = traffic[~job.split]
    usual = float(np.median(whole)) if len(whole) >= params.min_steps else 0.0
    if usual <= 0:  # too few steps to know the usual traffic
        return np.zeros(job.n_steps, bool)
    return traffic >= params.merged_step_traffic * usual


def find_slow_steps(job: JobHour, fit: Baseline, masks: StepMasks, params: DiagnosisParams) -> np.ndarray:
    """Per step: slow."""
    margin = np.where(masks.checkpoint, np.maximum(max(fit.limit - 1, params.checkpoint_margin) * fit.baseline,
                                                   fit.save_allowance), (fit.limit - 1) * fit.baseline)
    slow = (fit.judged - fit.expected > margin) & ~(masks.warmup | masks.windowed | masks.merged)
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
