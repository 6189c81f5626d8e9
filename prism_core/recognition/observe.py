"""The jobs of each minute of an hour, from its flow_minutes rows: one graph over all minutes, its
components merged into jobs, each with its NICs, span, flow sizes and rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import combination_ids, time_segments, unique_inverse, unique_rows
from prism_core.constants import CHECKPOINT_FLOW_BYTES
from prism_core.recognition.merge import Graph, csr_pointer, job_of_nodes, runs_past_minute
from prism_core.recognition.params import RecognitionParams
from prism_core.recognition.vocabulary import NicVocabulary
from prism_core.topology import Topology


@dataclass
class Observations:
    """The jobs seen in each minute of an hour, as flat arrays (one entry per minute-job)."""

    minute_ns: np.ndarray  # int64, start of the minute
    first_ns: np.ndarray  # int64, first flow start of the job in the minute
    last_ns: np.ndarray  # int64, last flow end
    nic_ptr: np.ndarray  # CSR over NIC codes: the members of observation k are
    nic_codes: np.ndarray  #   nic_codes[nic_ptr[k]:nic_ptr[k + 1]], sorted, each once
    size_ptr: np.ndarray  # CSR over the repeated flow sizes of each observation
    sizes: np.ndarray  # int64 flow size
    size_flows: np.ndarray  # int64 flows of that size
    edge_ptr: np.ndarray  # CSR over the job-traffic rows of each observation:
    edge_src_nic: np.ndarray  #   NIC codes of both ends,
    edge_dst_nic: np.ndarray
    edge_size: np.ndarray  #   top size, first flow start and last flow end of the row
    edge_first_ns: np.ndarray
    edge_last_ns: np.ndarray
    edge_estimated: np.ndarray  #   and whether its sizes are a packet sampler's estimates
    host_of_nic: np.ndarray  # host code of every NIC code

    @classmethod
    def empty(cls) -> Observations:
        empty, pointer = np.zeros(0, np.int64), np.zeros(1, np.int64)
        return cls(empty, empty, empty, pointer, empty, pointer, empty, empty, pointer, *[empty] * 5,
                   np.zeros(0, bool), empty)

    def nics(self, k: int) -> np.ndarray:
        return self.nic_codes[self.nic_ptr[k] : self.nic_ptr[k + 1]]

    def signature(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        span = slice(self.size_ptr[k], self.size_ptr[k + 1])
        return self.sizes[span], self.size_flows[span]

    def nics_of(self, ks: list[int] | np.ndarray) -> np.ndarray:
        """The NICs of observations `ks` together, sorted."""
        if len(ks) == 1:  # an observation's own NICs are sorted and distinct already
            return self.nics(ks[0]).copy()
        return np.unique(np.concatenate([self.nics(k) for k in ks]))

    def signatures(self, ks: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The repeated flow sizes of observations `ks` and their flows, one observation after the other."""
        parts = [self.signature(k) for k in ks]
        return np.concatenate([sizes for sizes, _ in parts]), np.concatenate([flows for _, flows in parts])

    def edges(self, ks: np.ndarray) -> tuple[np.ndarray, ...]:
        """src NIC, dst NIC, top size, first start, last end, estimated of the rows of observations `ks`."""
        rows = np.concatenate([np.arange(self.edge_ptr[k], self.edge_ptr[k + 1]) for k in ks.tolist()])
        columns = (self.edge_src_nic, self.edge_dst_nic, self.edge_size, self.edge_first_ns, self.edge_last_ns,
                   self.edge_estimated)
        return tuple(column[rows] for column in columns)


def minute_of_rows(flow_minutes: pa.Table) -> np.ndarray:
    """Start of the minute of every row, in ns."""
    return flow_minutes["minute"].cast(pa.int64()).to_numpy()


def rows_by_minute(minute_ns: np.ndarray) -> list[np.ndarray]:
    """Observation indices of each minute, in minute order (observations are sorted by minute)."""
    if len(minute_ns) == 0:
        return []
    starts = np.flatnonzero(np.r_[True, minute_ns[1:] != minute_ns[:-1]])
    return np.split(np.arange(len(minute_ns)), starts[1:])


