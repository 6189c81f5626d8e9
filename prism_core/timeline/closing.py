"""The last steps in view: whether a phase closes a step that finished, and when that is decided.

A phase short of its usual bytes (a hang or failure cut it) ends no step, nor does one after which
the job fell silent with a pair short of its usual flows, nor a checkpoint step whose GPU more
likely hung during the save than in the next step's first moments. A step whose sync ends near the
hour's end is decided once nothing can join the phase and no save can follow it.
"""

from __future__ import annotations

import numpy as np

from prism_core.timeline.params import TimelineParams
from prism_core.timeline.phases import Phases
from prism_core.timeline.traffic import Traffic
from prism_core.timeline.typical import Typical


def ends_step(phases: Phases, p: int, typical: Typical, failed: bool, complete: np.ndarray,
              traffic: Traffic, params: TimelineParams) -> bool:
    """Whether phase p closes a step that finished. Followed by the next step's traffic: if it
    carries its usual bytes. Followed by silence or a failure, the step's end is unseen: it
    finished if the phase carries all its bytes and no pair is short of its usual flows (a hung
    member sends no more), no checkpoint was being saved (its end is unknown), and, before a
    restart, the failure more likely came during the next step's compute than before this step's
    optimizer ended. `failed`: a restart came after the phase, by the next step's traffic."""
    if not complete[p]:
        return False
    if phases.next_ns[p] >= 0 and not failed:
        return True
    if phases.bulk_write[p] or phases.nbytes[p] < params.last_complete_share * typical.phase_bytes:
        return False
    if _pair_short(phases, p, complete, traffic, params):
        return False
    return not failed or (typical.lead_ns or 0.0) > typical.close_to_end(params)


def _pair_short(phases: Phases, p: int, complete: np.ndarray, traffic: Traffic, params: TimelineParams) -> bool:
    """Whether a pair that carried the same number of flows in each of the last complete phases
    before p (`steps_to_learn_whole` of them at least, else nothing tells) carries fewer in phase
    p. A step moves the same transfers over every pair each time (a pipeline step every
    micro-batch's activations and gradients over every stage link), so a pair short of them
    holds a step cut short, or one whose last transfers are still to come, however few are
    missing; pairs whose counts vary (sampled exporters), or whose last transfer would come
    after the phase's last one, tell nothing."""
    before = np.flatnonzero(complete[:p])[-params.steps_to_learn:]
    if len(before) < params.steps_to_learn_whole:
        return False
    n_pairs = len(traffic.pairs)
    # each pair's flows in each of those phases, and when its last transfer came after the
    # phase's start
    usual = np.zeros((len(before), n_pairs), np.int64)
    due = np.full((len(before), n_pairs), -1, np.int64)
    for row, q in enumerate(before):
        flows = phases.flows[q]
        pair = traffic.pair[flows]
        usual[row] = np.bincount(pair, minlength=n_pairs)
        np.maximum.at(due[row], pair, traffic.start[flows] - phases.start_ns[q])
    # a view that ends early (a job whose hosts another took over) cuts the phase's tail, not
    # transfers its peers outlived
    seen = phases.start_ns[p] + due.max(axis=0) < phases.close_ns[p]
    steady = np.all(usual == usual[0], axis=0) & (usual[0] > 0) & seen
    counts = np.bincount(traffic.pair[phases.flows[p]], minlength=n_pairs)
    return bool(np.any(counts[steady] < usual[0][steady]))


