"""Tracking: each minute's observed jobs linked to the jobs already known, across minutes, hours
and restarts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from prism_core.arrays import combination_ids, group_spans, nearest_within, unique_rows
from prism_core.minutes import MINUTE_NS
from prism_core.recognition.decisions import Handover, hand_over, resumes, same_job, size_share
from prism_core.recognition.merge import ranges
from prism_core.recognition.observe import Observations
from prism_core.recognition.params import RecognitionParams
from prism_core.recognition.state import CarriedTrack, RecognitionState
from prism_core.recognition.tables import Event, Presence
from prism_core.recognition.vocabulary import NicVocabulary


def _no_int64() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class Track:
    """One job as tracking knows it."""

    job_id: str
    nics: np.ndarray  # sorted NIC codes: the job's members
    first_seen_ns: int
    last_end_ns: int
    restarts: int = 0
    status: str = "running"
    # signature: the repeated flow sizes, their flows and the minutes they were seen in
    sizes: np.ndarray = field(default_factory=_no_int64)
    size_flows: np.ndarray = field(default_factory=_no_int64)
    size_minutes: np.ndarray = field(default_factory=_no_int64)
    seen_this_hour: bool = False
    born_this_hour: bool = False
    running_at_load: bool = False  # handed over running by the previous hour: owes a row this hour
    merged_into: int = -1  # the track that absorbed this one: one job first seen in parts
    reported_end: bool = False  # an `end` event was already emitted for the current stop
    # its observations in the latest minute it was seen this hour, and that minute's presence entry
    last_observations: np.ndarray = field(default_factory=_no_int64)
    last_presence: int = -1

    @classmethod
    def from_state(cls, carried: CarriedTrack, vocabulary: NicVocabulary) -> Track:
        signature = np.array(carried.signature, np.int64).reshape(-1, 3)
        return cls(
            job_id=carried.job_id,
            nics=np.sort(vocabulary.encode(list(carried.nics))),
            first_seen_ns=carried.first_seen_ns,
            last_end_ns=carried.last_end_ns,
            restarts=carried.restarts,
            status=carried.status,
            sizes=signature[:, 0],
            size_flows=signature[:, 1],
            size_minutes=signature[:, 2],
            reported_end=carried.reported_end,
            running_at_load=carried.status == "running",
        )

    def to_state(self, vocabulary: NicVocabulary) -> CarriedTrack:
        signature = np.stack([self.sizes, self.size_flows, self.size_minutes], axis=1).tolist()
        return CarriedTrack(
            job_id=self.job_id,
            nics=tuple(vocabulary.addr_list(self.nics)),
            first_seen_ns=int(self.first_seen_ns),
            last_end_ns=int(self.last_end_ns),
            restarts=self.restarts,
            status=self.status,
            reported_end=self.reported_end,
            signature=tuple(map(tuple, signature)),
        )

    def young(self, minute_ns: int, params: RecognitionParams) -> bool:
        """Begun this hour recently enough, at minute `minute_ns`, to be a part of a job not yet seen whole."""
        return self.born_this_hour and minute_ns - self.first_seen_ns < params.young_ns

    def known_sizes(self, params: RecognitionParams) -> np.ndarray:
        """The flow sizes the job is known by: those seen in enough minutes, if any."""
        established = self.sizes[self.size_minutes >= params.established_minutes]
        return established if len(established) else self.sizes

    def signature_share(self, sizes: np.ndarray, flows: np.ndarray, params: RecognitionParams) -> float:
        """Share of the observed repeated bytes in flow sizes the job is known by (`size_share`).
        Weighing by bytes lets the gradient buckets (sized by the model and its sharding) outweigh
        activation sizes, which many models share."""
        moved = sizes.astype(np.float64) * flows
        total = moved.sum()
        known = self.known_sizes(params)
        if total == 0 or len(known) == 0:
            return 1.0  # nothing to compare: trust the NICs
        return float(moved[_known_size(sizes, known, size_share(sizes, params)) >= 0].sum() / total)

    def add_sizes(self, sizes: np.ndarray, flows: np.ndarray, params: RecognitionParams) -> None:
        """Count a minute's repeated flow `sizes` (with their `flows`) into the signature, keeping
        the sizes with the most flows. A size within `size_share` of one the signature holds counts
        as that one; the minute's other sizes that close to each other count as the one of them
        with the most flows (header bytes spread one transfer size over nearby counts)."""
        share = size_share(sizes, params)
        held = _known_size(sizes, self.sizes, share)
        new = held < 0
        new_sizes, new_flows = _one_per_family(sizes[new], flows[new], share)
        all_sizes = np.concatenate([self.sizes, new_sizes])
        totals = np.concatenate([self.size_flows + np.bincount(held[~new], flows[~new], len(self.sizes)).astype(np.int64),
                                 new_flows])
        minutes = np.concatenate([self.size_minutes + (np.bincount(held[~new], minlength=len(self.sizes)) > 0),
                                  np.ones(len(new_sizes), np.int64)])
        by_size = np.argsort(all_sizes, kind="stable")  # ties in flows keep the smaller size first
        keep = by_size[np.argsort(-totals[by_size], kind="stable")[: params.signature_sizes]]
        self.sizes, self.size_flows, self.size_minutes = all_sizes[keep], totals[keep], minutes[keep]


def _known_size(sizes: np.ndarray, known: np.ndarray, share: float) -> np.ndarray:
    """Per size: the index in `known` of the size it is (the nearest within `share`), -1 for none."""
    order = np.argsort(known, kind="stable")
    at = nearest_within(sizes.astype(np.float64), known[order].astype(np.float64), share)
    at[at >= 0] = order[at[at >= 0]]
    return at


def _one_per_family(sizes: np.ndarray, flows: np.ndarray, share: float) -> tuple[np.ndarray, np.ndarray]:
    """Sizes within `share` of their neighbour (sorted) as one: the size with the most flows (the
    smallest on ties), with the family's flows."""
    if not len(sizes):
        return sizes, flows
    by_size = np.argsort(sizes, kind="stable")
    size, flow = sizes[by_size], flows[by_size]
    family = np.cumsum(np.r_[True, size[1:] > size[:-1] * (1.0 + share)]) - 1
    best = np.lexsort((size, -flow, family))
    first = best[np.r_[True, family[best][1:] != family[best][:-1]]]
    return size[first], np.bincount(family, flow).astype(np.int64)


