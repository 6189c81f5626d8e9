"""Stragglers (per step, Holmes): peers that wait look normal, the one they wait for is late.

Each DP/PP flow is compared with the same flow (same kind, size family, order) of the hosts of the same
pipeline stage in the same step; a host alone in its stage is compared with its own timing in the
other steps, as a share of the step (a flow whose stage peers' flows were left out is not
compared: its share moves with the job's pace). A pipeline send is late by how far it trails its
stage peers' (the DP replicas of a stage send their micro-batches at the same moments, so a
replica that trails them in every step is the slow one, however long it has been), beyond a
trail within clock skew that it keeps in most steps (the exporter's clock that recorded it); a
DP flow by how much more than usual it trails them (a ring's members start their sends in turn,
the same ones later every step). The host that sends the earliest late flow of a step is that step's
culprit; a host that is the culprit of enough nearby steps is a straggler.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from prism_core import waste
from prism_core.arrays import (
    MAD_TO_SIGMA, KeyGroups, combined_key, group_medians, kth_within_groups, row_medians,
    stable_order, unique_inverse,
)
from prism_core.constants import PP
from prism_core.parallelism import family_codes

from .baseline import Baseline
from .issues import Issue
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams
from .state import OpenWindow
from .windows import Span, Window, excess, find_windows, measure, position, still_open, window_issue

MAX_TABLE_CELLS_PER_FLOW = 4  # a table of positions by structure and step up to this many cells per flow
MAX_PEER_KEYS_PER_FLOW = 2  # a table of the peers' keys up to this many per flow (16 bytes each)


def straggler_steps(job: JobHour, excluded: np.ndarray, params: DiagnosisParams) -> tuple[np.ndarray, np.ndarray]:
    """Per step (but the `excluded` ones and those split across hours): the host that sent the
    earliest late DP/PP flow (-1 when none), and how far behind its peers that host fell (seconds:
    its latest flow's lateness)."""
    culprit = np.full(job.n_steps, -1)
    behind_s = np.zeros(job.n_steps)
    # a sampler's instants fall anywhere inside a transfer: no send's start
    sel = (job.step >= 0) & (job.kind <= PP) & ~job.sampled
    sel &= ~(excluded | job.split)[np.maximum(job.step, 0)]
    if not sel.any():
        return culprit, behind_s
    host = job.host_of_addr[job.src[sel]]
    # a transfer class: kind, size and direction along the pipeline (forward or backward)
    direction = np.sign(job.stage_of_host[job.host_of_addr[job.dst[sel]]] - job.stage_of_host[host]) + 1
    size = family_codes(job.nbytes[sel])  # header bytes make each record's count its own
    kind = combined_key(job.kind[sel], size, direction)
    step, start, pipeline = job.step[sel], job.start[sel], job.kind[sel] == PP
    sender_group = combined_key(step, kind, host)
    # by (step, kind, host, start): flows come in start order, so one stable sort does
    in_start_order = bool(np.all(start[1:] >= start[:-1]))
    order = stable_order(sender_group, scattered=True) if in_start_order else np.lexsort((start, sender_group))
    sender_group = sender_group[order]
    # The n-th flow of a host is compared with the n-th flow of its peers. So a host that sent
    # more flows than usual in a step (a flow across the step boundary) is left out of that step,
    # and classes whose count varies from step to step (MoE all-to-all sizes) are left out
    # altogether. A host a few flows short (records lost on the way) is compared counting from
    # its last flow (`short_flows_share`).
    # a sender's flows lie side by side: their count is their run's length. What a flow's sender
    # is (its step, class, host, stage; short, usual) is worked out per sender, a fraction of the
    # rows, and repeated over its flows: only the flows' starts are gathered in sorted order
    sender_first = np.flatnonzero(np.r_[True, sender_group[1:] != sender_group[:-1]])
    sent = np.diff(np.r_[sender_first, len(sender_group)])
    del sender_group
    first_flow = order[sender_first]
    del sender_first
    sender_step, sender_kind, sender_host, sender_pipeline = (
        a[first_flow] for a in (step, kind, host, pipeline))
    del step, kind, host, pipeline, first_flow
    class_of_sender = KeyGroups(combined_key(sender_kind, sender_host))
    sender_short = _complete_count(class_of_sender, sent, params.complete_count_quantile) - sent
    usual = (sender_short >= 0) & (sender_short <= np.maximum(1, params.short_flows_share * (sent + sender_short)))
    # each class's share of its senders (a host in a step) whose count is usual
    regular = class_of_sender.reduce(usual.astype(float), np.add) / class_of_sender.counts
    kept = usual & (regular >= params.regular_share)[class_of_sender.group]
    # each array is ~8 bytes per flow of a large job: dead ones are dropped at once
    start = start[order[np.repeat(kept, sent)]]
    del order, class_of_sender, usual, regular
    if not len(start):
        return culprit, behind_s
    sent, sender_short, sender_step, sender_kind, sender_host, sender_pipeline = (
        a[kept] for a in (sent, sender_short, sender_step, sender_kind, sender_host, sender_pipeline))
    del kept
    ordinal = np.arange(len(start)) - np.repeat(np.cumsum(sent) - sent, sent)
    sender_stage = job.stage_of_host[sender_host]
    # (step, kind) numbered in order (the senders are sorted by them): a denser key than both,
    # ranked without hashing more often
    step_kind = np.cumsum(np.r_[False, (sender_step[1:] != sender_step[:-1]) | (sender_kind[1:] != sender_kind[:-1])])
    # A host's peers' n-th flows set the reference of its n-th; a host short of flows is compared
    # as if the lost ones came first, and sets references as if they came last. Either way what
    # it sent reads at the same moment or earlier than it was, and the references later: a lost
    # record never makes a flow late.
    in_stage = np.repeat(combined_key(step_kind, sender_stage) * (int(sent.max()) + int(sender_short.max())), sent)
    del step_kind
    step, kind, host, pipeline, stage, short = (np.repeat(a, sent) for a in (
        sender_step, sender_kind, sender_host, sender_pipeline, sender_stage, sender_short))
    del sent, sender_step, sender_kind, sender_host, sender_pipeline, sender_stage, sender_short
    whole = short == 0
    peer_first, peer_hosts = _peers(in_stage + ordinal, start, in_stage + ordinal + short, whole)
    ordinal += short  # from here on, the n-th flow it is compared as
    del in_stage, short
    # against its stage peers in the same step (seconds), or alone against its own rhythm. A
    # flow whose stage peers' flows were left out has no reference in that step: as a share of
    # the step, its own rhythm moves with any change of the job's pace (a degradation), which
    # only a host alone in its stage has to live with.
    alone = np.bincount(job.stage_of_host + 1)[stage + 1] < 2  # hosts in the stage
    compared = alone | (peer_hosts >= 2)
    del peer_hosts, stage
    if not compared.all():  # usually every flow is
        step, kind, start, host, pipeline, ordinal, peer_first, alone, whole = (
            a[compared] for a in (step, kind, start, host, pipeline, ordinal, peer_first, alone, whole))
    del compared
    # hosts alone in their stage are few: their shares are computed for them alone
    position_in_step = start - peer_first
    del peer_first
    position_in_step[alone] = (start[alone] - job.step_start[step[alone]]) / job.duration[step[alone]]
    # median and MAD of each flow's position over the steps where its host sent every flow
    # (robust while a straggler makes up to half of the steps late): a short host's positions
    # read early, and would make a usual one's read late
    usual, noise, seen = _usual_positions(combined_key(kind, host, ordinal), step, job.n_steps, position_in_step, whole)
    del kind, ordinal, whole
    # Stage peers' pipeline sends keep in step: trailing them is late, even in every step (a replica
    # slow since before the hour). But a trail within exporter clock skew is how its exporter's
    # clock sets it, the same in every step: lateness counts from that.
    usual[pipeline & ~alone & (usual > params.clock_trail_max_s)] = 0.0
    excess_s = position_in_step - usual
    late = (excess_s > np.where(alone, params.late_min_share, params.late_min_s))
    late &= (excess_s > params.late_sigmas * noise) & (seen >= params.late_min_samples)
    if not late.any():
        return culprit, behind_s
    late_idx = np.flatnonzero(late)
    earliest = late_idx[np.lexsort((start[late_idx], step[late_idx]))]
    first = np.r_[True, step[earliest][1:] != step[earliest][:-1]]
    chosen = earliest[first]
    culprit[step[chosen]] = host[chosen]
    late_s = np.where(alone, excess_s * job.duration[step], excess_s)
    culprits_flows = late & (host == culprit[step])
    np.maximum.at(behind_s, step[culprits_flows], late_s[culprits_flows])
    return culprit, behind_s


def _peers(key: np.ndarray, start: np.ndarray, compared_as: np.ndarray, whole: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """Per flow: the earliest start of the flows whose `key` is its `compared_as` (a stage's
    n-th flows of a class in a step), and how many those are (0: none, and its earliest start any
    number). Flows `whole` are compared as their own key."""
    span = int(max(key.max(), compared_as.max())) + 1
    if span <= MAX_PEER_KEYS_PER_FLOW * len(key):
        # a table of every key where they are few (a stage's hosts send each n-th flow): no
        # ranking of the keys, no search for a short host's
        earliest = np.full(span, np.inf)
        np.minimum.at(earliest, key, start)
        return earliest[compared_as], np.bincount(key, minlength=span)[compared_as]
    peers = KeyGroups(key)
    at, seen_at = _group_of(peers, compared_as, whole, peers.group[whole])
    return peers.reduce(start, np.minimum)[at], np.where(seen_at, peers.counts[at], 0)


def _complete_count(class_of_sender: KeyGroups, sender_flows: np.ndarray, quantile: float) -> np.ndarray:
    """Per sender (a host's flows of a class in a step, `sender_flows` of them): the count of its
    class a host sends in a step when no record is lost, the `quantile` of its counts over the
    steps. Lost records make the usual count (the mode) short of it; a flow across the step
    boundary, now and then, one more."""
    of_class, by_class = class_of_sender.group, class_of_sender.order
    n = class_of_sender.counts  # every class sends in some step
    kth = np.floor(quantile * (n - 1)).astype(np.int64)
    return kth_within_groups(of_class[by_class], sender_flows[by_class], kth)[of_class]


def _usual_positions(structure: np.ndarray, step: np.ndarray, n_steps: int, position: np.ndarray, whole: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per flow: the median and robust sigma (MAD) of the positions of its `structure` (the same
    flow of a host over the steps: one flow of a step each) where `whole`, and how many steps
    those are (0: none)."""
    n = len(structure)
    if not whole.any():
        return np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
    structures, of = unique_inverse(structure)
    if len(structures) * n_steps > MAX_TABLE_CELLS_PER_FLOW * n:
        return _usual_positions_sorted(structure, position, whole)
    # A table of each structure's positions by step (NaN where it has none), its rows sorted where
    # they lie: the flows are placed once, not sorted by structure and gathered (~40% less). Most
    # structures show in every step: the table is about as large as the flows.
    placed = slice(None) if whole.all() else whole  # usually every flow is whole: then no copies
    seen = np.bincount(of[placed], minlength=len(structures))
    cell = of * n_steps
    cell += step
    table = np.full(len(structures) * n_steps, np.nan)
    table[cell[placed]] = position[placed]
    del cell
    table = table.reshape(len(structures), n_steps)
    median = row_medians(table, seen)
    table -= median[:, None]  # sorted or not, the same deviations
    np.abs(table, out=table)
    noise = MAD_TO_SIGMA * row_medians(table, seen)
    return median[of], noise[of], seen[of]


def _usual_positions_sorted(structure: np.ndarray, position: np.ndarray, whole: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_usual_positions` for structures that show in few of the steps: by group medians."""
    of_whole = KeyGroups(structure[whole])
    median = group_medians(of_whole, position[whole])
    noise = MAD_TO_SIGMA * group_medians(of_whole, np.abs(position[whole] - median[of_whole.group]))
    at, seen_at = _group_of(of_whole, structure, whole, of_whole.group)
    return median[at], noise[at], np.where(seen_at, of_whole.counts[at], 0)


def _group_of(groups: KeyGroups, keys: np.ndarray, known: np.ndarray, known_group: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per key: the index of its group among `groups` (any index where it has none) and whether
    it has one. The `known` keys' groups are `known_group` (keys the groups were made of): only
    the others are searched for (a search per flow of a large job was ~15 ms)."""
    at = np.empty(len(keys), np.int64)
    at[known] = known_group
    unknown = np.flatnonzero(~known)
    at[unknown] = np.minimum(np.searchsorted(groups.distinct, keys[unknown]), len(groups.distinct) - 1)
    seen_at = known.copy()
    seen_at[unknown] = groups.distinct[at[unknown]] == keys[unknown]
    return at, seen_at


def straggler_windows(job: JobHour, excluded: np.ndarray, previous: OpenWindow | None,
                      params: DiagnosisParams, link_hosts: set[int] = frozenset()) -> list[Window]:
    """The stragglers' windows, from the steps not `excluded` (slow links make their receivers
    late too), each `contested` where another host's shares steps with it or its host holds an
    end of a slow link of the hour (`link_hosts`: a slow NIC makes its own host's sends late, in
    the steps its link's windows leave out)."""
    culprit, behind_s = straggler_steps(job, excluded, params)
    carried = position(job.hosts, previous.name) if previous else -1
    windows = find_windows(job, culprit, behind_s, carried, params)
    return [replace(window, contested=window.code in link_hosts or any(
        other.code != window.code and other.run[0] <= window.run[-1] and window.run[0] <= other.run[-1]
        for other in windows)) for window in windows]


def slowing_windows(job: JobHour, windows: list[Window], previous: OpenWindow | None, masks: StepMasks,
                    slow: np.ndarray, fit: Baseline, params: DiagnosisParams) -> list[Window]:
    """The `windows` whose straggler slowed the steps; in the others a host was late, but nobody
    waited for it long enough to slow them."""
    kept = []
    for window in windows:
        span = measure(job, window, str(job.hosts[window.code]), previous, masks, slow, fit)
        if _slowed(span, _cost(job, window, span, fit)[1], fit, params):
            kept.append(window)
    return kept


def straggler_issues(job: JobHour, windows: list[Window], previous: OpenWindow | None, masks: StepMasks,
                     slow: np.ndarray, fit: Baseline, params: DiagnosisParams
                     ) -> tuple[list[Issue], OpenWindow | None]:
    """An issue per straggler window that slowed the steps and is not `contested`, and the window
    still open at the hour's end. A straggler is the one host the others wait for: where hosts
    take turns being the latest over the same steps, something they share makes them late (a slow
    link of their ring, a slow stage upstream). Their steps stay out of the baseline and the slow
    steps all the same: someone was late in them."""
    issues, open_window = [], None
    for window in windows:
        if window.contested:
            continue
        name = str(job.hosts[window.code])
        span = measure(job, window, name, previous, masks, slow, fit)
        cost, share = _cost(job, window, span, fit)
        if not _slowed(span, share, fit, params):
            continue
        evidence = {"late_steps": len(window.run), "window_steps": len(window.steps),
                    "median_behind_s": float(np.median(window.scores)),
                    "alone_in_stage": bool(np.sum(job.stage_of_host == job.stage_of_host[window.code]) < 2)}
        issues.append(window_issue(job, "straggler", name, window, span, share=share,
                                   margin=len(window.run) / params.window_min_steps, cost=cost, evidence=evidence,
                                   params=params))
        if still_open(job, window, params):
            open_window = OpenWindow(name=name, start_ns=span.start_ns, baseline_s=span.base, sync_baseline_s=None)
    return issues, open_window


def _cost(job: JobHour, window: Window, span: Span, fit: Baseline) -> tuple[float, float]:
    """A straggler's cost (GPU-seconds) and its share of the step: the whole steps' excess over the
    job's pace; when the job shows fewer steps without it than with it (a straggler from the job's
    start, so its pace is the straggler's), how far behind its peers it fell, which they waited for."""
    if fit.clean_steps >= len(window.steps):
        return excess(window, span, job.duration, span.measured, span.baseline)
    run = window.run
    cost = waste.window_excess_gpu_s(job.duration[run], job.duration[run] - window.scores, len(window.steps),
                                     span.n_gpus)
    return cost, float(np.median(window.scores / job.duration[run]))


def _slowed(span: Span, share: float, fit: Baseline, params: DiagnosisParams) -> bool:
    """Whether a window's straggler slowed the steps by more than their noise (or continues one
    that did)."""
    noticeable = params.straggler_min_sigmas * fit.sigma / np.sqrt(max(len(span.measured), 1))
    return span.continued or share > noticeable

