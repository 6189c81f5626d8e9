"""Baseline: what a step of the job normally takes.

BOCD (prism_core.bocd) segments the log durations of the clean steps (not warm-up, checkpoint or
inside a straggler or slow-link window), after the last clean durations of earlier hours; the
baseline is a rolling median inside a segment. A checkpoint step is expected to take a step plus
the job's usual saving time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism_core.arrays import MAD_TO_SIGMA, rolling_median, segment_median
from prism_core.bocd import NormalGammaPrior, bocd

from .checkpoints import Checkpoints
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams


@dataclass(frozen=True, eq=False)
class Baseline:
    """Per step of the hour (seconds unless said), and the job's jitter."""

    baseline: np.ndarray  # the rolling median of the clean steps around it, in its segment
    expected: np.ndarray  # the baseline, plus the usual saving time for a checkpoint step
    level: np.ndarray  # its segment's median
    clean: np.ndarray  # measured for the baseline
    segment: np.ndarray  # its level segment
    segment_before: int  # the segment of the last step remembered from earlier hours
    limit: float  # a step is slow above this times its baseline
    sigma: float  # the job's step-to-step jitter (log units)
    clean_steps: int  # clean steps, remembered ones included
    saving: np.ndarray  # per checkpoint step: its time over the baseline
    usual_sync: float | None  # median DP synchronization of the clean steps (None: none shows one)
    recent_s: tuple[float, ...]  # the last clean durations, to carry on


def fit_baseline(job: JobHour, masks: StepMasks, checkpoints: Checkpoints, recent_s: tuple[float, ...],
                 save_s: tuple[float, ...], params: DiagnosisParams) -> Baseline:
    """The baseline of the hour's steps, after the clean durations `recent_s` of earlier hours;
    `save_s` are the last checkpoints' saving times."""
    history = np.asarray(recent_s, float)
    durations = np.r_[history, job.duration]
    clean = np.r_[np.ones(len(history), bool), ~(masks.checkpoint | masks.warmup | masks.windowed)]
    logs = np.log(durations)
    rough = rolling_median(logs, clean, np.zeros(len(logs), int), params.baseline_steps)
    diffs = np.diff(logs[clean])
    # a difference of two steps' log durations has twice the variance of one
    sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(diffs))) / np.sqrt(2)
                if len(diffs) >= params.jitter_min_diffs else params.jitter_sigma, params.jitter_sigma_floor)
    log_limit = np.log(max(params.slow_step_delta, 1 + params.jitter_sigmas * sigma))
    outlier = clean & (logs - rough > log_limit)
    clean &= ~outlier
    segment = _segments(logs, clean, outlier, log_limit, sigma, params)
    hour = slice(len(history), None)
    baseline = np.exp(rolling_median(logs, clean, segment, params.baseline_steps))[hour]
    checkpoint = masks.checkpoint
    # A checkpoint step is a step plus the job's usual saving time: a stall right after a
    # checkpoint can join it (the timeline cannot split them), and it still costs time.
    saving = job.duration[checkpoint] - baseline[checkpoint]
    saves = np.r_[np.asarray(save_s, float), saving]
    usual_save = np.median(saves) if len(saves) >= params.usual_save_checkpoints else np.inf
    expected = baseline + np.where(checkpoint, usual_save, 0.0)
    # Until the job's usual saving time is known, a checkpoint step is expected to end when its
    # save does: the job resumes training right after. The save follows the step's work (a
    # step's baseline); it begins without traffic (tensors staged to host memory, files
    # opened) until its first write and ends the same way after its last (files closed, ranks
    # synchronized): the epilogue is taken as long as the prologue. A longer silence after the
    # save, by more than the slow-step margin, is a stall that joined the step.
    by_writes = checkpoint & (len(saves) < params.usual_save_checkpoints) & np.isfinite(checkpoints.save_end)
    prologue = np.maximum(checkpoints.save_start - job.step_start - baseline, 0.0)
    expected[by_writes] = np.maximum(checkpoints.save_end + prologue - job.step_start, baseline)[by_writes]
    sync = job.sync_s[clean[hour]]
    sync = sync[np.isfinite(sync)]
    return Baseline(
        baseline=baseline,
        expected=expected,
        # a window of many steps is measured against its segment's level, not against the few
        # clean steps at its edges
        level=np.exp(segment_median(logs, clean, segment))[hour],
        clean=clean[hour],
        segment=segment[hour],
        segment_before=segment[len(history) - 1] if len(history) else segment[0],
        limit=float(np.exp(log_limit)),
        sigma=sigma,
        clean_steps=int(clean.sum()),
        saving=saving,
        usual_sync=float(np.median(sync)) if len(sync) else None,
        recent_s=tuple(round(float(x), 6) for x in durations[clean][-2 * params.baseline_steps:]),
    )


def _segments(logs: np.ndarray, clean: np.ndarray, outlier: np.ndarray, limit: float, sigma: float,
              params: DiagnosisParams) -> np.ndarray:
    """Segment id per step: BOCD MAP change points of the clean log durations, keeping only
    level shifts of at least `degradation_min_shift` that last `degradation_min_steps`. The
    first steps of a higher level look like outliers of the old one: a change point moves
    back over outliers that fit the new level."""
    if clean.sum() < 2 * params.degradation_min_steps:
        return np.zeros(len(logs), int)
    z = np.where(clean, (logs - np.median(logs[clean])) / sigma, np.nan)
    found = bocd(z, hazard_lambda=params.change_hazard_steps, prior=NormalGammaPrior(kappa=params.level_prior_steps),
                 threshold=None).changepoints
    cuts = [0]
    for cp, next_cp in zip(found, np.r_[found[1:], len(logs)]):
        before = logs[cuts[-1]:cp][clean[cuts[-1]:cp]]
        after = logs[cp:next_cp][clean[cp:next_cp]]
        if min(len(before), len(after)) < params.degradation_min_steps:
            continue
        if abs(np.median(after) - np.median(before)) >= np.log1p(params.degradation_min_shift):
            while cp - 1 > cuts[-1] and outlier[cp - 1] and abs(logs[cp - 1] - np.median(after)) < limit:
                cp -= 1
            cuts.append(int(cp))
    segment = np.zeros(len(logs), int)
    for cut in cuts[1:]:
        segment[cut:] += 1
    return segment