def saves(flow_minutes: pa.Table, vocabulary: NicVocabulary) -> np.ndarray:
    """(NIC code, first start, last end) of each minute's checkpoint writes (CHECKPOINT_FLOW_BYTES
    or more from a GPU NIC to an address that is no GPU), by first start; shape (n, 3)."""
    src, dst = flow_minutes["src_addr"], flow_minutes["dst_addr"]
    topology = vocabulary.topology
    writes = flow_minutes.filter(pa.array(
        topology.is_gpu_nic(src) & ~topology.is_gpu_nic(dst)
        & (flow_minutes["bytes"].to_numpy(zero_copy_only=False) >= CHECKPOINT_FLOW_BYTES)))
    if writes.num_rows == 0:
        return np.zeros((0, 3), np.int64)
    found = np.stack([vocabulary.encode(writes["src_addr"].combine_chunks()),
                      writes["first_start_ns"].to_numpy(), writes["last_end_ns"].to_numpy()], axis=1)
    return found[np.argsort(found[:, 1], kind="stable")]


def observe(
    flow_minutes: pa.Table, vocabulary: NicVocabulary, minute_ns: np.ndarray, params: RecognitionParams
) -> Observations:
    """Per minute: connected components of the job-traffic graph, then components merged into
    jobs (see `merge`). All minutes are solved in one graph whose nodes are an address's traffic
    in one minute (split where it pauses for over the segment gap, so that a job that stops and
    another that starts on the same NIC within one minute stay apart), so no component or merge
    crosses a minute."""
    with_minute = flow_minutes.append_column("_minute_ns", pa.array(minute_ns))
    edges, loose = _job_edges(with_minute, vocabulary.topology, params)
    if edges.num_rows == 0:
        return Observations.empty()
    n_edges = edges.num_rows
    both = pa.concat_arrays([edges["src_addr"].combine_chunks(), edges["dst_addr"].combine_chunks()])
    encoded = both.dictionary_encode()
    addr_code = encoded.indices.to_numpy().astype(np.int64)
    nic_of_addr = vocabulary.encode(encoded.dictionary)
    host_of_addr = vocabulary.hosts(nic_of_addr)
    n_addrs = len(encoded.dictionary)

    edge_minutes, edge_minute_pos = np.unique(edges["_minute_ns"].to_numpy(), return_inverse=True)
    ends_key = np.tile(edge_minute_pos, 2) * n_addrs + addr_code  # (minute, address) of both ends
    span = (np.tile(edges["first_start_ns"].to_numpy(), 2), np.tile(edges["last_end_ns"].to_numpy(), 2))
    node_of_end, node_key, node_first_ns, node_last_ns = time_segments(ends_key, *span, params.segment_gap_ns)
    src_node = node_of_end[:n_edges]
    # host keys carry the minute, so jobs of different minutes share no host
    node_minute_pos = node_key // n_addrs
    node_nic = nic_of_addr[node_key % n_addrs]
    node_host_key = node_minute_pos * len(vocabulary.host_names) + host_of_addr[node_key % n_addrs]
    repeated = edges["_repeated"].to_numpy(zero_copy_only=False)
    # a sampler's sizes are estimates (rows of older warehouses say no rate: unsampled)
    estimated = pc.fill_null(edges["sampling_rate"], 1).to_numpy() > params.estimated_sampling_rate
    exact = (edges["top_size_flows"].to_numpy() >= params.min_repeated_flows) & ~estimated
    graph = Graph(node_host_key, node_nic, node_first_ns, node_last_ns, src_node, edges["top_size"].to_numpy(), exact)
    job = job_of_nodes(src_node, node_of_end[n_edges:], graph, params)
    job, job_nic_pairs, job_minute_pos = _in_tracking_order(job, node_minute_pos, node_nic, node_first_ns, vocabulary)
    n_jobs = len(job_minute_pos)

    edge_job = job[src_node]
    first_ns = np.full(n_jobs, np.iinfo(np.int64).max)
    last_ns = np.full(n_jobs, np.iinfo(np.int64).min)
    np.minimum.at(first_ns, edge_job, edges["first_start_ns"].to_numpy())
    np.maximum.at(last_ns, edge_job, edges["last_end_ns"].to_numpy())
    nodes = _Nodes(node_key, node_first_ns, node_last_ns, job)
    loose_job, loose_first_ns, loose_last_ns = _rows_within_jobs(
        loose, encoded.dictionary, edge_minutes, n_addrs, nodes, params.segment_gap_ns
    )
    np.minimum.at(first_ns, loose_job, loose_first_ns)
    np.maximum.at(last_ns, loose_job, loose_last_ns)

    # Signature: flows per repeated size, per job, on the pairs whose sizes tell (`pair_traits`):
    # a flow cache's sums recur from minute to minute of a steady job but not across its restart,
    # whose warm-up shows single transfers and then other sums. A sampler's estimates only where
    # the job shows no exact size: they are whole multiples of its packet size times its rate, and
    # two jobs' recur alike where their sizes are near
    telling = repeated & edges["_sized"].to_numpy(zero_copy_only=False)
    has_exact = np.bincount(edge_job[telling & ~estimated], minlength=n_jobs) > 0
    signed = telling & (~estimated | ~has_exact[edge_job])
    size_pairs, size_of_edge = unique_rows(edge_job[signed], edges["top_size"].to_numpy()[signed], return_inverse=True)
    size_flows = np.bincount(size_of_edge, weights=edges["top_size_flows"].to_numpy()[signed],
                             minlength=len(size_pairs))

    by_job = np.argsort(edge_job, kind="stable")
    return Observations(
        minute_ns=edge_minutes[job_minute_pos],
        first_ns=first_ns,
        last_ns=last_ns,
        nic_ptr=csr_pointer(job_nic_pairs[:, 0], n_jobs),
        nic_codes=job_nic_pairs[:, 1],
        size_ptr=csr_pointer(size_pairs[:, 0], n_jobs),
        sizes=size_pairs[:, 1],
        size_flows=size_flows.astype(np.int64),
        edge_ptr=csr_pointer(edge_job[by_job], n_jobs),
        edge_src_nic=nic_of_addr[addr_code[:n_edges][by_job]],
        edge_dst_nic=nic_of_addr[addr_code[n_edges:][by_job]],
        edge_size=edges["top_size"].to_numpy()[by_job],
        edge_first_ns=edges["first_start_ns"].to_numpy()[by_job],
        edge_last_ns=edges["last_end_ns"].to_numpy()[by_job],
        edge_estimated=estimated[by_job],
        host_of_nic=vocabulary.hosts(np.arange(len(vocabulary.addrs))),
    )


