"""The job's usual timings: learned from this hour's normal steps, else carried from previous hours."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism_core.arrays import MAD_TO_SIGMA
from prism_core.constants import PP
from prism_core.recognition.merge import connected
from prism_core.timeline import boundaries as bounds
from prism_core.timeline.params import TimelineParams
from prism_core.timeline.phases import Phases
from prism_core.timeline.traffic import Traffic


@dataclass
class Typical:
    """The job's usual timings: from this hour's normal steps, else from the previous hours."""

    period_ns: float
    gap_ns: float  # end of a sync phase -> the next step's first traffic
    phase_bytes: float
    phase_flows: float
    fill: int  # forward passes before the first visible pipeline send (stages on one host hide)
    close_to_end_ns: float | None  # end of a sync phase -> end of the step, where a gather or sends mark it
    lead_ns: float | None  # start of a step -> its first traffic
    lead_per_sync: float | None  # the same per ns of the step's sync phase (both scale with jitter)
    sync_ns: float | None  # length of a sync phase
    forward_ns: float | None  # one forward pass between the first pipeline sends of a step
    write_delay_ns: float | None  # longest seen from a sync's end to its checkpoint's first write
    save_tail_ns: float | None  # a save's last write ends -> the next step's start: this, plus
    save_tail_per_span: float | None  # this per ns of its writes' span (a save of more data takes longer to close)
    tail_per_sync: float | None = None  # the optimizer's tail per ns of the closing sync, from the pace (see below)
    gather_opens: bool | None = None  # the gather after the optimizer keeps the next step's pace: it opens it
    tail_per_sync_weight: float | None = None  # inverse variance of `tail_per_sync`, summed over the hours it pools

    @property
    def known(self) -> bool:
        """Whether the usual period and gap are known: steps can be told only then."""
        return bool(np.isfinite(self.period_ns) and np.isfinite(self.gap_ns))

    def close_to_end(self, params: TimelineParams) -> float:
        """End of a sync phase -> end of its step: measured, else learned from the steps' pace,
        else the prior optimizer share."""
        if self.close_to_end_ns is not None:
            return self.close_to_end_ns
        if self.tail_per_sync is not None and self.sync_ns:
            return self.tail_per_sync * self.sync_ns
        return params.optimizer_share * self.period_ns if np.isfinite(self.period_ns) else 0.0

    def tails(self, phases: Phases, params: TimelineParams) -> np.ndarray:
        """End of each sync phase -> end of its step. Where only the pace tells the optimizer's
        tail, it scales with the phase's own sync (step jitter stretches the whole step alike)
        when that is a usual one or the compute before it stretched as much (a heavy-tailed
        step); otherwise (a straggler stretches the sync with waiting) the usual sync's."""
        if self.close_to_end_ns is None and self.tail_per_sync is not None and self.sync_ns:
            sync = (phases.close_ns - phases.start_ns).astype(float)
            pace = sync / self.sync_ns
            compute = np.r_[np.nan, phases.start_ns[1:] - phases.close_ns[:-1]] / self.gap_ns
            tolerance = params.long_gap_share
            alike = (np.abs(pace - 1.0) <= tolerance) | (np.abs(compute / pace - 1.0) <= tolerance)
            return self.tail_per_sync * np.where(alike, sync, self.sync_ns)
        return np.full(len(phases.close_ns), self.close_to_end(params))

    def save_tail(self, span_ns: np.ndarray) -> np.ndarray:
        """A save's last write ends -> the next step's start, for saves whose writes spanned `span_ns`."""
        return (self.save_tail_ns or 0.0) + (self.save_tail_per_span or 0.0) * np.maximum(span_ns, 0)

    def as_baseline(self, gap_threshold_ns: float | None) -> dict:
        return {"period_ns": self.period_ns, "gap_ns": self.gap_ns, "phase_bytes": self.phase_bytes,
                "phase_flows": self.phase_flows,
                "fill": self.fill, "close_to_end_ns": self.close_to_end_ns, "lead_ns": self.lead_ns,
                "lead_per_sync": self.lead_per_sync, "sync_ns": self.sync_ns, "forward_ns": self.forward_ns,
                "write_delay_ns": self.write_delay_ns, "save_tail_ns": self.save_tail_ns,
                "save_tail_per_span": self.save_tail_per_span,
                "tail_per_sync": self.tail_per_sync, "gather_opens": self.gather_opens,
                "tail_per_sync_weight": self.tail_per_sync_weight, "gap_threshold_ns": gap_threshold_ns}


