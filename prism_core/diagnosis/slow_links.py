"""Slow links (per step): a NIC whose fastest transfer is far below the transfers of the same size
elsewhere in the job. An address that talks to one peer only (a tree collective's leaf) is slow
through that peer when the peer is as slow with others too; two addresses as slow as each other
make their link the culprit. A slow link's cost is measured where it shows: in the DP
synchronization when it carries gradients, in the 1F1B schedule replayed from the transfers
when it carries pipeline activations, else in the whole step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from prism_core import waste
from prism_core.arrays import (
    KeyGroups, combined_key, group_median, group_medians, group_mode, group_reduce, time_segments,
)
from prism_core.constants import DP, PP, UNCLASSIFIED
from prism_core.parallelism import family_codes
from prism_core.resolution import timed_sizes

from .baseline import Baseline
from .issues import Issue
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams
from .state import OpenWindow
from .windows import Window, excess, find_windows, measure, position, still_open, window_issue


@dataclass(frozen=True, eq=False)
class LinkSteps:
    """Per step, the slowest address or link; per measured flow, its throughput ratio."""

    culprit: np.ndarray  # address code, link code n + a * n + b, or -1 when none is below slow_link_ratio
    score: np.ndarray  # the culprit's throughput ratio (1 when none)
    flow_step: np.ndarray
    flow_src: np.ndarray
    flow_dst: np.ndarray
    flow_ratio: np.ndarray  # throughput over the median of same-size transfers in the step


def slow_link_steps(job: JobHour, excluded: np.ndarray, params: DiagnosisParams) -> LinkSteps:
    """Per step (but the `excluded` ones and those split across hours): the address whose fastest
    transfer is slowest against transfers of the same size in the same step, when below
    `slow_link_ratio`. When the two slowest addresses are as slow as each other, their link is the
    culprit (two hosts talking only to each other cannot tell which end is slow). When the slowest
    address talked to one peer only and that peer was as slow with another address, the peer is
    the culprit. Where a whole collective is as slow (a ring or tree throttled by one slow NIC: its
    transfers all move at that NIC's pace), the transfers too short for their exporter's clock,
    measured together (`_measured_together`), tell which address sets the pace."""
    timed, together = _throughputs(job, excluded, params)
    link_steps = _slowest(job, *timed, params)
    crowded = link_steps.culprit == collective_code(len(job.addrs))
    if crowded[together[0]].any():
        # every step measured (the usual throughput of each size), the crowded ones named
        told = _slowest(job, *(np.r_[one, other] for one, other in zip(timed, together)), params)
        named = crowded & (told.culprit >= 0)
        culprit, score = link_steps.culprit.copy(), link_steps.score.copy()
        culprit[named], score[named] = told.culprit[named], told.score[named]
        kept, shown = ~crowded[link_steps.flow_step], crowded[told.flow_step]
        link_steps = LinkSteps(culprit, score, *(np.r_[getattr(link_steps, name)[kept], getattr(told, name)[shown]]
                                                 for name in ("flow_step", "flow_src", "flow_dst", "flow_ratio")))
    return link_steps


def _slowest(job: JobHour, step: np.ndarray, src: np.ndarray, dst: np.ndarray, size: np.ndarray,
             rate: np.ndarray, params: DiagnosisParams) -> LinkSteps:
    """`slow_link_steps` from the throughputs of (step, src, dst, size family) measurements."""
    culprit = np.full(job.n_steps, -1)
    score = np.ones(job.n_steps)
    ratio = rate / _usual_rate(step, size, rate)
    flows = (step, src, dst, ratio)
    if not len(step):
        return LinkSteps(culprit, score, *flows)
    # every flow speaks for both its ends: an address is as fast as its fastest transfer. One cell
    # per (step, address), its step and address read off its key, reduced over the cell without
    # broadcasting back to the flows: in a table of every cell where they are fewer than the flows
    # (a step's address sends hundreds), each end's values reduced into it as they are (~2x
    # faster than concatenating both ends' and ranking their cells); else over the cells' groups
    n = len(job.addrs)
    src_cell, dst_cell = step * n + src, step * n + dst
    if job.n_steps * n <= len(step):
        seen = np.zeros(job.n_steps * n, bool)
        seen[src_cell] = seen[dst_cell] = True
        cell = np.flatnonzero(seen)

        def over_ends(at_src: np.ndarray, at_dst: np.ndarray, ufunc: np.ufunc, neutral) -> np.ndarray:
            table = np.full(len(seen), neutral, at_src.dtype)
            ufunc.at(table, src_cell, at_src)
            ufunc.at(table, dst_cell, at_dst)
            return table[cell]
    else:
        ends = KeyGroups(np.concatenate([src_cell, dst_cell]))
        cell = ends.distinct

        def over_ends(at_src: np.ndarray, at_dst: np.ndarray, ufunc: np.ufunc, neutral) -> np.ndarray:
            return ends.reduce(np.concatenate([at_src, at_dst]), ufunc)
    capacity = over_ends(ratio, ratio, np.maximum, -np.inf)
    fewest_peer = over_ends(dst, src, np.minimum, n)
    sole_peer = np.where(fewest_peer == over_ends(dst, src, np.maximum, -1), fewest_peer, -1)
    flow_step, (step, addr) = step, np.divmod(cell, n)
    del src_cell, dst_cell, cell
    order = np.lexsort((addr, capacity, step))
    first = np.r_[True, step[order][1:] != step[order][:-1]]
    lowest = order[first]
    pace = capacity[lowest] * (1 + params.link_tie)
    second, third = (_next_in_step(order, first, k) for k in (1, 2))
    score[step[lowest]] = capacity[lowest]
    runner_up = np.maximum(second, 0)
    tied = (second >= 0) & (capacity[runner_up] < pace)
    # a third address as slow: the whole collective moves at one pace and the records cannot
    # tell which of its links sets it (a tree or ring throttled by one slow NIC drains its other
    # links a little sooner, finer than a millisecond clock shows): its culprit is the collective,
    # unless one address is the common end of the slow links (below)
    crowded = tied & (third >= 0) & (capacity[np.maximum(third, 0)] < pace)
    a, b = np.sort(np.stack([addr[lowest], addr[runner_up]]), axis=0)
    code = np.where(tied, n + a * n + b, addr[lowest])
    # An address that exchanged all its transfers with one peer was slow through that link
    # only; when the peer was as slow with another address too, the peer is the slow NIC (a
    # tree collective's leaf talks to its parent alone).
    peer = sole_peer[lowest]
    of_step = np.full(job.n_steps, -1)
    of_step[step[lowest]] = np.arange(len(lowest))
    of = of_step[flow_step]  # each flow's step's lowest address
    peer_of, lowest_of = peer[of], addr[lowest][of]
    slow_elsewhere = (((src == peer_of) & (dst != lowest_of)) | ((dst == peer_of) & (src != lowest_of)))
    slow_elsewhere &= ratio <= pace[of]
    through_peer = np.bincount(of[slow_elsewhere], minlength=len(lowest)) > 0
    code = np.where(through_peer, peer, np.where(crowded, collective_code(n), code))
    slow = capacity[lowest] < params.slow_link_ratio
    culprit[step[lowest][slow]] = code[slow]
    return LinkSteps(culprit, score, *flows)


def _throughputs(job: JobHour, excluded: np.ndarray, params: DiagnosisParams) -> tuple[tuple, tuple]:
    """The throughputs measured in the steps (but the `excluded` ones and those split across
    hours), each as (step, src, dst, size family, bytes per second): of the records their
    exporter's clock times, one by one; and of the others, `_measured_together`."""
    seconds = job.end - job.start
    sel = (job.step >= 0) & (job.kind != UNCLASSIFIED) & (job.nbytes >= params.throughput_min_bytes)
    sel &= ~(excluded | job.split)[np.maximum(job.step, 0)]
    alone = sel & (seconds > 0)
    alone[alone] = timed_sizes(job.nbytes[alone], seconds[alone], job.shortest_timed[alone])
    rest = np.flatnonzero(sel & ~alone & np.isfinite(job.shortest_timed))
    alone = np.flatnonzero(alone)
    family = family_codes(job.nbytes[alone])  # header bytes make each record's count its own
    rate = job.nbytes[alone] / seconds[alone]
    timed = (job.step[alone], job.src[alone], job.dst[alone], family, rate)
    rest = rest[~timed_sizes(job.nbytes[rest], seconds[rest], job.shortest_timed[rest])]
    # the timed sizes' usual throughputs only judge the others' pace: none, none worked out (a
    # fine clock times every size; ~20 ms a large job)
    fastest = float(np.max(group_medians(family, rate), initial=0.0)) if len(rest) else 0.0
    apart = family_codes(job.nbytes[rest]) + len(alone)  # size codes of their own, past the timed ones'
    return timed, _measured_together(job, rest, apart, seconds, fastest, params)


def _measured_together(job: JobHour, rows: np.ndarray, family: np.ndarray, seconds: np.ndarray, fastest: float,
                       params: DiagnosisParams) -> tuple:
    """Throughputs of records too short for their exporter's clock (`rows`, of size `family`; a
    millisecond clock rounds a transfer of a few hundred microseconds to nothing or a tick): per
    step, link and size, their bytes over their summed lengths, the zero-length ones included (a
    clock that truncates start and end puts each record up to a tick off either way: a sum is off
    by far less than its parts). Only sizes that move at about the job's pace (`pace_share` of its
    fastest size's usual throughput, `fastest` among the timed ones): a short send that mostly
    waits, on its receiver or on latency, lasts what it waits, not what its link takes. A few
    records' sum is still a few ticks: these tell a slow NIC from the other links of a collective
    it throttles (whose own transfers all drain at its pace), not a step's slow link by themselves."""
    nbytes = job.nbytes[rows].astype(float)
    in_family = KeyGroups(family)
    pace = in_family.reduce(nbytes, np.add) / np.maximum(in_family.reduce(seconds[rows], np.add), 1e-12)
    moving = pace[in_family.group] >= params.pace_share * max(fastest, float(np.max(pace, initial=0.0)))
    rows, family, nbytes = rows[moving], family[moving], nbytes[moving]
    cells = KeyGroups(combined_key(job.step[rows], job.src[rows], job.dst[rows], family))
    summed = cells.reduce(seconds[rows], np.add)
    lasting = summed > 0
    first = cells.first_rows()[lasting]
    return (job.step[rows][first], job.src[rows][first], job.dst[rows][first], family[first],
            cells.reduce(nbytes, np.add)[lasting] / summed[lasting])


def _next_in_step(order: np.ndarray, first: np.ndarray, k: int) -> np.ndarray:
    """Per step (its rows of `order` begin where `first`): the row `k` places after its first,
    -1 where the step has fewer."""
    starts = np.flatnonzero(first)
    at = starts + k
    return np.where(at < np.r_[starts[1:], len(order)], order[np.minimum(at, len(order) - 1)], -1)


def _usual_rate(step: np.ndarray, size: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Per transfer, the throughput it is measured against: the median of the same size's
    transfers in its step, or the job's usual one for that size (the median over its steps of
    theirs) when that is higher. A ring moves each chunk only when the one before it has
    arrived, so a slow NIC in a ring slows every link of the ring alike and its step's own
    median is as slow as the culprit; the job's other steps still show the usual rate."""
    if not len(rate):
        return rate
    step_size = KeyGroups(combined_key(step, size))  # hashed once for the medians and the first rows
    in_step = group_medians(step_size, rate)
    size_of = size[step_size.first_rows()]  # read off the medians' order of the rows
    over_steps = np.zeros(int(size.max()) + 1)
    over_steps[size_of] = group_median(size_of, in_step)
    return np.maximum(in_step, over_steps[size_of])[step_size.group]


def collective_code(n_addrs: int) -> int:
    """The culprit code of steps whose collective is slow on links it cannot tell apart (one past
    every address and link code)."""
    return n_addrs + n_addrs * n_addrs


def link_windows(job: JobHour, link_steps: LinkSteps, previous: OpenWindow | None,
                 params: DiagnosisParams) -> list[Window]:
    """Windows of steps sharing a slow address or link; those of a slow collective whose link is
    not told are `contested`: no issue names a link for them, but their steps are the slow
    link's, not the job's pace (no degradation, no slow step, no straggler)."""
    carried = link_code(job, previous.name) if previous else -1
    collective = collective_code(len(job.addrs))
    return [replace(window, contested=window.code == collective)
            for window in find_windows(job, link_steps.culprit, link_steps.score, carried, params)]


def link_issues(job: JobHour, windows: list[Window], previous: OpenWindow | None, masks: StepMasks,
                slow: np.ndarray, fit: Baseline, link_steps: LinkSteps, params: DiagnosisParams
                ) -> tuple[list[Issue], OpenWindow | None]:
    """An issue per slow-link window (but `contested` ones), and the window still open at the
    hour's end. A slow link in the gradient collective stretches the DP synchronization, not the
    compute: its cost is measured there, clear of the compute's jitter, which is ten times
    larger. A link carrying pipeline activations only delays transfers by milliseconds, far below
    the step's jitter: its cost is the delay those transfers add to the 1F1B schedule
    (`pipeline_delay`). Otherwise the whole step is measured."""
    issues, open_window = [], None
    for window in (window for window in windows if not window.contested):
        name = link_name(job, window.code)
        span = measure(job, window, name, previous, masks, slow, fit)
        usual_sync = previous.sync_baseline_s if span.continued else fit.usual_sync
        carries_dp = _carries_dp(job, window.code, window.steps)
        pipeline = None
        if carries_dp and usual_sync is not None:
            cost, share = excess(window, span, job.sync_s, span.measured[np.isfinite(job.sync_s[span.measured])],
                                 usual_sync)
        else:
            usual_sync = None
            pipeline = None if carries_dp else pipeline_delay(job, window.code, window.steps, params)
            if pipeline is None:
                cost, share = excess(window, span, job.duration, span.measured, span.baseline)
            else:
                delay = pipeline.pop("delay_s")
                cost = waste.window_excess_gpu_s(delay, 0.0, len(window.steps), span.n_gpus)
                share = float(np.mean(delay)) / span.base if np.isfinite(span.base) and span.base > 0 else 0.0
        subject, detail = _link_subject(job, window.code, window.steps, link_steps, params)
        ratio = float(np.median(window.scores))
        evidence = {"slow_steps": len(window.run), "window_steps": len(window.steps), "throughput_ratio": ratio,
                    **detail, **({"pipeline": pipeline} if pipeline is not None else {})}
        issues.append(window_issue(job, "slow_link", subject, window, span, share=share,
                                   margin=params.slow_link_ratio / max(ratio, 1e-3), cost=cost, evidence=evidence,
                                   params=params))
        if still_open(job, window, params):
            open_window = OpenWindow(name=name, start_ns=span.start_ns, baseline_s=span.base,
                                     sync_baseline_s=usual_sync)
    return issues, open_window


def link_name(job: JobHour, code: int) -> str:
    """An address, or a link "a->b"."""
    n = len(job.addrs)
    if code < n:
        return str(job.addrs[code])
    a, b = divmod(code - n, n)
    return f"{job.addrs[a]}->{job.addrs[b]}"


def link_code(job: JobHour, name: str) -> int:
    """The code of a subject named in an earlier hour (-1 when it is not in this hour's job)."""
    if "->" not in name:
        return position(job.addrs, name)
    a, b = (position(job.addrs, end) for end in name.split("->"))
    n = len(job.addrs)
    return n + a * n + b if min(a, b) >= 0 else -1


def link_hosts(job: JobHour, windows: list[Window]) -> set[int]:
    """The hosts holding an end of the windows' slow addresses or links."""
    return {int(job.host_of_addr[end]) for window in windows if not window.contested
            for end in _ends(job, window.code)}


def _ends(job: JobHour, code: int) -> list[int]:
    """The addresses of a slow-link subject: itself, or a link's two ends."""
    n = len(job.addrs)
    return [code] if code < n else list(divmod(code - n, n))


def _carries_dp(job: JobHour, code: int, steps: np.ndarray) -> bool:
    """Does the slow-link subject `code` carry DP traffic in `steps`?"""
    ends = _ends(job, code)
    mine = np.isin(job.step, steps) & (np.isin(job.src, ends) | np.isin(job.dst, ends))
    return bool((job.kind[mine] == DP).any())


def _link_subject(job: JobHour, code: int, steps: np.ndarray, link_steps: LinkSteps,
                  params: DiagnosisParams) -> tuple[str, dict]:
    """A NIC when all its transfers are slow, else the one slow directed link it carries."""
    name = link_name(job, code)
    if code >= len(job.addrs):
        return name, {"ends_indistinguishable": True}
    src, dst = link_steps.flow_src, link_steps.flow_dst
    mine = np.isin(link_steps.flow_step, steps) & ((src == code) | (dst == code))
    pair = combined_key(src[mine], dst[mine])
    first = np.unique(pair, return_index=True)[1]
    pair_ratio = group_reduce(pair, link_steps.flow_ratio[mine], np.maximum)[first]  # its fastest transfer
    slow_pairs = pair_ratio < params.slow_link_ratio
    detail = {"slow_pairs": int(slow_pairs.sum()), "pairs": len(first)}
    if slow_pairs.sum() == 1 and len(first) > 2:
        i = first[np.flatnonzero(slow_pairs)[0]]
        return f"{job.addrs[src[mine][i]]}->{job.addrs[dst[mine][i]]}", detail
    return name, detail


def pipeline_delay(job: JobHour, code: int, steps: np.ndarray, params: DiagnosisParams) -> dict | None:
    """How much the slow-link subject `code` delayed each measured step of `steps` through the
    pipeline: the step's 1F1B schedule replayed twice from its observed PP transfers, once as
    they were and once with the subject's transfers taking what their peers of the same size
    took in the same step. None when the subject carries no pipeline transfer or the job's
    stages are unknown.

    A transfer is the flows (one per NCCL channel) of one size a pair of addresses sent
    together, within launch skew (`transfer_gap_s`). The activations are the transfers a pair
    repeats m times a step (m micro-batches); a step is measured when every activation pair
    moved its m transfers in it. A transfer goes forward when it climbs the
    stages of the hosts; it crosses hop s (stage s to s + 1), in the replica of the receiving
    GPU (rail-aligned sends arrive at the receiver's own NIC). A hop moves when all its tensor-
    parallel ranks have: its time is the longest of theirs; hops inside a host (NVLink) leave
    no record and take no time. The stages' compute comes from the same transfers: the first
    two forwards a stage sends go back to back (forward time f), and micro-batch 0's round trip
    from hop s to the last stage and back is (pp - 1 - s) x (f + b) plus the transfers between.
    """
    ends = _ends(job, code)
    known = job.stage_of_addr >= 0
    pp = int(job.stage_of_addr.max(initial=-1)) + 1
    dp = max(int(job.replica_of_addr.max(initial=-1)) + 1, 1)
    if pp < 2 or not known.all():
        return None
    usable = np.zeros(job.n_steps, bool)
    usable[steps] = True
    usable &= ~job.split
    idx = np.flatnonzero((job.kind == PP) & (job.step >= 0) & usable[np.maximum(job.step, 0)])
    if not len(idx):
        return None
    # transfers: flows of one pair and size within launch skew of each other
    size = family_codes(job.nbytes[idx])
    pair_step = combined_key(job.step[idx], job.src[idx], job.dst[idx], size)
    order = np.lexsort((job.start[idx], pair_step))
    idx, pair_step, size = idx[order], pair_step[order], size[order]
    start, end = job.start[idx], job.end[idx]
    first_of_pair = np.r_[True, pair_step[1:] != pair_step[:-1]]
    flow_transfer, _, t_start, t_end = time_segments(pair_step, start, end, params.transfer_gap_s)
    heads = np.flatnonzero(np.r_[True, flow_transfer[1:] != flow_transfer[:-1]])
    t_seconds = group_median(flow_transfer, end - start)[heads]
    step, src, dst, size = job.step[idx][heads], job.src[idx][heads], job.dst[idx][heads], size[heads]
    pair_head = np.flatnonzero(first_of_pair[heads])
    per_pair = np.diff(np.r_[pair_head, len(heads)])
    ordinal = np.arange(len(heads)) - np.repeat(pair_head, per_pair)
    count = np.repeat(per_pair, per_pair)
    # the activations: the transfer class (pair, size) that repeats m times a step, m the count
    # that holds the most transfers (an embedding or other once-a-step tensor sent on a
    # pipeline pair is left out)
    values, counts = np.unique(per_pair, return_counts=True)
    m = int(values[np.argmax(values * counts)])
    transfer_class = combined_key(src, dst, size)
    activation = group_mode(transfer_class, count) == m
    # place each transfer in its replica's pipeline
    host_stage = job.stage_of_host[job.host_of_addr]
    forward = host_stage[src] < host_stage[dst]
    hop = job.stage_of_addr[dst] - forward
    replica = job.replica_of_addr[dst]
    placed = (host_stage[src] != host_stage[dst]) & (hop >= 0) & (hop < pp - 1) & (replica >= 0)
    # a step is measured when every activation class moved its m transfers
    complete = group_reduce(step, (~activation | (count == m)).astype(np.int64), np.minimum) == 1
    keep = placed & activation & complete
    slowed = np.isin(src, ends) | np.isin(dst, ends)
    if not (keep & slowed).any():
        return None
    # what the subject's transfers would have taken: their peers' time for the same size
    peers = keep & ~slowed
    if not peers.any():
        return None
    in_step = combined_key(step, size)
    peer_keys, first_of_key = np.unique(in_step[peers], return_index=True)
    peer_seconds = group_median(in_step[peers], t_seconds[peers])[first_of_key]
    at = np.clip(np.searchsorted(peer_keys, in_step), 0, len(peer_keys) - 1)
    same = peer_keys[at] == in_step
    overall = np.full(size.max() + 1, np.nan)  # per size over all steps, where peers sent it
    overall[size[peers]] = group_median(size[peers], t_seconds[peers])
    usual_seconds = np.where(same, peer_seconds[at], overall[size])
    usual_seconds = np.where(slowed, usual_seconds, t_seconds)
    keep &= np.isfinite(usual_seconds)
    measured = np.unique(step[keep])
    if not len(measured):
        return None
    row = np.searchsorted(measured, step[keep])
    where = (row, replica[keep], hop[keep], (~forward[keep]).astype(int), ordinal[keep])
    shape = (len(measured), dp, pp - 1, 2, m)
    comm, usual = np.zeros(shape), np.zeros(shape)
    np.maximum.at(comm, where, t_seconds[keep])
    np.maximum.at(usual, where, usual_seconds[keep])
    fwd_s, bwd_s = _stage_compute(shape, where, t_start[keep], t_end[keep], comm, params.backward_per_forward)
    if fwd_s is None:
        return None
    fwd = np.broadcast_to(fwd_s[:, None, None], (len(measured), dp, pp))
    bwd = np.broadcast_to(bwd_s[:, None, None], (len(measured), dp, pp))
    delay = waste.pipeline_delay_s(fwd, bwd, comm[..., 0, :], comm[..., 1, :], usual[..., 0, :], usual[..., 1, :])
    return {"delay_s": delay, "measured_steps": len(measured), "stages": pp, "replicas": dp,
            "micro_batches": m, "forward_s": float(np.median(fwd_s)), "backward_s": float(np.median(bwd_s)),
            "slow_transfers_per_step": float(np.sum(keep & slowed) / len(measured)),
            "transfer_delay_s": float(np.median((t_seconds - usual_seconds)[keep & slowed])),
            "step_delay_s": float(np.mean(delay))}


def _stage_compute(shape: tuple, where: tuple, t_start: np.ndarray, t_end: np.ndarray, comm: np.ndarray,
                   backward_per_forward: float) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per measured step, a stage's forward and backward time per micro-batch, from its
    transfers (see `pipeline_delay`): medians over the replicas and hops that show them, the
    window's median for a step that shows none. Backward is taken as `backward_per_forward` x
    the forward when the transfers cannot tell them apart (a single micro-batch)."""
    steps, dp, hops, _, m = shape
    sent = np.full(shape, np.nan)
    arrived = np.full(shape, -np.inf)
    # a hop's tensor-parallel ranks send together (launch skew aside) and the receiving stage
    # goes on when the last one has arrived
    flat = np.ravel_multi_index(where, shape)
    cell, first = np.unique(flat, return_index=True)
    sent.flat[cell] = group_median(flat, t_start)[first]
    np.maximum.at(arrived, where, t_end)
    arrived[~np.isfinite(arrived)] = np.nan
    pp = hops + 1
    hop = np.arange(hops)
    forward = sent[:, :, :, 0, 1] - sent[:, :, :, 0, 0] if m >= 2 else np.full((steps, dp, hops), np.nan)
    between = np.cumsum((comm[:, :, ::-1, 0, 0] + comm[:, :, ::-1, 1, 0]), axis=2)[:, :, ::-1]
    between = np.concatenate([between[:, :, 1:], np.zeros((steps, dp, 1))], axis=2)  # hops after s
    round_trip = (sent[:, :, :, 1, 0] - arrived[:, :, :, 0, 0] - between) / (pp - 1 - hop)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = np.nanmedian(forward.reshape(steps, -1), axis=1)
        c = np.nanmedian(round_trip.reshape(steps, -1), axis=1)
    f = np.where(np.isfinite(f) & (f > 0), f, np.nanmedian(f[f > 0]) if (f > 0).any() else np.nan)
    c = np.where(np.isfinite(c) & (c > 0), c, np.nanmedian(c[c > 0]) if (c > 0).any() else np.nan)
    if not np.isfinite(c).all():
        return None, None
    split = np.isfinite(f) & (f < c)
    f = np.where(split, f, c / (1 + backward_per_forward))
    return f, c - f