def _job_edges(flow_minutes: pa.Table, topology: Topology, params: RecognitionParams) -> tuple[pa.Table, pa.Table]:
    """The rows that are job traffic: between two different GPU NICs, with a repeated size, or
    with flows all alike in size (`repeated_sizes`), or on a pair that talks minute after minute
    (`persistent_pairs`); and the other rows between two different GPU
    NICs (no size repeats on them that minute)."""
    if flow_minutes.num_rows == 0:
        return flow_minutes, flow_minutes
    src, dst = flow_minutes["src_addr"], flow_minutes["dst_addr"]
    between_gpus = (
        topology.is_gpu_nic(src) & topology.is_gpu_nic(dst) & pc.not_equal(src, dst).to_numpy(zero_copy_only=False)
    )
    repeated = repeated_sizes(flow_minutes, params)
    persistent, sized = pair_traits(flow_minutes, repeated, params)
    job_traffic = repeated | (persistent & ~sized)
    edges = (flow_minutes.append_column("_repeated", pa.array(repeated)).append_column("_sized", pa.array(sized))
             .filter(pa.array(between_gpus & job_traffic)))
    return edges, flow_minutes.filter(pa.array(between_gpus & ~job_traffic))


def pair_traits(flow_minutes: pa.Table, repeated: np.ndarray, params: RecognitionParams
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per row: does its NIC pair carry traffic in `params.persistent_minutes` minutes or more of
    the rows given, and do its sizes tell? A flow cache merges a queue pair's transfers into
    records whose sizes are sums that never repeat, and a packet sampler estimates every record's
    bytes, so behind them a job's pairs show no repeated size; they still talk minute after
    minute, where a one-off copy between two jobs' NICs lasts seconds: such a persistent pair is
    job traffic. Sizes tell nothing on a pair with under `params.sized_share` of its rows
    `repeated`, or of its rows ending within their minute (`in_step_ns`): a cache whose records
    run on past the minute sums a few transfers each, and two sums of as many equal transfers
    look alike by chance. On a pair whose sizes do tell, a row without a repeated size is not the
    job's for that (a copy seconds after the job's traffic)."""
    if flow_minutes.num_rows == 0:
        return np.zeros(0, bool), np.zeros(0, bool)
    both = pa.concat_arrays([flow_minutes["src_addr"].combine_chunks(), flow_minutes["dst_addr"].combine_chunks()])
    src_code, dst_code = np.split(pc.dictionary_encode(both).indices.to_numpy().astype(np.int64), 2)
    pair_code = combination_ids(src_code, dst_code)
    n_pairs = int(pair_code.max()) + 1
    # the minutes each pair talks in, marked in a table of (pair, minute): a byte per pair and
    # minute of the hour, not a hash and a sort of every row's (pair, minute)
    minutes, minute_at = unique_inverse(flow_minutes["_minute_ns"].to_numpy())
    talks = np.zeros((n_pairs, len(minutes)), bool)
    talks[pair_code, minute_at] = True
    minutes_of_pair = talks.sum(axis=1)
    rows_of_pair = np.bincount(pair_code, minlength=n_pairs)
    repeated_share = np.bincount(pair_code, weights=repeated, minlength=n_pairs) / rows_of_pair
    ended = ~runs_past_minute(flow_minutes["_minute_ns"].to_numpy(), flow_minutes["last_end_ns"].to_numpy(), params)
    ended_share = np.bincount(pair_code, weights=ended, minlength=n_pairs) / rows_of_pair
    sized = (repeated_share >= params.sized_share) & (ended_share >= params.sized_share)
    return minutes_of_pair[pair_code] >= params.persistent_minutes, sized[pair_code]


def repeated_sizes(flow_minutes: pa.Table, params: RecognitionParams) -> np.ndarray:
    """Per row: does a flow size repeat on it, `params.min_repeated_flows` flows of its top size,
    or as many flows whose mean size is within `params.same_size` of the top size? Exporters that
    count header bytes per packet, or estimate a flow's bytes, tell a size that repeats a few
    bytes apart each time, so no two of the flows match exactly."""
    flows = flow_minutes["flows"].to_numpy(zero_copy_only=False)
    top_size = flow_minutes["top_size"].to_numpy(zero_copy_only=False).astype(np.float64)
    mean_size = flow_minutes["bytes"].to_numpy(zero_copy_only=False) / np.maximum(flows, 1)
    alike = (flows >= params.min_repeated_flows) & (np.abs(mean_size - top_size) <= params.same_size * top_size)
    return alike | (flow_minutes["top_size_flows"].to_numpy(zero_copy_only=False) >= params.min_repeated_flows)


def _in_tracking_order(
    job: np.ndarray, node_minute_pos: np.ndarray, node_nic: np.ndarray, node_first_ns: np.ndarray,
    vocabulary: NicVocabulary,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Jobs renumbered by (minute, first traffic, smallest NIC address), so that tracking sees them
    deterministically, and in the minute where a job stops and another takes its NICs, first the
    one that stopped. Returns the new job of every node, the sorted (job, NIC code) pairs, and
    each job's minute (as a position among the minutes)."""
    job_minute = np.zeros(job.max() + 1, np.int64)
    job_minute[job] = node_minute_pos
    job_nic_pairs = unique_rows(job, node_nic)
    nic_rank = np.argsort(np.argsort(np.array(vocabulary.addrs, dtype=object)))
    smallest_nic = np.full(len(job_minute), np.iinfo(np.int64).max)
    np.minimum.at(smallest_nic, job_nic_pairs[:, 0], nic_rank[job_nic_pairs[:, 1]])
    job_first_ns = np.full(len(job_minute), np.iinfo(np.int64).max)
    np.minimum.at(job_first_ns, job, node_first_ns)
    order = np.lexsort((smallest_nic, job_first_ns, job_minute))
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    job_nic_pairs[:, 0] = renumber[job_nic_pairs[:, 0]]
    job_nic_pairs = job_nic_pairs[np.lexsort((job_nic_pairs[:, 1], job_nic_pairs[:, 0]))]
    return renumber[job], job_nic_pairs, job_minute[order]


