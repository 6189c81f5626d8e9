"""Integer codes for host names, so that host sets are numpy arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.topology import Topology


class HostVocabulary:
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