def steps_to_learn(traffic: Traffic, hour_end_ns: int, params: TimelineParams) -> int:
    """How many steps in view the job's timings are learned from: `steps_to_learn`, or
    `steps_to_learn_whole` when the job has been silent for longer than it ran in view (a short
    job that ended: waiting for more steps would leave its steps out for good)."""
    if not len(traffic.start):
        return params.steps_to_learn
    last = int(traffic.end.max())
    whole = hour_end_ns - last > last - int(traffic.start.min())
    return params.steps_to_learn_whole if whole else params.steps_to_learn


def typical(phases: Phases, traffic: Traffic, baseline: dict, learn_from: int, params: TimelineParams) -> Typical:
    """The job's usual timings: each a median over this hour's normal steps when `learn_from` of
    them or more show it, else the baseline's (the previous hours')."""
    def median(values: np.ndarray, name: str) -> float | None:
        return float(np.median(values)) if len(values) >= learn_from else baseline.get(name)

    phase_bytes = median(phases.nbytes, "phase_bytes") or 0.0
    phase_flows = median(phases.nflows, "phase_flows") or 0.0
    complete = bounds.complete(phases, phase_bytes, phase_flows, params)
    period = median(np.diff(phases.close_ns[complete]), "period_ns")
    followed = complete & (phases.next_ns >= 0)
    gap = median((phases.next_ns - phases.close_ns)[followed], "gap_ns")
    usual = Typical(period or np.inf, gap or np.inf, phase_bytes, phase_flows, baseline.get("fill", 1),
                    baseline.get("close_to_end_ns"), baseline.get("lead_ns"), baseline.get("lead_per_sync"),
                    baseline.get("sync_ns"), baseline.get("forward_ns"), baseline.get("write_delay_ns"),
                    baseline.get("save_tail_ns"), baseline.get("save_tail_per_span"), baseline.get("tail_per_sync"),
                    baseline.get("gather_opens"), baseline.get("tail_per_sync_weight"))
    if period is None or gap is None:
        return usual
    usual.forward_ns = median(phases.forward_ns[followed & (phases.forward_ns > 0)], "forward_ns")
    normal = followed & ~bounds.long_gap(phases, usual, params)
    opens = _gather_opens(phases, complete & normal, learn_from, params)
    usual.gather_opens = opens if opens is not None else usual.gather_opens
    sends = normal & (phases.first_send_ns >= 0)
    if sends.sum() >= learn_from:
        # stages sharing a host hide the first sends of a step
        passes = _fill_passes(phases, traffic, params)[sends]
        passes = passes[np.isfinite(passes)]
        if len(passes) >= learn_from:
            usual.fill = max(1, int(np.round(np.median(passes))))
    start = bounds.next_start(phases, usual)
    # the optimizer's tail, wherever the next step's traffic marks its start
    usual.close_to_end_ns = median((start - phases.close_ns)[normal & bounds.marked(phases)], "close_to_end_ns")
    usual.sync_ns = median((phases.close_ns - phases.start_ns)[complete], "sync_ns")
    if usual.close_to_end_ns is None and phases.has_dp:
        paced = _tail_per_sync(phases, complete, normal, learn_from, params)
        if paced is not None:
            usual.tail_per_sync, usual.tail_per_sync_weight = _pooled(
                paced, (usual.tail_per_sync, usual.tail_per_sync_weight))
    next_sync = bounds.next_sync(phases)
    timed = normal & (next_sync > 0)
    lead = phases.next_ns - bounds.boundaries(phases, usual, params)
    usual.lead_ns = median(lead[normal], "lead_ns")
    usual.lead_per_sync = median(lead[timed] / next_sync[timed], "lead_per_sync")
    saving = bounds.checkpoints(phases, usual, params)
    if np.any(saving):
        usual.write_delay_ns = float(max(phases.write_delay_ns[saving].max(), usual.write_delay_ns or 0.0))
    if saving.sum() >= params.saves_to_learn:
        tails = (bounds.saved_until(phases, usual, params) - phases.written_until_ns)[saving]
        usual.save_tail_ns, usual.save_tail_per_span = _save_tail(bounds.write_span(phases)[saving], tails, params)
    return usual


