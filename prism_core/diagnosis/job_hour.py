"""What the detectors read of one job's hour, as numpy arrays: its GPUs, flows, steps, recognition
events, and what the other jobs of the hour did with its hosts. Times are float seconds from the
hour's start; members (GPU addresses) and hosts are integer codes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import lookup
from prism_core.constants import KIND_CODES, UNCLASSIFIED
from prism_core.constants import NS_PER_S as NS
from prism_core.queue_pairs import source_ports
from prism_core.schema import STEPS, conform

from .params import DiagnosisParams

MAX_PAIR_TABLE = 1 << 24  # address pairs of a job looked up in a table (a byte each) up to this many


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class JobHour:
    job_id: str
    origin_ns: int  # the hour's start: times below are float seconds from here
    hour_end: float
    data_end: float  # how far the hour's data reaches (see `build`)
    addrs: np.ndarray  # member addresses (str), sorted
    host_of_addr: np.ndarray  # host code per address
    hosts: np.ndarray  # host names (str)
    gpus_of_host: np.ndarray  # job GPUs per host
    stage_of_host: np.ndarray  # most common pp_stage of the host's GPUs (-1 unknown)
    stage_of_addr: np.ndarray  # pp_stage of the GPU behind each address (-1 unknown)
    replica_of_addr: np.ndarray  # its dp_rank (-1 unknown)
    # flows between members, sorted by start
    start: np.ndarray
    end: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    port: np.ndarray  # source port (its queue pair's; -1: the record has none)
    shortest_timed: np.ndarray  # the shortest record its exporter's clock times (prism_core.resolution)
    sampled: np.ndarray  # bool: its exporter samples packets (an instant inside a transfer)
    kind: np.ndarray  # pair kind code (prism_core.constants)
    step: np.ndarray  # index of the step the flow starts in, -1 outside every step
    # large flows from members to outside the job, by start: checkpoint writes, or copies to
    # another job
    write_start: np.ndarray
    write_end: np.ndarray
    write_src: np.ndarray  # member code
    write_dst: np.ndarray  # destination address (str)
    write_bytes: np.ndarray
    write_to_storage: np.ndarray  # not to another job's address: a save (all are, membership unknown)
    # large flows from outside every job into members, by start: data or checkpoint loads
    read_start: np.ndarray
    read_end: np.ndarray
    read_dst: np.ndarray  # member code
    read_bytes: np.ndarray
    # steps, sorted by start
    step_start: np.ndarray
    step_end: np.ndarray
    duration: np.ndarray
    sync_s: np.ndarray  # the DP synchronization closing each step (nan: none seen)
    number: np.ndarray
    attempt: np.ndarray
    # the job's recognition events
    event_ns: np.ndarray
    event_kind: np.ndarray  # str
    # the other jobs' addresses and their hosts this hour: when each first and last used one
    other_addr: np.ndarray  # str
    other_host: np.ndarray  # str
    other_first: np.ndarray
    other_last: np.ndarray

    @classmethod
    def build(cls, job_id: str, flows: pa.Table, gpus: pa.Table, pairs: pa.Table, steps: pa.Table,
              events: pa.Table | None, membership: pa.Table | None, hour_start_ns: int, hour_end_ns: int,
              params: DiagnosisParams, shortest_timed_s: dict[str, float] | None = None,
              samplers: frozenset[str] = frozenset()) -> JobHour:
        """The hour of `job_id` from its tables. `membership` (prism_core.recognition.MEMBERSHIP, every job of
        the hour) tells which hosts other jobs took and how far the hour's data reaches: to the hour's
        end, unless the last flow of any job came more than `data_end_margin_s` before it (the data
        ends within this hour) or there was none; without it, the hour is complete and no host taken.
        `shortest_timed_s`: by exporter address, the shortest record whose length it times (an
        exporter not named, or none named: any record). `samplers`: the exporters that sample
        packets."""
        origin_ns = hour_start_ns
        members = _members(gpus, _gpus_behind(job_id, membership))
        addrs = members["addrs"]
        member_set = pa.array(addrs, pa.string())

        def code(table: pa.Table, name: str) -> np.ndarray:
            return lookup(table, name, member_set).astype(np.int64)

        src, dst = code(flows, "src_addr"), code(flows, "dst_addr")
        start = (flows["time_flow_start_ns"].to_numpy() - origin_ns) / NS
        end = (flows["time_flow_end_ns"].to_numpy() - origin_ns) / NS
        nbytes = flows["bytes"].to_numpy()
        src_member, dst_member, bulk = src >= 0, dst >= 0, nbytes >= params.checkpoint_write_bytes
        in_start_order = bool(np.all(start[1:] >= start[:-1]))  # records usually come so: so do all their subsets
        write_order = _by_start(start, src_member & ~dst_member & bulk, in_start_order)
        read_order = _by_start(start, ~src_member & dst_member & bulk, in_start_order)
        order = _by_start(start, src_member & dst_member, in_start_order)
        del src_member, dst_member, bulk
        step_columns = _steps(steps, origin_ns, params.min_step_s)
        write_dst = flows["dst_addr"].take(write_order).to_numpy(zero_copy_only=False).astype(str)
        others = _other_jobs(job_id, membership, origin_ns, hour_end_ns, params.data_end_margin_s)
        writes_and_reads = dict(
            write_start=start[write_order],
            write_end=end[write_order],
            write_src=src[write_order],
            write_dst=write_dst,
            write_bytes=nbytes[write_order],
            write_to_storage=~np.isin(write_dst, others["other_addr"]),
            read_start=start[read_order],
            read_end=end[read_order],
            read_dst=dst[read_order],
            read_bytes=nbytes[read_order],
        )
        # the flows between members in start order, one column at a time (each of a large job's
        # is hundreds of MB, and its unordered copy is dropped as the ordered one is made)
        start = start[order]
        end = end[order]
        src = src[order]
        dst = dst[order]
        nbytes = nbytes[order]
        kind = _flow_kinds(src, dst, code(pairs, "src_addr"), code(pairs, "dst_addr"), pairs["kind"].to_pylist(),
                           len(addrs))
        step = _step_of(start, step_columns["step_start"], step_columns["step_end"], params.boundary_slack_s)
        port = source_ports(flows, order)
        shortest_timed, sampled = np.zeros(len(order)), np.zeros(len(order), bool)
        named = sorted({*(shortest_timed_s or {}), *samplers})
        if named:
            exporter = lookup(flows, "sampler_address", pa.array(named, pa.string()))[order]  # -1: not named
            shortest_timed = np.r_[[(shortest_timed_s or {}).get(name, 0.0) for name in named], 0.0][exporter]
            if samplers:  # else none is sampled (the zeros above)
                sampled = np.r_[[name in samplers for name in named], False][exporter]
        return cls(
            job_id=job_id,
            origin_ns=origin_ns,
            hour_end=(hour_end_ns - origin_ns) / NS,
            data_end=others.pop("data_end"),
            **members,
            start=start,
            end=end,
            src=src,
            dst=dst,
            nbytes=nbytes,
            port=port,
            shortest_timed=shortest_timed,
            sampled=sampled,
            kind=kind,
            step=step,
            **writes_and_reads,
            **step_columns,
            **_events(events),
            **others,
        )

    @property
    def n_steps(self) -> int:
        return len(self.step_start)

    @cached_property
    def split(self) -> np.ndarray:
        """Per step: part of its flows fall in another hour (no evidence of who was late or slow)."""
        return (self.step_start < 0) | (self.step_end > self.hour_end)

    def ns(self, seconds: float) -> int:
        return self.origin_ns + int(round(seconds * NS))

    def seconds(self, ns: int) -> float:
        return (ns - self.origin_ns) / NS

    @cached_property
    def latest_end(self) -> np.ndarray:
        """Per flow: the latest end of the flows up to it (the flows come by start)."""
        return np.maximum.accumulate(self.end) if len(self.end) else self.end

    def hosts_active(self, lo: float, hi: float) -> np.ndarray:
        """Codes of the hosts that exchanged traffic within [lo, hi]."""
        # only the flows from the first that may end at or past `lo` to the last that starts by
        # `hi` are looked at: a window's, not the hour's (it is asked several times a job)
        first = int(np.searchsorted(self.latest_end, lo, side="left"))
        last = int(np.searchsorted(self.start, hi, side="right"))
        during = np.flatnonzero(self.end[first:last] >= lo) + first
        return np.unique(self.host_of_addr[np.concatenate([self.src[during], self.dst[during]])])

    def host_names_active(self, lo: float, hi: float) -> list[str]:
        return self.hosts[self.hosts_active(lo, hi)].tolist()

    def gpus_active(self, lo: float, hi: float) -> int:
        """GPUs of the hosts active within [lo, hi]: the job's size at that time (a replaced host
        is not counted twice); all the job's GPUs when none was."""
        hosts = self.hosts_active(lo, hi)
        return int(self.gpus_of_host[hosts].sum() if len(hosts) else self.gpus_of_host.sum())

    def hosts_taken_after(self, hosts: list[str], after: float) -> float:
        """When another job first used one of this job's GPUs on `hosts` after `after` (inf: never
        this hour). Platforms allocate GPUs: a job on the same hosts' other GPUs takes nothing. An
        hour without the job's addresses (silent, its membership gone) judges by the hosts."""
        mine = np.isin(self.other_host, hosts) & (self.other_last > after)
        if len(self.addrs):
            mine &= np.isin(self.other_addr, self.addrs)
        return float(max(self.other_first[mine].min(), after)) if mine.any() else np.inf

    def event_kinds(self, lo_ns: int, hi_ns: int, window_s: float) -> list[str]:
        """Kinds of the recognition events within `window_s` of [lo_ns, hi_ns]."""
        window_ns = int(window_s * NS)
        near = (self.event_ns >= lo_ns - window_ns) & (self.event_ns <= hi_ns + window_ns)
        return sorted(set(self.event_kind[near].tolist()))


