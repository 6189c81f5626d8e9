"""Where each step ends, from two marks around the gap after its sync phase.

A, from the closing sync: its end plus the optimizer (none when the phase ends with the all-gather
after the optimizer). B, from the next step's start: a parameter gather opening it, or its first
pipeline sends less the forward passes before them, whichever comes first, else its first traffic.
A gap much longer than usual is a checkpoint save (bulk writes out of the job) or a stall.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from prism_core.rhythm import on_rhythm, rhythm_of
from prism_core.timeline.params import TimelineParams
from prism_core.timeline.phases import Phases

if TYPE_CHECKING:  # typical.py learns the timings from these rules
    from prism_core.timeline.typical import Typical


def complete(phases: Phases, phase_bytes: float, phase_flows: float, params: TimelineParams) -> np.ndarray:
    """Phases that carry a usual phase's bytes in a usual phase's flows (a ZeRO-3 parameter
    gather alone moves as many bytes as a reduce-scatter, in fewer flows), or are whole otherwise
    (`Phases.whole_otherwise`: records lost, or a straggler's sync stretched out of them)."""
    share = params.complete_share
    whole = (phases.nbytes >= share * phase_bytes) & (phases.nflows >= share * phase_flows)
    return whole | phases.whole_otherwise


def checkpoints(phases: Phases, typical: Typical, params: TimelineParams) -> np.ndarray:
    """Phases followed by a checkpoint save: a long gap with bulk writes out of the job."""
    return long_gap(phases, typical, params) & phases.bulk_write


def quiet_gaps(phases: Phases, typical: Typical, params: TimelineParams) -> np.ndarray:
    """Phases followed by a long gap before the next step's traffic without bulk writes: a stall
    before the next step, or a save the flow logs do not see (over a storage network)."""
    return long_gap(phases, typical, params) & ~phases.bulk_write & (phases.next_ns >= 0)


def unwritten_saves(numbers: np.ndarray, quiet: np.ndarray, earlier: list[int], params: TimelineParams) -> np.ndarray:
    """Per phase (numbered `numbers`, the steps they close): its quiet gap (`quiet`) is a save.
    Saves recur every k steps (a training loop's save interval); stalls come at random, on no
    rhythm. The rhythm is looked for among these gaps and the `earlier` hours' (their step
    numbers): a job saving every 20 minutes shows three saves in no single hour."""
    rhythm = rhythm_of(np.r_[np.asarray(earlier, np.int64), numbers[quiet]], params.save_rhythm_repeats,
                       params.save_rhythm_coverage, params.save_rhythm_slack, params.save_rhythm_candidates)
    if rhythm is None:
        return np.zeros(len(quiet), bool)
    return on_rhythm(numbers, quiet, *rhythm, params.save_rhythm_slack)


def long_gap(phases: Phases, typical: Typical, params: TimelineParams) -> np.ndarray:
    """Whether the gap after each phase is longer than usual (a checkpoint or a stall), at the
    pace of the step (a warm-up or degraded step runs slower; its first sends show by how much)."""
    pace = np.where(phases.forward_ns > 0, phases.forward_ns / (typical.forward_ns or np.inf), 1.0)
    pace = np.where(np.isfinite(pace) & (pace > 0), pace, 1.0)
    margin = params.long_gap_share * typical.period_ns
    by_traffic = (phases.next_ns >= 0) & (phases.next_ns - phases.close_ns > typical.gap_ns * pace + margin)
    if typical.close_to_end_ns is None:
        return by_traffic
    # where the next step's start is marked, the time to it tells, whatever traffic came between
    # (an exchange that usually follows the sync may run inside it)
    by_start = next_start(phases, typical) - phases.close_ns > typical.close_to_end_ns * pace + margin
    return np.where(marked(phases), (phases.next_ns >= 0) & by_start, by_traffic)


def marked(phases: Phases) -> np.ndarray:
    """Whether the next step's traffic marks its start: a parameter gather or pipeline sends (a
    sync-only job's first traffic is its next sync, a whole compute after the start)."""
    return (phases.first_send_ns >= 0) | (phases.gather_ns >= 0)


def next_start(phases: Phases, typical: Typical) -> np.ndarray:
    """B: the next step's compute start from a parameter gather opening it or its first pipeline
    sends, whichever comes first (a gather runs before the first forward pass), else its first
    traffic."""
    never = np.iinfo(np.int64).max
    from_gather = np.where((phases.gather_ns >= 0) & ~ran_before_the_sends(phases, typical, phases.gather_ns),
                           phases.gather_ns, never)
    return np.where(marked(phases), np.minimum(_from_sends(phases, typical), from_gather), phases.next_ns)


def _from_sends(phases: Phases, typical: Typical) -> np.ndarray:
    """The next step's start from its first pipeline sends (max int64 where none)."""
    never = np.iinfo(np.int64).max
    return np.where(phases.first_send_ns >= 0, phases.first_send_ns - typical.fill * phases.forward_ns, never)


def ran_before_the_sends(phases: Phases, typical: Typical, collective_ns: np.ndarray) -> np.ndarray:
    """Whether a collective at `collective_ns` (per phase: where it began or where it ended) came
    over a forward pass before the next step's start as its first pipeline sends put it. A
    parameter gather opening a step runs under its first forward, which waits for it: the sends
    put the start as late as the gather's end, never later by more than a forward pass. One that
    was over before that ran in the step before: the distributed optimizer's all-gather without
    overlap, or a reduce-scatter read as one (sealed-10 job 029: every step 0.47 s early). Light
    DP traffic early in the quiet after a sync (`Phases.gather_ns`) is judged by where it begins:
    begun that early, it is the sync's tail (job 029's), not ZeRO-3's parameter gather, whose
    first forward can wait long for it, but which does not run with pipelines (DeepSpeed allows
    only ZeRO-1 beside them)."""
    sent = phases.first_send_ns >= 0
    return sent & (collective_ns < _from_sends(phases, typical) - np.where(sent, phases.forward_ns, 0))


def lead(phases: Phases, typical: Typical, params: TimelineParams) -> np.ndarray:
    """Compute of the next step before its first traffic: scaled by the next sync's length when
    that is a usual one (step jitter stretches both alike), the usual lead otherwise (a straggler
    stretches the sync with waiting, not the compute)."""
    if typical.lead_ns is None:
        return np.zeros(len(phases.close_ns), np.int64)
    sync = next_sync(phases)
    scaled = (typical.lead_per_sync or 0.0) * sync
    return np.where(usual_sync(sync, typical, params), scaled, typical.lead_ns).astype(np.int64)


def usual_sync(sync_ns: np.ndarray, typical: Typical, params: TimelineParams) -> np.ndarray:
    """Whether each sync phase lasts about the usual sync (a straggler stretches it with waiting)."""
    return np.abs(sync_ns / (typical.sync_ns or np.inf) - 1.0) <= params.long_gap_share


def next_sync(phases: Phases) -> np.ndarray:
    """Length of the sync phase after each phase (-1 for the last)."""
    return np.r_[phases.close_ns[1:] - phases.start_ns[1:], -1]


def after_sync(phases: Phases, typical: Typical, params: TimelineParams) -> np.ndarray:
    """A: the end of each phase plus the optimizer."""
    return phases.close_ns + np.where(phases.after_optimizer, 0.0, typical.tails(phases, params)).astype(np.int64)


def saved_until(phases: Phases, typical: Typical, params: TimelineParams) -> np.ndarray:
    """Where a save after each phase ended: B (from the next step's first traffic less the usual
    lead where nothing marks the next step's start)."""
    by_traffic = phases.next_ns - lead(phases, typical, params)
    return np.where(marked(phases), next_start(phases, typical), by_traffic)


def write_span(phases: Phases) -> np.ndarray:
    """Per phase: from the first bulk write after it to the end of the last (negative: none)."""
    return phases.written_until_ns - (phases.close_ns + phases.write_delay_ns)


def boundaries(phases: Phases, typical: Typical, params: TimelineParams,
               unwritten: np.ndarray | None = None) -> np.ndarray:
    """End of the step each phase closes. A normal gap: B where a gather or pipeline sends mark
    the next step's start, else the earlier of A and B (the next step's first traffic may come
    well after its start). A long gap with bulk writes: a checkpoint, B; once the job's saves
    show their tail (`Typical.save_tail`), the save's last write plus the tail for its span where
    B lies beyond that (a stall followed the save), or where nothing marks the start and the lead
    is longer than the tail. A long gap without: a stall before the next step, A,
    unless it is a save nothing shows (`unwritten`, per phase; `unwritten_saves`): B.
    Nothing after the phase: A."""
    after = after_sync(phases, typical, params)
    start = next_start(phases, typical)
    followed = phases.next_ns >= 0
    # a gather or pipeline sends time the next step's start; other first traffic may come later than it
    earlier = np.where(followed, np.minimum(after, start), after)
    normal_end = np.where(marked(phases), start, earlier)
    stalled_or_saved = long_gap(phases, typical, params)
    until = saved_until(phases, typical, params)
    save = np.maximum(until - after, 0)
    if typical.save_tail_ns is not None:
        # the save's last write plus the job's tail for a save of its span: where nothing marks the
        # next step's start, sharper than its first traffic less an estimated lead when that lead
        # is the longer (both vary in proportion: a sync-only job's first traffic comes at the
        # step's end, ZeRO-3 gathers and MoE all-to-all at its start); and where the next step
        # began later than that by a margin, a stall came after the save
        written = phases.written_until_ns >= 0
        closed = phases.written_until_ns + typical.save_tail(write_span(phases))
        stalled = after + save > closed + params.long_gap_share * typical.period_ns
        by_writes = written & (stalled | (~marked(phases) & (lead(phases, typical, params) > typical.save_tail_ns)))
        save = np.where(by_writes, closed - after, save)
    checkpoint = checkpoints(phases, typical, params)
    ends = np.where(checkpoint, after + save.astype(np.int64), np.where(stalled_or_saved, after, normal_end))
    if unwritten is not None:  # a save nothing shows ends where the next step starts (no stall after it shows)
        ends = np.where(unwritten, until, ends)
    # a gather after the optimizer that keeps the next step's pace opens it; one that keeps its
    # own step's closes it, even after gradient buckets reduce-scattered under the backward
    if typical.gather_opens:
        opening = (phases.after_optimizer & (phases.gather_start_ns >= 0)
                   & ~ran_before_the_sends(phases, typical, phases.close_ns))
        ends = np.where(opening, phases.gather_start_ns, ends)
    opens = phases.opens_step & ~ran_before_the_sends(phases, typical, phases.close_ns)
    opens_by_pace = opens & (typical.gather_opens is not False)
    return np.where(opens_by_pace, phases.start_ns, np.where(opens, phases.close_ns, ends))
