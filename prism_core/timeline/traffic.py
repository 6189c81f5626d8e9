"""One job's comm-pair flows as arrays sorted by start, and the part of them carried to the next hour."""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.constants import CHECKPOINT_FLOW_BYTES, DP, KIND_CODES, OTHER, PP
from prism_core.timeline.params import TimelineParams
from prism_core.timeline.rows import RowIndex

SIZE_BITS = 40  # flow sizes up to 1 TB fit below a pair's code in one int64 key


@dataclass
class Traffic:
    """One job's comm-pair flows as arrays sorted by start (ns), plus its outbound bulk writes."""

    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray
    kind: np.ndarray  # DP | PP | OTHER
    pair: np.ndarray  # index into `pairs`
    exporter: np.ndarray  # index into `exporters`
    pairs: list[str]  # "src>dst"
    exporters: list[str]
    bulk_writes: np.ndarray  # start of each large flow from the job to an address not its GPU
    bulk_write_ends: np.ndarray  # and its end, in the same order
    host_of: dict[str, str]  # address -> host, where known
    indexes: dict = field(default_factory=dict, repr=False)  # (kind, params) -> RowIndex, built on first use
    _quiet_before: np.ndarray | None = field(default=None, repr=False)

    COLUMNS = ("start", "end", "nbytes", "kind", "pair", "exporter")

    @classmethod
    def build(cls, job_flows: pa.Table, comm_pairs: pa.Table, carry: dict | None,
              job_gpus: pa.Table | None = None) -> Traffic:
        kinds = _pair_kinds(comm_pairs)
        gpus = _job_gpus(kinds)
        # only GPU-to-GPU pairs carry training traffic (not storage, monitoring or NFS pairs)
        kinds = kinds.filter(pc.and_(pc.is_in(kinds["src_addr"], value_set=gpus),
                                     pc.is_in(kinds["dst_addr"], value_set=gpus)))
        src = job_flows["src_addr"].combine_chunks().dictionary_encode()
        dst = job_flows["dst_addr"].combine_chunks().dictionary_encode()
        # each flow's pair row, through integer keys on the flows' own address dictionaries
        n_dst = max(len(dst.dictionary), 1)
        pair_src = pc.index_in(kinds["src_addr"], value_set=src.dictionary).to_numpy(zero_copy_only=False)
        pair_dst = pc.index_in(kinds["dst_addr"], value_set=dst.dictionary).to_numpy(zero_copy_only=False)
        pair_key = np.where(np.isnan(pair_src) | np.isnan(pair_dst), -1,
                            np.nan_to_num(pair_src) * n_dst + np.nan_to_num(pair_dst)).astype(np.int64)
        by_key = np.argsort(pair_key)
        flow_key = src.indices.to_numpy().astype(np.int64) * n_dst + dst.indices.to_numpy()
        found = np.minimum(np.searchsorted(pair_key[by_key], flow_key), len(by_key) - 1) if len(by_key) else None
        on_pair = pair_key[by_key][found] == flow_key if found is not None else np.zeros(len(flow_key), bool)
        pair = by_key[found[on_pair]] if found is not None else np.empty(0, np.int64)

        nbytes = job_flows["bytes"].to_numpy()
        outside = ~pc.is_in(dst.dictionary, value_set=gpus).to_numpy(zero_copy_only=False)
        outbound = outside[dst.indices.to_numpy()] & (nbytes >= CHECKPOINT_FLOW_BYTES)
        start = job_flows["time_flow_start_ns"].to_numpy()

        carried = _decode_carry(carry)
        pairs = [f"{s}>{d}" for s, d in zip(kinds["src_addr"].to_pylist(), kinds["dst_addr"].to_pylist())]
        exporter_text = pc.fill_null(job_flows["sampler_address"], "").combine_chunks().dictionary_encode()
        exporters = list(carried["exporters"])
        exporter = _extend(exporters, exporter_text.dictionary.to_pylist())[exporter_text.indices.to_numpy()]
        columns = {
            "start": start[on_pair],
            "end": job_flows["time_flow_end_ns"].to_numpy()[on_pair],
            "nbytes": nbytes[on_pair],
            "kind": kinds["kind"].to_numpy()[pair],
            "pair": pair,
            "exporter": exporter[on_pair],
        }
        # the carried flows' codes point into the lists they were carried with
        carried["pair"] = _extend(pairs, carried["pairs"])[carried["pair"]]
        columns["kind"] = _activations_only(columns["kind"], columns["pair"], columns["nbytes"])
        columns["kind"] = _syncs_only(columns["kind"], columns["pair"], columns["nbytes"], _mean_sizes(comm_pairs, kinds))
        columns = {name: np.concatenate([carried[name], values]).astype(np.int64) for name, values in columns.items()}
        start_order = columns["start"]
        if not np.all(start_order[1:] >= start_order[:-1]):  # flows usually come sorted already
            order = np.argsort(start_order, kind="stable")
            columns = {name: values[order] for name, values in columns.items()}
        write_start = np.concatenate([carried["bulk_writes"], start[outbound]])
        write_end = np.concatenate([carried["bulk_write_ends"], job_flows["time_flow_end_ns"].to_numpy()[outbound]])
        by_start = np.argsort(write_start, kind="stable")
        host_of = dict(zip(job_gpus["addr"].to_pylist(), job_gpus["host"].to_pylist())) if job_gpus is not None else {}
        return cls(**columns, pairs=pairs, exporters=exporters, bulk_writes=write_start[by_start].astype(np.int64),
                   bulk_write_ends=write_end[by_start].astype(np.int64), host_of=host_of)

    def pair_ends(self) -> list[list[str]]:
        """[src, dst] of each pair."""
        return [name.split(">", 1) for name in self.pairs]

    def host_links(self) -> tuple[np.ndarray, np.ndarray]:
        """(link of each pair, the reverse of each link): a link joins two hosts where the hosts are
        known (a pair inside a host is a link of its own), and its reverse runs the other way
        (len(links), one past the last link, where the job has none)."""
        hosts = [[self.host_of.get(addr, addr) for addr in ends] for ends in self.pair_ends()]
        links = [f"{src}>{dst}" if src != dst else name for (src, dst), name in zip(hosts, self.pairs)]
        names, link_of_pair = np.unique(np.array(links, dtype=object), return_inverse=True)
        index = {name: i for i, name in enumerate(names)}
        reverse = np.array([index.get(">".join(name.split(">")[::-1]), len(names)) for name in names] + [len(names)],
                           np.int64)
        return link_of_pair.astype(np.int64), reverse

    def carry(self, from_ns: int) -> dict | None:
        """The flows (and bulk writes) from `from_ns` on, compactly, for the next hour."""
        rows = np.flatnonzero(self.start >= from_ns)
        if not len(rows):
            return None
        pair_used, pair = np.unique(self.pair[rows], return_inverse=True)
        exporter_used, exporter = np.unique(self.exporter[rows], return_inverse=True)
        values = {name: getattr(self, name)[rows] for name in self.COLUMNS}
        values["pair"], values["exporter"] = pair, exporter
        packed = np.stack([values[name] for name in self.COLUMNS]).astype("<i8")
        later_writes = self.bulk_writes >= from_ns
        return {
            "flows": base64.b64encode(zlib.compress(packed.tobytes(), 6)).decode("ascii"),
            "pairs": [self.pairs[i] for i in pair_used],
            "exporters": [self.exporters[i] for i in exporter_used],
            "bulk_writes": self.bulk_writes[later_writes].tolist(),
            "bulk_write_ends": self.bulk_write_ends[later_writes].tolist(),
        }

    def index(self, kind: int | None, params: TimelineParams) -> RowIndex:
        """The rows of `kind` (every row for None) in start order, indexed by pair and exporter."""
        if (kind, params) not in self.indexes:
            rows = np.arange(len(self.start)) if kind is None else np.flatnonzero(self.kind == kind)
            self.indexes[kind, params] = RowIndex(rows, self.start, self.pair, self.exporter, params)
        return self.indexes[kind, params]

    def quiet_before(self) -> np.ndarray:
        """Per row, how long the job was quiet before it: its start less the latest end of the rows
        before it (the first row is never quiet)."""
        if self._quiet_before is None:
            reach = np.maximum.accumulate(self.end)
            self._quiet_before = np.r_[np.iinfo(np.int64).min, self.start[1:] - reach[:-1]][: len(self.start)]
        return self._quiet_before

    def cluster_end(self, rows: np.ndarray, params: TimelineParams) -> int:
        """When the collective of `rows` finished: each pair's last transfer ends at its earliest
        channel's end (single flows stretch), and the collective at the median of the pairs that end
        within `cluster_ns` of the latest ones (the group that finished last; clock skew averages)."""
        by_pair = rows[np.lexsort((self.start[rows], self.pair[rows]))]
        pair = self.pair[by_pair]
        last_of_pair = np.r_[pair[1:] != pair[:-1], True]
        group = np.cumsum(np.r_[True, pair[1:] != pair[:-1]]) - 1
        final = self.start[by_pair] >= self.start[by_pair][last_of_pair][group] - params.transfer_ns
        ends = np.full(group[-1] + 1, np.iinfo(np.int64).max)
        np.minimum.at(ends, group[final], self.end[by_pair][final])
        latest = np.sort(ends)[-2] if len(ends) > 1 else ends[0]
        return int(np.median(ends[ends >= latest - params.cluster_ns]))