def hung_before_it_ended(phases: Phases, p: int, boundary: np.ndarray, complete: np.ndarray, traffic: Traffic,
                         typical: Typical, hour_end_ns: int, params: TimelineParams) -> bool:
    """Whether a GPU hung before it finished the step phase p closes, although its peers did.

    The job fell silent in the next step, which its peers began without one GPU: that GPU hung
    after its last transfer in this step (in its optimizer or checkpoint save: the step is not
    done) or in the next step before its first one (this step is done). The flows are the same; a
    hang is as likely at any moment, so the longer of the two spans holds it: from the GPU's last
    transfer, sent or received, to the boundary, against the offset of its first send in a step
    (median over the steps before; of the GPUs that sent nothing in the next step, the one due
    first). Only a step that saved a checkpoint is judged so: the save makes the first span long.
    Otherwise the spans are of a size (the optimizer's tail against the next step's first compute)
    and the call would be a coin's (fleet seeds 0 and 2 had one hang each way); the step stays
    counted, as its peers finished it. A GPU is missing once its peers' traffic went on for a
    jitter's margin after it was due (a job ending at its time limit cuts its last collective
    short: some GPUs sent, none was due)."""
    silence = params.silence_steps * typical.period_ns
    if phases.next_ns[p] < 0 or not phases.bulk_write[p] or not np.isfinite(silence):
        return False
    done = np.flatnonzero(complete[: p + 1])[-params.steps_to_learn - 1:]
    if len(done) < 2 or done[-1] != p:
        return False
    lo = np.searchsorted(traffic.start, phases.next_ns[p])
    # a silence matters only if it began before the next complete phase closed (else the job went
    # on), and flows starting after that close reach past it: the first silence is looked for before
    later_closes = phases.close_ns[p + 1:][complete[p + 1:]]
    until = max(lo, np.searchsorted(traffic.start, later_closes.min())) if len(later_closes) else len(traffic.start)
    reach = np.maximum.accumulate(traffic.end[lo:until])
    next_start = traffic.start[lo + 1 : until + 1]
    if until == len(traffic.start):  # the last flow is followed by the hour's end
        next_start = np.r_[next_start, hour_end_ns]
    quiet = next_start - reach
    silent = np.flatnonzero(quiet >= silence)
    if not len(silent):
        return False  # the job went on (or the hour ended too soon to tell)
    stopped = int(reach[silent[0]])
    if len(later_closes) and later_closes.min() <= stopped:
        return False
    bounds = boundary[done]
    ends = np.array(traffic.pair_ends()).reshape(-1, 2)
    gpus, endpoint = np.unique(ends, return_inverse=True)
    sender, receiver = endpoint.reshape(ends.shape).T
    rows = np.arange(np.searchsorted(traffic.start, bounds[0]), lo)
    window = np.searchsorted(bounds, traffic.start[rows], side="right") - 1
    rows, window = rows[window < len(bounds) - 1], window[window < len(bounds) - 1]
    first = np.full((len(bounds) - 1, len(gpus)), np.iinfo(np.int64).max)
    np.minimum.at(first, (window, sender[traffic.pair[rows]]), traffic.start[rows] - bounds[window])
    offset = np.median(np.where(first == np.iinfo(np.int64).max, np.nan, first), axis=0)
    # a GPU is busy with a step until its last transfer, sent or received (a peer's send into a
    # hung GPU's memory still completes, so only its own sends tell it began the next step)
    in_step = rows[window == len(bounds) - 2]
    last = np.full(len(gpus), -1, np.int64)
    np.maximum.at(last, sender[traffic.pair[in_step]], traffic.end[in_step])
    np.maximum.at(last, receiver[traffic.pair[in_step]], traffic.end[in_step])
    later = np.arange(lo, lo + silent[0] + 1)
    sent_after = np.zeros(len(gpus), bool)
    sent_after[sender[traffic.pair[later]]] = True
    seen_for = traffic.start[later].max() - boundary[p]
    due = offset + params.long_gap_share * typical.period_ns < seen_for
    missing = np.flatnonzero((last >= 0) & ~sent_after & due)
    if not len(missing):
        return False
    due_first = missing[np.argmin(offset[missing])]
    return bool(boundary[p] - last[due_first] > offset[due_first])


def next_step_began(phases: Phases, p: int, typical: Typical, params: TimelineParams) -> bool:
    """Whether the next step's first pipeline sends followed phase p at the usual gap, one usual
    forward pass apart: the optimizer ran in between, so nothing more joins the phase (the
    cool-down's sends inside a phase are backward ones, a backward pass apart)."""
    if phases.first_send_ns[p] < 0 or not typical.forward_ns or not np.isfinite(typical.gap_ns):
        return False
    gap = phases.first_send_ns[p] - phases.close_ns[p]
    tolerance = params.long_gap_share
    return bool(abs(gap - typical.gap_ns) <= tolerance * typical.gap_ns
                and abs(phases.forward_ns[p] - typical.forward_ns) <= tolerance * typical.forward_ns)


def save_may_follow(step: int, checkpoint_steps: list[int], typical: Typical, quiet_ns: int,
                    params: TimelineParams) -> bool:
    """Whether a checkpoint save may still follow step number `step`, whose sync ended `quiet_ns`
    ago without a bulk write since. Saves recur every k steps (a training loop's save interval):
    once the last three checkpoint steps show k, exactly when the step is k after the last.
    Otherwise while the quiet is no longer than the job's saves took to start writing (with the
    step jitter's margin), or, with none seen, than the prior `save_start_share` of a step."""
    if len(checkpoint_steps) == 3:
        first, second, last = checkpoint_steps
        if last - second == second - first:
            return (step - last) % (last - second) == 0
    if typical.write_delay_ns is not None:
        return quiet_ns <= (1 + params.long_gap_share) * typical.write_delay_ns
    return quiet_ns <= params.save_start_share * typical.period_ns


def silences(traffic: Traffic, longer_than: float, since: int | None) -> np.ndarray:
    """(from, to) of each stretch longer than `longer_than` without job traffic nor bulk writes
    (a checkpoint save is quiet on the job's pairs, not silent), from `since` (the last emitted
    step's sync, whose flows the carry may not hold) on, shape (n, 2)."""
    known = [] if since is None else [since]
    # the starts come sorted: the few other times are inserted where they fall, not sorted with them
    more = np.sort(np.r_[known, traffic.bulk_writes]).astype(np.int64, copy=False)
    times = np.insert(traffic.start, np.searchsorted(traffic.start, more), more)
    # stable: timsort merges the sorted runs (ends nearly sorted, bulk writes) in linear time,
    # several times faster than quicksort over the job's every flow
    ends = np.sort(np.r_[known, traffic.end, traffic.bulk_writes], kind="stable").astype(np.int64, copy=False)
    if len(times) < 2:
        return np.empty((0, 2), np.int64)
    reach = ends[:-1]  # sorted already: its own running maximum
    quiet = np.flatnonzero(times[1:] - reach > longer_than)
    return np.stack([reach[quiet], times[1:][quiet]], axis=1)
