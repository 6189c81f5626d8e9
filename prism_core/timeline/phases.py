"""Sync phases: the heavy DP bursts (or pipeline sends) that close each step, and what follows each.

DP flows that overlap form bursts; gradient syncs are the heavy ones, and the quiet gaps between
them that separate steps (prism_core.timeline.regimes) group them into phases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism_core.arrays import KeyGroups, combined_key, unique_inverse
from prism_core.constants import DP, OTHER, PP
from prism_core.parallelism import reverse_in_flight, warm_up_votes
from prism_core.timeline.params import TimelineParams
from prism_core.timeline.regimes import boundary_gap_threshold, irregularity
from prism_core.timeline.rows import RowIndex
from prism_core.timeline.traffic import Traffic


@dataclass
class Phases:
    """Sync phases in time order, each closing a step (if complete), and what follows each."""

    flows: list[np.ndarray]  # traffic rows of each phase's heavy bursts
    start_ns: np.ndarray  # the phase's first burst starts
    close_ns: np.ndarray  # its last burst ends
    nbytes: np.ndarray
    nflows: np.ndarray
    whole_otherwise: np.ndarray  # bool: short of a usual phase's bytes, but only where an exporter lost
    # records, or with the step's signal traffic outside its heavy bursts (`_whole_otherwise`)
    after_optimizer: np.ndarray  # bool: the phase ends with a collective after the optimizer
    gather_start_ns: np.ndarray  # of such a phase, where that collective (its last burst) starts (-1: none)
    before_gather_ns: np.ndarray  # and where the bursts before it end (-1: none)
    scatter_start_ns: np.ndarray  # and where they start (of a phase opening a step, its reduce-scatter's)
    opens_step: np.ndarray  # bool: the phase is the parameter gather opening the next step (see below)
    closed: np.ndarray  # bool: nothing later can still join the phase
    next_ns: np.ndarray  # first traffic after the phase (-1: none in view)
    first_send_ns: np.ndarray  # the next step's first pipeline sends (-1: none)
    forward_ns: np.ndarray  # and one forward pass between them
    gather_ns: np.ndarray  # a DP collective opening the next step, before its sync (-1: none)
    bulk_write: np.ndarray  # bool: bulk writes between the phase and the next traffic
    write_delay_ns: np.ndarray  # end of the phase -> the first bulk write after it (-1: none in view)
    written_until_ns: np.ndarray  # end of the last bulk write after the phase, before the next traffic (-1: none)
    inner_gap_ns: int  # the longest quiet between bursts of one phase (at least merge_ns)
    has_dp: bool
    gap_threshold_ns: float | None


def sync_phases(traffic: Traffic, hour_end_ns: int, gap_threshold_ns: float | None, steps_to_learn: int,
                params: TimelineParams) -> Phases:
    """The job's sync phases and what follows each; `gap_threshold_ns` is the previous hours'
    boundary gap, kept while fewer than `steps_to_learn` steps are in view to find it again."""
    has_dp = bool(np.any(traffic.kind == DP))
    pipeline = bool(np.any(traffic.kind == PP))
    by_exchange = not has_dp and pipeline and _exchange_marks_steps(traffic, params)
    signal_index = traffic.index(DP if has_dp else OTHER if by_exchange else PP if pipeline else None, params)
    signal = signal_index.rows
    burst, b_start, b_end = bursts(traffic.start[signal], traffic.end[signal], params)
    if has_dp:
        burst, b_start, b_end = _split_trailing_collectives(traffic, signal_index, burst, b_start, b_end, params)
    b_bytes = np.bincount(burst, traffic.nbytes[signal], minlength=len(b_start))
    if has_dp:
        # bytes and flows per pair: a sync of several stages at once weighs as one stage's sync
        b_flows = np.bincount(burst, minlength=len(b_start))
        burst_pair = np.sort(burst * len(traffic.pairs) + traffic.pair[signal])
        distinct = burst_pair[np.r_[True, burst_pair[1:] != burst_pair[:-1]]]
        b_pairs = np.bincount(distinct // len(traffic.pairs), minlength=len(b_start))
        heavy = upper_class(np.log(np.maximum(b_bytes, 1.0) * b_flows / b_pairs.astype(float) ** 2), params)
        heavy |= _other_groups_syncs(traffic, signal, burst, heavy, params)
        if b_bytes[heavy].sum() < params.heavy_bytes_share * b_bytes.sum():
            # too light to hold every step's gradients: bucket syncs that happened to touch
            heavy[:] = True
        elif _runs_without_heavy(traffic, signal, burst, heavy, b_start, b_bytes, params):
            # the same collective runs for steps on end without them: buckets a straggler stretched
            # into overlap weigh as several
            heavy[:] = True
    else:
        heavy = np.ones(len(b_start), bool)
    candidates = np.flatnonzero(heavy)

    gaps = b_start[candidates[1:]] - b_end[candidates[:-1]]
    candidate_of_burst = np.cumsum(heavy) - 1
    on_candidate = heavy[burst]
    by_turns = pipeline and not has_dp and not by_exchange
    # a collective split off the one its stragglers overlap follows it without a quiet: one step
    every_gap = gaps > 0

    def threshold(eligible: np.ndarray) -> float:
        return boundary_gap_threshold(gaps, b_end[candidates[:-1]], candidate_of_burst[burst[on_candidate]],
                                      traffic.bulk_writes, gap_threshold_ns, eligible, steps_to_learn, params,
                                      syncs=has_dp)

    turn = _pipeline_turns(traffic, signal, burst) if by_turns else every_gap
    turn_threshold_ns = threshold(turn)
    if by_turns:
        alone_threshold_ns = threshold(every_gap)
        if _turns_misread(turn, gaps, turn_threshold_ns, alone_threshold_ns, params):
            turn, turn_threshold_ns = every_gap, alone_threshold_ns
    gap_threshold_ns = turn_threshold_ns
    between_phases = turn & (gaps >= gap_threshold_ns)
    # phase p holds candidates[first[p]:first[p + 1]]
    first = np.r_[0, np.flatnonzero(between_phases) + 1] if len(candidates) else np.empty(0, int)
    first = _join_partial_phases(first, b_bytes[candidates], b_start[candidates], b_end[candidates], params)
    last = np.r_[first[1:] - 1, len(candidates) - 1] if len(candidates) else np.empty(0, int)

    # per signal row, its phase (-1 in a light burst)
    phase_of_burst = np.full(len(b_start), -1)
    phase_of_burst[candidates] = np.repeat(np.arange(len(first)), last - first + 1)
    phase = phase_of_burst[burst]
    in_phase = phase >= 0
    in_last = in_phase & (burst == candidates[last][phase])
    shapes = (_phase_shapes(traffic, signal, phase, in_phase, in_last, b_bytes, b_flows, b_pairs, candidates, first,
                            last, params) if has_dp else _Shapes.none(len(first)))
    # the same collective again moves the same transfer sizes: another gradient bucket, or the
    # all-gather of the shards a reduce-scatter left (ZeRO-1/2); a parameter gather moves the
    # parameters' sizes, however close its bytes come to the gradients'
    all_gather = ((shapes.same_flows & (np.abs(shapes.repeated - 1.0) <= params.same_shape)) | shapes.same_but_lost)
    all_gather &= shapes.same_sizes
    repeats = (shapes.repeated >= params.repeat_share) & ~all_gather
    # a different collective on the same pairs right after the optimizer: the next step's ZeRO-3
    # parameter gather, its first traffic, not part of this sync (one like the burst before it pair
    # for pair is the sync's next gradient bucket, of as many DP groups or more: the first and last
    # stages sync theirs at once after holding them back for the tied embedding's all-reduce; one
    # moving fewer of their bytes is the rest of the buckets the burst before it synced together)
    drop_last = repeats & ~(shapes.same_sizes & (shapes.same_burst | shapes.rest_of_before))
    after_optimizer = (shapes.repeated >= params.repeat_share) & all_gather
    # every stage's updated shards gathered at once (of the last phase): the optimizer ran, the sync is over
    gathered_every_stage = bool(len(first)) and bool(all_gather[-1] & shapes.every_pair[-1])
    kept = in_phase & ~(in_last & drop_last[phase])
    flows = np.split(signal[kept], np.cumsum(np.bincount(phase[kept], minlength=len(first)))[:-1]) if len(first) else []
    kept_bursts = np.ones(len(candidates), bool)
    kept_bursts[last[drop_last]] = False
    nbytes = np.bincount(phase_of_burst[candidates], b_bytes[candidates] * kept_bursts, minlength=len(first))
    opening_burst = candidates[first]
    gather_burst = np.where(after_optimizer, candidates[last], -1)
    burst_from = np.searchsorted(burst, np.arange(len(b_start) + 1))  # signal positions of each burst
    start_ns = signal_index.cluster_starts(burst_from[opening_burst], burst_from[opening_burst + 1])
    gather_start_ns = np.full(len(gather_burst), -1, np.int64)
    gathered = gather_burst >= 0
    gather_start_ns[gathered] = signal_index.cluster_starts(burst_from[gather_burst[gathered]],
                                                            burst_from[gather_burst[gathered] + 1])
    opens_step, scattered = _gathers_after_bucketed_syncs(traffic, signal, heavy[burst], flows, nbytes, params)
    # where the collectives ended: each phase's last burst (kept), and the bursts before an
    # after-optimizer gather
    last_kept = kept & (burst == candidates[np.where(drop_last, last - 1, last)][phase])
    close = traffic.cluster_ends(signal[last_kept], phase[last_kept], len(first), params)
    before = in_phase & ~in_last & after_optimizer[phase]
    before_gather = np.full(len(first), -1, np.int64)
    gather_of_phase = np.cumsum(after_optimizer) - 1
    before_gather[after_optimizer] = traffic.cluster_ends(signal[before], gather_of_phase[phase[before]],
                                                          int(after_optimizer.sum()), params)
    scatter_start_ns = np.where(gather_start_ns >= 0, start_ns, -1)
    # a gather opening a step: its reduce-scatter ran in the lighter bursts before it
    gather_start_ns = np.where(opens_step, start_ns, gather_start_ns)
    scatter_start_ns = np.where(opens_step, scattered[:, 0], scatter_start_ns)
    before_gather = np.where(opens_step, scattered[:, 1], before_gather)
    closed = np.ones(len(first), bool)
    if len(first):
        closed[-1] = hour_end_ns - int(b_end[candidates[-1]]) >= gap_threshold_ns or gathered_every_stage
    nflows = np.bincount(phase[kept], minlength=len(first)).astype(float)
    return Phases(flows, start_ns, close, nbytes, nflows,
                  _whole_otherwise(traffic, flows, signal, start_ns, close, nbytes, nflows, params),
                  after_optimizer, gather_start_ns, before_gather, scatter_start_ns, opens_step,
                  closed, *_what_follows(traffic, flows, close, np.where(drop_last, b_start[candidates[last]], -1),
                                         has_dp, burst, params),
                  int(np.max(gaps[~between_phases], initial=params.merge_ns)), has_dp,
                  float(gap_threshold_ns) if np.isfinite(gap_threshold_ns) else None)


def _split_trailing_collectives(traffic: Traffic, signal_index: RowIndex, burst: np.ndarray, b_start: np.ndarray,
                                b_end: np.ndarray, params: TimelineParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`bursts` of the DP rows (`signal_index`, in start order) with a burst split where another
    collective follows the one before it once that one is over: a parameter gather after the
    optimizer, overlapped by the reduce-scatter's stragglers (a channel's flow stretched, another
    stage's ring) so that no quiet parts them. The later rows move none of the earlier rows' size
    families (the parameters' dtype, not the gradients'), on a `trailing_pairs_share` of their
    pairs or more, at least `trailing_collective_share` of the earlier rows' bytes on those pairs,
    and start once the earlier collective ended on that share of its pairs (`Traffic.pair_finishes`,
    within `cluster_ns`). Per burst the last row no size family straddles is the split looked at."""
    signal = signal_index.rows
    n = len(signal)
    if n < 2:
        return burst, b_start, b_end
    # a split before row p is possible where no (burst, size family) has rows on both sides of it
    families = KeyGroups(combined_key(burst, unique_inverse(traffic.family[signal])[1]))
    position = np.arange(n)
    first_row, last_row = families.reduce(position, np.minimum), families.reduce(position, np.maximum)
    straddled = np.cumsum(np.bincount(first_row + 1, minlength=n + 1) - np.bincount(last_row + 1, minlength=n + 1))
    splits = np.flatnonzero((straddled[1:n] == 0) & (burst[1:] == burst[:-1])) + 1
    if not len(splits):
        return burst, b_start, b_end
    splits = splits[np.r_[burst[splits][1:] != burst[splits][:-1], True]]  # the last of each burst
    n_candidates = len(splits)
    candidate_of_burst = np.full(len(b_start), -1)
    candidate_of_burst[burst[splits]] = np.arange(n_candidates)
    rows = np.flatnonzero(candidate_of_burst[burst] >= 0)
    candidate = candidate_of_burst[burst[rows]]
    later = rows >= splits[candidate]
    pair_key = combined_key(candidate, traffic.pair[signal[rows]])
    shared = np.isin(pair_key, pair_key[later]) & np.isin(pair_key, pair_key[~later])

    def pairs(of_rows: np.ndarray) -> np.ndarray:
        first_of_pair = np.unique(pair_key[of_rows], return_index=True)[1]
        return np.bincount(candidate[of_rows][first_of_pair], minlength=n_candidates)

    nbytes = traffic.nbytes[signal[rows]].astype(float)
    earlier_bytes = np.bincount(candidate[~later], (nbytes * shared)[~later], minlength=n_candidates)
    later_bytes = np.bincount(candidate[later], nbytes[later], minlength=n_candidates)
    covered = pairs(later & shared) >= params.trailing_pairs_share * pairs(~later)
    moved = later_bytes >= params.trailing_collective_share * earlier_bytes
    closes = np.searchsorted(burst, burst[splits], side="right")
    # most pairs of the earlier collective are done when the later starts: a slow rank's ring
    # and a channel's stretched flow still run
    started = signal_index.cluster_starts(splits, closes)
    set_of_end, ends = traffic.pair_finishes(signal[rows[~later]], candidate[~later], n_candidates, params)
    done = np.bincount(set_of_end, ends <= started[set_of_end] + params.cluster_ns, minlength=n_candidates)
    split = splits[covered & moved
                   & (done >= params.trailing_pairs_share * np.bincount(set_of_end, minlength=n_candidates))]
    if not len(split):
        return burst, b_start, b_end
    opens = np.r_[True, burst[1:] != burst[:-1]]
    opens[split] = True
    return _opened_bursts(opens, traffic.start[signal], traffic.end[signal])


