"""From a minute's traffic graph to its jobs: connected components, the Jaccard rail merge, and
the merge of parts busy on a job's hosts at the same time. Jobs hold GPUs, not hosts: components
on the same hosts are one job only when their traffic keeps in step (see `in_step`)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from prism_core.recognition.params import RecognitionParams


def job_of_nodes(
    src_node: np.ndarray,
    dst_node: np.ndarray,
    node_host_key: np.ndarray,
    node_nic: np.ndarray,
    node_first_ns: np.ndarray,
    node_last_ns: np.ndarray,
    params: RecognitionParams,
) -> np.ndarray:
    """Job label of every node (an address's traffic in one minute) of the graph whose edges join
    `src_node[i]` and `dst_node[i]`. `node_host_key` names the node's host in its minute, so no
    label spans two minutes; `node_nic` its NIC, the same in every minute."""
    component = connected(src_node, dst_node, len(node_host_key))
    job = merge_by_jaccard(component, node_host_key, node_nic, node_first_ns, node_last_ns, params)
    return merge_concurrent_parts(job, node_host_key, node_nic, node_first_ns, node_last_ns, params)


def connected(row: np.ndarray, col: np.ndarray, n_nodes: int) -> np.ndarray:
    """Component of each of `n_nodes` nodes in the undirected graph of edges row[i] - col[i]."""
    graph = sp.coo_matrix((np.ones(len(row), np.int8), (row, col)), shape=(n_nodes, n_nodes))
    return connected_components(graph, directed=False)[1]


def merge_by_jaccard(
    component: np.ndarray,
    node_host_key: np.ndarray,
    node_nic: np.ndarray,
    node_first_ns: np.ndarray,
    node_last_ns: np.ndarray,
    params: RecognitionParams,
) -> np.ndarray:
    """Job label of each node: components joined when their host sets have Jaccard >=
    `params.jaccard` and they talk at the same time (bridging pauses up to the segment gap) and in
    step: a job's rails run side by side, a job and the next one on its hosts one after the other,
    and two jobs on different GPUs of the same hosts each at its own rhythm."""
    _, keys, n_keys, shared = _label_hosts(component, node_host_key)
    n_comp = int(component.max()) + 1
    sizes = np.bincount(keys // n_keys, minlength=n_comp)
    union = sizes[shared.row] + sizes[shared.col] - shared.data
    first_ns = np.full(n_comp, np.iinfo(np.int64).max)
    last_ns = np.full(n_comp, np.iinfo(np.int64).min)
    np.minimum.at(first_ns, component, node_first_ns)
    np.maximum.at(last_ns, component, node_last_ns)
    gap = params.segment_gap_ns
    together = (first_ns[shared.row] <= last_ns[shared.col] + gap) & (first_ns[shared.col] <= last_ns[shared.row] + gap)
    similar = (shared.data >= params.jaccard * union) & together
    anchor = _anchors(component, node_nic)
    similar[similar] = in_step(first_ns, last_ns, anchor, shared.row[similar], shared.col[similar], params)
    return _joined(component, shared.row[similar], shared.col[similar])


def in_step(
    first_ns: np.ndarray, last_ns: np.ndarray, anchor: np.ndarray, a: np.ndarray, b: np.ndarray,
    params: RecognitionParams,
) -> np.ndarray:
    """Do parts `a[i]` and `b[i]` of one minute (spans `first_ns`..`last_ns` of their traffic
    there) keep in step? They do in a minute when they start and end within `params.in_step_ns`
    of each other: a job's rails carry the same collectives and sends at the same moments, while
    a job on other GPUs of the same hosts starts and ends its minute at its own step's phase. Parts
    of one job with other roles (a rail with the pipeline hops only, beside one with the DP sync
    too) differ in the minutes whose edge falls between their bursts, so the verdict is over the
    hour: the same two parts (known by their `anchor`, the smallest NIC, the same every minute)
    keep in step in at least `params.in_step_share` of the minutes they meet."""
    tolerance = params.in_step_ns
    minute_in_step = (np.abs(first_ns[a] - first_ns[b]) <= tolerance) & (np.abs(last_ns[a] - last_ns[b]) <= tolerance)
    if len(a) == 0:
        return minute_in_step
    low, high = np.minimum(anchor[a], anchor[b]), np.maximum(anchor[a], anchor[b])
    _, meeting = np.unique(low * (int(anchor.max()) + 1) + high, return_inverse=True)
    meeting = meeting.ravel()
    share = np.bincount(meeting, weights=minute_in_step) / np.bincount(meeting)
    return share[meeting] >= params.in_step_share


def _anchors(label: np.ndarray, node_nic: np.ndarray) -> np.ndarray:
    """The smallest NIC code of each label's nodes."""
    anchor = np.full(int(label.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(anchor, label, node_nic)
    return anchor


def merge_concurrent_parts(
    job: np.ndarray, node_host_key: np.ndarray, node_nic: np.ndarray, node_first_ns: np.ndarray,
    node_last_ns: np.ndarray, params: RecognitionParams,
) -> np.ndarray:
    """Job label of each node, with every job of a minute merged into another whose host set holds
    all of its hosts, when the two are busy on a host they share at the same time and keep in step
    (`in_step`): rails that carry only pipeline hops between two hosts of a wide job form
    components too small for the Jaccard merge, and at a job's last seconds their flow sizes can
    differ from every earlier minute's. Hosts only partly shared, or used one after the other,
    stay apart (a job on part of the hosts of one that stopped seconds before), and so do jobs on
    other GPUs of the hosts, each at its own rhythm."""
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
    pointer = csr_pointer(key_job, n_jobs)
    counts = hosts_of_job[part]
    pair_of = np.repeat(np.arange(len(part)), counts)
    in_part = pointer[part][pair_of] + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    in_whole = np.searchsorted(keys, whole[pair_of] * n_keys + key_host[in_part])
    together = (first_ns[in_part] < last_ns[in_whole]) & (first_ns[in_whole] < last_ns[in_part])
    concurrent = np.bincount(pair_of, weights=together, minlength=len(part)) > 0
    job_first_ns = np.full(n_jobs, np.iinfo(np.int64).max)
    job_last_ns = np.full(n_jobs, np.iinfo(np.int64).min)
    np.minimum.at(job_first_ns, job, node_first_ns)
    np.maximum.at(job_last_ns, job, node_last_ns)
    concurrent[concurrent] = in_step(
        job_first_ns, job_last_ns, _anchors(job, node_nic), part[concurrent], whole[concurrent], params)
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