def _save_tail(spans: np.ndarray, tails: np.ndarray, params: TimelineParams) -> tuple[float, float | None]:
    """The saves' tails (last write -> next step) as a line over their writes' spans: closing a
    save (flushing, syncing the ranks) may take the longer the more it wrote, or a fixed time.
    The slope is the median of the slopes between saves whose spans differ by `save_span_spread`
    of the usual span (Theil and Sen: a save followed by a stall is one outlier among them), where
    at least `saves_to_learn` pairs do and it is positive; else the tail is a fixed median. Over
    the hour's last `save_tail_saves` saves: the pairs grow with the square of the saves."""
    spans, tails = spans[-params.save_tail_saves:].astype(float), tails[-params.save_tail_saves:].astype(float)
    first, second = np.triu_indices(len(spans), 1)
    apart = np.abs(spans[second] - spans[first]) >= params.save_span_spread * np.median(spans)
    slope = None
    if apart.sum() >= params.saves_to_learn:
        fitted = float(np.median((tails[second] - tails[first])[apart] / (spans[second] - spans[first])[apart]))
        slope = fitted if fitted > 0 else None
    return float(np.median(tails - (slope or 0.0) * spans)), slope


def _gather_opens(phases: Phases, normal: np.ndarray, learn_from: int, params: TimelineParams) -> bool | None:
    """Whether the all-gather of the updated shards after the optimizer opens the next step
    rather than closing its own: the traffic is the same either way (the distributed optimizer
    with overlap gathers under the next step's first forward, ZeRO-1/2 and the distributed
    optimizer without overlap gather before the step ends; gradient buckets reduce-scattered
    under the last backward make the scatter lighter bursts in both), but a step's jitter
    stretches all of its traffic alike, so the gather keeps the pace of the step it belongs to.
    Its length is compared with its reduce-scatter's before it and the next one's: True where
    its ratio to the next one varies at most `gather_pace_ratio` as much as to its own (robust
    spreads of the log ratios), False for the reverse, None (not told) otherwise or with fewer
    than `learn_from` such pairs of phases."""
    gathers = (phases.after_optimizer | phases.opens_step) & (phases.gather_start_ns >= 0)
    pairs = np.flatnonzero(normal[:-1] & gathers[:-1] & gathers[1:])
    if len(pairs) < learn_from:
        return None
    scatter = (phases.before_gather_ns - phases.scatter_start_ns).astype(float)
    gather = (phases.close_ns - phases.gather_start_ns).astype(float)
    if np.any(scatter[np.r_[pairs, pairs + 1]] <= 0) or np.any(gather[pairs] <= 0):
        return None

    def spread(values: np.ndarray) -> float:
        return float(np.median(np.abs(values - np.median(values))))

    own = spread(np.log(gather[pairs] / scatter[pairs]))
    following = spread(np.log(gather[pairs] / scatter[pairs + 1]))
    if following <= params.gather_pace_ratio * own:
        return True
    if own <= params.gather_pace_ratio * following:
        return False
    return None


def _pooled(fit: tuple[float, float], earlier: tuple[float | None, float | None]) -> tuple[float, float]:
    """An hour's fit (value, inverse variance) pooled with the earlier hours' (inverse-variance
    weighted): each hour's fit alone moves the boundaries from hour to hour by its noise (a
    standard error of 1% of the step is the step's own tolerance), the job's optimizer does not."""
    value, weight = fit
    earlier_value, earlier_weight = earlier
    if earlier_value is None or not earlier_weight:
        return value, weight
    total = weight + earlier_weight
    return (value * weight + earlier_value * earlier_weight) / total, total


