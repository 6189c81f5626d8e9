"""The first step in view: where it started, if the view holds its start at all.

A job new to Prism, or one whose view opened again after a silence, shows its first sync without
the boundary before it. That step counts only if its start is in view: the job started in view
(warm-up), start markers give it a usual length, the view opened during the save before it, or the
usual lead before its sync puts the start in view. After a restart, the first step starts with the
job's traffic after the downtime.
"""

from __future__ import annotations

import numpy as np

from prism_core.constants import PP
from prism_core.timeline import boundaries as bounds
from prism_core.timeline.params import TimelineParams
from prism_core.timeline.phases import Phases
from prism_core.timeline.rows import first_where, last_where
from prism_core.timeline.traffic import Traffic
from prism_core.timeline.typical import Typical

FIRST_BATCH = 256  # quiet gaps tried at first for the start of the first step in view (then twice as many)


def opening_start(
    phases: Phases, p: int, boundary: np.ndarray, complete: np.ndarray, traffic: Traffic, typical: Typical,
    view_from_ns: int, params: TimelineParams,
) -> int | None:
    """Start of the step closed by the first phase in view, if the view (from `view_from_ns`)
    holds all of it: the job started in view (warm-up: its next step runs markedly slower than
    usual, or its next steps speed up step by step from somewhat slower; or its own first sends
    give it a warm-up length), the step's own start markers follow a quiet gap and give it a
    usual length, or, when its sync is the job's first traffic in view, the usual lead before
    it does. None if the view opened inside the step."""
    later = np.flatnonzero(complete[p + 1 :])
    if not len(later) or not np.isfinite(typical.period_ns):
        return None
    after = p + 1 + later[0]
    period = typical.period_ns
    next_length = boundary[after] - boundary[p]
    saving = phases.bulk_write[p] or phases.bulk_write[after]  # a checkpoint, not a warm-up
    lengths = np.diff(boundary[p:][complete[p:]][: params.speedup_steps + 1])
    speeding_up = len(lengths) == params.speedup_steps and lengths[0] >= (1 + params.long_gap_share / 2) * period
    speeding_up = speeding_up and bool(np.all(np.diff(lengths) < 0))
    if (next_length >= params.warmup_ratio * period or speeding_up) and not saving:
        return attempt_start(phases, p, boundary, traffic, None, typical, params)
    step_traffic_until = _step_traffic_until(phases, p, params)
    n_before = int(np.searchsorted(traffic.start, step_traffic_until))

    # usual and warm-up lengths are the local rhythm's: the steps that follow (a degradation
    # later in the hour moves the hour's median)
    following = np.diff(boundary[p:][complete[p:]][: params.rhythm_steps + 1])
    local = float(np.median(following)) if len(following) >= params.min_rhythm_steps else period

    def usual(start: int) -> bool:
        return bool(_usual_length(boundary[p] - start, local, params))

    if n_before:
        warming_fits = next_length > (1 + params.long_gap_share / 2) * local and not saving
        start = _start_after_quiet(traffic, n_before, typical, int(boundary[p]), local, warming_fits, params)
        if start is not None:
            return start
    # the view opened during the save that ended the step before: this one starts the job's
    # usual tail after the save's last write
    first_traffic = traffic.start[0] if n_before else step_traffic_until
    saved = slice(0, np.searchsorted(traffic.bulk_writes, first_traffic, side="left"))
    if typical.save_tail_ns is not None and saved.stop > 0:
        last_write = traffic.bulk_write_ends[saved].max()
        start = int(last_write + typical.save_tail(last_write - traffic.bulk_writes[saved].min()))
        if start <= first_traffic and usual(start):
            return start
    if not n_before:
        # the view opened in the compute before the sync: the step started the usual lead
        # before it, if that lies in view by more than the lead misses by, and after the save
        not_before = traffic.bulk_write_ends[saved].max(initial=view_from_ns)
        start = _start_by_lead(phases, p, boundary, typical, not_before, params)
        if start is not None and usual(start):
            return start
    return None