def hosts_held_in_part(part: np.ndarray, src: np.ndarray, dst: np.ndarray, size: np.ndarray,
                       vocabulary: NicVocabulary, tolerance: float) -> np.ndarray:
    """Hosts on which a job's traffic rows (NIC codes `src` -> `dst`, top `size`) show it ends
    before the host's last GPU, for the traffic of many jobs and minutes at once: each `part`
    code's rows (one job's in one minute) read apart, as distinct (part, host) rows. Ranks are
    consecutive on a host, so a pipeline hop between two hosts (or the embedding exchange
    between the first and last stage) joins the job's last GPUs on one with its first on the
    other, and with PXN each way arrives on the receiver's rail: one transfer size (within
    `tolerance`, exporters' header bytes) crossing between two hosts each way on other rails.
    The highest of those rails is the job's last GPU on the host it arrives at. A ring or a tree
    crosses on the same rails both ways, or one way only."""
    crossing = vocabulary.hosts(src) != vocabulary.hosts(dst)
    part, src, dst, size = part[crossing], src[crossing], dst[crossing], size[crossing]
    if not len(src):
        return np.zeros((0, 2), np.int64)
    src_host, dst_host, rail = vocabulary.hosts(src), vocabulary.hosts(dst), vocabulary.rails(dst)
    # a part's sizes in order: a family begins at a part's smallest or past `tolerance` of the one before
    sizes, size_at = unique_rows(*_signed(part, size), return_inverse=True)
    family = np.cumsum(np.r_[True, (sizes[1:, 0] != sizes[:-1, 0]) | (sizes[1:, 1] > sizes[:-1, 1] * (1 + tolerance))])
    family = family[size_at]
    low, high = np.minimum(src_host, dst_host), np.maximum(src_host, dst_host)
    # ids of the (low, high, family) and (crossing, rail) combinations, numbered as
    # `np.unique(..., axis=0)` numbers them, by hashing packed integers rather than sorting rows
    crossing_of = combination_ids(*_signed(family, high, low))
    n = int(crossing_of.max()) + 1
    upward = src_host < dst_host
    rail_of = combination_ids(*_signed(rail, crossing_of))
    rail_up = np.bincount(rail_of, weights=upward) > 0
    rail_down = np.bincount(rail_of, weights=~upward) > 0
    rail_crossing = np.zeros(len(rail_up), np.int64)
    rail_crossing[rail_of] = crossing_of
    shared_rail = np.bincount(rail_crossing, weights=rail_up & rail_down, minlength=n) > 0
    hop = (np.bincount(crossing_of, weights=upward, minlength=n) > 0) & (
        np.bincount(crossing_of, weights=~upward, minlength=n) > 0) & ~shared_rail
    top = np.full(n, -1)
    np.maximum.at(top, crossing_of, rail)
    arrives = np.flatnonzero(hop[crossing_of] & (rail == top[crossing_of]))
    arrives = arrives[~vocabulary.on_last_rail(dst[arrives])]
    return unique_rows(*_signed(part[arrives], dst_host[arrives]))


def _bit_length(values: np.ndarray) -> np.ndarray:
    """Bits of each non-negative integer (0 for 0): 1 << _bit_length(n - 1) is the power of two
    at or above n."""
    values = np.asarray(values, np.int64)
    return np.where(values > 0, np.floor(np.log2(np.maximum(values, 1))).astype(np.int64) + 1, 0)


def _signed(*columns: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(c, np.int64) for c in columns]


def job_id(minute_ns: int, addrs: list[str]) -> str:
    """Deterministic (first minute + NIC addresses), so re-running an hour from the same state gives the same ids."""
    digest = hashlib.sha1(f"{minute_ns}|{','.join(addrs)}".encode()).hexdigest()
    return f"job-{digest[:12]}"