def _other_groups_syncs(traffic: Traffic, signal: np.ndarray, burst: np.ndarray, heavy: np.ndarray,
                        params: TimelineParams) -> np.ndarray:
    """Per burst of the DP rows `signal` (`burst` of each), whether a light one is another DP
    group's gradient sync: it moves the heavy bursts' transfer sizes (all but a `same_shape` share
    of its bytes in their size families) on pairs no heavy burst uses. Per pair a group whose ring
    crosses more hosts shows more pairs of the same flows, so its syncs weigh less; a ZeRO-3
    parameter gather or an MoE all-to-all runs on the sync's own pairs."""
    light_row = ~heavy[burst]
    if not light_row.any() or light_row.all():
        return np.zeros(len(heavy), bool)
    pair, family, nbytes = traffic.pair[signal], traffic.family[signal], traffic.nbytes[signal].astype(float)
    alike = ~np.isin(pair, pair[~light_row]) & np.isin(family, family[~light_row])
    moved = np.bincount(burst, nbytes, minlength=len(heavy))
    alike_bytes = np.bincount(burst, nbytes * alike, minlength=len(heavy))
    return ~heavy & (alike_bytes >= (1.0 - params.same_shape) * moved)


def _runs_without_heavy(traffic: Traffic, signal: np.ndarray, burst: np.ndarray, heavy: np.ndarray,
                        b_start: np.ndarray, b_bytes: np.ndarray, params: TimelineParams) -> bool:
    """Whether the lighter DP bursts move the heavy ones' collective (their transfer sizes on
    their pairs) between two heavy bursts (or before the first, after the last) in as many bytes
    as `heavy_absent_syncs` heavy bursts (the median) or more: the job syncs its gradients there
    without any heavy burst, so the heavy ones are that sync's buckets merged into one burst (a
    straggler stretches them until they overlap), not a heavier collective of every step. A
    distributed optimizer's bucketed reduce-scatter moves one all-gather's bytes between two."""
    if heavy.all() or not heavy.any():
        return False
    heavy_row = heavy[burst]
    key = combined_key(traffic.pair[signal], traffic.family[signal])
    light = ~heavy_row & np.isin(key, key[heavy_row])
    stretch = np.searchsorted(b_start[heavy], traffic.start[signal[light]])
    carried = np.bincount(stretch, traffic.nbytes[signal[light]], minlength=int(heavy.sum()) + 1)
    return bool(carried.max() >= params.heavy_absent_syncs * np.median(b_bytes[heavy]))


