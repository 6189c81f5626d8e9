"""Job recognition per minute and job tracking across minutes, hours and restarts.

Per minute, the GPU NICs that exchange repeated traffic form connected components
(scipy.sparse.csgraph over integer-coded addresses). On a rail-aligned fabric one job shows up as
up to one component per rail over the same hosts, so components of a minute whose host sets are
similar are merged (LLMPrism's topology-aware merge). Jobs own whole hosts, so a job's GPUs are
all NICs of its hosts, and a component busy on hosts all inside another's, at the same time on
one of them, is part of that job (rails with only the pipeline hops between two hosts of a wide
job). Traffic between GPU NICs whose sizes do not repeat neither forms nor joins jobs, but counts
for the job of each NIC it leaves or reaches within that job's stretch of traffic there (a job's
last gradient sync, one flow per pair, outlasts its last activation sends).

Tracking links each minute's jobs to the jobs already known: a job keeps its id while its hosts
keep talking (or write a checkpoint to storage: a large model's save outlasts the silence that
stops a job), and across a stop-and-resume on the same hosts (or with one host replaced) when the
flow sizes it uses (its signature: activation and bucket sizes) are the same. A new job on hosts
another just left has other sizes and gets a new id. Ids are deterministic (first minute + hosts),
so re-running an hour from the same previous state gives the same ids.

A job that ends and another that starts on its hosts seconds later in the same minute stay apart
when they are silent in between: their pair rows split there (see `prism_core.minutes`), their
parts only join while they talk at the same time, and traffic after a silence is judged by its
sizes even on a job minutes old. Without such a silence they can share a pair's flow_minutes row
(one row spans both): that minute is split when the new job takes the hosts. Where each job also
used host pairs the other did not, those tell the times: the new job begins with its first row on
a pair of its own (or the shared pairs' traffic in the moments before it) and the old one holds
the hosts until then (its last rows on shared pairs may carry a size both use, an all-to-all's
family).
Otherwise the old job keeps its traffic up to the last row of its own flow sizes, and the new job
begins after it (or at the first row of its sizes, if later); a row spanning both jobs carries
only its most frequent size, so it can look like either job's: the old job's end is where the
fewest rows fall on the wrong side. A job minutes old may not have shown all its sizes yet, so its
traffic continues it whatever the sizes, but not traffic on only some of the hosts it showed: that
is how a new job on hosts a short job left looks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from prism_core.arrays import time_segments
from prism_core.constants import CHECKPOINT_FLOW_BYTES
from prism_core.minutes import HOUR_NS, MINUTE_NS, PAIR_PAUSE_NS
from prism_core.schema import JOBS, TS, conform
from prism_core.topology import Topology

# Components of one minute whose host sets have at least this Jaccard similarity are one job
# (one component per rail over the same hosts).
DEFAULT_JACCARD = 0.5
# Pauses up to this long inside one NIC's traffic of a minute are bridged; longer ones separate
# a job that stopped from one that started on the same hosts within the minute (as they separate
# the flow_minutes rows of a pair whose flow sizes change across one).
SEGMENT_GAP_NS = PAIR_PAUSE_NS
# An edge is job traffic when some flow size repeats on it within the minute: activations and
# gradient buckets repeat every micro-batch and step, one-off background transfers do not.
MIN_REPEATED_FLOWS = 2
# A minute's job continues a running job when this share of the smaller host set is shared.
TRACK_OVERLAP = 0.5
# Traffic on a job's hosts continues the job without comparing flow sizes only when it comes
# within this much silence and on exactly the job's hosts: a new job can start on all or part of
# the hosts another left seconds before.
RESUME_CHECK_NS = 10_000_000_000
# Tracks that began this long ago or less may still be parts of one job not yet seen whole.
YOUNG_NS = 3 * MINUTE_NS
# Silence longer than this between a job's flows is a stop; resuming after it is a restart.
RESTART_GAP_NS = 60_000_000_000
# A stopped job that resumes within this time on the same hosts (or one replaced) is restarted.
RESTART_WINDOW_NS = 30 * MINUTE_NS
# A minute's bytes from a GPU NIC to an address that is no GPU (storage) this large are a
# checkpoint save: the job is busy, though its GPUs do not talk to each other (a large model's
# save outlasts RESTART_GAP_NS).
SAVE_BYTES = CHECKPOINT_FLOW_BYTES
# Share of a resumed job's repeated bytes in flow sizes the stopped job also used.
SIGNATURE_MATCH = 0.5
# Flow sizes kept per job as its signature (most frequent first).
SIGNATURE_SIZES = 32

STATE_VERSION = 1

MEMBERSHIP = pa.schema(
    [
        ("job_id", pa.string()),
        ("addr", pa.string()),
        ("host", pa.string()),
        ("gpu", pa.int32()),
        ("first_ns", pa.int64()),
        ("last_ns", pa.int64()),
    ]
)

EVENTS = pa.schema(
    [
        ("job_id", pa.string()),
        ("kind", pa.string()),  # start | end | restart | host_replaced
        ("at_ns", pa.int64()),
        ("detail", pa.string()),  # JSON: hosts (start), gap_s (restart), removed/added hosts
    ]
)


@dataclass
class Recognition:
    jobs: pa.Table  # JOBS columns (dp/pp/tp null: parallelism fills them)
    membership: pa.Table  # MEMBERSHIP: which addresses belonged to which job when, this hour
    events: pa.Table  # EVENTS: start | end | restart | host_replaced
    state: dict  # JSON-serializable, handed to the next hour


@dataclass
class _Observations:
    """The jobs seen in each minute of an hour, as flat arrays (one entry per minute-job)."""

    minute_ns: np.ndarray  # int64, start of the minute
    first_ns: np.ndarray  # int64, first flow start of the job in the minute
    last_ns: np.ndarray  # int64, last flow end
    host_ptr: np.ndarray  # CSR over host codes: hosts of observation k are
    host_codes: np.ndarray  #   host_codes[host_ptr[k]:host_ptr[k + 1]], sorted
    size_ptr: np.ndarray  # CSR over the repeated flow sizes of each observation
    sizes: np.ndarray  # int64 flow size
    size_flows: np.ndarray  # int64 flows of that size
    edge_ptr: np.ndarray  # CSR over the job-traffic rows of each observation:
    edge_src_host: np.ndarray  #   host codes of both ends,
    edge_dst_host: np.ndarray
    edge_size: np.ndarray  #   top size, first flow start and last flow end of the row
    edge_first_ns: np.ndarray
    edge_last_ns: np.ndarray

    def hosts(self, k: int) -> np.ndarray:
        return self.host_codes[self.host_ptr[k] : self.host_ptr[k + 1]]

    def signature(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        span = slice(self.size_ptr[k], self.size_ptr[k + 1])
        return self.sizes[span], self.size_flows[span]

    def edges(self, ks: np.ndarray) -> tuple[np.ndarray, ...]:
        """src host, dst host, top size, first start, last end of the rows of observations `ks`."""
        rows = np.concatenate([np.arange(self.edge_ptr[k], self.edge_ptr[k + 1]) for k in ks.tolist()])
        columns = (self.edge_src_host, self.edge_dst_host, self.edge_size, self.edge_first_ns, self.edge_last_ns)
        return tuple(column[rows] for column in columns)


@dataclass
class _Track:
    """One job as tracking knows it."""

    job_id: str
    hosts: np.ndarray  # sorted host codes
    first_seen_ns: int
    last_end_ns: int
    restarts: int = 0
    status: str = "running"
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # signature
    size_flows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size_minutes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # minutes seen
    seen_this_hour: bool = False
    born_this_hour: bool = False
    running_at_load: bool = False  # handed over running by the previous hour: owes a row this hour
    merged_into: int = -1  # the track that absorbed this one: one job first seen in parts
    reported_end: bool = False  # an `end` event was already emitted for the current stop
    # its observations in the latest minute it was seen this hour, and that minute's presence entry
    last_observations: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last_presence: int = -1


def recognize_minute(
    minute_pairs: pa.Table, topology: Topology, *, jaccard: float = DEFAULT_JACCARD
) -> list[np.ndarray]:
    """The jobs communicating in one minute's `flow_minutes` rows: for each, the sorted addresses
    of all NICs of its hosts."""
    vocabulary = _HostVocabulary(topology)
    minute_ns = _minute_ns(minute_pairs)
    observations = _observe(minute_pairs, vocabulary, minute_ns, jaccard)
    return [
        np.sort(vocabulary.nics(observations.hosts(k))["addr"].to_numpy(zero_copy_only=False))
        for k in range(len(observations.minute_ns))
    ]


def recognize_hour(
    flow_minutes: pa.Table,
    topology: Topology,
    previous_state: dict | None,
    hour_start_ns: int,
    *,
    jaccard: float = DEFAULT_JACCARD,
) -> Recognition:
    """Jobs of one hour from its `flow_minutes`, continuing the jobs of `previous_state`."""
    vocabulary = _HostVocabulary(topology)
    hour_end_ns = hour_start_ns + HOUR_NS
    tracks = _load_state(previous_state, vocabulary)
    observations = _observe(flow_minutes, vocabulary, _minute_ns(flow_minutes), jaccard)
    tracker = _Tracker(tracks, vocabulary, _saves(flow_minutes, vocabulary))
    for minute_rows in _rows_by_minute(observations.minute_ns):
        tracker.observe_minute(observations, minute_rows)
    return tracker.close_hour(hour_end_ns)


def _saves(flow_minutes: pa.Table, vocabulary: _HostVocabulary) -> np.ndarray:
    """(host code, first start, last end) of each minute's checkpoint writes (SAVE_BYTES or more
    from a GPU NIC to an address that is no GPU), by first start; shape (n, 3)."""
    src, dst = flow_minutes["src_addr"], flow_minutes["dst_addr"]
    topology = vocabulary.topology
    writes = flow_minutes.filter(pa.array(
        topology.is_gpu_nic(src) & ~topology.is_gpu_nic(dst)
        & (flow_minutes["bytes"].to_numpy(zero_copy_only=False) >= SAVE_BYTES)))
    if writes.num_rows == 0:
        return np.zeros((0, 3), np.int64)
    saves = np.stack([vocabulary.encode(vocabulary.host_of(writes["src_addr"].combine_chunks())),
                      writes["first_start_ns"].to_numpy(), writes["last_end_ns"].to_numpy()], axis=1)
    return saves[np.argsort(saves[:, 1], kind="stable")]


class _HostVocabulary:
    """Integer codes for host names, and each host's NICs from the topology. Without an inventory
    every address is its own host with one NIC (gpu 0)."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.names: list[str] = []
        self._codes: dict[str, int] = {}
        by_host = topology.table.sort_by([("host", "ascending"), ("gpu", "ascending")])
        self._nic_table = by_host.select(["addr", "host", "gpu"])

    def host_of(self, addrs: pa.Array) -> pa.Array:
        return self.topology.lookup(addrs)["host"].combine_chunks()

    def encode(self, hosts: pa.Array | list[str]) -> np.ndarray:
        """Codes of `hosts`, adding unseen names to the vocabulary."""
        encoded = pa.array(hosts, pa.string()).dictionary_encode()
        codes = np.array([self._code(name) for name in encoded.dictionary.to_pylist()], np.int64)
        return codes[encoded.indices.to_numpy(zero_copy_only=False)] if len(codes) else codes

    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self.names)
            self.names.append(name)
        return code

    def name_list(self, codes: np.ndarray) -> list[str]:
        return sorted(self.names[c] for c in codes.tolist())

    def nics(self, codes: np.ndarray) -> pa.Table:
        """addr, host, gpu of every NIC of the hosts `codes`, sorted by host then gpu."""
        hosts = pa.array(self.name_list(codes), pa.string())
        if not self.topology.from_inventory:
            return pa.table({"addr": hosts, "host": hosts, "gpu": pa.array(np.zeros(len(hosts), np.int32))})
        return self._nic_table.filter(pc.is_in(self._nic_table["host"], value_set=hosts))