@dataclass(frozen=True, eq=False)
class StepMasks:
    """Per step of the hour, what earlier detectors found that later ones must leave out."""

    warmup: np.ndarray  # after a (re)start: slow by nature (restarts)
    checkpoint: np.ndarray  # the job saving its state (checkpoints)
    windowed: np.ndarray  # inside a straggler or slow-link window (windows)
    merged: np.ndarray  # carrying several steps' traffic: a boundary the records missed (slow_steps)


def _gpus_behind(job_id: str, membership: pa.Table | None) -> pa.Table | None:
    """addr, gpus_max: GPUs each of the job's addresses serves (a host may have 4 NICs for 8
    GPUs), as recognition read them from the inventory."""
    if membership is None or "gpus" not in membership.column_names:
        return None
    mine = membership.filter(pc.equal(membership["job_id"], job_id))
    return mine.group_by("addr", use_threads=False).aggregate([("gpus", "max")])


def _members(gpus: pa.Table, gpus_behind: pa.Table | None) -> dict[str, np.ndarray]:
    """The job's addresses (each once, sorted) and what is behind them; `gpus_behind` (addr,
    gpus_max): GPUs per address, one where it does not say."""
    gpus = gpus.sort_by("addr")
    addr_col = gpus["addr"].to_numpy(zero_copy_only=False)
    keep = np.r_[True, addr_col[1:] != addr_col[:-1]] if len(addr_col) else np.zeros(0, bool)
    gpus = gpus.filter(pa.array(keep))
    addrs = gpus["addr"].to_numpy(zero_copy_only=False).astype(str)
    served = np.ones(len(addrs), np.int64)
    if gpus_behind is not None and gpus_behind.num_rows:
        row = pc.fill_null(pc.index_in(gpus["addr"], value_set=gpus_behind["addr"]), -1).to_numpy()
        behind = pc.fill_null(gpus_behind["gpus_max"], 1).to_numpy()
        served[row >= 0] = np.maximum(behind[row[row >= 0]], 1)
    hosts, host_of_addr = np.unique(gpus["host"].to_numpy(zero_copy_only=False).astype(str), return_inverse=True)
    stages = pc.fill_null(gpus["pp_stage"], -1).to_numpy().astype(np.int64)
    stage_of_host = np.full(len(hosts), -1)
    for h in range(len(hosts)):
        values, counts = np.unique(stages[host_of_addr == h], return_counts=True)
        stage_of_host[h] = values[np.argmax(counts)]
    return {
        "addrs": addrs,
        "host_of_addr": host_of_addr,
        "hosts": hosts,
        "gpus_of_host": np.bincount(host_of_addr, served, minlength=len(hosts)).astype(np.int64),
        "stage_of_host": stage_of_host,
        "stage_of_addr": stages,
        "replica_of_addr": pc.fill_null(gpus["dp_rank"], -1).to_numpy().astype(np.int64),
    }