def _whole_otherwise(traffic: Traffic, flows: list[np.ndarray], signal: np.ndarray, start: np.ndarray,
                     close: np.ndarray, nbytes: np.ndarray, nflows: np.ndarray, params: TimelineParams) -> np.ndarray:
    """Per phase short of a usual phase's bytes, whether it still closes a whole step: on most
    exporters (`_whole_on_most_exporters`), over its usual span (`_whole_over_its_span`), or over
    the step (`_whole_since_previous`)."""
    return (_whole_on_most_exporters(traffic, flows, params)
            | _whole_over_its_span(start, close, nbytes, nflows, params)
            | _whole_since_previous(traffic, signal, close, params))


def _whole_over_its_span(start: np.ndarray, close: np.ndarray, nbytes: np.ndarray, nflows: np.ndarray,
                         params: TimelineParams) -> np.ndarray:
    """Per phase, whether it lasted a usual phase (at least `usual_span_share` of the median span)
    and carries at least 1 - `lost_share` of the usual bytes and flows (medians over the hour's
    phases, `steps_to_learn` of them at least). Lost export datagrams take records out of a
    collective, not its time: a sync whose records all pass one exporter has no other exporter to
    show it whole. A phase cut short by a failure ends early; one split by a pause holds part of
    the span."""
    if len(close) < params.steps_to_learn:
        return np.zeros(len(close), bool)
    span = close - start
    kept = 1.0 - params.lost_share
    return ((span >= params.usual_span_share * np.median(span)) & (nbytes >= kept * np.median(nbytes))
            & (nflows >= kept * np.median(nflows)))