def _tail_per_sync(phases: Phases, complete: np.ndarray, normal: np.ndarray, learn_from: int,
                   params: TimelineParams) -> tuple[float, float] | None:
    """The optimizer's tail after a sync, per ns of that sync, and its inverse variance, where
    nothing on the network marks a step's start (a data-parallel job whose only traffic is its
    sync): from the job's pace. A
    step's jitter stretches the whole step, its compute, sync and optimizer alike, so the time
    between two syncs' ends holds the optimizer of the first step at the first sync's pace and
    the compute and sync of the second at the second's: regressed on the two syncs' lengths, the
    period splits into the optimizer's share and the rest. The fit counts only when it explains
    the job's whole period (the premise: each step scales as one; a degradation, slow link or
    straggler that stretches compute or sync alone breaks it, so a fit begun from a stretch of
    the hour at one pace may stand for it) to within `pace_fit_misfit`, pins the share
    to within `pace_fit_error` (standard error) and departs from the prior `optimizer_share` by `pace_fit_confidence`
    standard errors; None otherwise (the prior stands: a fit no surer than it would only move
    the boundaries from hour to hour). Steps after a long gap (a save, a stall) and outliers of
    the fit (beyond `pace_fit_outlier` MADs; it starts from the steps whose syncs last about the
    usual) are left out."""
    pairs = np.flatnonzero(complete[:-1] & complete[1:] & normal[:-1])
    if len(pairs) < max(learn_from, params.pace_fit_steps):
        return None
    sync = (phases.close_ns - phases.start_ns).astype(float)
    before, after = sync[pairs], sync[pairs + 1]
    period = (phases.close_ns[pairs + 1] - phases.close_ns[pairs]).astype(float)
    design = np.c_[np.ones(len(pairs)), before - before.mean(), after - after.mean()]
    # first from the steps at a usual pace (a warm-up stretches the compute, not the optimizer),
    # then from every step the fit explains
    usual = np.median(sync[complete])
    if not usual > 0:  # syncs of instants (a packet sampler's records) have no pace
        return None
    at_pace = (np.abs(before / usual - 1.0) <= params.long_gap_share) & (np.abs(after / usual - 1.0) <= params.long_gap_share)
    # Seeded from the whole hour, then from each of a few stretches of it: a fault that changes
    # the sync's pace alone (a slow link) for part of the hour pulls a fit of the whole hour off
    # every step, so its trim keeps them all about a loose fit, while a fit seeded where the job
    # ran at one pace explains the steps of that pace closely and sets the others aside. A
    # stretch's fit counts if it explains most of the hour's steps (a pace that a part of them
    # keep by chance is no pace of the job's) `pace_fit_tighter` times more closely.
    keep, spread = _trimmed_fit(design, period, at_pace, params.pace_fit_steps, params)
    stretch = np.arange(len(pairs)) * params.pace_fit_stretches // len(pairs)
    for i in range(params.pace_fit_stretches):
        kept, closer = _trimmed_fit(design, period, at_pace & (stretch == i), design.shape[1] + 2, params)
        if (kept is not None and kept.sum() >= params.pace_fit_steps and 2 * kept.sum() > len(pairs)
                and (keep is None or params.pace_fit_tighter * closer < spread)):
            keep, spread = kept, closer
    if keep is None:
        return None
    coef, *_ = np.linalg.lstsq(design[keep], period[keep], rcond=None)
    residual = (period - design @ coef)[keep]
    _, slow_before, slow_after = coef
    if slow_before <= 0 or slow_after <= 0:
        return None
    x_before, x_after, mean_period = before[keep].mean(), after[keep].mean(), period[keep].mean()
    # the syncs' pace explains the whole period: no part of it runs at a pace of its own
    if abs(slow_before * x_before + slow_after * x_after - mean_period) > params.pace_fit_misfit * mean_period:
        return None
    share = slow_before * x_before / mean_period
    # the share's standard error (delta method on the two slopes)
    cov = np.linalg.pinv(design[keep].T @ design[keep])[1:, 1:] * residual.var(ddof=3)
    gradient = np.array([x_before, 0.0]) / mean_period
    error = np.sqrt(gradient @ cov @ gradient)
    if error > params.pace_fit_error or abs(share - params.optimizer_share) < params.pace_fit_confidence * error:
        return None  # too loose to tell, or no clear departure from the prior
    return float(slow_before), float(1.0 / max(cov[0, 0], np.finfo(float).tiny))