@dataclass
class _Nodes:
    """The graph's nodes, sorted by (key, first start): key = minute position * n_addrs + address
    code, the span of that stretch of the address's traffic, and its job."""

    key: np.ndarray
    first_ns: np.ndarray
    last_ns: np.ndarray
    job: np.ndarray


def _rows_within_jobs(
    rows: pa.Table, addrs: pa.Array, minutes: np.ndarray, n_addrs: int, nodes: _Nodes, gap_ns: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(job, first start, last end) for each end of the `rows` (GPU-to-GPU traffic without a
    repeated size) that lies within one stretch of a job's traffic on that NIC in that minute
    (bridging pauses up to `gap_ns`, as the nodes do, and touching no other stretch): a NIC
    serves one job at a time. Such rows cannot tell a job or join its parts, but are its traffic:
    a gradient sync with one bucket per pair sends one flow per pair in the minute of a job's last
    step, after its last repeated activation sends, and the job's membership must reach to its end."""
    empty = np.zeros(0, np.int64)
    if rows.num_rows == 0 or len(nodes.key) == 0:
        return empty, empty, empty
    minute = rows["_minute_ns"].to_numpy()
    position = np.minimum(np.searchsorted(minutes, minute), len(minutes) - 1)
    first, last = rows["first_start_ns"].to_numpy(), rows["last_end_ns"].to_numpy()
    base = int(min(nodes.first_ns.min(), first.min())) - 2 * gap_ns
    width = int(max(nodes.last_ns.max(), last.max())) - base + 2 * gap_ns + 1
    dense = np.r_[0, np.cumsum(nodes.key[1:] != nodes.key[:-1])]
    if (int(dense[-1]) + 1) * width >= np.iinfo(np.int64).max:
        raise OverflowError("too many (minute, address) keys for one hour of flow_minutes")
    stretch_start = dense * width + (nodes.first_ns - base)

    def stretch_of(column: str) -> np.ndarray:
        """The stretch each row's end NIC is in when the row runs, -1 where none (or two)."""
        code = pc.index_in(rows[column], value_set=addrs)
        known = pc.is_valid(code).to_numpy(zero_copy_only=False) & (minutes[position] == minute)
        key = position * n_addrs + pc.fill_null(code, 0).to_numpy().astype(np.int64)
        at = np.minimum(np.searchsorted(nodes.key, key), len(nodes.key) - 1)
        known &= nodes.key[at] == key
        # the latest stretch of the key that starts before the row ends (with the bridging)
        node = np.searchsorted(stretch_start, dense[at] * width + (last + gap_ns - base), side="right") - 1
        node = np.maximum(node, 0)
        inside = known & (nodes.key[node] == key) & (nodes.last_ns[node] + gap_ns >= first)
        inside &= first + gap_ns >= nodes.first_ns[node]
        earlier = np.maximum(node - 1, 0)
        inside &= ~((node > 0) & (nodes.key[earlier] == key) & (nodes.last_ns[earlier] + gap_ns >= first))
        return np.where(inside, node, -1)

    node = np.concatenate([stretch_of("src_addr"), stretch_of("dst_addr")])
    inside = node >= 0
    return nodes.job[node[inside]], np.tile(first, 2)[inside], np.tile(last, 2)[inside]
