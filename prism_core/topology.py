"""The NIC inventory: which host, GPU (rail), leaf switch and pod each address belongs to.

An inventory is read as operators keep it: storage and CPU servers' NICs have an empty `gpu`
(non-GPU endpoints, like any address the inventory lacks); a NIC serving several GPUs lists
them in `gpu` separated by `;` (or gives its first GPU and `gpus_per_nic`, or has one row per
GPU); hosts have any number of NICs. A row that cannot be used is skipped and described in
`topology_problems`.

Without an inventory (`Topology.empty`, which a run uses only when asked to) every address is its
own GPU on its own host (`host` = the address, `gpu` = 0): results come out without the rail
merge and host grouping, so a multi-host job shows up once per rail.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from prism_core.ingest import canonical_address
from prism_core.schema import TOPOLOGY

REQUIRED_COLUMNS = ("addr", "host", "gpu")
TEXT_COLUMNS = (*REQUIRED_COLUMNS, "leaf", "pod", "gpus_per_nic")


class TopologyError(ValueError):
    """The inventory cannot be used; the message says why."""


@dataclass(frozen=True)
class Topology:
    table: pa.Table  # TOPOLOGY schema, one row per GPU NIC address; gpu = the first GPU it serves
    from_inventory: bool
    # TOPOLOGY schema, one row per GPU a NIC serves and one with a null gpu per NIC serving none:
    # the fleet as the capacity reports count it
    inventory: pa.Table
    topology_problems: tuple[str, ...] = ()  # "line N: why", one per row skipped

    @classmethod
    def from_csv_bytes(cls, payload: bytes, source: str = "topology") -> Topology:
        raw, lines, problems = _read_csv(payload, source)
        inventory, unusable = _usable_rows(raw, lines)
        problems.update(unusable)
        described = [f"line {line}: {why}" for line, why in sorted(problems.items())]
        if inventory.num_rows == 0:
            first = f" that can be used ({first_few(described, 3)})" if described else ""
            raise TopologyError(f"{source}: the inventory lists no NIC{first}")
        gpu_rows = inventory.filter(pc.is_valid(inventory["gpu"]))
        # inventory is sorted by (addr, gpu): a NIC's first row carries its lowest GPU
        _, first_row = np.unique(gpu_rows["addr"].to_numpy(zero_copy_only=False), return_index=True)
        return cls(
            table=gpu_rows.take(pa.array(first_row)),
            from_inventory=True,
            inventory=inventory,
            topology_problems=tuple(described),
        )

    @classmethod
    def empty(cls) -> Topology:
        return cls(TOPOLOGY.empty_table(), from_inventory=False, inventory=TOPOLOGY.empty_table())

    def lookup(self, addrs: pa.Array | np.ndarray) -> pa.Table:
        """Inventory rows for `addrs`, in order, with `known` telling which were listed as GPU NICs.
        Any other address is its own host; its gpu is -1 (a non-GPU endpoint such as storage)
        when there is an inventory, and 0 when there is none."""
        addrs = pa.array(addrs, pa.string())
        index = pc.index_in(addrs, value_set=self.table["addr"])
        known = pc.is_valid(index)
        rows = self.table.take(pc.fill_null(index, 0)) if self.table.num_rows else None
        unknown_gpu = pa.scalar(-1 if self.from_inventory else 0, pa.int32())
        if rows is None:
            null_text = pa.nulls(len(addrs), pa.string())
            gpu = pa.array(np.full(len(addrs), unknown_gpu.as_py(), np.int32))
            columns = {"host": addrs, "gpu": gpu, "leaf": null_text, "pod": null_text}
        else:
            columns = {
                "host": pc.if_else(known, rows["host"], addrs),
                "gpu": pc.if_else(known, rows["gpu"], unknown_gpu),
                "leaf": pc.if_else(known, rows["leaf"], pa.scalar(None, pa.string())),
                "pod": pc.if_else(known, rows["pod"], pa.scalar(None, pa.string())),
            }
        return pa.table({"addr": addrs, **columns, "known": known})

    def is_gpu_nic(self, addrs: pa.Array | np.ndarray) -> np.ndarray:
        """True for addresses that are GPU NICs: listed with a GPU, or any address without an
        inventory. Storage and CPU hosts' NICs and unlisted addresses are not."""
        if not self.from_inventory:
            return np.ones(len(addrs), bool)
        return self._is_in(addrs, self.table["addr"])

    def unlisted(self, addrs: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Array:
        """The distinct addresses of `addrs` that the inventory does not list at all, sorted: hosts
        missing from it, which are analyzed as non-GPU endpoints."""
        if not self.from_inventory:
            return pa.array([], pa.string())
        distinct = pc.unique(addrs if isinstance(addrs, (pa.Array, pa.ChunkedArray)) else pa.array(addrs, pa.string()))
        return distinct.filter(pa.array(~self._is_in(distinct, self.inventory["addr"]))).sort()

    @staticmethod
    def _is_in(addrs: pa.Array | pa.ChunkedArray | np.ndarray, listed: pa.ChunkedArray) -> np.ndarray:
        if isinstance(addrs, np.ndarray):
            addrs = pa.array(addrs, pa.string())
        # Arrow columns go to is_in as they are: rebuilding them would convert through Python.
        return pc.is_in(addrs, value_set=listed).to_numpy(zero_copy_only=False)


def _read_csv(payload: bytes, source: str) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """The inventory's columns as text, the line of each row, and the lines skipped for a wrong
    number of fields."""
    # One newline spelling, so that the lines counted by _physical_lines are the reader's.
    payload = payload.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    malformed: list[pacsv.InvalidRow] = []

    def skip_malformed(row: pacsv.InvalidRow) -> str:
        malformed.append(row)
        return "skip"

    try:
        raw = pacsv.read_csv(
            io.BytesIO(payload),
            read_options=pacsv.ReadOptions(use_threads=False),  # keeps InvalidRow.number known
            parse_options=pacsv.ParseOptions(invalid_row_handler=skip_malformed),
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.string() for name in TEXT_COLUMNS}, strings_can_be_null=True
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as error:
        raise TopologyError(f"{source}: not a readable CSV inventory ({error})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.column_names]
    if missing:
        raise TopologyError(f"{source}: inventory lacks column(s) {', '.join(missing)}")
    # The reader numbers non-empty lines, the header as 1; the table's rows are the others in order.
    line_of_row = _physical_lines(payload)
    skipped = np.array([row.number for row in malformed], np.int64)
    data_rows = np.setdiff1d(np.arange(2, len(line_of_row) + 1), skipped)
    problems = {
        int(line_of_row[row.number - 1]): f"{row.actual_columns} fields where the header has {row.expected_columns}"
        for row in malformed
    }
    return raw, line_of_row[data_rows - 1], problems


def _usable_rows(raw: pa.Table, lines: np.ndarray) -> tuple[pa.Table, dict[int, str]]:
    """TOPOLOGY rows of the usable rows of a parsed inventory (a row per GPU a NIC serves, one
    with a null gpu per NIC serving none), and why each other row is not usable, by line."""
    text = {name: _text(raw, name) for name in TEXT_COLUMNS}
    addr = pa.array(
        [None if t is None else canonical_address(t) for t in text["addr"].to_pylist()], pa.string()
    )
    gpu_owner, gpu_index, gpu_error = _gpus(text["gpu"], text["gpus_per_nic"])
    reasons = [  # the first that applies is the row's
        (pc.is_null(text["addr"]), lambda i: "no addr"),
        (pc.is_null(addr), lambda i: f"{text['addr'][i].as_py()!r} is not an IP address"),
        (pc.is_null(text["host"]), lambda i: "no host"),
        (gpu_error != "", lambda i: str(gpu_error[i])),
    ]
    bad = np.zeros(raw.num_rows, bool)
    problems: dict[int, str] = {}
    for mask, reason in reasons:
        new = np.asarray(mask, bool) & ~bad
        problems.update({int(lines[i]): reason(i) for i in np.flatnonzero(new)})
        bad |= new

    # An address listed again keeps its first row's host; a row naming another host is a problem.
    encoded = pc.dictionary_encode(addr)
    codes = pc.fill_null(encoded.indices, 0).to_numpy()  # a null addr is a bad row: never used
    good = np.flatnonzero(~bad)
    listed, first_position = np.unique(codes[good], return_index=True)
    first_of_code = np.full(len(encoded.dictionary), -1)
    first_of_code[listed] = good[first_position]
    host = text["host"].to_numpy(zero_copy_only=False)
    first = first_of_code[codes[good]]
    conflict = good[host[good] != host[first]]
    for i, j in zip(conflict.tolist(), first_of_code[codes[conflict]].tolist()):
        problems[int(lines[i])] = f"{addr[i].as_py()} is on host {host[j]!r} at line {lines[j]}"
    bad[conflict] = True

    keep = np.unique(first_of_code[codes[~bad]])
    nics = pa.table(
        {"addr": addr.take(keep), "host": text["host"].take(keep),
         "leaf": text["leaf"].take(keep), "pod": text["pod"].take(keep)}
    )
    served = ~bad[gpu_owner]  # a NIC's GPUs are those of all its usable rows
    gpus = pa.table(
        {"addr": addr.take(pa.array(gpu_owner[served])), "gpu": pa.array(gpu_index[served], pa.int32())}
    ).group_by(["addr", "gpu"], use_threads=False).aggregate([])
    rows = nics.join(gpus, "addr", join_type="left outer", use_threads=False).select(TOPOLOGY.names)
    return rows.cast(TOPOLOGY).sort_by([("addr", "ascending"), ("gpu", "ascending")]), problems


def _text(raw: pa.Table, name: str) -> pa.Array:
    """A column as trimmed text, blank as null (absent columns are all null)."""
    if name not in raw.column_names:
        return pa.nulls(raw.num_rows, pa.string())
    trimmed = pc.utf8_trim_whitespace(raw[name].combine_chunks())
    return pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, pa.string()), trimmed)