def _trimmed_fit(design: np.ndarray, period: np.ndarray, keep: np.ndarray, least: int,
                 params: TimelineParams) -> tuple[np.ndarray | None, float]:
    """The periods a least-squares fit of `period` on `design`, begun from the rows `keep`,
    explains after trimming its outliers three times, and the spread of their residuals (None
    and inf when fewer than `least` rows remain to fit)."""
    for _ in range(3):  # trimmed least squares: stalls add to a period without stretching its syncs
        if keep.sum() < least:
            return None, np.inf
        coef, *_ = np.linalg.lstsq(design[keep], period[keep], rcond=None)
        residual = period - design @ coef
        # about the kept steps' median residual: stalls lengthen a few periods a lot, pulling the
        # fit's mean residual off the bulk of the steps
        center = np.median(residual[keep])
        spread = MAD_TO_SIGMA * np.median(np.abs(residual[keep] - center))
        keep = np.abs(residual - center) <= params.pace_fit_outlier * max(spread, 1.0)
    return keep, spread


def _fill_passes(phases: Phases, traffic: Traffic, params: TimelineParams) -> np.ndarray:
    """Forward passes before each phase's next first pipeline send, unrounded (NaN where the
    pipeline does not show them), from the pipeline's own layout: stages sharing a host hide
    their sends, so the first visible send of a step comes after the forward passes of every
    stage on the first host. Under 1F1B the stage before the first visible link sends one forward
    more than the stages after the link before the first gradient comes back over it (its
    warm-up), one forward pass apart: so the sends up to that reply count the stages after the
    link, which fill the other hosts of the pipeline; with as many stages on every host, the
    first host holds that many over the other hosts' count. Data-parallel replicas each run
    their pipeline over hosts of their own: chains of as many hosts. A step of fewer
    micro-batches than that warm-up sends them all before the reply, and its link falls silent
    after it (no steady forward sends): there the count is short, and the stages parallelism's
    layout puts on the sending host stand in (NaN where it gives none). NaN where the hosts form
    no such chains."""
    pipeline = traffic.index(PP, params)
    link_of_pair, reverse = traffic.host_links()
    ends = traffic.pair_ends()
    links = {tuple(sorted(traffic.host_of.get(addr, addr) for addr in ends[p]))
             for p in np.unique(traffic.pair[pipeline.rows])}
    sent = phases.first_send_ns >= 0
    chain_hosts = _hosts_per_chain(links)
    if chain_hosts is None:
        # not chains of hosts (an interleaved pipeline's last stage sends on to the first): its
        # warm-up runs another way
        return np.full(len(sent), np.nan)
    # the step's first send: no earlier than the phase's end, no later than the leading pairs' sends
    lo = np.maximum(pipeline.positions(phases.close_ns + 1), pipeline.positions(phases.first_send_ns - params.cluster_ns))
    # the step's sends end where the next sync phase begins
    hi = pipeline.positions(np.r_[phases.start_ns[1:], np.iinfo(np.int64).max])
    last_forward, resumed = pipeline.last_before_reply(lo[sent], hi[sent], link_of_pair, reverse)
    replied = last_forward >= 0
    # counted from its own pair's first send of the step: one exporter's clock (the step's first
    # send is the leading pairs' median, on other leaves whose clocks may be a forward pass apart)
    last_forward = np.maximum(last_forward, 0)
    own_first = pipeline.first_of_pair(lo[sent], last_forward)
    after_link = (pipeline.start[last_forward] - pipeline.start[np.minimum(own_first, len(pipeline) - 1)])
    # the stages parallelism's layout puts on each pair's sending host
    stages_of_pair = np.array([traffic.stages_on_host.get(traffic.host_of.get(src), np.nan) for src, _ in ends], float)
    by_layout = stages_of_pair[pipeline.pair[last_forward]]
    passes = np.full(len(sent), np.nan)
    passes[sent] = np.where(replied, np.where(resumed, after_link / phases.forward_ns[sent] / max(chain_hosts - 1, 1),
                                              by_layout), np.nan)
    return passes