def _pair_kinds(comm_pairs: pa.Table) -> pa.Table:
    """One row per directed pair, sorted, with its kind code (dp before pp before other)."""
    code = pa.array([KIND_CODES[k] for k in comm_pairs["kind"].to_pylist()], pa.int64())
    table = pa.table({"src_addr": comm_pairs["src_addr"], "dst_addr": comm_pairs["dst_addr"], "kind": code})
    table = table.group_by(["src_addr", "dst_addr"], use_threads=False).aggregate([("kind", "min")])
    return table.rename_columns(["src_addr", "dst_addr", "kind"]).sort_by([("src_addr", "ascending"),
                                                                          ("dst_addr", "ascending")])


def _job_gpus(kinds: pa.Table) -> pa.Array:
    """The job's GPU addresses: the ends of its DP and pipeline pairs (of all its pairs if it has
    neither)."""
    collective = kinds.filter(pc.less_equal(kinds["kind"], PP))
    ends = collective if collective.num_rows else kinds
    return pc.unique(pa.concat_arrays([ends["src_addr"].combine_chunks(), ends["dst_addr"].combine_chunks()]))


def _activations_only(kind: np.ndarray, pair: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Pipeline pairs carry one activation size per micro-batch; other sizes on them (the tied
    embedding all-reduce between the first and last stage of a 2-stage pipeline) are not
    pipeline sends: kind OTHER."""
    on_pipeline = np.flatnonzero(kind == PP)
    if not len(on_pipeline):
        return kind
    key = pair[on_pipeline] << SIZE_BITS | np.minimum(nbytes[on_pipeline], (1 << SIZE_BITS) - 1)
    sizes, count = np.unique(key, return_counts=True)
    size_pair = sizes >> SIZE_BITS
    most = np.lexsort((count, size_pair))  # per pair, its most frequent size comes last
    last_of_pair = np.r_[size_pair[most][1:] != size_pair[most][:-1], True]
    activation = np.full(int(pair.max()) + 1, -1, np.int64)
    activation[size_pair[most][last_of_pair]] = sizes[most][last_of_pair]
    kind = kind.copy()
    kind[on_pipeline[key != activation[pair[on_pipeline]]]] = OTHER
    return kind


def _mean_sizes(comm_pairs: pa.Table, kinds: pa.Table) -> np.ndarray:
    """(pairs of `kinds` x 2) the mean flow size of each pair's DP and of its other traffic (nan
    where it has none, or where the pairs come without their flows and bytes)."""
    means = np.full((kinds.num_rows, 2), np.nan)
    if not {"flows", "bytes"} <= set(comm_pairs.column_names):
        return means
    for column, kind in enumerate(("dp", "other")):
        rows = comm_pairs.filter(pc.equal(comm_pairs["kind"], kind))
        at = pc.index_in(pc.binary_join_element_wise(rows["src_addr"], rows["dst_addr"], ">"),
                         value_set=pc.binary_join_element_wise(kinds["src_addr"], kinds["dst_addr"], ">"))
        known = pc.is_valid(at).to_numpy(zero_copy_only=False)
        sizes = (pc.divide(rows["bytes"].cast(pa.float64()), rows["flows"].cast(pa.float64()))).to_numpy()
        means[at.to_numpy(zero_copy_only=False)[known].astype(np.int64), column] = sizes[known]
    return means


def _syncs_only(kind: np.ndarray, pair: np.ndarray, nbytes: np.ndarray, mean_sizes: np.ndarray) -> np.ndarray:
    """A pair that carries both a DP sync and other traffic (a MoE all-to-all between the same
    GPUs as a ring's neighbours) is labelled DP as a whole; each of its flows is DP only if its
    size is nearer, by ratio, to the pair's mean DP flow than to its mean other flow (all-to-all
    chunks are orders of magnitude below gradient chunks), so the timeline does not read an
    all-to-all as a sync or a parameter gather."""
    dp_mean, other_mean = mean_sizes[pair, 0], mean_sizes[pair, 1]
    mixed = (kind == DP) & np.isfinite(dp_mean) & np.isfinite(other_mean)
    if not mixed.any():
        return kind
    size = np.maximum(nbytes[mixed], 1).astype(float)
    nearer_other = np.abs(np.log(size / dp_mean[mixed])) > np.abs(np.log(size / other_mean[mixed]))
    kind = kind.copy()
    kind[np.flatnonzero(mixed)[nearer_other]] = OTHER
    return kind


def _extend(names: list[str], more: list[str]) -> np.ndarray:
    """Append the names of `more` that `names` lacks; the index of each of `more` in `names`."""
    index = {name: i for i, name in enumerate(names)}
    for name in more:
        if name not in index:
            index[name] = len(names)
            names.append(name)
    return np.array([index[name] for name in more], np.int64)


def _decode_carry(carry: dict | None) -> dict:
    empty = {name: np.empty(0, np.int64) for name in Traffic.COLUMNS}
    if not carry:
        return {**empty, "pairs": [], "exporters": [], "bulk_writes": np.empty(0, np.int64),
                "bulk_write_ends": np.empty(0, np.int64)}
    packed = np.frombuffer(zlib.decompress(base64.b64decode(carry["flows"])), "<i8").reshape(len(Traffic.COLUMNS), -1)
    return {**dict(zip(Traffic.COLUMNS, packed)), "pairs": list(carry["pairs"]),
            "exporters": list(carry["exporters"]), "bulk_writes": np.asarray(carry["bulk_writes"], np.int64),
            "bulk_write_ends": np.asarray(carry["bulk_write_ends"], np.int64)}