def _start_after_quiet(traffic: Traffic, n_before: int, typical: Typical, boundary_ns: int, local: float,
                       warming_fits: bool, params: TimelineParams) -> int | None:
    """The start of the step ending at `boundary_ns`, marked by the traffic (of rows before
    `n_before`) from the view's start or from a quiet gap, that gives the step a usual length
    (`local`), or from the view's start a warm-up's (when `warming_fits`): the first such in time
    order. The marks after a gap start no later than its first pipeline send that sends again, or
    its first flow, by `cluster_ns`: gaps whose marks start too early for a usual length are passed
    over unread, and of the gaps before the last such send only the first is tried (they share
    their marks). The rest are tried in batches of growing size, so that an early fit ends the
    search."""
    # a start before this cannot be a usual one (float rounding of the medians is well within 1 us)
    too_early = boundary_ns - local - params.long_gap_share / 2 * local - params.cluster_ns - 1_000
    sends = traffic.index(PP, params)
    anchored = sends.last_sending_before(int(sends.positions(too_early)), int(sends.at_or_after_rows(n_before)))
    passed = int(sends.rows[anchored]) if anchored >= 0 else -1
    quiet, quiet_enough = traffic.quiet_before(), params.quiet_gap_share * typical.gap_ns
    late = min(int(np.searchsorted(traffic.start, too_early)), n_before)
    shared = first_where(lambda rows: quiet[rows] >= quiet_enough, passed + 1, late)
    late_gaps = late + np.flatnonzero(quiet[late:n_before] >= quiet_enough)
    candidates = np.r_[np.array([0, shared] if shared < late else [0], np.int64), late_gaps]
    tried, size = 0, FIRST_BATCH
    while tried < len(candidates):
        first = candidates[tried : tried + size]
        start = marked_starts(traffic, first, n_before, typical, params)
        length = boundary_ns - start
        warming = (first == 0) & (params.warmup_ratio * local <= length) & (length <= 2 * params.warmup_ratio * local)
        fits = _usual_length(length, local, params) | (warming & warming_fits)
        if fits.any():
            return int(start[np.argmax(fits)])
        tried, size = tried + size, 2 * size
    return None


def _usual_length(length: np.ndarray | int, local: float, params: TimelineParams) -> np.ndarray:
    """Whether each step length is within half the long-gap share of the local rhythm's step."""
    return np.abs(length - local) <= params.long_gap_share / 2 * local


def _start_by_lead(phases: Phases, p: int, boundary: np.ndarray, typical: Typical, not_before: int,
                   params: TimelineParams) -> int | None:
    """Start of the step closed by phase p from its sync alone: the usual lead per ns of sync
    before the sync (step jitter stretches compute and sync alike). None unless it is later than
    `not_before` by more than the lead missed the boundaries of the hour's usual steps by, when
    the sync is not a usual one (a straggler stretches it with waiting), or when too few steps
    show the lead's accuracy."""
    sync = phases.close_ns[p] - phases.start_ns[p]
    if typical.lead_per_sync is None or not bounds.usual_sync(sync, typical, params):
        return None
    timed = ((phases.next_ns >= 0) & ~bounds.long_gap(phases, typical, params)
             & bounds.usual_sync(bounds.next_sync(phases), typical, params))
    if timed.sum() < params.steps_to_learn_whole:
        return None
    missed = np.abs(phases.next_ns - bounds.lead(phases, typical, params) - boundary)[timed].max()
    start = int(phases.start_ns[p] - typical.lead_per_sync * sync)
    return start if start - missed >= not_before else None


def attempt_start(
    phases: Phases, p: int, boundary: np.ndarray, traffic: Traffic, since: int | None, typical: Typical,
    params: TimelineParams,
) -> int:
    """Start of the first step of an attempt (after `since`, the tracker's restart, or from the
    job's first traffic), closed by phase p: from the traffic before the phase when there is
    some; when the sync itself is the first traffic, the step's length is extrapolated from the
    next step's warm-up (the first step is slower still)."""
    fresh = since is None
    since = since if since is not None else -(1 << 62)
    lo, hi = np.searchsorted(traffic.start, [since, _step_traffic_until(phases, p, params)])
    if fresh and hi - lo > 1:
        # a new job's traffic starts after its last silence of steps (before: another job's tail)
        quiet, silence = traffic.quiet_before(), params.tail_silence_steps * typical.period_ns
        lo = max(lo, last_where(lambda rows: quiet[rows] > silence, hi))
    if hi > lo:
        return int(marked_starts(traffic, np.array([lo]), hi, typical, params)[0])
    later = float(boundary[p + 1] - boundary[p]) if p + 1 < len(boundary) else typical.period_ns
    length = later * later / typical.period_ns if np.isfinite(typical.period_ns) else later
    # not before the job's last traffic ahead of the downtime
    down_since = traffic.end[:lo].max() if lo else -(1 << 62)
    return int(max(boundary[p] - length, down_since))


def _step_traffic_until(phases: Phases, p: int, params: TimelineParams) -> int:
    """Where the traffic that can mark the start of the step closed by phase p ends: before its
    sync, or, without DP, the phase itself (a pipeline step's traffic is its phase)."""
    return int(phases.start_ns[p] - params.cluster_ns if phases.has_dp else phases.close_ns[p])


def marked_starts(traffic: Traffic, first: np.ndarray, until: int, typical: Typical,
                  params: TimelineParams) -> np.ndarray:
    """Compute start of a step whose traffic runs from each row of `first` to row `until` (rows in
    start order): from its first pipeline sends, else its first traffic (ZeRO-3 gathers and MoE
    all-to-all come at or just after the start)."""
    sends = traffic.index(PP, params)
    send_from, which = np.unique(sends.at_or_after_rows(first), return_inverse=True)
    send_until = np.full(len(send_from), sends.at_or_after_rows(until))
    links = traffic.host_links()[0]
    t1, forward, found = (values[which] for values in sends.first_sends(send_from, send_until, links))
    start = t1 - typical.fill * forward
    start[~found] = traffic.index(None, params).cluster_starts(first[~found], np.full((~found).sum(), until))
    return start