def _hosts_per_chain(links: set[tuple]) -> int | None:
    """How many hosts each chain holds, where the host links (pairs of hosts) form disjoint
    chains of as many hosts each; None otherwise (a ring, a branch, chains of unequal length)."""
    if not links:
        return None
    hosts, ends = np.unique([host for link in links for host in link], return_inverse=True)
    ends = ends.reshape(-1, 2)
    chain = connected(ends[:, 0], ends[:, 1], len(hosts))
    sizes = np.bincount(chain)
    # a chain holds one link fewer than its hosts (a ring as many), and no host more than two
    links_of_chain = np.bincount(chain[ends[:, 0]], minlength=len(sizes))
    if np.bincount(ends.ravel()).max() > 2 or np.any(links_of_chain != sizes - 1) or len(np.unique(sizes)) != 1:
        return None
    return int(sizes[0])


def last_step_timings(phases: Phases, traffic: Traffic, params: TimelineParams) -> dict:
    """The usual timings of a job seen whole from its last step alone, when too few steps are in
    view to learn them (and no previous hour knew them): the step closed by the last phase ran
    from the end of the step before it, closed by the phase before (one the view cut into still
    closes its step), so the two phases give its period, the gap before its first traffic, and
    with pipeline sends its first forward passes and the optimizer's tail after the step before's
    last send. That tail (stage 0's last backward pass and the optimizer) is compute: it is scaled
    to the last step's pace by the spacing of each step's last two sends (a jittered step stretches
    its micro-batches alike). Without pipeline sends the tail stays the prior optimizer share of the
    period. A usual phase carries the larger bytes of the two (the view may cut the first, the
    job's end the last). Empty without two phases, the first followed by the next step's traffic,
    or with a checkpoint save between them (the gap would hold the save, not the optimizer's tail)."""
    if len(phases.close_ns) < 2 or phases.next_ns[-2] < 0 or phases.bulk_write[-2]:
        return {}
    before_close, period = int(phases.close_ns[-2]), int(phases.close_ns[-1] - phases.close_ns[-2])
    timings = {"period_ns": period, "gap_ns": int(phases.next_ns[-2]) - before_close,
               "phase_bytes": float(phases.nbytes[-2:].max()), "phase_flows": float(phases.nflows[-2:].max())}
    if phases.first_send_ns[-2] >= 0:
        forward = int(phases.forward_ns[-2])
        passes = _fill_passes(phases, traffic, params)[-2]
        fill = 1 if phases.has_dp or not np.isfinite(passes) else max(1, int(np.round(passes)))
        tail = int(phases.first_send_ns[-2]) - fill * forward - before_close
        spacings = [_last_send_spacing(traffic, phases.flows[p], params) for p in (-2, -1)]
        pace = spacings[1] / spacings[0] if all(spacings) else 1.0
        timings |= {"forward_ns": forward, "fill": fill, "close_to_end_ns": tail * pace}
    return timings


def _last_send_spacing(traffic: Traffic, rows: np.ndarray, params: TimelineParams) -> int | None:
    """Between the starts of the last two sends of `rows` (flows starting within `cluster_ns` of
    each other are one send, across channels and exporters); None with fewer than two."""
    starts = np.sort(traffic.start[rows])
    sends = starts[np.r_[True, np.diff(starts) > params.cluster_ns]]
    return int(sends[-1] - sends[-2]) if len(sends) > 1 else None
