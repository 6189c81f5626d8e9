"""The judgements tracking makes about one job, apart from its bookkeeping: is a minute's traffic
on its hosts the job, does traffic after a stop resume it, and where does a minute split when a
new job takes its hosts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from prism_core.arrays import nearest_within
from prism_core.recognition.observe import Observations
from prism_core.recognition.params import RecognitionParams

if TYPE_CHECKING:  # the tracker, in track.py, decides with these functions
    from prism_core.recognition.track import Track


def same_job(
    track: Track, nics: np.ndarray, shared: int, all_hosts: bool, gap_ns: int, alongside: bool, minute_ns: int,
    sizes: np.ndarray, flows: np.ndarray, params: RecognitionParams,
) -> bool:
    """Is an observation in minute `minute_ns` on `nics`, `shared` of them running `track`'s, on
    `all_hosts` of the track or not, `gap_ns` after the track's last traffic, with repeated flow
    `sizes` (and their `flows`), the track's job? Without comparing sizes when it comes soon on
    (nearly) the job's NICs, or on NICs of the job on all its hosts (a job holding its hosts whole
    holds NICs it never shows); else by
    its sizes (a new job can start on all or part of the NICs another left seconds before), unless
    it began before the job's last traffic ended (`params.continuing_overlap_ns`) or comes soon,
    `alongside` the job's traffic on its other NICs in the minute: a NIC serves one job at a time,
    and a job keeps its NICs while it runs."""
    within_check = gap_ns < params.resume_check_ns
    # parts talking at once continue a job that was talking, not one silent for a while (new jobs
    # on its NICs, side by side on other GPUs of its hosts, start at about the same time)
    overlapping = (alongside and within_check) or gap_ns <= -params.continuing_overlap_ns
    union = len(nics) + len(track.nics) - shared
    unchanged = within_check and (shared >= params.same_nics_jaccard * union or (shared == len(nics) and all_hosts))
    # A job minutes old may not have shown all its flow sizes yet (no DP sync in its parts), but
    # its parts join into more NICs while it talks: traffic on only some of the NICs it already
    # showed, or after a silence, is judged by its sizes (a new job on NICs a short job left).
    part_of_young = track.young(minute_ns, params) and within_check and not (shared == len(nics) < len(track.nics))
    return overlapping or unchanged or part_of_young or track.signature_share(sizes, flows, params) >= params.signature_match


def resumes(
    track: Track, track_hosts: np.ndarray, seen_hosts: np.ndarray, gap_ns: int, sizes: np.ndarray, flows: np.ndarray,
    params: RecognitionParams,
) -> bool:
    """Does traffic on hosts `seen_hosts`, `gap_ns` after the last of stopped `track` (on
    `track_hosts`), with repeated flow `sizes` (and their `flows`), resume the job: soon enough, on
    its hosts with at most `params.replaced_hosts` replaced, with its flow sizes?"""
    shared = len(np.intersect1d(seen_hosts, track_hosts))
    return (
        gap_ns <= params.restart_window_ns
        and len(track_hosts) - shared <= params.replaced_hosts
        and len(seen_hosts) - shared <= params.replaced_hosts
        and track.signature_share(sizes, flows, params) >= params.signature_match
    )


def size_share(sizes: np.ndarray, params: RecognitionParams) -> float:
    """How far apart (a share) a minute's `sizes` may be from a job's and still be its: within
    `params.signature_size_share` where two of them are that close but unequal (an exporter
    counting header bytes tells each pair's transfers a few bytes apart), else byte for byte:
    where sizes recur exactly, another job's sizes a few tenths of a percent off are another
    model's."""
    distinct = np.unique(sizes).astype(np.float64)
    spread = len(distinct) > 1 and bool(np.any(distinct[1:] <= distinct[:-1] * (1.0 + params.signature_size_share)))
    return params.signature_size_share if spread else 0.0


@dataclass(frozen=True)
class Handover:
    """How the minute in which a new job took NICs of an old one splits between them."""

    nics: np.ndarray  # the NICs the new job took
    start_ns: int  # the new job's first traffic on them
    old_until_ns: int  # the old job holds them until then
    old_end_ns: int  # the old job's last traffic in that minute, on any of its hosts


def hand_over(track: Track, obs: Observations, k: int, params: RecognitionParams) -> Handover | None:
    """When observation `k`'s new job was already talking on NICs of the old job `track` in that
    job's latest minute (its rows there carry sizes the old job is not known by, and last past
    the old job's own rows on those NICs), split that minute on the NICs: the new job starts
    with its first row on a host pair only it used if that follows the old job's last row on a
    pair only the old one used, else after the old job's last row of other sizes (see
    `old_job_end`). None when the latest minute holds no such change."""
    taken = np.intersect1d(obs.nics(k), track.nics)
    if len(track.last_observations) == 0 or len(taken) == 0:
        return None
    src, dst, size, first, last, _ = obs.edges(track.last_observations)
    on_taken = np.isin(src, taken) | np.isin(dst, taken)
    known = np.sort(track.known_sizes(params)).astype(np.float64)
    seen = obs.signature(k)[0]
    share = size_share(seen, params)
    new_sizes = np.sort(seen[nearest_within(seen.astype(np.float64), known, share) < 0]).astype(np.float64)
    new_shape = on_taken & (nearest_within(size.astype(np.float64), new_sizes, share) >= 0)
    old_shape = on_taken & ~new_shape
    if not (new_shape.any() and old_shape.any()):
        return None
    # A host pair both jobs used has rows spanning both (its top size may even be one they
    # share: a rail of the new job's all-to-all); pairs only one used tell when each job talked there.
    src_host, dst_host = obs.host_of_nic[src], obs.host_of_nic[dst]
    low, high = np.minimum(src_host, dst_host), np.maximum(src_host, dst_host)
    pair = low * (high.max() + 1) + high
    old_only = old_shape & ~np.isin(pair, pair[new_shape])
    new_only = new_shape & ~np.isin(pair, pair[old_shape])
    if old_only.any() and new_only.any() and first[new_only].min() > last[old_only].max():
        # the old job holds the NICs until the new one's first traffic of its own, but the
        # flows on pairs both used in the moments before that are the new job's first
        # collective reaching all its pairs, not the old job's tail
        old_end_ns = int(last[old_only].max())
        start_ns = max(old_end_ns + 1, int(first[new_only].min()) - params.handover_lead_in_ns)
        old_until_ns = start_ns - 1
    else:
        old_until_ns = old_end_ns = old_job_end(last[old_shape], first[new_shape])
        if last[new_shape].max() <= old_until_ns:
            return None
        start_ns = max(old_until_ns + 1, int(first[new_shape].min()))
    old_rows = ~on_taken | (old_shape & (last <= old_end_ns))
    return Handover(taken, start_ns, old_until_ns, int(last[old_rows].max(initial=old_end_ns)))


def old_job_end(old_last_ns: np.ndarray, new_first_ns: np.ndarray) -> int:
    """When a job stopped and another took its NICs within one minute: the end of the old job's
    traffic there, given the last ends of the rows of its sizes and the first starts of the rows
    of the new job's. A pair both jobs use has one row spanning both, labelled by whichever sent
    more flows of one size: its end is the new job's, or its start the old job's. So the end is
    the one that leaves the fewest rows on the wrong side of it (rows of old sizes ending later,
    rows of new sizes starting earlier), the latest of those on a tie (without such rows: the
    last row of old sizes)."""
    candidates = np.unique(old_last_ns)
    old_after = len(old_last_ns) - np.searchsorted(np.sort(old_last_ns), candidates, side="right")
    new_before = np.searchsorted(np.sort(new_first_ns), candidates, side="right")
    misplaced = old_after + new_before
    return int(candidates[np.flatnonzero(misplaced == misplaced.min())[-1]])
