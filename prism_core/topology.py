"""The NIC inventory: which host, GPU (rail), leaf switch and pod each address belongs to.

Without an inventory every address is its own GPU on its own host (`host` = the address,
`gpu` = 0), so results still come out, only without the rail merge and host grouping.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from prism_core.ingest import canonical_address
from prism_core.schema import TOPOLOGY, conform


class TopologyError(ValueError):
    """The inventory cannot be used; the message says why."""


@dataclass(frozen=True)
class Topology:
    table: pa.Table  # TOPOLOGY schema, one row per NIC address
    from_inventory: bool

    @classmethod
    def from_csv_bytes(cls, payload: bytes, source: str = "topology") -> Topology:
        try:
            raw = pacsv.read_csv(
                io.BytesIO(payload),
                convert_options=pacsv.ConvertOptions(
                    column_types={"addr": pa.string(), "host": pa.string(), "gpu": pa.int32()}
                ),
            )
        except (pa.ArrowInvalid, UnicodeDecodeError) as error:
            raise TopologyError(f"{source}: not a readable CSV inventory ({error})") from None
        missing = [c for c in ("addr", "host", "gpu") if c not in raw.column_names]
        if missing:
            raise TopologyError(f"{source}: inventory lacks column(s) {', '.join(missing)}")
        table = conform(raw, TOPOLOGY)
        if table.num_rows == 0:
            raise TopologyError(f"{source}: the inventory lists no NIC")
        if table["addr"].null_count or table["host"].null_count or table["gpu"].null_count:
            raise TopologyError(f"{source}: addr, host and gpu must be set on every row")
        addrs = [canonical_address(text) for text in table["addr"].to_pylist()]
        if None in addrs:
            bad = table["addr"][addrs.index(None)].as_py()
            raise TopologyError(f"{source}: {bad!r} is not an IP address")
        table = table.set_column(0, "addr", pa.array(addrs, pa.string()))
        if pc.count_distinct(table["addr"]).as_py() != table.num_rows:
            raise TopologyError(f"{source}: an address is listed twice")
        return cls(table.sort_by("addr"), from_inventory=True)

    @classmethod
    def empty(cls) -> Topology:
        return cls(TOPOLOGY.empty_table(), from_inventory=False)

    def lookup(self, addrs: pa.Array | np.ndarray) -> pa.Table:
        """Inventory rows for `addrs`, in order, with `known` telling which were listed. An address
        the inventory lacks is its own host; its gpu is -1 (a background endpoint such as storage)
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
        """True for addresses that are GPU NICs: in the inventory, or any address without one."""
        if not self.from_inventory:
            return np.ones(len(addrs), bool)
        if isinstance(addrs, np.ndarray):
            addrs = pa.array(addrs, pa.string())
        # Arrow columns go to is_in as they are: rebuilding them would convert through Python.
        return pc.is_in(addrs, value_set=self.table["addr"]).to_numpy(zero_copy_only=False)