class NicOwners:
    """The track owning each NIC code, -1 for none. A NIC serves one job at a time, so every NIC
    has at most one owning track, which makes overlaps a bincount."""

    def __init__(self, tracks: list[Track], n_nics: int):
        self.owner = np.full(n_nics, -1, np.int64)
        for index, track in enumerate(tracks):
            self.owner[track.nics] = index

    def cover(self, n_nics: int) -> None:
        """Make room for NICs coded since (they have no owner)."""
        if len(self.owner) < n_nics:
            self.owner = np.r_[self.owner, np.full(n_nics - len(self.owner), -1)]

    def of(self, nics: np.ndarray | int) -> np.ndarray:
        return self.owner[nics]

    def best(self, nics: np.ndarray) -> tuple[int | None, int]:
        """The track owning most of `nics` (the earlier on ties) and how many it owns."""
        owners = self.owner[nics]
        owners = owners[owners >= 0]
        if len(owners) == 0:
            return None, 0
        shared_by_track = np.bincount(owners)
        best = int(np.argmax(shared_by_track))
        return best, int(shared_by_track[best])

    def held_by_at_most(self, nics: np.ndarray, index: int) -> bool:
        """Whether track `index` owns every one of `nics` that has an owner (most observations:
        the one job on its NICs), told without listing the owners."""
        owners = self.owner[nics]
        return bool(np.all((owners == index) | (owners < 0)))

    def give(self, nics: np.ndarray, index: int) -> None:
        self.owner[nics] = index

    def release(self, index: int, nics: np.ndarray) -> None:
        """Those of `nics` that track `index` owns have no owner any more."""
        self.owner[nics[self.owner[nics] == index]] = -1

    def relabel(self, part: int, survivor: int) -> None:
        self.owner[self.owner == part] = survivor

    def owning(self) -> set[int]:
        """The tracks that own a NIC."""
        return set(np.unique(self.owner[self.owner >= 0]).tolist())


class CheckpointSaves:
    """The hour's checkpoint writes, (NIC code, first start, last end) by first start (see
    `observe.saves`), applied to the jobs minute by minute."""

    def __init__(self, saves: np.ndarray):
        self.saves = saves
        self.applied = 0

    def keep_busy(self, minute_ns: int, owners: NicOwners, tracks: list[Track], params: RecognitionParams) -> None:
        """A job that writes a checkpoint from its NICs is busy until the save ends: its last
        traffic moves to the end of each save begun by the end of minute `minute_ns` while the job
        was running (a NIC's writes long after its job stopped are another's), so that traffic
        after the save does not read as a restart."""
        upto = int(np.searchsorted(self.saves[:, 1], minute_ns + MINUTE_NS, side="left"))
        for nic, first_ns, last_ns in self.saves[self.applied:upto].tolist():
            index = int(owners.of(nic))
            if index >= 0 and first_ns - tracks[index].last_end_ns < params.restart_gap_ns:
                tracks[index].last_end_ns = max(tracks[index].last_end_ns, last_ns)
        self.applied = max(self.applied, upto)


def _overlaps_another(group: np.ndarray, first_ns: np.ndarray, last_ns: np.ndarray) -> np.ndarray:
    """Per interval [first_ns, last_ns]: does another interval of its group overlap it in time?
    Group -1 is no group."""
    if len(group) == 0:
        return np.zeros(0, bool)
    order = np.lexsort((first_ns, group))
    group, first, last = group[order], first_ns[order], last_ns[order]
    base, width = int(first.min()), int(last.max() - first.min()) + 1
    rank = np.r_[0, np.cumsum(group[1:] != group[:-1])]
    # one running maximum for all groups: each group's ends lie above every earlier group's
    reach = np.maximum.accumulate(rank * width + (last - base))
    same_as_previous = np.r_[False, group[1:] == group[:-1]]
    earlier_reaches = same_as_previous & (np.r_[-1, reach[:-1]] > rank * width + (first - base))
    next_starts_before = np.r_[same_as_previous[1:], False] & (np.r_[first[1:], 0] < last)
    overlaps = np.empty(len(order), bool)
    overlaps[order] = (group >= 0) & (earlier_reaches | next_starts_before)
    return overlaps


