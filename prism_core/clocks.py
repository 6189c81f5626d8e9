"""Exporters' clocks brought onto one time per job, learned from the job's own traffic.

Each switch stamps its records with its own clock: offset by milliseconds, and drifting by tens of
ppm where it runs free (no PTP), so two leaves can be 50 ms apart by the end of an hour. The
timeline takes a collective's start as the median over exporters of their first records and a
straggler is a GPU later than its peers, both across exporters: clocks apart by more than a
step's 1% move boundaries and name the wrong GPU.

Exporters that carry the same host-to-host links between the same pipeline stages (one rail each
of a rail-optimized fabric, where a job's tensor-parallel ranks sit on the rails) see the job's
collectives at the same moments, so the moments their traffic resumes after a quiet (`quiet_ns`)
differ by their clocks alone; rails that carry different stages of a job on part of a host do
not, and are not compared. Per window, each exporter's offset from the class's
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

from prism_core.arrays import combination_ids, stable_order


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
    # ns; clocks this close to the common time are left as they are, and those further away are
    # brought this close, no closer: the timeline's rules take a few ms of skew between exporters
    # (`TimelineParams.merge_ns`, `cluster_ns`), and a pipeline-only job's division still leans
    # on it (its micro-batch sends on every rail in step read as more gaps: sealed-family seed 3)
    kept_skew_ns: int = 5_000_000
    # share (Jaccard); exporters whose links (host and pipeline stage at each end) overlap at least
    # this much carry the same collectives, so their resumes coincide but for their clocks
    same_links: float = 0.8


DEFAULT_PARAMS = ClockParams()
TIME_COLUMNS = ("time_flow_start_ns", "time_flow_end_ns")


@dataclass(frozen=True)
class ExporterClocks:
    """How far each exporter's clock runs ahead of the job's common time (ns), at `times`."""

    times: np.ndarray  # window centres, ns
    ahead: dict[str, np.ndarray]  # sampler_address -> ns ahead at each of `times` (nan: not measured)

    def apply(self, flows: pa.Table) -> pa.Table:
        """`flows` with each measured exporter's times moved onto the common time (interpolated
        between windows, held beyond them), in start order if they came so."""
        if not self.ahead or flows.num_rows == 0:
            return flows
        exporter = pc.fill_null(flows["sampler_address"], "").combine_chunks().dictionary_encode()
        start = flows["time_flow_start_ns"].to_numpy()
        codes = exporter.indices.to_numpy()
        correction = np.zeros(len(start), np.int64)
        order = stable_order(codes.astype(np.int64))
        bounds = np.searchsorted(codes[order], np.arange(len(exporter.dictionary) + 1))
        for code, address in enumerate(exporter.dictionary.to_pylist()):
            ahead = self.ahead.get(address)
            if ahead is not None:
                rows = order[bounds[code]:bounds[code + 1]]
                known = np.isfinite(ahead)
                correction[rows] = np.round(np.interp(start[rows], self.times[known], ahead[known])).astype(np.int64)
        moved = flows
        for name in TIME_COLUMNS:
            values = moved[name].to_numpy() - correction
            moved = moved.set_column(moved.schema.get_field_index(name), name,
                                     pa.array(values, moved.schema.field(name).type))
        was_ordered = np.all(start[1:] >= start[:-1])
        start = start - correction
        if not was_ordered or np.all(start[1:] >= start[:-1]):
            return moved
        return moved.take(pa.array(np.argsort(start, kind="stable")))


def learn(flows: pa.Table, job_gpus: pa.Table, params: ClockParams = DEFAULT_PARAMS) -> ExporterClocks:
    """Each exporter's clock against its peers', from the flows a job's members sent; `job_gpus`:
    addr, host, pp_stage."""
    none = ExporterClocks(np.zeros(0), {})
    if flows.num_rows == 0 or job_gpus.num_rows == 0:
        return none
    exporter_text = pc.fill_null(flows["sampler_address"], "").combine_chunks().dictionary_encode()
    if len(exporter_text.dictionary) < 2:
        return none
    exporter = exporter_text.indices.to_numpy().astype(np.int64)
    start = flows["time_flow_start_ns"].to_numpy()
    end = flows["time_flow_end_ns"].to_numpy()
    origin = int(start.min())
    n_windows = (int(start.max()) - origin) // params.window_ns + 1
    ahead = exporter_offsets(start, end, exporter, _stage_links(flows, job_gpus), len(exporter_text.dictionary),
                             origin, n_windows, params)
    names = exporter_text.dictionary.to_pylist()
    return ExporterClocks(origin + (np.arange(n_windows) + 0.5) * params.window_ns,
                          {names[code]: ahead[code] for code in np.flatnonzero(np.nan_to_num(ahead).any(axis=1))})


def _stage_links(flows: pa.Table, job_gpus: pa.Table) -> np.ndarray:
    """Per flow, a code of its (source host and stage, destination host and stage); -1 off the
    job's GPUs."""
    addrs = job_gpus["addr"].combine_chunks()
    place = combination_ids(job_gpus["host"].combine_chunks().dictionary_encode().indices.to_numpy().astype(np.int64),
                            pc.fill_null(job_gpus["pp_stage"], -1).to_numpy().astype(np.int64))
    n_places = int(place.max(initial=0)) + 1

    def place_of(column: str) -> np.ndarray:
        row = pc.index_in(flows[column].combine_chunks(), value_set=addrs).to_numpy(zero_copy_only=False)
        known = ~np.isnan(row)
        return np.where(known, place[np.nan_to_num(row).astype(np.int64)], -1)

    src, dst = place_of("src_addr"), place_of("dst_addr")
    return np.where((src >= 0) & (dst >= 0), src * n_places + dst, -1)


def exporter_offsets(start: np.ndarray, end: np.ndarray, exporter: np.ndarray, links: np.ndarray, n_exporters: int,
                     origin: int, n_windows: int, params: ClockParams) -> np.ndarray:
    """(exporter, window): how far (ns) the exporter's clock runs ahead of its class's common
    time beyond `kept_skew_ns`; nan where that is not measured."""
    on_job = np.flatnonzero(links >= 0)
    by_exporter = on_job[stable_order(exporter[on_job])]
    resumes = _resumes(start[by_exporter], end[by_exporter], exporter[by_exporter], params.quiet_ns)
    ahead = np.full((n_exporters, n_windows), np.nan)
    for peers in _peer_classes(exporter[on_job], links[on_job], resumes, params.same_links):
        reference = resumes.get(peers[0], np.zeros(0, np.int64))
        offsets = np.stack([_window_offsets(resumes.get(code, np.zeros(0, np.int64)), reference, origin,
                                            n_windows, params) for code in peers])
        measured = np.isfinite(offsets).sum(axis=0) > 1
        common = np.full(n_windows, np.nan)
        common[measured] = np.nanmedian(offsets[:, measured], axis=0)
        ahead[peers] = offsets - common
    excess = np.abs(ahead) - params.kept_skew_ns
    return np.where(np.isnan(ahead), np.nan, np.sign(ahead) * np.maximum(excess, 0))


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
    """Classes of exporters carrying the same links (hosts and stages), each led by its exporter
    with the most resumes; classes of one are left out (nothing to compare a clock with)."""
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
