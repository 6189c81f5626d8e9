"""The walk over a job's sync phases in time order, emitting the steps they close."""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import pyarrow as pa

from prism_core.schema import STEPS
from prism_core.timeline import boundaries as bounds
from prism_core.timeline.closing import ends_step, hung_before_it_ended, next_step_began, save_may_follow, silences
from prism_core.timeline.opening import attempt_start, opening_start
from prism_core.timeline.params import TimelineParams
from prism_core.timeline.phases import Phases
from prism_core.timeline.state import TimelineState
from prism_core.timeline.traffic import Traffic
from prism_core.timeline.typical import Typical


def emit_steps(
    phases: Phases, typical: Typical, traffic: Traffic, state: TimelineState, restarts: np.ndarray,
    paused: np.ndarray, hour_start_ns: int, hour_end_ns: int, params: TimelineParams,
) -> list[dict]:
    """Walk the phases in time order and emit the steps they close (none until the job's usual
    timings are known: too few steps in view so far, they wait in the carry); the state follows
    the last emitted step. `restarts`: the restart instants, sorted; `paused`: those of them that
    were pauses (the job resumed on its connections): divided alike, in the same attempt."""
    if not typical.known:
        return []
    # the step each phase closes, as numbered if every phase closes one (a few do not: the rhythm
    # of saves allows a step's slack)
    numbers = state.next_step + np.arange(len(phases.close_ns))
    quiet_gap = bounds.quiet_gaps(phases, typical, params)
    unwritten = bounds.unwritten_saves(numbers, quiet_gap, state.quiet_gaps, params)
    boundary = bounds.boundaries(phases, typical, params, unwritten)
    complete = bounds.complete(phases, typical.phase_bytes, typical.phase_flows, params)
    saved = bounds.checkpoints(phases, typical, params) | unwritten
    restarts, paused = _without_saves(restarts, paused, phases, unwritten)
    # a save between the distributed optimizer's reduce-scatter and its all-gather parts the sync
    # in two halves, each short of a usual phase: the first closes the step, the gather opens the next
    halved = saved & _halves(phases, complete, typical, params)
    complete = complete | halved
    boundary[halved] = phases.start_ns[np.flatnonzero(halved) + 1]
    silence = params.silence_steps * typical.period_ns
    usual_gap = ~bounds.long_gap(phases, typical, params)
    stopped = silences(traffic, silence, state.last_close_ns)
    # the restarts by each phase's close, and whether one came after it by the next step's traffic:
    # counted for every phase at once (a job has few restarts, and most none)
    restarts_by_close = np.searchsorted(restarts, phases.close_ns, side="right")
    failed = np.searchsorted(restarts, phases.next_ns, side="right") > restarts_by_close
    restart_list = restarts.tolist()
    paused_list = paused.tolist()
    paused_by_close = np.searchsorted(paused, phases.close_ns, side="right")
    attempts_by_close = restarts_by_close - paused_by_close
    rows: list[dict] = []
    end, close = state.last_end_ns, state.last_close_ns
    saving = False  # the last step emitted ends with a save: a silence after it is the save's
    for p in range(len(phases.close_ns)):
        if close is not None and not saving and _silent_between(stopped, close, phases.start_ns[p]):
            # the job was silent for steps without a restart reported: what came before was
            # another job's tail or a stop; this phase opens the view again
            end = close = None
        followed = phases.next_ns[p] >= 0
        quiet = hour_end_ns - phases.close_ns[p]
        # the last phase is over once quiet longer than inside any phase, or once the next step
        # began; its step, once no save can follow it (the saving is the step's)
        over = (phases.closed[p] or (phases.has_dp and quiet > phases.inner_gap_ns)
                or next_step_began(phases, p, typical, params))
        unsaved = phases.has_dp and not phases.bulk_write[p] and not save_may_follow(
            state.next_step + len(rows), state.checkpoint_steps, typical, quiet, params)
        decided = over and (followed or quiet >= silence or unsaved)
        if not decided or boundary[p] >= hour_end_ns:
            break
        if not ends_step(phases, p, typical, bool(failed[p]), complete, traffic, params) or (
                end is not None
                and hung_before_it_ended(phases, p, boundary, complete, traffic, typical, hour_end_ns, params)):
            if end is None and followed and usual_gap[p]:
                # the view opened inside this phase's step; the next step follows as usual
                end, close = int(boundary[p]), int(phases.close_ns[p])
            continue
        after = close if close is not None else -(1 << 62)
        restarted = restarts_by_close[p] - bisect_right(restart_list, after)  # since the last close
        start = end
        if restarted > 0:
            start = attempt_start(phases, p, boundary, traffic, restart_list[restarts_by_close[p] - 1], typical, params)
            if restarted > paused_by_close[p] - bisect_right(paused_list, after):  # not only pauses
                # a restarted job may save on another cadence (a paused one not)
                state.checkpoint_steps, state.quiet_gaps = [], []
        elif end is None:
            start = opening_start(phases, p, boundary, complete, traffic, typical, hour_start_ns, params)
            if start is None:  # the view opened inside this step: its end is only a reference
                end, close = int(boundary[p]), int(phases.close_ns[p])
                continue
        attempt = state.attempt + int(attempts_by_close[p])
        sync = phases.has_dp
        rows.append({"start": int(min(start, boundary[p] - 1)), "end": int(boundary[p]),
                     "sync_start": int(phases.start_ns[p]) if sync else None,
                     "sync_s": (phases.close_ns[p] - phases.start_ns[p]) / 1e9 if sync else None,
                     "attempt": attempt})
        if saved[p]:
            state.checkpoint_steps = [*state.checkpoint_steps[-2:], state.next_step + len(rows) - 1]
        saving = bool(saved[p])
        if quiet_gap[p]:
            state.quiet_gaps.append(int(numbers[p]))
        end, close = int(boundary[p]), int(phases.close_ns[p])
    state.last_end_ns, state.last_close_ns = end, close
    # the quiet gaps of the last steps, to find a rhythm of saves that spans hours
    state.quiet_gaps = [n for n in state.quiet_gaps if n > state.next_step + len(rows) - params.save_rhythm_memory_steps]
    return rows


