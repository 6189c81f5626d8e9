"""Checkpoints: the job's normal rhythm, never slow steps.

A step that writes a large flow out of the job to storage (not to another job's GPUs) is a
checkpoint when it is long; so is a long step on the job's checkpoint rhythm (long steps every N
step numbers). Without any write seen, the rhythm must recur more often: a recurring stall spreads
evenly over time too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from prism_core.arrays import rolling_median
from prism_core.rhythm import on_rhythm, rhythm_of

from .baseline import jitter_sigma
from .job_hour import JobHour
from .params import DiagnosisParams
from .state import CheckpointState


@dataclass(frozen=True, eq=False)
class Checkpoints:
    """The hour's checkpoint steps, and where the job's work was last saved before the hour."""

    step: np.ndarray  # per step: a checkpoint
    save_start: np.ndarray  # per step: start of its first write to storage (nan: none)
    save_end: np.ndarray  # per step: end of its last write to storage (nan: none)
    earlier_ns: int | None  # end of the last checkpoint of earlier hours, else the job's first step
    # ends of the quiet gaps a job that shows no writes paused in (`unseen_saves`), in order
    unseen_ends: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def before(self, job: JobHour, t: float) -> int | None:
        """End of the last checkpoint completed by `t` (ns): this hour's (a save seen, or where a
        job whose saves show no writes last paused), else the last one of earlier hours, else the
        job's first step (its work since then is lost)."""
        ends = np.r_[job.step_end[self.step], self.unseen_ends]
        ends = ends[ends <= t]
        return job.ns(ends.max()) if len(ends) else self.earlier_ns


def find_checkpoints(job: JobHour, warmup: np.ndarray, previous: CheckpointState, first_step_ns: int | None,
                     params: DiagnosisParams, paused: np.ndarray = np.zeros(0, np.int64),
                     ) -> tuple[Checkpoints, CheckpointState]:
    """The hour's checkpoints (warm-up steps are long for another reason), and the checkpoint
    state to carry on: rhythm, last checkpoint, and what the last save wrote (a resume reads it
    back). The saving times are carried on by `saving_times`, once slow steps are known.
    `paused`: the steps that end a quiet gap that was no restart (`unseen_saves`)."""
    n = job.n_steps
    checkpoint = np.zeros(n, bool)
    save_start, save_end = np.full(n, np.nan), np.full(n, np.nan)
    earlier_ns = previous.last_checkpoint_ns if previous.last_checkpoint_ns is not None else first_step_ns
    if not n:
        return Checkpoints(checkpoint, save_start, save_end, earlier_ns), previous
    long = _long_steps(job, warmup, params)
    # a checkpoint step is long; a large write alone may be a copy to another job. A save has no
    # traffic to mark its end: the timeline may end its step early and put the rest of the save
    # into the next one, so each step its writes overlap is the save's.
    stored = job.write_to_storage
    to_storage, stored_until = job.write_start[stored], job.write_end[stored]
    writes = np.searchsorted(job.step_start, to_storage, side="right") - 1
    inside = (writes >= 0) & (to_storage < job.step_end[np.maximum(writes, 0)])
    writes = writes[inside]
    first = np.searchsorted(job.step_end, to_storage, side="right")  # the steps each write overlaps
    last = np.searchsorted(job.step_start, stored_until, side="left") - 1
    overlaps = first <= last
    overlapped = np.zeros(n + 1, int)  # +1 at each first step a write overlaps, -1 after its last
    np.add.at(overlapped, first[overlaps], 1)
    np.add.at(overlapped, last[overlaps] + 1, -1)
    written = np.cumsum(overlapped)[:n] > 0
    np.fmin.at(save_start, writes, to_storage[inside])
    np.fmax.at(save_end, writes, stored_until[inside])
    checkpoint = written & long
    # the rhythm of the saves seen, else of the long steps (stalls spread evenly over time put a few
    # long steps equal gaps apart: without writes the rhythm must hold more often)
    rhythm = (save_rhythm(job.number[checkpoint], params.rhythm_repeats, params)
              or save_rhythm(job.number[long], params.rhythm_repeats_unwritten, params) or previous.checkpoint_rhythm)
    state = previous
    if rhythm:
        period, phase = rhythm
        checkpoint |= on_rhythm(job.number, long, period, phase, params.rhythm_slack_steps)
        state = replace(state, checkpoint_rhythm=(int(period), int(phase)))
    # A save ends as quietly as it began (files closed, ranks synchronized, as long as the quiet
    # before its first write): a long step that starts within that quiet after the last write
    # holds the save's end.
    prologue = np.maximum(save_start - job.step_start - np.median(job.duration), params.boundary_slack_s)
    ends_save = checkpoint & np.isfinite(save_end)
    checkpoint[1:] |= long[1:] & ends_save[:-1] & (job.step_start[1:] <= (save_end + prologue)[:-1])
    done = np.flatnonzero(checkpoint)
    unseen_ends = unseen_saves(job, paused, previous)
    if len(done) or len(unseen_ends):
        state = replace(state, last_checkpoint_ns=job.ns(np.r_[job.step_end[done], unseen_ends].max()))
    saved = np.isin(writes, done)
    if saved.any():  # a resume reads back what the last save wrote
        last_save = writes == writes[saved].max()
        state = replace(state, checkpoint_bytes=int(job.write_bytes[stored][inside][last_save].sum()),
                        checkpoint_writers=len(np.unique(job.write_src[stored][inside][last_save])))
    return Checkpoints(checkpoint, save_start, save_end, earlier_ns, unseen_ends), state


def unseen_saves(job: JobHour, paused: np.ndarray, previous: CheckpointState) -> np.ndarray:
    """Where the saves of a job that writes nothing the flow logs see completed: the ends of the
    quiet gaps it `paused` in (its step finished, its connections kept: no crash), which are the
    starts of the steps that follow them. Over a storage network the flow logs do not see, a save
    leaves only such a gap, or a long step (`find_checkpoints`); a stall that long is rarer than
    a save. A job whose saves show writes, in this hour or earlier, paused for something else."""
    if job.write_to_storage.any() or previous.checkpoint_bytes:
        return np.zeros(0)
    return job.step_start[paused]


def saving_times(previous: tuple[float, ...], saving: np.ndarray, slow: np.ndarray,
                 params: DiagnosisParams) -> tuple[float, ...]:
    """The checkpoints' saving times (time over a step) to carry on: the last ones, with this
    hour's checkpoints that were not slow."""
    return (previous + tuple(round(float(x), 6) for x in saving[~slow]))[-params.save_history:]


def _long_steps(job: JobHour, warmup: np.ndarray, params: DiagnosisParams) -> np.ndarray:
    """Per step: longer than the slow-step limit of the job's own jitter over the rolling median
    of its steps (warm-up steps are long for another reason)."""
    logs = np.log(job.duration)
    usual = ~warmup
    rough = rolling_median(logs, usual, np.zeros(len(logs), int), params.baseline_steps)
    limit = np.log(max(params.slow_step_delta, 1 + params.jitter_sigmas * jitter_sigma(logs, usual, params)))
    return (logs - rough > limit) & usual


def save_rhythm(numbers: np.ndarray, min_repeats: int, params: DiagnosisParams) -> tuple[int, int] | None:
    """The rhythm of saves among the long steps numbered `numbers` (prism_core.rhythm.rhythm_of)."""
    return rhythm_of(numbers, min_repeats, params.rhythm_coverage, params.rhythm_slack_steps, params.rhythm_candidates)