def _gpus(gpu: pa.Array, gpus_per_nic: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, GPU index) of every GPU the rows serve, and per row why its GPUs cannot be read
    ("" when they can). `gpu` lists indexes separated by ';'; a row giving one index and
    `gpus_per_nic` n serves n GPUs from that index."""
    listed = pc.split_pattern(gpu, ";")  # null gpu: no list, no GPU
    items = pc.utf8_trim_whitespace(pc.list_flatten(listed))
    owner = pc.list_parent_indices(listed).to_numpy()
    is_index = pc.match_substring_regex(items, r"^[0-9]{1,6}$")
    index = pc.cast(pc.if_else(is_index, items, "0"), pa.int64()).to_numpy()
    n_listed = pc.fill_null(pc.list_value_length(listed), 0).to_numpy()
    per_nic_given = pc.is_valid(gpus_per_nic).to_numpy(zero_copy_only=False)
    per_nic_ok = pc.fill_null(pc.match_substring_regex(gpus_per_nic, r"^[1-9][0-9]{0,2}$"), False)
    per_nic = pc.cast(pc.if_else(per_nic_ok, gpus_per_nic, "1"), pa.int64()).to_numpy()

    error = np.full(len(gpu), "", dtype=object)
    error[(n_listed > 1) & per_nic_given & (per_nic != n_listed)] = "gpu lists another number of GPUs than gpus_per_nic"
    error[per_nic_given & ~per_nic_ok.to_numpy(zero_copy_only=False)] = "gpus_per_nic is not a count of GPUs"
    bad_rows = np.unique(owner[~is_index.to_numpy(zero_copy_only=False)])
    error[bad_rows] = [f"gpu {text!r} is not a GPU index (or indexes separated by ';')"
                       for text in gpu.take(pa.array(bad_rows, pa.int64())).to_pylist()]

    # one listed index with gpus_per_nic n stands for n consecutive GPUs
    repeats = np.where(n_listed[owner] == 1, per_nic[owner], 1)
    starts = np.repeat(np.cumsum(repeats) - repeats, repeats)
    expanded = np.repeat(index, repeats) + np.arange(repeats.sum()) - starts
    return np.repeat(owner, repeats), expanded, error


def _physical_lines(payload: bytes) -> np.ndarray:
    """1-based line number of each non-empty line: the CSV reader skips empty lines when it
    numbers rows."""
    text = np.frombuffer(payload, np.uint8)
    ends = np.append(np.flatnonzero(text == ord("\n")), len(text))
    starts = np.r_[0, ends[:-1] + 1]
    return np.flatnonzero(ends > starts) + 1


def first_few(items: list[str], count: int = 5) -> str:
    """The first `count` items joined for a one-line message, and how many more there are."""
    more = len(items) - count
    return "; ".join(items[:count]) + (f"; and {more} more" if more > 0 else "")