def _minute_ns(flow_minutes: pa.Table) -> np.ndarray:
    return flow_minutes["minute"].cast(pa.int64()).to_numpy()


def _job_edges(flow_minutes: pa.Table, topology: Topology) -> tuple[pa.Table, pa.Table]:
    """The rows that are job traffic: between two different GPU NICs, with a repeated size; and
    the other rows between two different GPU NICs (no size repeats on them that minute)."""
    if flow_minutes.num_rows == 0:
        return flow_minutes, flow_minutes
    src, dst = flow_minutes["src_addr"], flow_minutes["dst_addr"]
    between_gpus = (
        topology.is_gpu_nic(src) & topology.is_gpu_nic(dst) & pc.not_equal(src, dst).to_numpy(zero_copy_only=False)
    )
    repeated = flow_minutes["top_size_flows"].to_numpy(zero_copy_only=False) >= MIN_REPEATED_FLOWS
    return flow_minutes.filter(pa.array(between_gpus & repeated)), flow_minutes.filter(pa.array(between_gpus & ~repeated))


def _observe(
    flow_minutes: pa.Table, vocabulary: _HostVocabulary, minute_ns: np.ndarray, jaccard: float
) -> _Observations:
    """Per minute: connected components of the job-traffic graph, then components whose host sets
    have Jaccard >= `jaccard` merged into one job. All minutes are solved in one graph whose nodes
    are an address's traffic in one minute (split where it pauses for over SEGMENT_GAP_NS, so that
    a job that stops and another that starts on the same NIC within one minute stay apart), so no
    component or merge crosses a minute."""
    edges, loose = _job_edges(flow_minutes.append_column("_minute_ns", pa.array(minute_ns)), vocabulary.topology)
    if edges.num_rows == 0:
        empty, pointer = np.zeros(0, np.int64), np.zeros(1, np.int64)
        return _Observations(empty, empty, empty, pointer, empty, pointer, empty, empty, pointer, *[empty] * 5)
    n_edges = edges.num_rows
    both = pa.concat_arrays([edges["src_addr"].combine_chunks(), edges["dst_addr"].combine_chunks()])
    encoded = both.dictionary_encode()
    addr_code = encoded.indices.to_numpy().astype(np.int64)
    host_of_addr = vocabulary.encode(vocabulary.host_of(encoded.dictionary))
    n_addrs = len(encoded.dictionary)

    edge_minutes, edge_minute_pos = np.unique(edges["_minute_ns"].to_numpy(), return_inverse=True)
    ends_key = np.tile(edge_minute_pos, 2) * n_addrs + addr_code  # (minute, address) of both ends
    span = (np.tile(edges["first_start_ns"].to_numpy(), 2), np.tile(edges["last_end_ns"].to_numpy(), 2))
    node_of_end, node_key, node_first_ns, node_last_ns = time_segments(ends_key, *span, SEGMENT_GAP_NS)
    src_node, dst_node = node_of_end[:n_edges], node_of_end[n_edges:]
    n_nodes = len(node_key)
    graph = sp.coo_matrix((np.ones(n_edges, np.int8), (src_node, dst_node)), shape=(n_nodes, n_nodes))
    _, component = connected_components(graph, directed=False)

    # Rail merge: host keys carry the minute, so components of different minutes share none.
    node_minute_pos = node_key // n_addrs
    node_addr = node_key % n_addrs
    n_hosts = len(vocabulary.names)
    node_host_key = node_minute_pos * n_hosts + host_of_addr[node_addr]
    job = _merge_by_jaccard(component, node_host_key, node_first_ns, node_last_ns, jaccard)
    job = _merge_concurrent_parts(job, node_host_key, node_first_ns, node_last_ns)

    # Order jobs by (minute, first traffic, smallest host name) so tracking sees them
    # deterministically, and in the minute where a job stops and another takes its hosts, first
    # the one that stopped.
    job_minute = np.zeros(job.max() + 1, np.int64)
    job_minute[job] = node_minute_pos
    job_host_pairs = np.unique(np.stack([job, host_of_addr[node_addr]], axis=1), axis=0)
    host_rank = np.argsort(np.argsort(np.array(vocabulary.names, dtype=object)))
    smallest_host = np.full(len(job_minute), np.iinfo(np.int64).max)
    np.minimum.at(smallest_host, job_host_pairs[:, 0], host_rank[job_host_pairs[:, 1]])
    job_first_ns = np.full(len(job_minute), np.iinfo(np.int64).max)
    np.minimum.at(job_first_ns, job, node_first_ns)
    order = np.lexsort((smallest_host, job_first_ns, job_minute))
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    job = renumber[job]
    job_host_pairs[:, 0] = renumber[job_host_pairs[:, 0]]
    job_host_pairs = job_host_pairs[np.lexsort((job_host_pairs[:, 1], job_host_pairs[:, 0]))]
    n_jobs = len(order)

    edge_job = job[src_node]
    first_ns = np.full(n_jobs, np.iinfo(np.int64).max)
    last_ns = np.full(n_jobs, np.iinfo(np.int64).min)
    np.minimum.at(first_ns, edge_job, edges["first_start_ns"].to_numpy())
    np.maximum.at(last_ns, edge_job, edges["last_end_ns"].to_numpy())
    loose_job, loose_first_ns, loose_last_ns = _rows_within_jobs(
        loose, encoded.dictionary, edge_minutes, n_addrs, node_key, node_first_ns, node_last_ns, job
    )
    np.minimum.at(first_ns, loose_job, loose_first_ns)
    np.maximum.at(last_ns, loose_job, loose_last_ns)

    # Signature: flows per repeated size, per job.
    size_keys = np.stack([edge_job, edges["top_size"].to_numpy()], axis=1)
    size_pairs, size_of_edge = np.unique(size_keys, axis=0, return_inverse=True)
    size_flows = np.bincount(size_of_edge.ravel(), weights=edges["top_size_flows"].to_numpy(), minlength=len(size_pairs))

    by_job = np.argsort(edge_job, kind="stable")
    return _Observations(
        minute_ns=edge_minutes[job_minute[order]],
        first_ns=first_ns,
        last_ns=last_ns,
        host_ptr=_csr_pointer(job_host_pairs[:, 0], n_jobs),
        host_codes=job_host_pairs[:, 1],
        size_ptr=_csr_pointer(size_pairs[:, 0], n_jobs),
        sizes=size_pairs[:, 1],
        size_flows=size_flows.astype(np.int64),
        edge_ptr=_csr_pointer(edge_job[by_job], n_jobs),
        edge_src_host=host_of_addr[addr_code[:n_edges][by_job]],
        edge_dst_host=host_of_addr[addr_code[n_edges:][by_job]],
        edge_size=edges["top_size"].to_numpy()[by_job],
        edge_first_ns=edges["first_start_ns"].to_numpy()[by_job],
        edge_last_ns=edges["last_end_ns"].to_numpy()[by_job],
    )