def _flow_kinds(src: np.ndarray, dst: np.ndarray, pair_src: np.ndarray, pair_dst: np.ndarray,
                pair_kinds: list[str], n_addrs: int) -> np.ndarray:
    """The kind code of each flow's pair (UNCLASSIFIED for a pair no kind was given to); flows
    between members (`src`, `dst` codes >= 0)."""
    n = max(n_addrs, 1)
    pair_kind = np.array([KIND_CODES.get(k, UNCLASSIFIED) for k in pair_kinds], np.int8)
    known = (pair_src >= 0) & (pair_dst >= 0)
    pair_key = pair_src[known] * n + pair_dst[known]
    if n * n <= MAX_PAIR_TABLE:
        # a kind per address pair in a table: one lookup per flow, no binary search
        kind_of_key = np.full(n * n, UNCLASSIFIED, np.int8)
        np.minimum.at(kind_of_key, pair_key, pair_kind[known])  # a pair with several kinds: the lowest
        return kind_of_key[src * n + dst]
    key_order = np.lexsort((pair_kind[known], pair_key))  # a pair with several kinds: the lowest
    pair_key, pair_kind = pair_key[key_order], pair_kind[known][key_order]
    flow_key = src * n + dst
    at = np.clip(np.searchsorted(pair_key, flow_key), 0, max(len(pair_key) - 1, 0))
    found = (pair_key[at] == flow_key) if len(pair_key) else np.zeros(len(flow_key), bool)
    return np.where(found, pair_kind[at] if len(pair_kind) else UNCLASSIFIED, UNCLASSIFIED).astype(np.int8)


