"""Baseline: what a step of the job normally takes.

BOCD (prism_core.bocd) segments the log durations of the clean steps (not warm-up, checkpoint,
inside a straggler or slow-link window, or merged: slow_steps.merged_steps), after the last clean
durations of earlier hours; the baseline is a rolling median inside a segment. A checkpoint step is expected to take a step plus
the job's usual saving time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from prism_core.arrays import MAD_TO_SIGMA, rolling_median, segment_median
from prism_core.bocd import NormalGammaPrior, bocd

from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams

if TYPE_CHECKING:  # checkpoints finds its long steps with the jitter measured here
    from .checkpoints import Checkpoints


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
    saving: np.ndarray  # per save: its time over the baseline of its first step
    save_first: np.ndarray  # the first step of each save (a save may spill into the next step)
    save_allowance: float  # s; a save may take this much longer than the usual one (its spread)
    judged: np.ndarray  # per step: its duration, a save's first step the whole save's, the rest of
    # a save its baseline
    usual_sync: float | None  # median DP synchronization of the clean steps (None: none shows one)
    recent_s: tuple[float, ...]  # the last clean durations, to carry on


def fit_baseline(job: JobHour, masks: StepMasks, checkpoints: Checkpoints, recent_s: tuple[float, ...],
                 save_s: tuple[float, ...], params: DiagnosisParams) -> Baseline:
    """The baseline of the hour's steps, after the clean durations `recent_s` of earlier hours;
    `save_s` are the last checkpoints' saving times."""
    history = np.asarray(recent_s, float)
    durations = np.r_[history, job.duration]
    clean = np.r_[np.ones(len(history), bool), ~(masks.checkpoint | masks.warmup | masks.windowed | masks.merged)]
    logs = np.log(durations)
    rough = rolling_median(logs, clean, np.zeros(len(logs), int), params.baseline_steps)
    sigma = jitter_sigma(logs, clean, params)
    log_limit = tail_limit(logs - rough, clean, np.log(max(params.slow_step_delta, 1 + params.jitter_sigmas * sigma)),
                           sigma, params)
    outlier = clean & (logs - rough > log_limit)
    clean &= ~outlier
    segment = _segments(logs, clean, outlier, log_limit, sigma, params)
    hour = slice(len(history), None)
    baseline = np.exp(rolling_median(logs, clean, segment, params.baseline_steps))[hour]
    checkpoint = masks.checkpoint
    # A checkpoint step is a step plus the job's usual saving time: a stall right after a
    # checkpoint can join it (the timeline cannot split them), and it still costs time. A save
    # whose end the timeline put into the next steps is one save, judged on its first step.
    save_first = np.flatnonzero(checkpoint & ~np.r_[False, checkpoint[:-1]])
    save_of_step = np.cumsum(checkpoint & ~np.r_[False, checkpoint[:-1]]) - 1
    saving = np.bincount(save_of_step[checkpoint], (job.duration - baseline)[checkpoint], len(save_first))
    judged = job.duration.copy()
    judged[save_first] = baseline[save_first] + saving
    saves = np.r_[np.asarray(save_s, float), saving]
    known = len(saves) >= params.usual_save_checkpoints
    usual_save = np.median(saves) if known else np.inf
    expected = baseline + np.where(checkpoint, usual_save, 0.0)
    # Saving times vary from save to save (shared storage, what each save holds): a save is slow
    # beyond the job's own spread of saving times
    log_saves = np.log(saves[saves > 0])
    save_spread = max(MAD_TO_SIGMA * float(np.median(np.abs(log_saves - np.median(log_saves)))),
                      params.save_spread_floor) if len(log_saves) >= params.usual_save_checkpoints else 0.0
    # Until the job's usual saving time is known, a checkpoint step is expected to end when its
    # save does: the job resumes training right after. The save follows the step's work (a
    # step's baseline); it begins without traffic (tensors staged to host memory, files
    # opened) until its first write and ends the same way after its last (files closed, ranks
    # synchronized): the epilogue is taken as long as the prologue. A longer silence after the
    # save, by more than the slow-step margin, is a stall that joined the step.
    by_writes = checkpoint & np.isfinite(checkpoints.save_end) & (not known)
    prologue = np.maximum(checkpoints.save_start - job.step_start - baseline, 0.0)
    expected[by_writes] = np.maximum(checkpoints.save_end + prologue - job.step_start, baseline)[by_writes]
    spill = checkpoint & np.r_[False, checkpoint[:-1]]  # counted in its save's first step
    judged[spill] = expected[spill] = baseline[spill]
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
        save_first=save_first,
        save_allowance=usual_save * np.expm1(params.save_sigmas * save_spread) if save_spread else 0.0,
        judged=judged,
        usual_sync=float(np.median(sync)) if len(sync) else None,
        recent_s=tuple(round(float(x), 6) for x in durations[clean][-2 * params.baseline_steps:]),
    )


def jitter_sigma(logs: np.ndarray, clean: np.ndarray, params: DiagnosisParams) -> float:
    """The job's step-to-step jitter (log units) from the robust spread of the differences of its
    clean steps' log durations; the prior until enough steps show it."""
    diffs = np.diff(logs[clean])
    # a difference of two steps' log durations has twice the variance of one
    sigma = (MAD_TO_SIGMA * float(np.median(np.abs(diffs))) / np.sqrt(2) if len(diffs) >= params.jitter_min_diffs
             else params.jitter_sigma)
    return max(sigma, params.jitter_sigma_floor)


def tail_limit(residual: np.ndarray, clean: np.ndarray, log_limit: float, sigma: float,
               params: DiagnosisParams) -> float:
    """The slow-step limit (log units over the baseline) for the job's own tail: the excess over
    the baseline that the job's clean steps pass `natural_slow_steps_per_hour` times in an
    analysis, by a Pareto fit (Hill's estimator) of the excesses beyond `tail_sigmas` of its
    jitter, or of its longest `tail_share` of steps if more (at least `tail_min_steps`); never
    under `log_limit`, the jitter's. Stalls of a heavy tail (data loading, garbage collection, a
    shared file system) come in every length a slow-step fault has: a job's limit is where its
    own tail stops explaining a step. A light tail (jitter alone) fits a steep Pareto beyond a
    few sigmas and keeps about the jitter's limit. A slow-step fault slows a few steps: the
    `tail_trim_steps` longest are set aside first, as they are what the limit must still find."""
    kept = np.sort(np.expm1(residual[clean]))[:max(int(clean.sum()) - params.tail_trim_steps, 0)]
    if len(kept) <= params.tail_min_steps:
        return log_limit
    threshold = max(kept[-max(int(params.tail_share * len(kept)), params.tail_min_steps) - 1],
                    np.expm1(params.tail_sigmas * sigma))
    fitted = max(int(np.sum(kept > threshold)), params.tail_min_steps)
    threshold, longest = kept[-fitted - 1], kept[-fitted:]
    spread = float(np.sum(np.log(longest / threshold))) if threshold > 0 else 0.0
    if spread <= 0:
        return log_limit
    exceeding = fitted + int(clean.sum()) - len(kept)  # the longest steps set aside exceed it too
    excess = threshold * (exceeding / params.natural_slow_steps_per_hour) ** (spread / fitted)
    return max(log_limit, float(np.log1p(excess)))


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
