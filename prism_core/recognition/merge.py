"""From a minute's traffic graph to its jobs: connected components, the Jaccard rail merge, and
the merge of parts busy on a job's hosts at the same time. Jobs hold GPUs, not hosts: components
on the same hosts are one job only when the traffic says so (see `one_job`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from prism_core.arrays import group_median, time_segments
from prism_core.minutes import MINUTE_NS
from prism_core.recognition.params import RecognitionParams


@dataclass(frozen=True)
class Graph:
    """The graph's nodes, each an address's traffic in one minute: its host in that minute
    (`host_key`, so no label spans two minutes), its NIC (the same code every minute) and span;
    and the source node, top flow size and whether that size recurs exactly, of every edge."""

    host_key: np.ndarray
    nic: np.ndarray
    first_ns: np.ndarray
    last_ns: np.ndarray
    edge_node: np.ndarray
    edge_size: np.ndarray
    edge_exact: np.ndarray  # bool: the edge's top size recurs byte for byte (no cache's sum, sampler's estimate or header count)


def job_of_nodes(src_node: np.ndarray, dst_node: np.ndarray, graph: Graph, params: RecognitionParams) -> np.ndarray:
    """Job label of every node of the graph whose edges join `src_node[i]` and `dst_node[i]`."""
    component = connected(src_node, dst_node, len(graph.host_key))
    job = merge_by_jaccard(component, graph, params)
    return merge_concurrent_parts(job, graph, params)


def connected(row: np.ndarray, col: np.ndarray, n_nodes: int) -> np.ndarray:
    """Component of each of `n_nodes` nodes in the undirected graph of edges row[i] - col[i]."""
    graph = sp.coo_matrix((np.ones(len(row), np.int8), (row, col)), shape=(n_nodes, n_nodes))
    return connected_components(graph, directed=False)[1]


def merge_by_jaccard(component: np.ndarray, graph: Graph, params: RecognitionParams) -> np.ndarray:
    """Job label of each node: components joined when their host sets have Jaccard >=
    `params.jaccard`, they talk at the same time (bridging pauses up to the segment gap) and the
    traffic says they are one job (`one_job`): a job's rails run side by side, a job and the next
    one on its hosts one after the other, two jobs on other GPUs of the same hosts each its own way."""
    _, keys, n_keys, shared = _label_hosts(component, graph.host_key)
    n_comp = int(component.max()) + 1
    sizes = np.bincount(keys // n_keys, minlength=n_comp)
    union = sizes[shared.row] + sizes[shared.col] - shared.data
    first_ns, last_ns = _spans(component, graph)
    gap = params.segment_gap_ns
    together = (first_ns[shared.row] <= last_ns[shared.col] + gap) & (first_ns[shared.col] <= last_ns[shared.row] + gap)
    similar = (shared.data >= params.jaccard * union) & together
    similar[similar] = one_job(component, shared.row[similar], shared.col[similar], graph, params)
    return _joined(component, shared.row[similar], shared.col[similar])


def one_job(label: np.ndarray, a: np.ndarray, b: np.ndarray, graph: Graph, params: RecognitionParams) -> np.ndarray:
    """Are parts `a[i]` and `b[i]` of one minute (labels of the nodes), on the same hosts, one job?
    Each part is known in every minute by its life: its anchor (its smallest NIC) while that talks
    without a stop (`_life_gaps`), so the verdict weighs every minute of the part's life, and none
    of a later job's on the same NICs (two jobs side by side on the hosts
    would otherwise share the life of whatever ran on their NICs up to the hour's end). They are
    when they keep in step: their traffic of a minute starts and ends within `params.in_step_ns`
    of each other in at least `params.in_step_share` of the minutes they meet (a job's rails carry the same collectives and sends at the same moments; a job on
    other GPUs of the hosts starts and ends its minutes at the phase of its own steps). Parts of a
    job with other roles (a rail with the DP sync beside rails with only pipeline hops, a hop's
    forward and backward sends) are out of step, but carry its activations: they are one job also
    when they carry a flow size in common (within the share `params.same_size`) and live the same
    life, beginning and ending their traffic this hour within `params.same_life_ns` of each other
    (many models share an activation size, but a job that arrives on other GPUs of busy hosts
    begins later than the job already there)."""
    first_ns, last_ns = _spans(label, graph)
    anchor = _anchors(label, graph.nic)
    gaps = _life_gaps(anchor, first_ns, last_ns, params)
    life, _, life_first, life_last = time_segments(anchor, first_ns, last_ns, gaps)
    life_a, life_b = life[a], life[b]
    same_life = (np.abs(life_first[life_a] - life_first[life_b]) <= params.same_life_ns) & (
        np.abs(life_last[life_a] - life_last[life_b]) <= params.same_life_ns)
    tolerance = params.in_step_ns
    minute_in_step = (np.abs(first_ns[a] - first_ns[b]) <= tolerance) & (np.abs(last_ns[a] - last_ns[b]) <= tolerance)
    low, high = np.minimum(life_a, life_b), np.maximum(life_a, life_b)
    _, meeting = np.unique(low * (int(life.max()) + 1) + high, return_inverse=True)
    meeting = meeting.ravel()
    in_step = np.bincount(meeting, weights=minute_in_step) / np.bincount(meeting) >= params.in_step_share
    out_of_step = ~in_step[meeting] & same_life
    if not out_of_step.any():
        return in_step[meeting]
    # the (life, flow size) pairs of the parts still to judge, each once
    edge_life = life[label[graph.edge_node]]
    asked = np.isin(edge_life, np.r_[life_a[out_of_step], life_b[out_of_step]])
    width = int(graph.edge_size.max()) + 1
    keys = np.unique(edge_life[asked] * width + graph.edge_size[asked])
    life_sizes = np.stack([keys // width, keys % width], axis=1)
    shared = np.zeros(len(a), bool)
    shared[out_of_step] = _share_a_size(life_sizes, life_a[out_of_step], life_b[out_of_step], params.same_size)
    # a part whose sizes mostly do not recur byte for byte (behind flow caches, packet samplers or
    # exporters counting header bytes) can show neither a common size nor, with a cache's or a
    # sampler's timing, its rhythm: its life decides
    n_lives = int(life.max()) + 1
    exact_share = np.bincount(edge_life, weights=graph.edge_exact, minlength=n_lives) / np.maximum(
        np.bincount(edge_life, minlength=n_lives), 1)
    sized = exact_share >= params.sized_share
    # nor, where its records run on past their minute's end (a flow cache's merges, cut by the
    # active timeout at the phase of the rail's own leaf), when its traffic starts and ends
    unended = runs_past_minute(first_ns // MINUTE_NS * MINUTE_NS, last_ns, params)
    timed = np.bincount(life, weights=~unended, minlength=n_lives) / np.maximum(
        np.bincount(life, minlength=n_lives), 1) >= params.sized_share
    judged = sized & timed
    return in_step[meeting] | shared | (out_of_step & ~(judged[life_a] & judged[life_b]))


def runs_past_minute(minute_ns: np.ndarray, last_ns: np.ndarray, params: RecognitionParams) -> np.ndarray:
    """Whether traffic of the minute starting at `minute_ns` runs on past the minute's end by more
    than `params.in_step_ns` (exporters' clock offsets): a flow cache holding a flow past it."""
    return last_ns > minute_ns + MINUTE_NS + params.in_step_ns


def _life_gaps(anchor: np.ndarray, first_ns: np.ndarray, last_ns: np.ndarray, params: RecognitionParams) -> np.ndarray:
    """The silence each part (`anchor` NIC, span) may follow within its anchor's life: its
    anchor's median pause between parts, `params.life_pause_factor` times over, at least
    `params.life_pause_floor_ns` and at most `params.life_gap_ns`."""
    order = np.lexsort((first_ns, anchor))
    key, first, last = anchor[order], first_ns[order], last_ns[order]
    new_anchor = np.r_[True, key[1:] != key[:-1]]
    # the latest end before each part among its anchor's: one running maximum, each anchor offset
    # by more than the widest span
    base = int(min(first.min(), last.min()))
    offset = (np.cumsum(new_anchor) - 1) * (int(max(first.max(), last.max())) - base + 1)
    reach = np.r_[0, np.maximum.accumulate(offset + (last - base))[:-1]]
    pause = np.where(new_anchor, 0, np.maximum(offset + (first - base) - reach, 0)).astype(float)
    usual = group_median(key, pause)
    gaps = np.empty(len(order), np.int64)
    gaps[order] = np.clip(params.life_pause_factor * usual, params.life_pause_floor_ns, params.life_gap_ns)
    return gaps


def _share_a_size(anchor_sizes: np.ndarray, a: np.ndarray, b: np.ndarray, tolerance: float) -> np.ndarray:
    """Per (a[i], b[i]): do the two parts carry flow sizes within `tolerance` (a share) of each
    other? `anchor_sizes`: the sorted (part, size) pairs."""
    if len(a) == 0 or len(anchor_sizes) == 0:
        return np.zeros(len(a), bool)
    width = int(anchor_sizes[:, 1].max() * (1 + tolerance)) + 2
    keys = anchor_sizes[:, 0] * width + anchor_sizes[:, 1]
    start = np.searchsorted(anchor_sizes[:, 0], a, side="left")
    count = np.searchsorted(anchor_sizes[:, 0], a, side="right") - start
    pair = np.repeat(np.arange(len(a)), count)
    size = anchor_sizes[ranges(start, count), 1]
    low = np.searchsorted(keys, b[pair] * width + np.floor(size * (1 - tolerance)).astype(np.int64), side="left")
    high = np.searchsorted(keys, b[pair] * width + np.ceil(size * (1 + tolerance)).astype(np.int64), side="right")
    return np.bincount(pair, weights=high > low, minlength=len(a)) > 0


def _spans(label: np.ndarray, graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """First start and last end of each label's graph."""
    first_ns = np.full(int(label.max()) + 1, np.iinfo(np.int64).max)
    last_ns = np.full(int(label.max()) + 1, np.iinfo(np.int64).min)
    np.minimum.at(first_ns, label, graph.first_ns)
    np.maximum.at(last_ns, label, graph.last_ns)
    return first_ns, last_ns


def _anchors(label: np.ndarray, node_nic: np.ndarray) -> np.ndarray:
    """The smallest NIC code of each label's graph."""
    anchor = np.full(int(label.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(anchor, label, node_nic)
    return anchor


def merge_concurrent_parts(job: np.ndarray, graph: Graph, params: RecognitionParams) -> np.ndarray:
    """Job label of each node, with every job of a minute merged into another whose host set holds
    all of its hosts, when the two are busy on a host they share at the same time and the traffic
    says they are one job (`one_job`): rails that carry only pipeline hops between two hosts of a wide job form
    components too small for the Jaccard merge, and at a job's last seconds their flow sizes can
    differ from every earlier minute's. Hosts only partly shared, or used one after the other,
    stay apart (a job on part of the hosts of one that stopped seconds before), and so do jobs on
    other GPUs of the hosts that came or went at other times."""
    position, keys, n_keys, shared = _label_hosts(job, graph.host_key)
    key_job, key_host = np.divmod(keys, n_keys)
    first_ns = np.full(len(keys), np.iinfo(np.int64).max)
    last_ns = np.full(len(keys), np.iinfo(np.int64).min)
    np.minimum.at(first_ns, position, graph.first_ns)
    np.maximum.at(last_ns, position, graph.last_ns)
    n_jobs = int(job.max()) + 1
    hosts_of_job = np.bincount(key_job, minlength=n_jobs)
    inside = (shared.row != shared.col) & (shared.data == hosts_of_job[shared.row])
    part, whole = shared.row[inside].astype(np.int64), shared.col[inside].astype(np.int64)
    if len(part) == 0:
        return job
    # every (part, whole, host of the part): are both busy on that host at once?
    pointer = csr_pointer(key_job, n_jobs)
    counts = hosts_of_job[part]
    pair_of = np.repeat(np.arange(len(part)), counts)
    in_part = ranges(pointer[part], counts)
    in_whole = np.searchsorted(keys, whole[pair_of] * n_keys + key_host[in_part])
    together = (first_ns[in_part] < last_ns[in_whole]) & (first_ns[in_whole] < last_ns[in_part])
    concurrent = np.bincount(pair_of, weights=together, minlength=len(part)) > 0
    concurrent[concurrent] = one_job(job, part[concurrent], whole[concurrent], graph, params)
    return _joined(job, part[concurrent], whole[concurrent])


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
    return connected(row, col, int(label.max()) + 1)[label]


def csr_pointer(sorted_rows: np.ndarray, n_rows: int) -> np.ndarray:
    """Start of each of `n_rows` rows in `sorted_rows` (row numbers, ascending), and the end."""
    return np.searchsorted(sorted_rows, np.arange(n_rows + 1)).astype(np.int64)


def ranges(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The indices start[i], start[i] + 1, ..., start[i] + count[i] - 1 of every i, one after the other."""
    return np.repeat(start, count) + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
