"""One job's comm-pair flows as arrays sorted by start, and the part of them carried to the next hour."""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import encoded, value_codes
from prism_core.constants import (
    CHECKPOINT_FLOW_BYTES,
    FLOW_FAMILY_BYTES,
    FLOW_KIND,
    KIND_CODES,
    PP,
)
from prism_core.parallelism import family_sizes
from prism_core.timeline.params import TimelineParams
from prism_core.timeline.rows import RowIndex

# address pairs of a job whose pair rows are looked up in a table (4 bytes each) up to this many
MAX_PAIR_TABLE = 1 << 22
# the carried columns of a state written before the flows came with their size families
CARRIED_BEFORE_FAMILIES = ("start", "end", "nbytes", "kind", "pair", "exporter")


@dataclass
class Traffic:
    """One job's comm-pair flows as arrays sorted by start (ns), plus its outbound bulk writes."""

    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray
    kind: np.ndarray  # DP | PP | OTHER (int8)
    family: np.ndarray  # smallest size of the flow's size family (one transfer size as exporters count it)
    pair: np.ndarray  # index into `pairs` (int32)
    exporter: np.ndarray  # index into `exporters` (int32)
    pairs: list[str]  # "src>dst"
    exporters: list[str]
    bulk_writes: np.ndarray  # start of each large flow from the job to an address not its GPU
    bulk_write_ends: np.ndarray  # and its end, in the same order
    host_of: dict[str, str]  # address -> host, where known
    stages_on_host: dict[str, int] = field(default_factory=dict)  # host -> pipeline stages parallelism put on it
    indexes: dict = field(default_factory=dict, repr=False)  # (kind, params) -> RowIndex, built on first use
    _quiet_before: np.ndarray | None = field(default=None, repr=False)
    # the pairs' ends and host links, made once (the rules ask for them several times a job, and
    # each is a pass of Python over the job's pairs)
    _pair_ends: list[list[str]] | None = field(default=None, repr=False)
    _host_links: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    COLUMNS = ("start", "end", "nbytes", "kind", "family", "pair", "exporter")
    # codes in narrow types (a large job's columns are ~10 M rows each); times and bytes int64
    NARROW_TYPES = {"kind": np.int8, "pair": np.int32, "exporter": np.int32}

    @classmethod
    def build(cls, job_flows: pa.Table, comm_pairs: pa.Table, carry: dict | None,
              job_gpus: pa.Table | None = None) -> Traffic:
        """From the job's flows, labelled by parallelism (`Parallelism.labelled`: each flow's kind
        and size family), or, where they come without labels, each taking its pair's kind and
        the size family parallelism's defaults give its size."""
        kinds = _pair_kinds(comm_pairs)
        gpus = _job_gpus(kinds)
        # only GPU-to-GPU pairs carry training traffic (not storage, monitoring or NFS pairs)
        kinds = kinds.filter(pc.and_(pc.is_in(kinds["src_addr"], value_set=gpus),
                                     pc.is_in(kinds["dst_addr"], value_set=gpus)))
        # the addresses' codes as the flows carry them: only matched to the pairs, whatever their numbering
        dst, dst_names = value_codes(job_flows, "dst_addr")
        on_pair, pair = _pair_of_flows(*value_codes(job_flows, "src_addr"), dst, dst_names, kinds)

        nbytes = job_flows["bytes"].to_numpy()
        outside = ~pc.is_in(dst_names, value_set=gpus).to_numpy(zero_copy_only=False)
        outbound = outside[dst] & (nbytes >= CHECKPOINT_FLOW_BYTES)
        del dst
        start = job_flows["time_flow_start_ns"].to_numpy()

        carried = _decode_carry(carry)
        pairs = [f"{s}>{d}" for s, d in zip(kinds["src_addr"].to_pylist(), kinds["dst_addr"].to_pylist())]
        exporter_code, exporter_names = encoded(job_flows, "sampler_address", fill="")
        exporters = list(carried["exporters"])
        exporter = _extend(exporters, exporter_names.to_pylist()).astype(np.int32)[exporter_code]  # the column's type
        labelled = FLOW_KIND in job_flows.column_names
        # the carried flows' codes point into the lists they were carried with
        carried["pair"] = _extend(pairs, carried["pairs"])[carried["pair"]]
        n_carried = len(carried["start"])

        def column(name: str, values: np.ndarray, of_every_flow: bool = True) -> np.ndarray:
            """The carried flows' values of column `name`, then the flows on a pair's: taken from the
            `values` of every flow straight into the column (no copy between), or given as they are."""
            out = np.empty(n_carried + len(on_pair), cls.NARROW_TYPES.get(name, np.int64))
            out[:n_carried] = carried[name]
            if of_every_flow:
                np.take(values, on_pair, out=out[n_carried:], mode="clip")  # rows in range; "raise" buffers
            else:
                out[n_carried:] = values
            return out

        # one column at a time (each is hundreds of MB for a large job's flows)
        columns = {"start": column("start", start), "end": column("end", job_flows["time_flow_end_ns"].to_numpy()),
                   "nbytes": column("nbytes", nbytes)}
        columns["kind"] = (column("kind", job_flows[FLOW_KIND].to_numpy()) if labelled
                           else column("kind", kinds["kind"].to_numpy()[pair], of_every_flow=False))
        columns["family"] = (column("family", job_flows[FLOW_FAMILY_BYTES].to_numpy()) if labelled
                             else column("family", family_sizes(nbytes[on_pair]), of_every_flow=False))
        columns["pair"] = column("pair", pair, of_every_flow=False)
        columns["exporter"] = column("exporter", exporter)
        del exporter, pair, nbytes  # copied into the columns
        start_order = columns["start"]
        if not np.all(start_order[1:] >= start_order[:-1]):  # flows usually come sorted already
            order = np.argsort(start_order, kind="stable")
            for name in columns:
                columns[name] = columns[name][order]
        write_start = np.concatenate([carried["bulk_writes"], start[outbound]])
        write_end = np.concatenate([carried["bulk_write_ends"], job_flows["time_flow_end_ns"].to_numpy()[outbound]])
        by_start = np.argsort(write_start, kind="stable")
        host_of = dict(zip(job_gpus["addr"].to_pylist(), job_gpus["host"].to_pylist())) if job_gpus is not None else {}
        return cls(**columns, pairs=pairs, exporters=exporters, bulk_writes=write_start[by_start].astype(np.int64),
                   bulk_write_ends=write_end[by_start].astype(np.int64), host_of=host_of,
                   stages_on_host=_stages_on_host(job_gpus))

    def pair_ends(self) -> list[list[str]]:
        """[src, dst] of each pair."""
        if self._pair_ends is None:
            self._pair_ends = [name.split(">", 1) for name in self.pairs]
        return self._pair_ends

    def host_links(self) -> tuple[np.ndarray, np.ndarray]:
        """(link of each pair, the reverse of each link): a link joins two hosts where the hosts are
        known (a pair inside a host is a link of its own), and its reverse runs the other way
        (len(links), one past the last link, where the job has none)."""
        if self._host_links is None:
            hosts = [[self.host_of.get(addr, addr) for addr in ends] for ends in self.pair_ends()]
            links = [f"{src}>{dst}" if src != dst else name for (src, dst), name in zip(hosts, self.pairs)]
            names, link_of_pair = np.unique(np.array(links, dtype=object), return_inverse=True)
            index = {name: i for i, name in enumerate(names)}
            reverse = np.array([index.get(">".join(name.split(">")[::-1]), len(names)) for name in names]
                               + [len(names)], np.int64)
            self._host_links = link_of_pair.astype(np.int64), reverse
        return self._host_links

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
            "columns": list(self.COLUMNS),
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

    def pair_finishes(self, rows: np.ndarray, owner: np.ndarray, n_sets: int,
                      params: TimelineParams) -> tuple[np.ndarray, np.ndarray]:
        """When each pair's part of the collective of each set of `rows` (`owner`: the set of each,
        0..n_sets-1, none empty) finished: the pair's last transfer ends at its earliest
        channel's end (single flows stretch). (set of each pair, its end), sorted by set, then end."""
        order = np.lexsort((self.start[rows], self.pair[rows], owner))
        rows, owner = rows[order], owner[order]
        pair, start = self.pair[rows], self.start[rows]
        opens_pair = np.r_[True, (pair[1:] != pair[:-1]) | (owner[1:] != owner[:-1])]
        group = np.cumsum(opens_pair) - 1
        last_start = start[np.r_[opens_pair[1:], True]][group]
        final = start >= last_start - params.transfer_ns
        ends = np.full(group[-1] + 1, np.iinfo(np.int64).max)
        np.minimum.at(ends, group[final], self.end[rows][final])
        set_of_end = owner[opens_pair]
        by_set = np.lexsort((ends, set_of_end))
        return set_of_end[by_set], ends[by_set]

    def cluster_ends(self, rows: np.ndarray, owner: np.ndarray, n_sets: int, params: TimelineParams) -> np.ndarray:
        """When the collective of each set of `rows` (`owner`: the set of each, 0..n_sets-1, none
        empty) finished: at the median of its pairs' ends (`pair_finishes`) within `cluster_ns` of the
        latest ones (the group that finished last; clock skew averages); the median as np.median
        takes it, truncated to ns. Every set at once."""
        if not n_sets:
            return np.empty(0, np.int64)
        # the second latest pair end (the latest of a lone pair) sets the cluster, a suffix of the set's ends
        set_of_end, ends = self.pair_finishes(rows, owner, n_sets, params)
        count = np.bincount(set_of_end, minlength=n_sets)
        stop = np.cumsum(count)
        latest = ends[stop - 1 - (count > 1)]
        in_cluster = np.bincount(set_of_end, ends >= latest[set_of_end] - params.cluster_ns,
                                 minlength=n_sets).astype(np.int64)
        first = stop - in_cluster
        low, high = ends[first + (in_cluster - 1) // 2], ends[first + in_cluster // 2]
        return ((low.astype(np.float64) + high.astype(np.float64)) / 2).astype(np.int64)


def _pair_of_flows(src: np.ndarray, src_names: pa.Array, dst: np.ndarray, dst_names: pa.Array,
                   kinds: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(the flows on one of the pairs of `kinds`, in order: their row numbers, taken faster than
    by a mask; the pair row of each), through integer keys on the flows' own address dictionaries
    (`src`, `dst`: each flow's codes among `src_names`, `dst_names`); the pair rows int32, the
    pair column's type."""
    n_dst = max(len(dst_names), 1)
    pair_src = pc.index_in(kinds["src_addr"], value_set=src_names).to_numpy(zero_copy_only=False)
    pair_dst = pc.index_in(kinds["dst_addr"], value_set=dst_names).to_numpy(zero_copy_only=False)
    pair_key = np.where(np.isnan(pair_src) | np.isnan(pair_dst), -1,
                        np.nan_to_num(pair_src) * n_dst + np.nan_to_num(pair_dst)).astype(np.int64)
    flow_key = src * n_dst
    flow_key += dst
    n_keys = max(len(src_names), 1) * n_dst
    if n_keys <= MAX_PAIR_TABLE:
        # pairs are distinct: the row of every address pair in a table, one lookup per flow
        row_of_key = np.full(n_keys, -1, np.int32)
        listed = pair_key >= 0
        row_of_key[pair_key[listed]] = np.flatnonzero(listed)
        flow_row = row_of_key[flow_key]
        on_pair = np.flatnonzero(flow_row >= 0)
        return on_pair, flow_row[on_pair]
    # pairs are distinct (a flow key is never -1): a hashed lookup per flow, not a binary search
    pair_row = pc.index_in(pa.array(flow_key), value_set=pa.array(pair_key, pa.int64()))
    return (np.flatnonzero(pc.is_valid(pair_row).to_numpy(zero_copy_only=False)),
            pair_row.drop_null().to_numpy().astype(np.int32, copy=False))


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


def _stages_on_host(job_gpus: pa.Table | None) -> dict[str, int]:
    """Per host: how many pipeline stages parallelism's layout puts on its GPUs (none where the
    layout gives no stages)."""
    if job_gpus is None or "pp_stage" not in job_gpus.column_names:
        return {}
    pairs = job_gpus.select(["host", "pp_stage"]).drop_null()
    pairs = pairs.group_by(["host", "pp_stage"], use_threads=False).aggregate([])
    hosts, counts = np.unique(pairs["host"].to_numpy(zero_copy_only=False).astype(str), return_counts=True)
    return dict(zip(hosts.tolist(), counts.tolist()))


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
    names = carry.get("columns", CARRIED_BEFORE_FAMILIES)
    packed = np.frombuffer(zlib.decompress(base64.b64decode(carry["flows"])), "<i8").reshape(len(names), -1)
    columns = dict(zip(names, packed))
    columns.setdefault("family", columns["nbytes"])  # carried before flows had families: each its own
    return {**columns, "pairs": list(carry["pairs"]),
            "exporters": list(carry["exporters"]), "bulk_writes": np.asarray(carry["bulk_writes"], np.int64),
            "bulk_write_ends": np.asarray(carry["bulk_write_ends"], np.int64)}