def _halves(phases: Phases, complete: np.ndarray, typical: Typical, params: TimelineParams) -> np.ndarray:
    """Per phase: it and the next are both short of a usual phase's bytes and flows, and together
    carry them."""
    both = np.r_[~complete[:-1] & ~complete[1:], False]
    nbytes = phases.nbytes + np.r_[phases.nbytes[1:], 0.0]
    nflows = phases.nflows + np.r_[phases.nflows[1:], 0.0]
    margin = 1 - params.complete_share
    return (both & (np.abs(nbytes / typical.phase_bytes - 1) <= margin)
            & (np.abs(nflows / typical.phase_flows - 1) <= margin))


def _without_saves(restarts: np.ndarray, paused: np.ndarray, phases: Phases,
                   unwritten: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The restart instants without the pauses that ended a save nothing showed (`unwritten`, per
    phase): a long save leaves the job as quiet as a pause does, and it resumes on its connections."""
    before = np.searchsorted(phases.close_ns, paused, side="left") - 1  # the phase the quiet followed
    after_phase = np.maximum(before, 0)
    inside = (before >= 0) & unwritten[after_phase] & (paused <= phases.next_ns[after_phase])
    return np.setdiff1d(restarts, paused[inside]), paused[~inside]


def _silent_between(silences: np.ndarray, since_ns: int, until_ns: int) -> bool:
    """Whether one of `silences` ((from, to), in time order, disjoint) lies within [since_ns, until_ns]."""
    first = np.searchsorted(silences[:, 0], since_ns)
    return bool(first < len(silences) and silences[first, 1] <= until_ns)


def steps_table(job_id: str, rows: list[dict], first_step: int) -> pa.Table:
    """The emitted steps as rows of prism_core.schema.STEPS, numbered from `first_step`."""
    n = len(rows)
    start = np.array([r["start"] for r in rows], np.int64)
    end = np.array([r["end"] for r in rows], np.int64)
    return pa.table(
        {
            "job_id": pa.array([job_id] * n, pa.string()),
            "step": pa.array(np.arange(first_step, first_step + n), pa.int64()),
            "start": pa.array(start, pa.int64()).cast(STEPS.field("start").type),
            "end": pa.array(end, pa.int64()).cast(STEPS.field("end").type),
            "duration_s": pa.array((end - start) / 1e9, pa.float64()),
            "sync_start": pa.array([r["sync_start"] for r in rows], pa.int64()).cast(STEPS.field("sync_start").type),
            "sync_s": pa.array([r["sync_s"] for r in rows], pa.float64()),
            "attempt": pa.array([r["attempt"] for r in rows], pa.int32()),
        },
        schema=STEPS,
    )
