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
from prism_core.arrays import rolling_median, searchsorted_many

from .baseline import Baseline
from .issues import Issue, confidence
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams


def merged_steps(job: JobHour, params: DiagnosisParams, usual_before: float | None) -> tuple[np.ndarray, float | None]:
    """Per step: it, or a step beside it, carries at least `merged_step_traffic` x the bytes
    between members of the steps around it (the rolling median over `baseline_steps` each side:
    a job's members, and so its traffic, may change within the hour). A slow step moves the usual
    bytes, later; two steps the timeline could not divide move twice as many, and the boundary it
    missed may have been read in the wrong place, leaving a neighbour long with the usual bytes
    or short with more. A record's bytes are spread evenly over its span (a flow cache's record
    may cover several steps); steps the hour's edges cut are no measure of the usual traffic.
    Behind a cache whose records run through a step's quiet, a slow step's share grows with its
    length too: it is left unjudged, as the records cannot show it. An hour of too few whole
    steps to know the usual traffic (a job's last minutes) measures them against the usual of
    earlier hours (`usual_before`: realistic-4, a job's last 100 s read as one step of 16 steps'
    traffic was a slow step). Also returns the usual traffic of a whole step to carry on."""
    whole = ~job.split
    if not job.n_steps or (whole.sum() < params.min_steps and usual_before is None):
        return np.zeros(job.n_steps, bool), usual_before
    # both edges of every step in one pass over the flows
    until_end, until_start = np.split(_bytes_until(job, np.r_[job.step_end, job.step_start]), 2)
    traffic = until_end - until_start
    if whole.sum() >= params.min_steps:
        usual = rolling_median(traffic, whole, np.zeros(job.n_steps, int), params.baseline_steps)
        usual_now = float(np.median(traffic[whole]))
    else:
        usual, usual_now = np.full(job.n_steps, usual_before), usual_before
    merged = (traffic >= params.merged_step_traffic * usual) & (usual > 0)
    return merged | np.r_[merged[1:], False] | np.r_[False, merged[:-1]], usual_now


def _bytes_until(job: JobHour, at: np.ndarray) -> np.ndarray:
    """The bytes between members carried before each time of `at` (seconds), each record's
    bytes spread evenly from its start to its end (an instant's at its start).

    The times are few (a step's edges) and the records millions: each record is placed among the
    sorted times by binary search and summed per time, not sorted itself."""
    span = job.end - job.start
    ramp = span > 0
    rate = job.nbytes[ramp] / span[ramp]
    del span
    by_time = np.argsort(at)
    times = at[by_time]

    def summed_up_to(edge: np.ndarray, weights: np.ndarray, first_time_after: np.ndarray | None = None) -> np.ndarray:
        """per sorted time t: the sum of the weights whose edge is at or before t (`first_time_after`:
        each edge's place among the times, where already found)"""
        if first_time_after is None:
            first_time_after = searchsorted_many(times, edge, side="left")
        return np.cumsum(np.bincount(first_time_after, weights=weights, minlength=len(times) + 1))[:len(times)]

    def ramps_from(edge: np.ndarray, place: np.ndarray) -> np.ndarray:
        """per sorted time t: the sum over the ramps whose `edge` (placed among the times at
        `place`) is at or before t of rate x (t - edge)"""
        return times * summed_up_to(edge, rate, place) - summed_up_to(edge, rate * edge, place)

    start, end = job.start[ramp], job.end[ramp]
    start_place = searchsorted_many(times, start, side="left")
    # A ramp ends where it starts among the times but where it spans one (a step's edge, which
    # few records do): only those ends are searched for, not every record's (~4x less)
    end_place = start_place.copy()
    spanning = np.flatnonzero(end > np.r_[times, np.inf][start_place])
    end_place[spanning] = np.searchsorted(times, end[spanning], side="left")
    instant = ~ramp
    carried = (ramps_from(start, start_place) - ramps_from(end, end_place)
               + summed_up_to(job.start[instant], job.nbytes[instant].astype(np.float64)))
    until = np.empty(len(at))
    until[by_time] = carried
    return until


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