class Tracker:
    """Links each minute's observed jobs to tracks; collects membership and events."""

    def __init__(self, tracks: list[Track], vocabulary: NicVocabulary, saves: np.ndarray, params: RecognitionParams):
        self.tracks = tracks
        self.vocabulary = vocabulary
        self.params = params
        self.saves = CheckpointSaves(saves)
        self.owners = NicOwners(tracks, len(vocabulary.addrs))
        self.events: list[Event] = []
        self.presence: list[Presence] = []  # per job-minute, for membership
        self.alongside: dict[int, bool] = {}  # per observation of the minute (`observe_minute`)
        # (track, its observations) of each minute a track talked in: their pipeline hops are read
        # at the hour's end, all at once (`_holding_hosts_in_part`)
        self.talked: list[tuple[int, np.ndarray]] = []

    def observe_minute(self, obs: Observations, rows: np.ndarray) -> None:
        self.owners.cover(len(self.vocabulary.addrs))
        self.saves.keep_busy(int(obs.minute_ns[rows[0]]), self.owners, self.tracks, self.params)
        # last traffic of every track before this minute (tracks started in it: their own)
        self.last_end = np.array([t.last_end_ns for t in self.tracks], np.int64)
        claimed: dict[int, list[int]] = {}  # track -> observations it absorbs this minute
        resuming: dict[int, list[int]] = {}  # stopped track -> observations on its NICs
        # per observation: does another of the minute, on NICs of the same track, talk at the same time?
        owner = np.array([-1 if best is None else best for best, _ in map(self.owners.best, map(obs.nics, rows))])
        self.alongside = dict(zip(rows.tolist(), _overlaps_another(owner, obs.first_ns[rows], obs.last_ns[rows])))
        for k in rows.tolist():
            best, shared = self.owners.best(obs.nics(k))
            if best is not None and not self._stopped(best, obs, k):
                best = self._resumed_past_fragments(obs, k, best)
            if best is not None and self._stopped(best, obs, k):
                resuming.setdefault(self._stopped_owner_by_sizes(obs, k, best), []).append(k)
            else:
                self._place(obs, k, best, shared, claimed)
        for best, ks in resuming.items():
            if self._resumes(obs, ks, best):
                for k in ks:
                    self._claim(claimed, best, obs, k)
            else:  # another job: its observations are placed like any other
                for k in ks:
                    self._place(obs, k, *self.owners.best(obs.nics(k)), claimed)
        by_survivor: dict[int, list[int]] = {}
        for index, ks in claimed.items():
            while self.tracks[index].merged_into >= 0:
                index = self.tracks[index].merged_into
            by_survivor.setdefault(index, []).extend(ks)
        for index, ks in by_survivor.items():
            talked = obs.nics_of(ks)
            seen = talked[self.owners.of(talked) == index]
            if len(seen):
                self._advance(index, seen, obs, np.array(ks))
            else:  # a job later this minute took every NIC it talked on: it stopped in the minute
                stopped_on = np.intersect1d(talked, self.tracks[index].nics)
                if len(stopped_on):
                    self._advance(index, stopped_on, obs, np.array(ks), superseded=True)

    def _stopped(self, index: int, obs: Observations, k: int) -> bool:
        return int(obs.first_ns[k]) - self.last_end[index] >= self.params.restart_gap_ns

    def _place(self, obs: Observations, k: int, best: int | None, shared: int, claimed: dict) -> None:
        """Observation `k` continues the running track owning most of its NICs, or starts a job."""
        if best is not None and self._stopped(best, obs, k):
            self._supersede(best, obs.nics(k))
            best = None
        index = None if best is None else self._continue(obs, k, best, shared)
        if index is None:
            # `best` ended just now: this new job took its NICs, maybe within its last minute
            took_over = best is not None and self.tracks[best].status == "ended"
            index = self._start(obs, k, self._hand_over(best, obs, k) if took_over else None)
        self._claim(claimed, index, obs, k)

    def _claim(self, claimed: dict, index: int, obs: Observations, k: int) -> None:
        """Give observation `k`'s NICs to track `index`, except NICs of another running job,
        which stay with it whatever glued them to this component."""
        self.owners.give(self._free_nics(obs, k, index), index)
        claimed.setdefault(index, []).append(k)

    def _free_nics(self, obs: Observations, k: int, index: int | None) -> np.ndarray:
        """Observation `k`'s NICs but those of a running job other than track `index`: a NIC
        serves one job at a time, and a job keeps its NICs while it runs, whatever glued them to
        this component (a one-off copy between two jobs' hosts)."""
        nics = obs.nics(k)
        owners = self.owners.of(nics)
        others = (owners >= 0) & (owners != (-1 if index is None else index))
        running = np.zeros(len(nics), bool)
        running[others] = obs.first_ns[k] - self.last_end[owners[others]] < self.params.restart_gap_ns
        return nics[~running]

    def _start(self, obs: Observations, k: int, handover: Handover | None = None) -> int:
        """A new job from observation `k`; after a `handover`, it began on the NICs it took at
        the time the hand-over says, in an earlier minute whose traffic went to the job it replaced.
        Other running jobs' NICs glued to its component stay theirs (`_free_nics`)."""
        nics = self._free_nics(obs, k, None)
        nics = nics if len(nics) else obs.nics(k)
        first_ns = int(obs.first_ns[k]) if handover is None else handover.start_ns
        identity = job_id(int(obs.minute_ns[k]), self.vocabulary.addr_list(nics))
        track = Track(identity, nics, first_ns, int(obs.last_ns[k]), born_this_hour=True)
        self.tracks.append(track)
        self.last_end = np.r_[self.last_end, track.last_end_ns]
        self.events.append((track.job_id, "start", first_ns, json.dumps({"hosts": self.vocabulary.host_list(nics)})))
        if handover is not None:
            self.presence.append((len(self.tracks) - 1, first_ns, first_ns, handover.nics))
        return len(self.tracks) - 1

    def _hand_over(self, old: int, obs: Observations, k: int) -> Handover | None:
        """Split the latest minute of track `old` where observation `k`'s new job took its NICs
        (see `decisions.hand_over`): the old job keeps the NICs until then."""
        track = self.tracks[old]
        handover = hand_over(track, obs, k, self.params)
        if handover is None:
            return None
        # min: an earlier hand-over of other NICs from this minute may have ended it sooner
        track.last_end_ns = min(track.last_end_ns, handover.old_end_ns)
        _, minute_first_ns, _, minute_nics = self.presence[track.last_presence]
        kept = np.setdiff1d(minute_nics, handover.nics)
        self.presence[track.last_presence] = (old, minute_first_ns, track.last_end_ns, kept)
        self.presence.append((old, minute_first_ns, handover.old_until_ns, handover.nics))
        return handover

    def _continue(self, obs: Observations, k: int, best: int, shared: int) -> int | None:
        """The running track observation `k` continues, or None for a new job on its NICs (other
        running jobs' NICs left out: `_free_nics`)."""
        track, nics = self.tracks[best], self._free_nics(obs, k, best)
        gap = int(obs.first_ns[k]) - int(self.last_end[best])
        # on NICs only the job holds, while it talks on others of its NICs: the job seen in parts
        alongside = shared == len(nics) and self.alongside[k]
        hosts = self.vocabulary.hosts
        # every host of the track among the observation's: host codes marked in a table of them
        # (np.isin on a few codes costs ~30 us, once per observation of the hour)
        observed_hosts = np.zeros(len(self.vocabulary.host_names), bool)
        observed_hosts[hosts(nics)] = True
        all_hosts = bool(observed_hosts[hosts(track.nics)].all())
        if not same_job(track, nics, shared, all_hosts, gap, alongside, int(obs.minute_ns[k]), *obs.signature(k),
                        self.params):
            self._supersede(best, nics)
            return None
        if shared < self.params.track_overlap * min(len(nics), len(track.nics)):
            return None
        return self._merge_young_fragments(obs, k, best)

    def _merge_young_fragments(self, obs: Observations, k: int, best: int) -> int:
        """A component spanning several running tracks that all began minutes ago this hour is one
        job whose first minutes showed its parts apart (pipelines before the first DP sync): the
        parts merge into the oldest."""
        if self.owners.held_by_at_most(obs.nics(k), best):
            return best  # no other track to merge
        owners = np.unique(self.owners.of(obs.nics(k)))
        owners = owners[owners >= 0]
        owners = owners[obs.first_ns[k] - self.last_end[owners] < self.params.restart_gap_ns]
        minute_ns = int(obs.minute_ns[k])
        if len(owners) < 2 or not all(self.tracks[i].young(minute_ns, self.params) for i in owners.tolist()):
            return best
        survivor = int(min(owners, key=lambda i: (self.tracks[i].first_seen_ns, i)))
        for part in owners.tolist():
            if part != survivor:
                self._absorb(survivor, part)
        return survivor

    def _absorb(self, survivor: int, part: int) -> None:
        keeper, merged = self.tracks[survivor], self.tracks[part]
        keeper.nics = np.union1d(keeper.nics, merged.nics)
        self.owners.relabel(part, survivor)
        self.presence = [(survivor if t == part else t, f, l, h) for t, f, l, h in self.presence]
        self.events = [e for e in self.events if e[0] != merged.job_id]
        keeper.first_seen_ns = min(keeper.first_seen_ns, merged.first_seen_ns)
        merged.merged_into = survivor

    def _resumes(self, obs: Observations, ks: list[int], best: int) -> bool:
        """Do observations `ks`, together, resume stopped track `best` (see `decisions.resumes`)?
        Judged on all of the minute's observations on its NICs: a job resuming with slow warm-up
        steps may show its pipelines apart. If so it restarts; if not, it will not resume on them."""
        track, seen = self.tracks[best], obs.nics_of(ks)
        resumed_ns = int(obs.first_ns[ks].min())
        gap = resumed_ns - int(self.last_end[best])
        hosts = self.vocabulary.hosts
        if not resumes(track, np.unique(hosts(track.nics)), np.unique(hosts(seen)), gap, *obs.signatures(ks), self.params):
            self._supersede(best, seen)
            return False
        # jobs that began on its NICs since it stopped, young and all on NICs of the resume, were
        # its first seconds: too few transfers to show its sizes (a flow cache reports a resume's
        # first transfers merged, each record a size of its own)
        for part in self._resume_fragments(best, seen, int(obs.minute_ns[ks[0]])):
            resumed_ns = min(resumed_ns, self.tracks[part].first_seen_ns)
            self._absorb(best, part)
        gap = resumed_ns - int(self.last_end[best])
        track.restarts += 1
        detail = {"stopped_ns": track.last_end_ns, "gap_s": gap / 1e9}
        self.events.append((track.job_id, "restart", resumed_ns, json.dumps(detail)))
        track.reported_end = False
        return True

    def _owners(self, obs: Observations, k: int) -> tuple[list[int], list[int]]:
        """The tracks owning observation `k`'s NICs, and those of them that stopped before it."""
        owners = np.unique(self.owners.of(obs.nics(k)))
        owners = owners[owners >= 0].tolist()
        return owners, [index for index in owners if self._stopped(index, obs, k)]

    def _resumed_past_fragments(self, obs: Observations, k: int, best: int) -> int:
        """The one stopped track among the owners of observation `k`'s NICs where every other
        owner is a young job begun since it stopped (its resume's first seconds, seen apart: they
        may hold more of the NICs than it still does); else `best`."""
        if not self._stopped(best, obs, k) and self.owners.held_by_at_most(obs.nics(k), best):
            return best  # the one owner is running
        owners, stopped = self._owners(obs, k)
        if len(stopped) != 1:
            return best
        minute_ns = int(obs.minute_ns[k])
        fragments = [self.tracks[index] for index in owners if index != stopped[0]]
        if all(t.young(minute_ns, self.params) and t.first_seen_ns >= self.last_end[stopped[0]] for t in fragments):
            return stopped[0]
        return best

    def _stopped_owner_by_sizes(self, obs: Observations, k: int, best: int) -> int:
        """Of the stopped tracks owning observation `k`'s NICs, the one its sizes are most of
        (`best`, the owner of most of them, on ties): a job may resume on hosts it shares with a
        job stopped there too (one that held the host whole owns NICs of the GPUs it left)."""
        stopped = self._owners(obs, k)[1]
        if len(stopped) < 2:
            return best
        sizes = obs.signature(k)
        share = {index: self.tracks[index].signature_share(*sizes, self.params) for index in stopped}
        return max(stopped, key=lambda index: (share[index], index == best))

    def _resume_fragments(self, index: int, seen: np.ndarray, minute_ns: int) -> list[int]:
        """The young jobs of this hour that began after track `index` stopped, on NICs all among
        `seen`."""
        stopped_ns = int(self.last_end[index])
        return [i for i, other in enumerate(self.tracks)
                if i != index and other.merged_into < 0 and other.young(minute_ns, self.params)
                and other.first_seen_ns >= stopped_ns and np.isin(other.nics, seen).all()]

    def _supersede(self, index: int, nics: np.ndarray) -> None:
        """Another job took `nics`: the track stopped and will not resume on them."""
        self.tracks[index].status = "ended"
        self.owners.release(index, nics)

    def _advance(
        self, index: int, seen: np.ndarray, obs: Observations, ks: np.ndarray, superseded: bool = False
    ) -> None:
        """Track `index` talked on NICs `seen` in observations `ks` of this minute; `superseded`:
        before another job took them, so it keeps its NICs and its stop."""
        track = self.tracks[index]
        # most minutes a job talks on the NICs it had: one comparison, not a set difference
        added = seen[:0] if np.array_equal(seen, track.nics) else np.setdiff1d(seen, track.nics)
        if len(added):
            # New NICs: the ones not heard from this minute were replaced (or the job grew).
            removed = np.setdiff1d(track.nics, seen)
            if len(removed):
                kept_hosts = set(self.vocabulary.host_list(np.intersect1d(track.nics, seen)))
                removed_hosts = sorted(set(self.vocabulary.host_list(removed)) - kept_hosts)
                if removed_hosts:  # not just other NICs of the same hosts
                    detail = {"removed": removed_hosts, "added": sorted(set(self.vocabulary.host_list(added)) - kept_hosts)}
                    self.events.append((track.job_id, "host_replaced", int(obs.first_ns[ks].min()), json.dumps(detail)))
                self.owners.release(index, removed)
            track.nics = seen
        first_ns, last_ns = int(obs.first_ns[ks].min()), int(obs.last_ns[ks].max())
        track.last_end_ns = max(track.last_end_ns, last_ns)
        track.status = "ended" if superseded else "running"
        track.seen_this_hour = True
        track.add_sizes(*obs.signatures(ks), self.params)
        self.talked.append((index, ks))
        track.last_observations, track.last_presence = ks, len(self.presence)
        self.presence.append((index, first_ns, last_ns, seen if superseded else track.nics))

    def _holding_hosts_in_part(self, obs: Observations) -> np.ndarray:
        """Per track: whether its pipeline hops this hour show it holds a host only in part
        (`hosts_held_in_part`), from the traffic of each minute it talked in, read apart, or from
        that of a track it absorbed (one job first seen in parts). One pass over the hour's
        traffic: read minute by minute, its ~15 array calls on a few rows each were a third of
        recognition's time."""
        holding = np.zeros(len(self.tracks), bool)
        if not self.talked:
            return holding
        ks = np.concatenate([ks for _, ks in self.talked])
        part_of_k = np.repeat(np.arange(len(self.talked)), [len(ks) for _, ks in self.talked])
        count = obs.edge_ptr[ks + 1] - obs.edge_ptr[ks]
        rows = ranges(obs.edge_ptr[ks], count)
        exact = ~obs.edge_estimated[rows]  # a sampler's estimates tell no transfer size apart from another
        rows, part = rows[exact], np.repeat(part_of_k, count)[exact]
        held = hosts_held_in_part(part, obs.edge_src_nic[rows], obs.edge_dst_nic[rows], obs.edge_size[rows],
                                  self.vocabulary, self.params.same_size)
        for talked_part in np.unique(held[:, 0]).tolist():
            index = self.talked[talked_part][0]
            holding[index] = True
            while self.tracks[index].merged_into >= 0:  # and each track that absorbed it
                index = self.tracks[index].merged_into
                holding[index] = True
        return holding

    def hold_whole_hosts(self, obs: Observations) -> None:
        """Give each job that holds its hosts whole this hour every GPU NIC of them, also those it
        never showed: with NCCL's PXN a send leaves through the NIC of the receiver's rail, so GPUs
        whose peers are all on their own host or reached on other rails (a tensor-parallel group
        smaller than the host, its DP ring crossing hosts on the first rails) never show their NIC.
        A job holds a host whole when it holds the host's first NIC (its lowest GPU), no other job
        is present on the host while it is, and its pipeline hops do not show it ending before the
        host's last GPU (`hosts_held_in_part`) and, on a platform that hands out GPUs
        (`hands_out_gpus`), it does not show several of the host's NICs but not all; it holds its
        hosts whole when it does each of them. A job on part of a host, beside others or idle
        GPUs, keeps the NICs it showed."""
        if not self.presence or not self.vocabulary.topology.from_inventory:
            return
        track_of = np.concatenate([np.full(len(n), t) for t, _, _, n in self.presence])
        nics = np.concatenate([n for _, _, _, n in self.presence])
        first = np.concatenate([np.full(len(n), f) for _, f, _, n in self.presence])
        last = np.concatenate([np.full(len(n), l) for _, _, l, n in self.presence])
        host = self.vocabulary.hosts(nics)
        all_nics, is_first = self.vocabulary.nics_of_hosts(np.unique(host))
        keys, at = unique_rows(host, track_of, return_inverse=True)
        span_first, span_last = group_spans(at, len(keys), first, last)
        holds_first = np.bincount(at, weights=np.isin(nics, all_nics[is_first]), minlength=len(keys)) > 0
        # (host, track) spans by host then first: alone when no other span on the host overlaps
        # it, neither one begun before it (their latest end reaches it) nor the next one
        order = np.lexsort((span_first, keys[:, 0]))
        host_sorted = keys[order, 0]
        base = int(span_first.min())
        width = int(span_last.max()) - base + 1
        _, group = np.unique(host_sorted, return_inverse=True)
        start_at = group * width + (span_first[order] - base)  # one running maximum for all hosts
        end_at = group * width + (span_last[order] - base)
        new_host = np.r_[True, host_sorted[1:] != host_sorted[:-1]]
        earlier_reach = np.where(new_host, -1, np.r_[-1, np.maximum.accumulate(end_at)[:-1]])
        next_start = np.where(np.r_[new_host[1:], True], np.iinfo(np.int64).max, np.r_[start_at[1:], 0])
        alone = np.empty(len(keys), bool)
        alone[order] = (earlier_reach < start_at) & (next_start > end_at)
        # On a platform that hands out GPUs, not hosts, a job showing several of a host's NICs but
        # not all holds the GPUs behind those it shows: NCCL crosses hosts over the NICs of the
        # GPUs a ring holds there (a ring per NIC). Where hosts are handed out whole, the same
        # NICs are a job of whole hosts whose rings cross on the first rails (PXN).
        lanes_in_part = np.zeros(len(keys), bool)
        if self.hands_out_gpus(keys, span_first, span_last, alone):
            shown = np.bincount(unique_rows(at, nics)[:, 0], minlength=len(keys))
            host_nics = np.bincount(self.vocabulary.hosts(np.unique(all_nics)), minlength=int(keys[:, 0].max()) + 1)
            lanes_in_part = (shown >= 2) & (shown < host_nics[keys[:, 0]])
        partial = np.bincount(keys[:, 1], weights=~(alone & holds_first) | lanes_in_part,
                              minlength=len(self.tracks)) > 0
        partial |= self._holding_hosts_in_part(obs)
        whole = {t for t in np.unique(keys[:, 1]).tolist() if not partial[t]}
        by_host = np.argsort(self.vocabulary.hosts(all_nics), kind="stable")
        by_host_nics = all_nics[by_host]
        host_of_all = self.vocabulary.hosts(by_host_nics)

        extended: dict[tuple[str, bytes], np.ndarray] = {}

        def with_their_hosts(nics: np.ndarray) -> np.ndarray:
            """`nics` and every other GPU NIC of their hosts; once per set of NICs (a track's
            presence entries mostly repeat its NICs, one entry per minute)."""
            key = (nics.dtype.str, nics.tobytes())
            if key not in extended:
                hosts = np.unique(self.vocabulary.hosts(nics))
                start = np.searchsorted(host_of_all, hosts, side="left")
                count = np.searchsorted(host_of_all, hosts, side="right") - start
                extended[key] = np.union1d(nics, by_host_nics[ranges(start, count)])
            return extended[key]

        self.owners.cover(len(self.vocabulary.addrs))
        for index in whole:
            track = self.tracks[index]
            track.nics = with_their_hosts(track.nics)
            self.owners.give(track.nics, index)
        blocks = {}
        if self.params.same_gpus_per_host:
            blocks = self.gpu_blocks(keys, at, (nics, first, last), (span_first, span_last), partial,
                                     (by_host_nics, host_of_all))
        for index, block in blocks.items():
            track = self.tracks[index]
            added = np.setdiff1d(block, track.nics)
            track.nics = np.union1d(track.nics, block)
            self.owners.give(added[self.owners.of(added) < 0], index)

        def with_blocks(index: int, nics: np.ndarray) -> np.ndarray:
            """`nics` and the NICs of the job's GPU blocks on their hosts."""
            block = blocks[index]
            return np.union1d(nics, block[np.isin(self.vocabulary.hosts(block), self.vocabulary.hosts(nics))])

        self.presence = [(t, f, l, with_their_hosts(n) if t in whole else with_blocks(t, n) if t in blocks else n)
                         for t, f, l, n in self.presence]

    def hands_out_gpus(self, keys: np.ndarray, span_first: np.ndarray, span_last: np.ndarray,
                       alone: np.ndarray) -> bool:
        """Whether this hour's platform hands out GPUs rather than whole hosts: at least
        `RecognitionParams.shared_hosts` hosts each held at once, for longer than a job may show
        its parts apart (`young_ns`), by two jobs whose hosts differ (the pieces of one job that
        recognition split, or its tracks before and after a restart, hold the job's hosts). The
        (host, track) `keys` are present over `span_first` to `span_last`, `alone` if no other
        key of their host overlaps them."""
        beside = np.flatnonzero(~alone)
        if len(np.unique(keys[beside, 0])) < self.params.shared_hosts:
            return False
        by_track = np.argsort(keys[:, 1], kind="stable")
        tracks, track_first = np.unique(keys[by_track, 1], return_index=True)
        hosts_of = dict(zip(tracks.tolist(),
                            (frozenset(h.tolist()) for h in np.split(keys[by_track, 0], track_first[1:]))))
        by_host = beside[np.argsort(keys[beside, 0], kind="stable")]
        _, host_first = np.unique(keys[by_host, 0], return_index=True)
        shared = 0
        for on in (run.tolist() for run in np.split(by_host, host_first[1:])):
            shared += any(min(span_last[a], span_last[b]) - max(span_first[a], span_first[b]) > self.params.young_ns
                          and hosts_of[keys[a, 1]] != hosts_of[keys[b, 1]]
                          for i, a in enumerate(on) for b in on[i + 1:])
        return shared >= self.params.shared_hosts

    def gpu_blocks(self, keys: np.ndarray, at: np.ndarray, entries: tuple[np.ndarray, np.ndarray, np.ndarray],
                   key_span: tuple[np.ndarray, np.ndarray], partial: np.ndarray,
                   host_nics: tuple[np.ndarray, np.ndarray]) -> dict[int, np.ndarray]:
        """The NICs of each job on part of its hosts, its GPUs taken as one aligned block of as
        many GPUs on every host (`RecognitionParams.same_gpus_per_host`), as wide as the job shows
        on its widest host. The presence entries' (NIC, first, last) `entries` belong to the
        (host, track) `keys` at `at`, each key present over `key_span`; `partial`: per track, on
        part of its hosts; `host_nics`: every GPU NIC of the hosts and its host, by host then GPU.

        With NCCL's PXN a send crossing hosts leaves through the NIC of the receiver's rail, so a
        DP ring over blocks of GPUs shows one NIC per host (the block's first GPU, where the ring
        arrives from the previous host), the others talk over NVLink; the block's width shows
        where a NIC serves two GPUs, a tensor-parallel group has a ring per rank, or blocks on
        different GPUs of two hosts make a send leave through the sender's own NIC. A host where
        another job is present on the block's other NICs at the same time keeps the NICs shown."""
        vocabulary = self.vocabulary
        nics, entry_first, entry_last = entries
        rail = vocabulary.rails(nics)
        n_keys = len(keys)
        low = np.full(n_keys, np.iinfo(np.int64).max)
        high = np.full(n_keys, -1)
        np.minimum.at(low, at, rail)
        np.maximum.at(high, at, rail + vocabulary.gpus_served(nics) - 1)
        candidate = partial[keys[:, 1]] & (low >= 0)
        if not candidate.any():
            return {}
        # the track's block: its widest host's GPUs, a power of two
        widest = np.zeros(len(partial), np.int64)
        np.maximum.at(widest, keys[candidate, 1], high[candidate] - low[candidate] + 1)
        width = np.left_shift(1, _bit_length(np.maximum(widest[keys[:, 1]], 1) - 1))
        # per host the aligned block holding every GPU shown there, at least that wide
        width = np.maximum(width, np.left_shift(1, _bit_length(np.bitwise_xor(low, np.maximum(high, low)))))
        block_first = low - low % width
        by_host_nics, host_of_all = host_nics
        hosts = keys[:, 0]
        start = np.searchsorted(host_of_all, hosts, side="left")
        count = np.where(candidate, np.searchsorted(host_of_all, hosts, side="right") - start, 0)
        pair_key = np.repeat(np.arange(n_keys), count)
        pair_nic = by_host_nics[ranges(start, count)]
        pair_rail = vocabulary.rails(pair_nic)
        inside = (pair_rail >= block_first[pair_key]) & (pair_rail < block_first[pair_key] + width[pair_key])
        pair_key, pair_nic = pair_key[inside], pair_nic[inside]
        # another job on the block's NICs while this one is on the host: not its block
        spans_of, span_at = unique_rows(nics, keys[at, 1], return_inverse=True)
        nic_first, nic_last = group_spans(span_at, len(spans_of), entry_first, entry_last)
        by_nic = np.argsort(spans_of[:, 0], kind="stable")
        span_nic = spans_of[by_nic, 0]
        lo_at = np.searchsorted(span_nic, pair_nic, side="left")
        many = np.searchsorted(span_nic, pair_nic, side="right") - lo_at
        other = by_nic[ranges(lo_at, many)]
        of_pair = np.repeat(np.arange(len(pair_nic)), many)
        track = keys[pair_key[of_pair], 1]
        first, last = key_span[0][pair_key[of_pair]], key_span[1][pair_key[of_pair]]
        clash = (spans_of[other, 1] != track) & (nic_first[other] <= last) & (nic_last[other] >= first)
        key_clashes = np.bincount(pair_key[of_pair], weights=clash, minlength=n_keys) > 0
        keep = ~key_clashes[pair_key]
        pair_track = keys[pair_key[keep], 1]
        pair_nic = pair_nic[keep]
        order = np.argsort(pair_track, kind="stable")
        tracks, first_of = np.unique(pair_track[order], return_index=True)
        return {int(t): np.unique(n) for t, n in zip(tracks.tolist(), np.split(pair_nic[order], first_of[1:]))}

    def end_hour(self, obs: Observations, hour_end_ns: int) -> list[Track]:
        """The tracks the hour reports (seen this hour, or running when it began), each ended if
        silent for a restart gap at the hour's end; `obs`: the hour's observations."""
        self.hold_whole_hosts(obs)
        reported = [t for t in self.tracks if t.merged_into < 0 and (t.seen_this_hour or t.running_at_load)]
        for track in reported:
            if hour_end_ns - track.last_end_ns >= self.params.restart_gap_ns:
                track.status = "ended"
            if track.status == "ended" and not track.reported_end:
                self.events.append((track.job_id, "end", track.last_end_ns, "{}"))
                track.reported_end = True
        return reported

    def carried(self, hour_end_ns: int) -> RecognitionState:
        """Tracks the next hour may continue: running, or stopped recently on NICs no other job
        took (in creation order, so a newer job's NICs win when the state is loaded)."""
        owning = self.owners.owning()
        return RecognitionState(tuple(
            track.to_state(self.vocabulary)
            for index, track in enumerate(self.tracks)
            if index in owning
            and (track.status == "running" or hour_end_ns - track.last_end_ns <= self.params.restart_window_ns)
        ))