def _steps(steps: pa.Table, origin_ns: int, min_step_s: float) -> dict[str, np.ndarray]:
    """The step columns, sorted by start, without the steps shorter than `min_step_s` (artifacts
    of step division)."""
    steps = conform(steps, STEPS).sort_by("start")
    step_start = (steps["start"].cast(pa.int64()).to_numpy() - origin_ns) / NS
    step_end = (steps["end"].cast(pa.int64()).to_numpy() - origin_ns) / NS
    real = step_end - step_start >= min_step_s
    steps, step_start, step_end = steps.filter(pa.array(real)), step_start[real], step_end[real]
    return {
        "step_start": step_start,
        "step_end": step_end,
        "duration": step_end - step_start,
        "sync_s": pc.fill_null(steps["sync_s"], np.nan).to_numpy(),
        "number": pc.fill_null(steps["step"], -1).to_numpy(),
        "attempt": pc.fill_null(steps["attempt"], 0).to_numpy().astype(np.int64),
    }


def _by_start(start: np.ndarray, rows: np.ndarray, in_start_order: bool) -> np.ndarray:
    """The indices of the `rows` (a mask), stably by `start`: as they are where they come in start
    order already (`in_start_order`: every row does; records usually do, and a sort of them, even
    sorted, costs more than the check)."""
    at = np.flatnonzero(rows)
    if in_start_order:
        return at
    times = start[at]
    return at if np.all(times[1:] >= times[:-1]) else at[np.argsort(times, kind="stable")]


def _step_of(start: np.ndarray, step_start: np.ndarray, step_end: np.ndarray, slack_s: float) -> np.ndarray:
    """Index of the step each flow starts in (a flow `slack_s` early still belongs to it), -1
    outside every step; `start` sorted."""
    shifted = start + slack_s
    # the flows of a step lie side by side, from the first at or past its start: those before the
    # first at or past its end are in it, the rest outside (two searches per step, no pass per flow)
    opens = np.searchsorted(shifted, step_start, side="left")
    next_opens = np.r_[opens[1:], len(shifted)]
    closes = np.clip(np.searchsorted(shifted, step_end + slack_s, side="left"), opens, next_opens)
    runs = np.stack([closes - opens, next_opens - closes], axis=1).ravel()
    codes = np.stack([np.arange(len(step_start)), np.full(len(step_start), -1)], axis=1).ravel()
    return np.repeat(np.r_[-1, codes], np.r_[opens[0] if len(opens) else len(shifted), runs])


def _events(events: pa.Table | None) -> dict[str, np.ndarray]:
    if events is None or not events.num_rows:
        return {"event_ns": np.zeros(0, np.int64), "event_kind": np.zeros(0, str)}
    return {"event_ns": events["at_ns"].to_numpy(), "event_kind": events["kind"].to_numpy(zero_copy_only=False)}


def _other_jobs(job_id: str, membership: pa.Table | None, origin_ns: int, hour_end_ns: int,
                data_end_margin_s: float) -> dict:
    """The other jobs' addresses, their hosts and when they used them (seconds), and how far the
    hour's data reaches."""
    hour_end = (hour_end_ns - origin_ns) / NS
    none = {"other_addr": np.zeros(0, str), "other_host": np.zeros(0, str),
            "other_first": np.zeros(0), "other_last": np.zeros(0)}
    if membership is None:
        return {**none, "data_end": hour_end}
    if not membership.num_rows:
        return {**none, "data_end": 0.0}  # no data at all this hour
    last = (int(pc.max(membership["last_ns"]).as_py()) - origin_ns) / NS
    others = membership.filter(pc.not_equal(membership["job_id"], job_id))
    return {
        "data_end": hour_end if last >= hour_end - data_end_margin_s else last,
        "other_addr": others["addr"].to_numpy(zero_copy_only=False).astype(str),
        "other_host": pc.fill_null(others["host"], "").to_numpy(zero_copy_only=False).astype(str),
        "other_first": (others["first_ns"].to_numpy() - origin_ns) / NS,
        "other_last": (others["last_ns"].to_numpy() - origin_ns) / NS,
    }