def _whole_since_previous(traffic: Traffic, signal: np.ndarray, close: np.ndarray, params: TimelineParams) -> np.ndarray:
    """Per phase, whether the signal traffic (DP, else the pipeline's) since the phase before
    closed carries at least `complete_share` of its median over the hour's phases (`steps_to_learn`
    of them at least; never for the first). A straggler stretches a sync's buckets into bursts too
    light to be told from the rest: its phases hold part of the sync, the step still all of it. A
    phase cut short by a failure, or a warm-up step's sync split by a pause, carries part of it."""
    whole = np.zeros(len(close), bool)
    if len(close) <= params.steps_to_learn:
        return whole
    carried = np.r_[0.0, np.cumsum(traffic.nbytes[signal], dtype=np.float64)]
    until_close = carried[np.searchsorted(traffic.start[signal], close, side="right")]
    since_previous = np.diff(until_close)
    whole[1:] = since_previous >= params.complete_share * np.median(since_previous)
    return whole


def _whole_on_most_exporters(traffic: Traffic, flows: list[np.ndarray], params: TimelineParams) -> np.ndarray:
    """Per phase, whether half the exporters of the job's sync or more carry at least
    `complete_share` of their usual bytes and flows in it (usual: an exporter's median over the
    hour's phases, `steps_to_learn` of them at least). An exporter that loses records (UDP export
    drops whole datagrams) leaves its part of a phase short; a phase cut short or split in time is
    short on every exporter."""
    if len(flows) < params.steps_to_learn:
        return np.zeros(len(flows), bool)
    rows = np.concatenate(flows)
    n_exporters = len(traffic.exporters)
    cell = np.repeat(np.arange(len(flows)), [len(f) for f in flows]) * n_exporters + traffic.exporter[rows]
    size = len(flows) * n_exporters
    whole = np.ones(len(flows), bool)
    for weights in (traffic.nbytes[rows], None):
        per_exporter = np.bincount(cell, weights, minlength=size).reshape(len(flows), n_exporters).astype(float)
        usual = np.median(per_exporter, axis=0)
        syncing = usual > 0
        if not syncing.any():
            return np.zeros(len(flows), bool)
        share = np.quantile(per_exporter[:, syncing] / usual[syncing], 0.5, axis=1, method="higher")
        whole &= share >= params.complete_share
    return whole