def _rows_within_jobs(
    rows: pa.Table,
    addrs: pa.Array,
    minutes: np.ndarray,
    n_addrs: int,
    node_key: np.ndarray,
    node_first_ns: np.ndarray,
    node_last_ns: np.ndarray,
    node_job: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(job, first start, last end) for each end of the `rows` (GPU-to-GPU traffic without a
    repeated size) that lies within one stretch of a job's traffic on that NIC in that minute
    (bridging pauses up to SEGMENT_GAP_NS, as the nodes do, and touching no other
    stretch): a NIC serves one job at a time. Such rows cannot tell a job or join its parts, but
    are its traffic: a gradient sync with one bucket per pair sends one flow per pair in the
    minute of a job's last step, after its last repeated activation sends, and the job's
    membership must reach to its end."""
    empty = np.zeros(0, np.int64)
    if rows.num_rows == 0 or len(node_key) == 0:
        return empty, empty, empty
    minute = rows["_minute_ns"].to_numpy()
    position = np.minimum(np.searchsorted(minutes, minute), len(minutes) - 1)
    first, last = rows["first_start_ns"].to_numpy(), rows["last_end_ns"].to_numpy()
    base = int(min(node_first_ns.min(), first.min())) - 2 * SEGMENT_GAP_NS
    width = int(max(node_last_ns.max(), last.max())) - base + 2 * SEGMENT_GAP_NS + 1
    dense = np.r_[0, np.cumsum(node_key[1:] != node_key[:-1])]  # nodes are sorted by (key, first)
    if (int(dense[-1]) + 1) * width >= np.iinfo(np.int64).max:
        raise OverflowError("too many (minute, address) keys for one hour of flow_minutes")
    stretch_start = dense * width + (node_first_ns - base)

    def stretch_of(column: str) -> np.ndarray:
        """The stretch each row's end NIC is in when the row runs, -1 where none (or two)."""
        code = pc.index_in(rows[column], value_set=addrs)
        known = pc.is_valid(code).to_numpy(zero_copy_only=False) & (minutes[position] == minute)
        key = position * n_addrs + pc.fill_null(code, 0).to_numpy().astype(np.int64)
        at = np.minimum(np.searchsorted(node_key, key), len(node_key) - 1)
        known &= node_key[at] == key
        # the latest stretch of the key that starts before the row ends (with the bridging)
        node = np.searchsorted(stretch_start, dense[at] * width + (last + SEGMENT_GAP_NS - base), side="right") - 1
        node = np.maximum(node, 0)
        inside = known & (node_key[node] == key) & (node_last_ns[node] + SEGMENT_GAP_NS >= first)
        inside &= first + SEGMENT_GAP_NS >= node_first_ns[node]
        earlier = np.maximum(node - 1, 0)
        inside &= ~((node > 0) & (node_key[earlier] == key) & (node_last_ns[earlier] + SEGMENT_GAP_NS >= first))
        return np.where(inside, node, -1)

    node = np.concatenate([stretch_of("src_addr"), stretch_of("dst_addr")])
    inside = node >= 0
    return node_job[node[inside]], np.tile(first, 2)[inside], np.tile(last, 2)[inside]


def _label_hosts(label: np.ndarray, node_host_key: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, sp.coo_matrix]:
    """Each (label, host key) of the nodes once, as label * n_keys + host key, sorted: the
    position of every node's among them, those keys, n_keys, and how many host keys every two
    labels share (sparse COO)."""
    n_keys = int(node_host_key.max()) + 1
    keys, position = np.unique(label.astype(np.int64) * n_keys + node_host_key, return_inverse=True)
    n_labels = int(label.max()) + 1
    incidence = sp.csr_matrix((np.ones(len(keys), np.int32), np.divmod(keys, n_keys)), shape=(n_labels, n_keys))
    return position.ravel(), keys, n_keys, (incidence @ incidence.T).tocoo()


def _joined(label: np.ndarray, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """Node labels with labels `row[i]` and `col[i]` joined (transitively)."""
    n_labels = int(label.max()) + 1
    merge = sp.coo_matrix((np.ones(len(row), np.int8), (row, col)), shape=(n_labels, n_labels))
    _, joined = connected_components(merge, directed=False)
    return joined[label]


def _merge_by_jaccard(
    component: np.ndarray, node_host_key: np.ndarray, node_first_ns: np.ndarray, node_last_ns: np.ndarray, jaccard: float
) -> np.ndarray:
    """Job label of each node: components joined when their host sets have Jaccard >= `jaccard`
    and they talk at the same time (bridging pauses up to SEGMENT_GAP_NS): a job's rails run side
    by side, a job and the next one on its hosts one after the other."""
    _, keys, n_keys, shared = _label_hosts(component, node_host_key)
    n_comp = int(component.max()) + 1
    sizes = np.bincount(keys // n_keys, minlength=n_comp)
    union = sizes[shared.row] + sizes[shared.col] - shared.data
    first_ns = np.full(n_comp, np.iinfo(np.int64).max)
    last_ns = np.full(n_comp, np.iinfo(np.int64).min)
    np.minimum.at(first_ns, component, node_first_ns)
    np.maximum.at(last_ns, component, node_last_ns)
    together = (first_ns[shared.row] <= last_ns[shared.col] + SEGMENT_GAP_NS) & (
        first_ns[shared.col] <= last_ns[shared.row] + SEGMENT_GAP_NS
    )
    similar = (shared.data >= jaccard * union) & together
    return _joined(component, shared.row[similar], shared.col[similar])


def _merge_concurrent_parts(
    job: np.ndarray, node_host_key: np.ndarray, node_first_ns: np.ndarray, node_last_ns: np.ndarray
) -> np.ndarray:
    """Job label of each node, with every job of a minute merged into another whose host set holds
    all of its hosts, when the two are busy on a host they share at the same time. Jobs own whole
    hosts, so two components active on one host at once are one job: rails that carry only
    pipeline hops between two hosts of a wide job form components too small for the Jaccard
    merge, and at a job's last seconds their flow sizes can differ from every earlier minute's.
    Hosts only partly shared, or used one after the other, stay apart (a job on part of the
    hosts of one that stopped seconds before)."""
    position, keys, n_keys, shared = _label_hosts(job, node_host_key)
    key_job, key_host = np.divmod(keys, n_keys)
    first_ns = np.full(len(keys), np.iinfo(np.int64).max)
    last_ns = np.full(len(keys), np.iinfo(np.int64).min)
    np.minimum.at(first_ns, position, node_first_ns)
    np.maximum.at(last_ns, position, node_last_ns)
    n_jobs = int(job.max()) + 1
    hosts_of_job = np.bincount(key_job, minlength=n_jobs)
    inside = (shared.row != shared.col) & (shared.data == hosts_of_job[shared.row])
    part, whole = shared.row[inside].astype(np.int64), shared.col[inside].astype(np.int64)
    if len(part) == 0:
        return job
    # every (part, whole, host of the part): are both busy on that host at once?
    pointer = _csr_pointer(key_job, n_jobs)
    counts = hosts_of_job[part]
    pair_of = np.repeat(np.arange(len(part)), counts)
    in_part = pointer[part][pair_of] + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    in_whole = np.searchsorted(keys, whole[pair_of] * n_keys + key_host[in_part])
    together = (first_ns[in_part] < last_ns[in_whole]) & (first_ns[in_whole] < last_ns[in_part])
    concurrent = np.bincount(pair_of, weights=together, minlength=len(part)) > 0
    return _joined(job, part[concurrent], whole[concurrent])


def _csr_pointer(sorted_rows: np.ndarray, n_rows: int) -> np.ndarray:
    return np.searchsorted(sorted_rows, np.arange(n_rows + 1)).astype(np.int64)


def _rows_by_minute(minute_ns: np.ndarray) -> list[np.ndarray]:
    """Observation indices of each minute, in minute order (observations are sorted by minute)."""
    if len(minute_ns) == 0:
        return []
    starts = np.flatnonzero(np.r_[True, minute_ns[1:] != minute_ns[:-1]])
    return np.split(np.arange(len(minute_ns)), starts[1:])


def _job_id(minute_ns: int, host_names: list[str]) -> str:
    digest = hashlib.sha1(f"{minute_ns}|{','.join(host_names)}".encode()).hexdigest()
    return f"job-{digest[:12]}"


def _signature_share(sizes: np.ndarray, flows: np.ndarray, track: _Track) -> float:
    """Share of the observed repeated bytes in flow sizes the track's job also used. Weighing by
    bytes lets the gradient buckets (sized by the model and its sharding) outweigh activation
    sizes, which many models share. Only sizes seen in two minutes or more count once there are
    any: a minute where one job ends and the next starts on the same NIC pairs mixes both."""
    moved = sizes.astype(np.float64) * flows
    total = moved.sum()
    known = _known_sizes(track)
    if total == 0 or len(known) == 0:
        return 1.0  # nothing to compare: trust the hosts
    return float(moved[np.isin(sizes, known)].sum() / total)


def _old_job_end(old_last_ns: np.ndarray, new_first_ns: np.ndarray) -> int:
    """When a job stopped and another took its hosts within one minute: the end of the old job's
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


def _known_sizes(track: _Track) -> np.ndarray:
    """The flow sizes a track's job is known by: those seen in two minutes or more, if any."""
    established = track.sizes[track.size_minutes >= 2]
    return established if len(established) else track.sizes


class _Tracker:
    """Links each minute's observed jobs to tracks; collects membership and events. Jobs own
    whole hosts, so every host has at most one owning track, which makes overlaps a bincount."""

    def __init__(self, tracks: list[_Track], vocabulary: _HostVocabulary, saves: np.ndarray):
        self.tracks = tracks
        self.vocabulary = vocabulary
        self.saves = saves  # see `_saves`; applied up to each minute observed
        self.saves_applied = 0
        self.owner = np.full(len(vocabulary.names), -1, np.int64)
        for index, track in enumerate(tracks):
            self.owner[track.hosts] = index
        self.events: list[tuple[str, str, int, str]] = []
        # (track index, first_ns, last_ns, host codes) per job-minute, for membership
        self.presence: list[tuple[int, int, int, np.ndarray]] = []

    def observe_minute(self, obs: _Observations, rows: np.ndarray) -> None:
        if len(self.owner) < len(self.vocabulary.names):
            self.owner = np.r_[self.owner, np.full(len(self.vocabulary.names) - len(self.owner), -1)]
        self._keep_saving_jobs(int(obs.minute_ns[rows[0]]))
        # last traffic of every track before this minute (tracks started in it: their own)
        self.last_end = np.array([t.last_end_ns for t in self.tracks], np.int64)
        claimed: dict[int, list[int]] = {}  # track -> observations it absorbs this minute
        resuming: dict[int, list[int]] = {}  # stopped track -> observations on its hosts
        for k in rows.tolist():
            best, shared = self._best_owner(obs.hosts(k))
            if best is not None and self._stopped(best, obs, k):
                resuming.setdefault(best, []).append(k)
            else:
                self._place(obs, k, best, shared, claimed)
        for best, ks in resuming.items():
            if self._resumes(obs, ks, best):
                for k in ks:
                    self._claim(claimed, best, obs, k)
            else:  # another job: its observations are placed like any other
                for k in ks:
                    self._place(obs, k, *self._best_owner(obs.hosts(k)), claimed)
        by_survivor: dict[int, list[int]] = {}
        for index, ks in claimed.items():
            while self.tracks[index].merged_into >= 0:
                index = self.tracks[index].merged_into
            by_survivor.setdefault(index, []).extend(ks)
        for index, ks in by_survivor.items():
            talked = np.unique(np.concatenate([obs.hosts(k) for k in ks]))
            seen = talked[self.owner[talked] == index]
            if len(seen):
                self._advance(index, seen, obs, np.array(ks))
            else:  # a job later this minute took every host it talked on: it stopped in the minute
                stopped_on = np.intersect1d(talked, self.tracks[index].hosts)
                if len(stopped_on):
                    self._advance(index, stopped_on, obs, np.array(ks), superseded=True)

    def _keep_saving_jobs(self, minute_ns: int) -> None:
        """A job that writes a checkpoint from its hosts is busy until the save ends: its last
        traffic moves to the end of each save begun by the end of minute `minute_ns` while the job
        was running (a host's writes long after its job stopped are another's), so that traffic
        after the save does not read as a restart."""
        upto = int(np.searchsorted(self.saves[:, 1], minute_ns + MINUTE_NS, side="left"))
        for host, first_ns, last_ns in self.saves[self.saves_applied:upto].tolist():
            index = int(self.owner[host]) if host < len(self.owner) else -1
            if index >= 0 and first_ns - self.tracks[index].last_end_ns < RESTART_GAP_NS:
                self.tracks[index].last_end_ns = max(self.tracks[index].last_end_ns, last_ns)
        self.saves_applied = max(self.saves_applied, upto)

    def _best_owner(self, hosts: np.ndarray) -> tuple[int | None, int]:
        """The track owning most of `hosts` (the earlier on ties) and how many it owns."""
        owners = self.owner[hosts]
        owners = owners[owners >= 0]
        if len(owners) == 0:
            return None, 0
        shared_by_track = np.bincount(owners)
        best = int(np.argmax(shared_by_track))
        return best, int(shared_by_track[best])

    def _stopped(self, index: int, obs: _Observations, k: int) -> bool:
        return int(obs.first_ns[k]) - self.last_end[index] >= RESTART_GAP_NS

    def _place(self, obs: _Observations, k: int, best: int | None, shared: int, claimed: dict) -> None:
        """Observation `k` continues the running track owning most of its hosts, or starts a job."""
        if best is not None and self._stopped(best, obs, k):
            self._supersede(best, obs.hosts(k))
            best = None
        index = None if best is None else self._continue(obs, k, best, shared)
        if index is None:
            # `best` ended just now: this new job took its hosts, maybe within its last minute
            took_over = best is not None and self.tracks[best].status == "ended"
            index = self._start(obs, k, self._hand_over(best, obs, k) if took_over else None)
        self._claim(claimed, index, obs, k)

    def _claim(self, claimed: dict, index: int, obs: _Observations, k: int) -> None:
        """Give observation `k`'s hosts to track `index`, except hosts of another running job,
        which stay with it whatever glued them to this component."""
        hosts = obs.hosts(k)
        owners = self.owner[hosts]
        others = (owners >= 0) & (owners != index)
        running = np.zeros(len(hosts), bool)
        running[others] = obs.first_ns[k] - self.last_end[owners[others]] < RESTART_GAP_NS
        self.owner[hosts[~running]] = index
        claimed.setdefault(index, []).append(k)

    def _start(self, obs: _Observations, k: int, handover: tuple[int, np.ndarray] | None = None) -> int:
        """A new job from observation `k`; `handover` (time, hosts): it began on those hosts at that
        time, in an earlier minute whose traffic went to the job it replaced."""
        hosts = obs.hosts(k)
        names = self.vocabulary.name_list(hosts)
        first_ns = int(obs.first_ns[k]) if handover is None else handover[0]
        track = _Track(_job_id(int(obs.minute_ns[k]), names), hosts, first_ns, int(obs.last_ns[k]), born_this_hour=True)
        self.tracks.append(track)
        self.last_end = np.r_[self.last_end, track.last_end_ns]
        self.events.append((track.job_id, "start", first_ns, json.dumps({"hosts": names})))
        if handover is not None:
            self.presence.append((len(self.tracks) - 1, first_ns, first_ns, handover[1]))
        return len(self.tracks) - 1

    def _hand_over(self, old: int, obs: _Observations, k: int) -> tuple[int, np.ndarray] | None:
        """When observation `k`'s new job was already talking on hosts of the job `old` in that
        job's latest minute (its rows there carry sizes the old job is not known by, and last past
        the old job's own rows on those hosts), split that minute on the hosts: the new job starts
        with its first row on a host pair only it used if that follows the old job's last row on a
        pair only the old one used, else after the old job's last row of other sizes (see
        `_old_job_end`). Returns (start, hosts) of the new job there, or None when the latest
        minute holds no such change."""
        track = self.tracks[old]
        taken = np.intersect1d(obs.hosts(k), track.hosts)
        if len(track.last_observations) == 0 or len(taken) == 0:
            return None
        src, dst, size, first, last = obs.edges(track.last_observations)
        on_taken = np.isin(src, taken) | np.isin(dst, taken)
        new_sizes = np.setdiff1d(obs.signature(k)[0], _known_sizes(track))
        new_shape = on_taken & np.isin(size, new_sizes)
        old_shape = on_taken & ~new_shape
        if not (new_shape.any() and old_shape.any()):
            return None
        # A host pair both jobs used has rows spanning both (its top size may even be one they
        # share); pairs only one used tell when each job talked there.
        pair = np.minimum(src, dst) * (np.maximum(src, dst).max() + 1) + np.maximum(src, dst)
        old_only = old_shape & ~np.isin(pair, pair[new_shape])
        new_only = new_shape & ~np.isin(pair, pair[old_shape])
        if old_only.any() and new_only.any() and first[new_only].min() > last[old_only].max():
            # the old job holds the hosts until the new one's first traffic of its own, but the
            # flows on pairs both used in the moments before that are the new job's first
            # collective reaching all its pairs, not the old job's tail
            old_end_ns = int(last[old_only].max())
            start_ns = max(old_end_ns + 1, int(first[new_only].min()) - SEGMENT_GAP_NS)
            old_last_ns = start_ns - 1
        else:
            old_last_ns = old_end_ns = _old_job_end(last[old_shape], first[new_shape])
            if last[new_shape].max() <= old_last_ns:
                return None
            start_ns = max(old_last_ns + 1, int(first[new_shape].min()))
        old_rows = ~on_taken | (old_shape & (last <= old_end_ns))
        # min: an earlier hand-over of other hosts from this minute may have ended it sooner
        track.last_end_ns = min(track.last_end_ns, int(last[old_rows].max(initial=old_end_ns)))
        _, minute_first_ns, _, minute_hosts = self.presence[track.last_presence]
        kept = np.setdiff1d(minute_hosts, taken)
        self.presence[track.last_presence] = (old, minute_first_ns, track.last_end_ns, kept)
        self.presence.append((old, minute_first_ns, old_last_ns, taken))
        return start_ns, taken

    def _continue(self, obs: _Observations, k: int, best: int, shared: int) -> int | None:
        """The running track observation `k` continues, or None for a new job on its hosts."""
        track, hosts = self.tracks[best], obs.hosts(k)
        gap = int(obs.first_ns[k]) - int(self.last_end[best])
        unchanged = gap < RESUME_CHECK_NS and shared == len(hosts) == len(track.hosts)
        # A job minutes old may not have shown all its flow sizes yet (no DP sync in its parts), but
        # its parts join into more hosts while it talks: traffic on only some of the hosts it
        # already showed, or after a silence, is judged by its sizes (a new job on hosts a short
        # job left).
        part_of_young = (
            self._young(best, obs, k) and gap < RESUME_CHECK_NS and not (shared == len(hosts) < len(track.hosts))
        )
        if not (unchanged or part_of_young) and _signature_share(*obs.signature(k), track) < SIGNATURE_MATCH:
            self._supersede(best, hosts)
            return None
        if shared < TRACK_OVERLAP * min(len(hosts), len(track.hosts)):
            return None
        return self._merge_young_fragments(obs, k, best)

    def _merge_young_fragments(self, obs: _Observations, k: int, best: int) -> int:
        """A component spanning several running tracks that all began minutes ago this hour is one
        job whose first minutes showed its parts apart (pipelines before the first DP sync): the
        parts merge into the oldest."""
        owners = np.unique(self.owner[obs.hosts(k)])
        owners = owners[owners >= 0]
        owners = owners[obs.first_ns[k] - self.last_end[owners] < RESTART_GAP_NS]
        if len(owners) < 2 or not all(self._young(i, obs, k) for i in owners.tolist()):
            return best
        survivor = int(min(owners, key=lambda i: (self.tracks[i].first_seen_ns, i)))
        for part in owners.tolist():
            if part != survivor:
                self._absorb(survivor, part)
        return survivor

    def _young(self, index: int, obs: _Observations, k: int) -> bool:
        track = self.tracks[index]
        return track.born_this_hour and obs.minute_ns[k] - track.first_seen_ns < YOUNG_NS

    def _absorb(self, survivor: int, part: int) -> None:
        keeper, merged = self.tracks[survivor], self.tracks[part]
        keeper.hosts = np.union1d(keeper.hosts, merged.hosts)
        self.owner[self.owner == part] = survivor
        self.presence = [(survivor if t == part else t, f, l, h) for t, f, l, h in self.presence]
        self.events = [e for e in self.events if e[0] != merged.job_id]
        keeper.first_seen_ns = min(keeper.first_seen_ns, merged.first_seen_ns)
        merged.merged_into = survivor

    def _resumes(self, obs: _Observations, ks: list[int], best: int) -> bool:
        """Do observations `ks`, together, resume stopped track `best`: soon enough, on its hosts
        with at most one replaced, with its flow sizes? Judged on all of the minute's observations
        on its hosts: a job resuming with slow warm-up steps may show its pipelines apart."""
        track = self.tracks[best]
        seen = np.unique(np.concatenate([obs.hosts(k) for k in ks]))
        shared = len(np.intersect1d(seen, track.hosts))
        gap = int(obs.first_ns[ks].min()) - int(self.last_end[best])
        sizes = np.concatenate([obs.signature(k)[0] for k in ks])
        flows = np.concatenate([obs.signature(k)[1] for k in ks])
        if (
            gap <= RESTART_WINDOW_NS
            and len(track.hosts) - shared <= 1
            and len(seen) - shared <= 1
            and _signature_share(sizes, flows, track) >= SIGNATURE_MATCH
        ):
            track.restarts += 1
            detail = {"stopped_ns": track.last_end_ns, "gap_s": gap / 1e9}
            self.events.append((track.job_id, "restart", int(obs.first_ns[ks].min()), json.dumps(detail)))
            track.reported_end = False
            return True
        self._supersede(best, seen)
        return False

    def _supersede(self, index: int, hosts: np.ndarray) -> None:
        """Another job took `hosts`: the track stopped and will not resume on them."""
        self.tracks[index].status = "ended"
        self.owner[hosts[self.owner[hosts] == index]] = -1

    def _advance(
        self, index: int, seen: np.ndarray, obs: _Observations, ks: np.ndarray, superseded: bool = False
    ) -> None:
        """Track `index` talked on hosts `seen` in observations `ks` of this minute; `superseded`:
        before another job took them, so it keeps its hosts and its stop."""
        track = self.tracks[index]
        added = np.setdiff1d(seen, track.hosts)
        if len(added):
            # New hosts: the ones not heard from this minute were replaced (or the job grew).
            removed = np.setdiff1d(track.hosts, seen)
            if len(removed):
                detail = {"removed": self.vocabulary.name_list(removed), "added": self.vocabulary.name_list(added)}
                self.events.append((track.job_id, "host_replaced", int(obs.first_ns[ks].min()), json.dumps(detail)))
                self.owner[removed[self.owner[removed] == index]] = -1
            track.hosts = seen
        first_ns, last_ns = int(obs.first_ns[ks].min()), int(obs.last_ns[ks].max())
        track.last_end_ns = max(track.last_end_ns, last_ns)
        track.status = "ended" if superseded else "running"
        track.seen_this_hour = True
        seen_sizes = np.concatenate([obs.signature(k)[0] for k in ks.tolist()])
        sizes = np.concatenate([track.sizes, seen_sizes])
        flows = np.concatenate([track.size_flows] + [obs.signature(k)[1] for k in ks.tolist()])
        minutes = np.concatenate([track.size_minutes, np.zeros(len(seen_sizes), np.int64)])
        distinct, position = np.unique(sizes, return_inverse=True)
        totals = np.bincount(position, weights=flows).astype(np.int64)
        minutes = np.bincount(position, weights=minutes).astype(np.int64) + np.isin(distinct, seen_sizes)
        keep = np.argsort(-totals, kind="stable")[:SIGNATURE_SIZES]
        track.sizes, track.size_flows, track.size_minutes = distinct[keep], totals[keep], minutes[keep]
        track.last_observations, track.last_presence = ks, len(self.presence)
        self.presence.append((index, first_ns, last_ns, seen if superseded else track.hosts))

    def close_hour(self, hour_end_ns: int) -> Recognition:
        job_rows = []
        for track in self.tracks:
            if track.merged_into >= 0 or not (track.seen_this_hour or track.running_at_load):
                continue
            if hour_end_ns - track.last_end_ns >= RESTART_GAP_NS:
                track.status = "ended"
            if track.status == "ended" and not track.reported_end:
                self.events.append((track.job_id, "end", track.last_end_ns, "{}"))
                track.reported_end = True
            nics = self.vocabulary.nics(track.hosts)
            job_rows.append(
                {
                    "job_id": track.job_id,
                    "first_seen": track.first_seen_ns,
                    "last_seen": track.last_end_ns,
                    "n_gpus": nics.num_rows,
                    "n_hosts": len(track.hosts),
                    "status": track.status,
                    "restarts": track.restarts,
                    "hosts": self.vocabulary.name_list(track.hosts),
                }
            )
        return Recognition(
            jobs=_jobs_table(job_rows),
            membership=self._membership(),
            events=_events_table(self.events),
            state=self._state(hour_end_ns),
        )

    def _membership(self) -> pa.Table:
        if not self.presence:
            return MEMBERSHIP.empty_table()
        track_of = np.concatenate([np.full(len(h), t) for t, _, _, h in self.presence])
        hosts = np.concatenate([h for _, _, _, h in self.presence])
        first = np.concatenate([np.full(len(h), f) for _, f, _, h in self.presence])
        last = np.concatenate([np.full(len(h), l) for _, _, l, h in self.presence])
        keys, position = np.unique(np.stack([track_of, hosts], axis=1), axis=0, return_inverse=True)
        position = position.ravel()
        first_ns = np.full(len(keys), np.iinfo(np.int64).max)
        last_ns = np.full(len(keys), np.iinfo(np.int64).min)
        np.minimum.at(first_ns, position, first)
        np.maximum.at(last_ns, position, last)
        host_names = np.array(self.vocabulary.names, dtype=object)[keys[:, 1]]
        per_host = pa.table(
            {
                "job_id": pa.array([self.tracks[t].job_id for t in keys[:, 0].tolist()], pa.string()),
                "host": pa.array(host_names, pa.string()),
                "first_ns": first_ns,
                "last_ns": last_ns,
            }
        )
        nics = self.vocabulary.nics(np.unique(keys[:, 1]))
        joined = per_host.join(nics, "host", join_type="inner")
        return conform(joined, MEMBERSHIP).sort_by([("job_id", "ascending"), ("host", "ascending"), ("gpu", "ascending")])

    def _state(self, hour_end_ns: int) -> dict:
        """Tracks the next hour may continue: running, or stopped recently on hosts no other job
        took (listed in creation order, so a newer job's hosts win when the state is loaded)."""
        owning = set(np.unique(self.owner[self.owner >= 0]).tolist())
        kept = [
            t
            for index, t in enumerate(self.tracks)
            if index in owning and (t.status == "running" or hour_end_ns - t.last_end_ns <= RESTART_WINDOW_NS)
        ]
        return {
            "version": STATE_VERSION,
            "jobs": [
                {
                    "job_id": t.job_id,
                    "hosts": self.vocabulary.name_list(t.hosts),
                    "first_seen_ns": t.first_seen_ns,
                    "last_end_ns": t.last_end_ns,
                    "restarts": t.restarts,
                    "status": t.status,
                    "reported_end": t.reported_end,
                    "signature": np.stack([t.sizes, t.size_flows, t.size_minutes], axis=1).tolist(),
                }
                for t in kept
            ],
        }


def _load_state(state: dict | None, vocabulary: _HostVocabulary) -> list[_Track]:
    if not state:
        return []
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"job state version {state.get('version')!r}, expected {STATE_VERSION}")
    tracks = []
    for job in state["jobs"]:
        signature = np.array(job["signature"], np.int64).reshape(-1, 3)
        tracks.append(
            _Track(
                job_id=job["job_id"],
                hosts=np.sort(vocabulary.encode(job["hosts"])),
                first_seen_ns=job["first_seen_ns"],
                last_end_ns=job["last_end_ns"],
                restarts=job["restarts"],
                status=job["status"],
                sizes=signature[:, 0],
                size_flows=signature[:, 1],
                size_minutes=signature[:, 2],
                reported_end=job["reported_end"],
                running_at_load=job["status"] == "running",
            )
        )
    return tracks


def _jobs_table(rows: list[dict]) -> pa.Table:
    if not rows:
        return JOBS.empty_table()
    table = pa.Table.from_pylist(rows)
    for name in ("first_seen", "last_seen"):
        table = table.set_column(table.column_names.index(name), name, table[name].cast(pa.int64()).cast(TS))
    return conform(table, JOBS).sort_by("job_id")


def _events_table(events: list[tuple[str, str, int, str]]) -> pa.Table:
    if not events:
        return EVENTS.empty_table()
    job_id, kind, at_ns, detail = zip(*events)
    return pa.table({"job_id": job_id, "kind": kind, "at_ns": at_ns, "detail": detail}, schema=EVENTS)
