"""Exporters' clocks brought onto one time per job, learned from the job's own traffic.

Each switch stamps its records with its own clock: offset by milliseconds, and drifting by tens of
ppm where it runs free (no PTP), so two leaves can be 50 ms apart by the end of an hour. The
timeline takes a collective's start as the median over exporters of their first records and a
straggler is a GPU later than its peers, both across exporters: clocks apart by more than a
step's 1% move boundaries and name the wrong GPU.

Exporters that carry the same host-to-host links (one rail each of a rail-optimized fabric) see
the job's collectives at the same moments, so the moments their traffic resumes after a quiet
(`quiet_ns`) differ by their clocks alone. Per window, each exporter's offset from the class's
most active exporter is the median difference to the nearest of that exporter's resumes; the
class's time is the median exporter's, and each exporter's records move by its offset from it,
interpolated between windows (a drift is a steady change of offset). Exporters whose resumes do
not pair one to one (other traffic, clocks further apart than half the quiet) keep their clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import stable_order


@dataclass(frozen=True)
class ClockParams:
    # ns; an exporter's traffic of the job resuming after this much quiet marks a moment all its
    # peers see; two exporters' resumes pair one to one while their clocks differ by less than
    # half of it (well above collective launch skew, below the compute phases of a step)
    quiet_ns: int = 200_000_000
    # ns; an exporter's offset is measured per window this long; a drift shows as the offset
    # changing from window to window
    window_ns: int = 60_000_000_000
    # count; a window's offset needs at least this many paired resumes ...
    min_pairs: int = 5
    # ns; ... whose differences stay within this of their median (median absolute deviation):
    # resumes that do not pair one to one leave the exporter's clock alone in that window
    max_spread_ns: int = 2_000_000
    # share (Jaccard); exporters whose host-to-host links overlap at least this much carry the
    # same collectives, so their resumes coincide but for their clocks
    same_links: float = 0.8


DEFAULT_PARAMS = ClockParams()
TIME_COLUMNS = ("time_flow_start_ns", "time_flow_end_ns")


def aligned(flows: pa.Table, members: pa.Table, params: ClockParams = DEFAULT_PARAMS) -> pa.Table:
    """`flows` (a job's, in start order) with each exporter's times moved onto the job's common
    clock, still in start order; unchanged where no exporters peer. `members`: addr, host."""
    if flows.num_rows == 0 or members.num_rows == 0:
        return flows
    exporter_text = pc.fill_null(flows["sampler_address"], "").combine_chunks().dictionary_encode()
    if len(exporter_text.dictionary) < 2:
        return flows
    exporter = exporter_text.indices.to_numpy().astype(np.int64)
    start = flows["time_flow_start_ns"].to_numpy()
    end = flows["time_flow_end_ns"].to_numpy()
    links = _host_links(flows, members)
    correction = exporter_corrections(start, end, exporter, links, len(exporter_text.dictionary), params)
    if not correction.any():
        return flows
    start, end = start - correction, end - correction
    moved = flows.set_column(flows.schema.get_field_index("time_flow_start_ns"), "time_flow_start_ns",
                             pa.array(start, flows.schema.field("time_flow_start_ns").type))
    moved = moved.set_column(moved.schema.get_field_index("time_flow_end_ns"), "time_flow_end_ns",
                             pa.array(end, flows.schema.field("time_flow_end_ns").type))
    if np.all(start[1:] >= start[:-1]):
        return moved
    return moved.take(pa.array(np.argsort(start, kind="stable")))


def _host_links(flows: pa.Table, members: pa.Table) -> np.ndarray:
    """Per flow, a code of its (source host, destination host) link; -1 off the job's hosts."""
    addrs = members["addr"].combine_chunks()
    host_text = members["host"].combine_chunks().dictionary_encode()
    host_of_member = host_text.indices.to_numpy().astype(np.int64)
    n_hosts = len(host_text.dictionary)

    def host(column: str) -> np.ndarray:
        member = pc.index_in(flows[column].combine_chunks(), value_set=addrs).to_numpy(zero_copy_only=False)
        known = ~np.isnan(member)
        return np.where(known, host_of_member[np.nan_to_num(member).astype(np.int64)], -1)

    src, dst = host("src_addr"), host("dst_addr")
    return np.where((src >= 0) & (dst >= 0), src * n_hosts + dst, -1)


def exporter_corrections(start: np.ndarray, end: np.ndarray, exporter: np.ndarray, links: np.ndarray,
                         n_exporters: int, params: ClockParams) -> np.ndarray:
    """Per flow, how far (ns) its exporter's clock runs ahead of its class's common time (0 where
    that is not known)."""
    on_job = np.flatnonzero(links >= 0)
    by_exporter = on_job[stable_order(exporter[on_job])]
    resumes = _resumes(start[by_exporter], end[by_exporter], exporter[by_exporter], params.quiet_ns)
    origin = int(start.min())
    n_windows = (int(start.max()) - origin) // params.window_ns + 1
    ahead = np.full((n_exporters, n_windows), np.nan)  # ns ahead of the class's time, per window
    for peers in _peer_classes(exporter[on_job], links[on_job], resumes, params.same_links):
        reference = resumes.get(peers[0], np.zeros(0, np.int64))
        offsets = np.stack([_window_offsets(resumes.get(code, np.zeros(0, np.int64)), reference, origin,
                                            n_windows, params) for code in peers])
        measured = np.isfinite(offsets).sum(axis=0) > 1
        common = np.full(n_windows, np.nan)
        common[measured] = np.nanmedian(offsets[:, measured], axis=0)
        ahead[peers] = offsets - common
    correction = np.zeros(len(start), np.int64)
    centres = origin + (np.arange(n_windows) + 0.5) * params.window_ns
    order = stable_order(exporter)
    bounds = np.searchsorted(exporter[order], np.arange(n_exporters + 1))
    for code in np.flatnonzero(np.isfinite(ahead).any(axis=1)):
        known = np.isfinite(ahead[code])
        rows = order[bounds[code]:bounds[code + 1]]
        correction[rows] = np.round(np.interp(start[rows], centres[known], ahead[code][known])).astype(np.int64)
    return correction


def _resumes(start: np.ndarray, end: np.ndarray, exporter: np.ndarray, quiet_ns: int) -> dict[int, np.ndarray]:
    """Per exporter (flows ordered by exporter, then start), the starts of its flows that follow
    at least `quiet_ns` of its own quiet."""
    if not len(start):
        return {}
    # the latest end so far within each exporter: times shifted by a span per exporter, so that
    # one running maximum never carries over from the exporter before
    low = int(start.min())
    span = int(max(end.max(), start.max())) - low + 1
    group = np.cumsum(np.r_[False, exporter[1:] != exporter[:-1]])
    reach = np.maximum.accumulate((end - low) + group * span)
    quiet = np.r_[0, (start[1:] - low) + group[1:] * span - reach[:-1]]
    resume = (quiet >= quiet_ns) & np.r_[False, exporter[1:] == exporter[:-1]]
    codes, firsts = np.unique(exporter, return_index=True)
    bounds = np.r_[firsts, len(exporter)]
    return {int(code): start[lo:hi][resume[lo:hi]] for code, lo, hi in zip(codes, bounds[:-1], bounds[1:])}


def _peer_classes(exporter: np.ndarray, links: np.ndarray, resumes: dict[int, np.ndarray],
                  same_links: float) -> list[list[int]]:
    """Classes of exporters carrying the same host links, each led by its exporter with the most
    resumes; classes of one are left out (nothing to compare a clock with)."""
    radix = int(links.max(initial=0)) + 1
    link_sets: dict[int, set[int]] = {}
    for code, link in zip(*np.divmod(np.unique(exporter * radix + links), radix)):
        link_sets.setdefault(int(code), set()).add(int(link))
    left = sorted(link_sets, key=lambda code: -len(resumes.get(code, ())))
    classes = []
    while left:
        lead, *rest = left
        peers = [code for code in rest if _jaccard(link_sets[lead], link_sets[code]) >= same_links]
        left = [code for code in rest if code not in peers]
        if peers:
            classes.append([lead, *peers])
    return classes


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b)


def _window_offsets(resumes: np.ndarray, reference: np.ndarray, origin: int, n_windows: int,
                    params: ClockParams) -> np.ndarray:
    """Per window, the median difference of `resumes` to the nearest `reference` resume, where
    enough of them pair one to one (nan elsewhere)."""
    offsets = np.full(n_windows, np.nan)
    if not len(resumes) or len(reference) < 2:
        return offsets
    after = np.clip(np.searchsorted(reference, resumes), 1, len(reference) - 1)
    before = after - 1
    nearer = np.where(resumes - reference[before] <= reference[after] - resumes, before, after)
    difference = (resumes - reference[nearer]).astype(np.float64)
    window = (resumes - origin) // params.window_ns
    for w in np.unique(window):
        d = difference[window == w]
        if len(d) < params.min_pairs:
            continue
        median = np.median(d)
        if np.median(np.abs(d - median)) <= params.max_spread_ns:
            offsets[w] = median
    return offsets