def _exchange_marks_steps(traffic: Traffic, params: TimelineParams) -> bool:
    """Whether a pipeline job whose DP sync the network does not show (its replicas inside hosts)
    marks each step's end with an exchange of its own: the tied embedding's all-reduce between the
    first and the last stage, once per step after the last backward pass (Megatron runs it before
    the DP sync and the optimizer). Its bursts (traffic neither DP nor PP; those within
    `cluster_ns` of each other one exchange) then recur regularly (`regimes.irregularity` at most
    `max_irregularity`), each after several pipeline sends (at least `marker_sends`, median between
    two: an MoE all-to-all repeats within a micro-batch's pass); the pipeline's own turns are
    harder to read (an interleaved schedule sends forward activations both ways)."""
    other = traffic.index(OTHER, params).rows
    if len(other) < 2:
        return False
    _, starts, ends = bursts(traffic.start[other], traffic.end[other], params)
    # bursts within `cluster_ns` of each other are one exchange (exporters' clocks a few ms apart)
    starts = starts[np.r_[True, starts[1:] - ends[:-1] > params.cluster_ns]]
    if len(starts) < params.steps_to_learn or irregularity(starts) > params.max_irregularity:
        return False
    sends = traffic.index(PP, params).rows
    _, send_starts, _ = bursts(traffic.start[sends], traffic.end[sends], params)
    between = np.diff(np.searchsorted(send_starts, starts))
    return bool(np.median(between) >= params.marker_sends)


