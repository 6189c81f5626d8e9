"""Checkpoints: the job's normal rhythm, never slow steps.

A step that writes a large flow out of the job to storage (not to another job's GPUs) is a
checkpoint when it is long; so is a long step on the job's checkpoint rhythm (long steps every N
step numbers). Without any write seen, the rhythm must recur more often: a recurring stall spreads
evenly over time too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

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

    def before(self, job: JobHour, t: float) -> int | None:
        """End of the last checkpoint completed by `t` (ns): this hour's, else the last one of
        earlier hours, else the job's first step (its work since then is lost)."""
        ends = job.step_end[self.step]
        ends = ends[ends <= t]
        return job.ns(ends[-1]) if len(ends) else self.earlier_ns


def find_checkpoints(job: JobHour, warmup: np.ndarray, previous: CheckpointState, first_step_ns: int | None,
                     params: DiagnosisParams) -> tuple[Checkpoints, CheckpointState]:
    """The hour's checkpoints (warm-up steps are long for another reason), and the checkpoint
    state to carry on: rhythm, last checkpoint, and what the last save wrote (a resume reads it
    back). The saving times are carried on by `saving_times`, once slow steps are known."""
    n = job.n_steps
    checkpoint = np.zeros(n, bool)
    save_start, save_end = np.full(n, np.nan), np.full(n, np.nan)
    earlier_ns = previous.last_checkpoint_ns if previous.last_checkpoint_ns is not None else first_step_ns
    if not n:
        return Checkpoints(checkpoint, save_start, save_end, earlier_ns), previous
    # a checkpoint step is long; a large write alone may be a copy to another job
    long = (job.duration > params.checkpoint_long_ratio * np.median(job.duration)) & ~warmup
    stored = job.write_to_storage
    to_storage, stored_until = job.write_start[stored], job.write_end[stored]
    writes = np.searchsorted(job.step_start, to_storage, side="right") - 1
    inside = (writes >= 0) & (to_storage < job.step_end[np.maximum(writes, 0)])
    writes = writes[inside]
    checkpoint[writes] = True
    np.fmin.at(save_start, writes, to_storage[inside])
    np.fmax.at(save_end, writes, stored_until[inside])
    checkpoint &= long
    written = checkpoint.any()
    rhythm = _rhythm(job.number[checkpoint if written else long],
                     params.rhythm_repeats if written else params.rhythm_repeats_unwritten)
    rhythm = rhythm or previous.checkpoint_rhythm
    state = previous
    if rhythm:
        period, phase = rhythm
        checkpoint |= long & (job.number % period == phase)
        state = replace(state, checkpoint_rhythm=(int(period), int(phase)))
    done = np.flatnonzero(checkpoint)
    if len(done):
        state = replace(state, last_checkpoint_ns=job.ns(job.step_end[done[-1]]))
    saved = np.isin(writes, done)
    if saved.any():  # a resume reads back what the last save wrote
        last_save = writes == writes[saved].max()
        state = replace(state, checkpoint_bytes=int(job.write_bytes[stored][inside][last_save].sum()),
                        checkpoint_writers=len(np.unique(job.write_src[stored][inside][last_save])))
    return Checkpoints(checkpoint, save_start, save_end, earlier_ns), state


def saving_times(previous: tuple[float, ...], saving: np.ndarray, slow: np.ndarray,
                 params: DiagnosisParams) -> tuple[float, ...]:
    """The checkpoints' saving times (time over a step) to carry on: the last ones, with this
    hour's checkpoints that were not slow."""
    return (previous + tuple(round(float(x), 6) for x in saving[~slow]))[-params.save_history:]


def _rhythm(numbers: np.ndarray, min_repeats: int) -> tuple[int, int] | None:
    """(period, phase) when long steps recur every `period` step numbers at least `min_repeats` times."""
    numbers = np.unique(numbers[numbers >= 0])
    if len(numbers) <= min_repeats:
        return None
    gaps, counts = np.unique(np.diff(numbers), return_counts=True)
    best = np.argmax(counts)
    if counts[best] < min_repeats or gaps[best] < 2:
        return None
    period = int(gaps[best])
    return period, int(numbers[-1] % period)
