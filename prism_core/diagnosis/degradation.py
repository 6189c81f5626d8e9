"""Degradation: a persistent rise of the job's step-time level (a BOCD segment change in
baseline.py of at least `degradation_min_shift`, holding `degradation_min_steps`), by more than
the job's own jitter explains: `degradation_min_z` standard errors of the difference of the two
levels (a job jittering 6% a step moves a ten-step level by 3% at random). It stays open across
hours under one issue id until the level falls back, each hour charging its own steps' excess
over the level before it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from prism_core import waste

from .baseline import Baseline
from .issues import Issue, confidence
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams
from .state import LevelState, OpenDegradation


def degradation_issues(job: JobHour, fit: Baseline, masks: StepMasks, slow: np.ndarray, previous: LevelState,
                       params: DiagnosisParams) -> tuple[list[Issue], LevelState]:
    """The degradations of the hour (one continuing from the previous hour included), and the
    level state to carry on."""
    clean = fit.clean
    level = previous.level_s
    level_steps = np.inf  # clean steps the level was measured over (earlier hours': many)
    if level is None and clean.any():
        first_segment = clean & (fit.segment == fit.segment[clean][0])
        level, level_steps = float(np.median(job.duration[first_segment])), int(first_segment.sum())
    opened, first = previous.open_degradation, 0  # the open degradation, from this step of the hour
    issues = []
    changes = np.flatnonzero(np.diff(np.r_[fit.segment_before, fit.segment]))  # a change may open the hour
    for cp in changes:
        segment_steps = clean & (fit.segment == fit.segment[cp])
        new_level = float(np.median(job.duration[segment_steps]))
        rise = new_level / level - 1
        risen = rise >= params.degradation_min_shift
        # the standard error of the two levels' difference, in shares of a step (log units)
        noise = fit.sigma * np.sqrt(1 / max(int(segment_steps.sum()), 1) + 1 / level_steps)
        if opened and not risen:
            issues += _degradation(job, fit, masks, slow, opened, first, cp, params)
            opened = None
        elif not opened and risen and np.log1p(rise) >= params.degradation_min_z * noise:
            opened, first = OpenDegradation(issue_id=None, start_ns=job.ns(job.step_start[cp]), baseline_s=level), cp
        elif not opened and not risen:
            level, level_steps = new_level, int(segment_steps.sum())
    still_open = None
    if opened:
        last = _degradation(job, fit, masks, slow, opened, first, job.n_steps, params)
        issues += last
        still_open = replace(opened, issue_id=last[0].issue_id) if last else opened
    return issues, LevelState(recent_s=fit.recent_s, level_s=level, open_degradation=still_open)


def _degradation(job: JobHour, fit: Baseline, masks: StepMasks, slow: np.ndarray, opened: OpenDegradation,
                 first: int, stop: int, params: DiagnosisParams) -> list[Issue]:
    """The issue of degradation `opened` over steps [first, stop) of the hour (none when empty):
    the measured steps' excess over the level before it stands for all its steps."""
    steps = np.arange(first, stop)
    if not len(steps):
        return []
    measured = steps[~(masks.checkpoint[steps] | masks.warmup[steps] | slow[steps] | masks.windowed[steps]
                       | masks.merged[steps])]
    baseline = opened.baseline_s
    n_gpus = job.gpus_active(job.step_start[first], job.step_end[stop - 1])
    cost = waste.window_excess_gpu_s(job.duration[measured], baseline, len(steps), n_gpus)
    share = float(np.median(job.duration[measured])) / baseline - 1 if len(measured) else 0.0
    evidence = {"baseline_s": baseline, "level_s": baseline * (1 + share), "steps": len(steps),
                "measured_steps": len(measured), "continued": opened.issue_id is not None}
    return [Issue.of(job.job_id, "degradation", job.job_id, opened.start_ns, job.ns(job.step_end[stop - 1]),
                     share=share, confidence=confidence(share / params.degradation_min_shift), wasted_gpu_s=cost,
                     evidence=evidence, params=params)]