def _what_follows(traffic: Traffic, flows: list[np.ndarray], close: np.ndarray, dropped_ns: np.ndarray, has_dp: bool,
                  signal_burst: np.ndarray, params: TimelineParams) -> tuple[np.ndarray, ...]:
    """Per phase (its flows, its end, where the burst it dropped as the next step's starts, -1
    where none; `signal_burst`: the burst of each row of the signal, the DP rows where `has_dp`):
    the next traffic after it, before the
    next phase ends (the next step's first traffic may open the next phase), as (its start, the
    next step's first pipeline send and forward pass, the start of DP traffic before the next phase
    (a parameter gather: the distributed optimizer's all-gather of the updated shards, ZeRO-3's
    gather), whether bulk writes came before it, the delay to the first bulk write after the phase
    and where the writes before the next traffic ended), -1 where none."""
    max_ns = np.iinfo(np.int64).max
    after_phase = np.array([traffic.end[rows].max() + 1 for rows in flows], np.int64)
    # the next step's collective may start while the phase's stragglers still run
    after_phase = np.where(dropped_ns >= 0, np.minimum(after_phase, dropped_ns), after_phase)
    until = np.r_[close[1:], max_ns]
    # other traffic after a pipeline step's last send (a tied embedding) is its own
    following = traffic.index(None if has_dp else PP, params)
    lo, hi = following.positions(after_phase), following.positions(until)
    followed = hi > lo
    next_ns = np.full(len(close), -1, np.int64)
    next_ns[followed] = following.cluster_starts(lo[followed], hi[followed])
    # the first sends come within a small part of a step: look no further
    look_until = np.where(followed, next_ns + (until - close) // params.first_sends_part, 0)
    sends = traffic.index(PP, params)
    send_hi = np.minimum(sends.positions(look_until), sends.positions(until))
    t1, forward, found = sends.first_sends(sends.positions(after_phase)[followed], send_hi[followed],
                                           traffic.host_links()[0])
    first_send_ns = np.full(len(close), -1, np.int64)
    forward_ns = np.full(len(close), -1, np.int64)
    first_send_ns[followed] = np.where(found, t1, -1)
    forward_ns[followed] = np.where(found, forward, -1)
    gather_ns = np.full(len(close), -1, np.int64)
    if has_dp:
        # lighter DP traffic early in the quiet before the next sync gathers parameters at the next
        # step's start (an all-gather after the optimizer joins the phase that ran it; gradient
        # buckets synced during the last backward come late in it)
        gathers = traffic.index(DP, params)
        next_phase = np.array([traffic.start[rows].min() for rows in flows[1:]] + [max_ns], np.int64)
        lo, hi = gathers.positions(after_phase), gathers.positions(after_phase + (next_phase - after_phase) // 2)
        lo = _past_waiting_syncs(traffic, signal_burst, lo, hi, params)
        gathered = hi > lo
        gather_ns[gathered] = gathers.cluster_starts(lo[gathered], hi[gathered])
    # the writes after the phase and before the next traffic (bulk writes are sorted by start)
    write_from = np.searchsorted(traffic.bulk_writes, close, side="right")
    write_to = np.searchsorted(traffic.bulk_writes, np.where(followed, next_ns, until), side="left")
    first_write = np.r_[traffic.bulk_writes, -1][write_from]
    write_delay_ns = np.where(first_write >= 0, first_write - close, -1)
    return (next_ns, first_send_ns, forward_ns, gather_ns, write_to > write_from, write_delay_ns,
            _range_max(traffic.bulk_write_ends, write_from, write_to))


def _past_waiting_syncs(traffic: Traffic, dp_burst: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                        params: TimelineParams) -> np.ndarray:
    """`lo` (positions in the DP rows, in start order; `dp_burst`: the burst of each, as
    `sync_phases` found them) moved past the DP burst it opens where that burst begins as an
    exchange outside the job's hops ends (within `cluster_ns`): the tied embedding's all-reduce,
    after which the first and last stages sync the gradient buckets they held back for it. That
    burst ends the sync; a parameter gather comes after the optimizer."""
    other = traffic.index(OTHER, params).rows
    dp_rows = traffic.index(DP, params).rows
    if not len(other) or not len(dp_rows):
        return lo
    other_ends = np.sort(traffic.end[other])
    opens = np.minimum(lo, len(dp_rows) - 1)
    starts = traffic.start[dp_rows[opens]]
    at = np.clip(np.searchsorted(other_ends, starts), 1, max(len(other_ends) - 1, 1))
    nearest = np.minimum(np.abs(other_ends[np.minimum(at, len(other_ends) - 1)] - starts),
                         np.abs(other_ends[at - 1] - starts))
    waiting = (hi > lo) & (nearest <= params.cluster_ns)
    burst_end = np.searchsorted(dp_burst, dp_burst[opens], side="right")
    return np.where(waiting, np.minimum(burst_end, hi), lo)


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) per range, -1 for an empty one; ranges in order and disjoint, so one
    reduceat pass over `values`."""
    if not len(lo) or not len(values):
        return np.full(len(lo), -1, np.int64)
    maxima = np.maximum.reduceat(np.r_[values, -1], np.stack([lo, hi], axis=1).ravel())[::2]
    return np.where(hi > lo, maxima, -1)


def _turns_misread(turn: np.ndarray, gaps: np.ndarray, turn_threshold_ns: float, alone_threshold_ns: float,
                   params: TimelineParams) -> bool:
    """Whether a pipeline's turns (`_pipeline_turns`) are misread, so that its steps are parted by
    the gaps alone: they are read from the overlap of a link's two directions and of its rails,
    each on its own exporter, and exporters whose clocks are tens of ms apart (drift) shift that
    overlap. Then the gaps that part steps without the turns (`alone_threshold_ns`) and are as
    long as the turns' cut mostly do not turn (`min_turn_share`), where those gaps are longer
    than the turns' cut (they lie inside the steps the turns would make) or the turns part too
    few steps to learn from. A warm-up's long micro-batch gaps do not turn either, but there the
    turns part the steps and the gaps alone cut below them. Only where those gaps are enough to
    learn steps from (`steps_to_learn`, even for a job seen whole: a tail's few gaps are no
    rhythm)."""
    enough = params.steps_to_learn
    long = gaps >= max(turn_threshold_ns, alone_threshold_ns)
    if long.sum() < enough or np.mean(turn[long]) >= params.min_turn_share:
        return False
    return alone_threshold_ns > turn_threshold_ns or np.sum(turn & (gaps >= turn_threshold_ns)) < enough


def _pipeline_turns(traffic: Traffic, rows: np.ndarray, burst: np.ndarray) -> np.ndarray:
    """Per gap between consecutive bursts of the pipeline sends `rows` (burst of each): whether it
    turns from backward to forward sends, as a step gap does. A step opens with warm-up forwards
    before any gradient comes back and closes with cool-down backwards after the last forward; in
    between, both directions of a stage link are in flight together. So a step gap follows lone
    backward sends and precedes lone forward sends, while a slow step's micro-batch gaps (a
    warm-up step's can outlast usual step gaps) do not. A link joins two hosts (where the hosts
    are known): a stage boundary inside a host may send forward and backward through different
    NICs. A direction's lone sends come right before exchanges (warm-up) or right after them
    (cool-down); of a link's two directions, the one with more warm-up-like sends is forward (the
    first backward, before the exchanges, looks like warm-up too). A link without exchanges of its
    own (the first stage's, when there are no more micro-batches than stages) is timed against the
    exchanges of every link. Every gap when no lone sends show a direction."""
    n_gaps = int(burst[-1]) if len(burst) else 0
    direction_of_pair, reverse_of = traffic.host_links()
    none = len(reverse_of) - 1
    direction, start, end = direction_of_pair[traffic.pair[rows]], traffic.start[rows], traffic.end[rows]
    reverse = reverse_of[direction]
    answered = reverse_in_flight(direction, reverse, start, end)
    lead = np.zeros(len(rows))  # > 0 on forward directions
    for link in (np.minimum(direction, reverse), np.zeros_like(direction)):
        score = np.bincount(direction, warm_up_votes(link, start, answered), minlength=none + 1)
        lead = np.where(lead == 0, score[direction] - score[reverse], lead)
    if not np.any(lead):
        return np.ones(n_gaps, bool)
    flows = np.bincount(burst)
    lone_forward = np.bincount(burst, ~answered & (lead > 0)) == flows
    lone_backward = np.bincount(burst, ~answered & (lead < 0)) == flows
    return lone_backward[:-1] & lone_forward[1:]


def _join_partial_phases(first: np.ndarray, nbytes: np.ndarray, start: np.ndarray, end: np.ndarray,
                         params: TimelineParams) -> np.ndarray:
    """Consecutive phases short of a usual phase's bytes join while that brings them closer to
    it: a warm-up step runs slower, and its pauses between micro-batches can look like step gaps.
    A silence longer than a usual step keeps them apart (a failure: the cut phase stays short and
    ends no step)."""
    if len(first) < 2:
        return first
    bounds = np.r_[first, len(nbytes)]
    cumulative = np.r_[0.0, np.cumsum(nbytes)]
    phase_bytes = cumulative[bounds[1:]] - cumulative[bounds[:-1]]
    usual = np.median(phase_bytes)
    phase_end = end[bounds[1:] - 1]
    complete_ends = phase_end[phase_bytes >= params.complete_share * usual]
    # fewer than two complete phases: no usual step, so no silence is known to part them
    step = float(np.median(np.diff(complete_ends))) if len(complete_ends) > 1 else np.inf
    joined, carried = [], np.inf
    for p in range(len(first)):
        short = phase_bytes[p] < params.complete_share * usual
        closer = abs(carried + phase_bytes[p] - usual) < abs(carried - usual)
        if not (short and closer) or start[first[p]] - phase_end[p - 1] > step:
            joined.append(first[p])
            carried = 0.0
        carried += phase_bytes[p]
    return np.array(joined, first.dtype)


def _gathers_after_bucketed_syncs(traffic: Traffic, signal: np.ndarray, heavy_flow: np.ndarray,
                                  flows: list[np.ndarray], nbytes: np.ndarray, params: TimelineParams) -> tuple[np.ndarray, np.ndarray]:
    """Per phase, whether it is the distributed optimizer's parameter all-gather opening a step
    rather than a sync closing one: the gradients were reduce-scattered bucket by bucket under the
    last backward (lighter bursts), moving the phase's bytes on its pairs since the phase before.
    The step that ends then ends where the phase starts. `signal`: the DP rows, `heavy_flow` per
    row whether its burst is heavy. Also, per phase, where those lighter bursts start and end
    (-1 where the phase opens no step)."""
    opens = np.zeros(len(flows), bool)
    extent = np.full((len(flows), 2), -1, np.int64)
    if not len(flows):
        return opens, extent
    light = signal[~heavy_flow]
    light_start = traffic.start[light]
    begins = np.array([traffic.start[rows].min() for rows in flows], np.int64)
    ends = np.array([traffic.end[rows].max() for rows in flows], np.int64)
    lo = np.searchsorted(light_start, np.r_[np.iinfo(np.int64).min, ends[:-1]], side="right")
    hi = np.searchsorted(light_start, begins)
    for p in np.flatnonzero(hi > lo):
        between = light[lo[p] : hi[p]]
        # the reduce-scatter moves the gather's transfer sizes (both the shards of the same
        # buckets); a ZeRO-3 parameter gather after a sync moves the parameters' sizes
        same = np.isin(traffic.pair[between], traffic.pair[flows[p]]) & np.isin(traffic.family[between],
                                                                                 traffic.family[flows[p]])
        opens[p] = abs(traffic.nbytes[between][same].sum() / nbytes[p] - 1.0) <= params.same_shape
        if opens[p]:
            extent[p] = traffic.start[between[same]].min(), traffic.end[between[same]].max()
    return opens, extent


@dataclass
class _Shapes:
    """Per phase, how its last burst compares with the bursts before it (none for a phase of one)."""

    repeated: np.ndarray  # bytes the earlier bursts moved on the last burst's pairs per byte of that burst
    same_flows: np.ndarray  # bool: in as many flows (within `same_shape`)
    every_pair: np.ndarray  # bool: those were all of the earlier bytes (within `same_shape`)
    same_sizes: np.ndarray  # bool: the last burst moves its bytes, all but a `same_shape` share, in size
    # families the earlier bursts moved too
    same_burst: np.ndarray  # bool: it moves the bytes of the burst before it in as many flows per pair
    # (within `same_shape`), on as many pairs or more: one gradient bucket after another, of as many
    # DP groups or more at once
    rest_of_before: np.ndarray  # bool: it moves fewer bytes than the burst before it (by `same_shape` at
    # least): buckets released as the last backward pass ends sync together or apart as the step's
    # timing falls, so one sync's bursts weigh one bucket or several
    same_but_lost: np.ndarray  # bool: its flows' mean size is the earlier bursts' (on its pairs, within
    # `same_shape`), and either holds at least 1 - `lost_share` of the other's flows: the same
    # collective again, one side short of the records a lost export datagram took

    @classmethod
    def none(cls, n_phases: int) -> _Shapes:
        return cls(np.zeros(n_phases), *(np.zeros(n_phases, bool) for _ in range(6)))


def _phase_shapes(traffic: Traffic, signal: np.ndarray, phase: np.ndarray, in_phase: np.ndarray, in_last: np.ndarray,
                  b_bytes: np.ndarray, b_flows: np.ndarray, b_pairs: np.ndarray, candidates: np.ndarray,
                  first: np.ndarray, last: np.ndarray, params: TimelineParams) -> _Shapes:
    """The `_Shapes` of every phase at once, from the signal rows (`phase` of each, `in_last`: in
    its phase's last burst). About repeated 1 with the same flows when the last burst repeats a
    collective on the same pairs bucket for bucket (the all-gather of the updated shards after the
    optimizer, ZeRO-1/2), with every pair when it gathers every stage's shards at once; near 0 when
    pipeline stages sync one after another on their own pairs; a ZeRO-3 parameter gather moves the
    whole shard at once, in fewer flows. Byte sums are of integers, exact in float64."""
    n_phases = len(first)
    several = last > first
    earlier = in_phase & ~in_last
    last_rows, earlier_rows = signal[in_last], signal[earlier]
    last_phase, earlier_phase = phase[in_last], phase[earlier]

    def per_phase(of_phase: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(of_phase, weights, minlength=n_phases)

    # the earlier bursts' flows on a pair of their phase's last burst
    pair_key = combined_key(phase, traffic.pair[signal])
    repeated = np.isin(pair_key[earlier], pair_key[in_last])
    earlier_bytes, last_bytes = traffic.nbytes[earlier_rows], traffic.nbytes[last_rows]
    repeated_bytes = per_phase(earlier_phase, earlier_bytes * repeated)
    share = np.divide(repeated_bytes, per_phase(last_phase, last_bytes), out=np.zeros(n_phases), where=several)
    repeated_flows, last_flows = per_phase(earlier_phase, repeated), per_phase(last_phase)
    flows_ratio = repeated_flows / last_flows
    same_flows = several & (np.abs(flows_ratio - 1.0) <= params.same_shape)
    # a lost datagram takes whole records: the flows left keep their sizes, not their count
    mean_size_ratio = np.divide(share, flows_ratio, out=np.zeros(n_phases), where=flows_ratio > 0)
    kept = np.minimum(repeated_flows, last_flows) / np.maximum(repeated_flows, last_flows)
    same_but_lost = several & (np.abs(mean_size_ratio - 1.0) <= params.same_shape) & (kept >= 1.0 - params.lost_share)
    every_pair = several & (repeated_bytes >= (1.0 - params.same_shape) * per_phase(earlier_phase, earlier_bytes))
    # the last burst's flows in a size family of its phase's earlier bursts
    family_key = combined_key(phase, unique_inverse(traffic.family[signal])[1])
    known = np.isin(family_key[in_last], family_key[earlier])
    same_sizes = several & (per_phase(last_phase, last_bytes * known)
                            >= (1.0 - params.same_shape) * per_phase(last_phase, last_bytes))
    final, before = candidates[last], candidates[np.maximum(last - 1, first)]
    # per pair: the first and last stages' buckets synced at once after the tied embedding's
    # all-reduce move one stage's bucket on each of their pairs (a ZeRO-3 parameter gather runs on
    # the sync's own pairs, in fewer flows)
    def like_before(scale: np.ndarray) -> np.ndarray:
        bytes_ratio = b_bytes[final] / np.maximum(b_bytes[before], 1) / scale
        return ((np.abs(b_flows[final] / b_flows[before] / scale - 1.0) <= params.same_shape)
                & (np.abs(bytes_ratio - 1.0) <= params.same_shape))

    pairs_ratio = b_pairs[final] / np.maximum(b_pairs[before], 1)
    same_burst = several & (like_before(np.ones(n_phases)) | ((pairs_ratio > 1.0) & like_before(pairs_ratio)))
    rest_of_before = several & (b_bytes[final] <= (1.0 - params.same_shape) * b_bytes[before])
    return _Shapes(share, same_flows, every_pair, same_sizes, same_burst, rest_of_before, same_but_lost)


def bursts(start: np.ndarray, end: np.ndarray, params: TimelineParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flows (sorted by start) that overlap or nearly touch form one burst: (burst of each flow,
    burst starts, burst ends)."""
    if not len(start):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    reach = np.maximum.accumulate(end)
    return _opened_bursts(np.r_[True, start[1:] > reach[:-1] + params.merge_ns], start, end)


def _opened_bursts(opens: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flows (sorted by start) in bursts, each opened where `opens`: as `bursts` returns them."""
    first = np.flatnonzero(opens)
    return np.cumsum(opens) - 1, start[first], np.maximum.reduceat(end, first)


def upper_class(weight: np.ndarray, params: TimelineParams) -> np.ndarray:
    """The upper of two classes of `weight` (log scale) by Otsu's split, when the two class means
    are at least log(heavy_separation) apart; otherwise every element."""
    n = len(weight)
    if n < 2:
        return np.ones(n, bool)
    ordered = np.sort(weight)
    below = np.arange(1, n)
    sum_below = np.cumsum(ordered)[:-1]
    mean_below = sum_below / below
    mean_above = (ordered.sum() - sum_below) / (n - below)
    split = int(np.argmax(below * (n - below) * (mean_above - mean_below) ** 2))
    if mean_above[split] - mean_below[split] < np.log(params.heavy_separation):
        return np.ones(n, bool)
    return weight >= ordered[split + 1]
