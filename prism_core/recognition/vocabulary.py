"""Integer codes for GPU NICs, a job's members, so that member sets are numpy arrays; and the host
and the GPUs behind each NIC."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.topology import Topology


class NicVocabulary:
    """Integer codes for GPU NIC addresses, each with its host (coded too) and the GPUs it serves
    from the topology. Without an inventory every address is its own host with one GPU (gpu 0)."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.addrs: list[str] = []
        self._codes: dict[str, int] = {}
        self.host_names: list[str] = []
        self._host_codes: dict[str, int] = {}
        self._host_of = np.zeros(0, np.int64)  # host code of every NIC code
        self._gpus_of = np.zeros(0, np.int64)  # GPUs every NIC code serves
        self._gpu_of = np.zeros(0, np.int64)  # the first GPU every NIC code serves (its rail; -1 unknown)
        self._nic_table = topology.table.select(["addr", "host", "gpu"])
        served = topology.inventory.filter(pc.is_valid(topology.inventory["gpu"]))
        per_addr = served.group_by("addr", use_threads=False).aggregate([("gpu", "count")])
        self._gpus_of_addr = dict(zip(per_addr["addr"].to_pylist(), per_addr["gpu_count"].to_pylist()))
        last = self._nic_table.group_by("host", use_threads=False).aggregate([("gpu", "max")])
        self._last_rail_of = dict(zip(last["host"].to_pylist(), last["gpu_max"].to_pylist()))

    def encode(self, addrs: pa.Array | list[str]) -> np.ndarray:
        """Codes of the NIC `addrs`, adding unseen addresses to the vocabulary."""
        encoded = pa.array(addrs, pa.string()).dictionary_encode()
        distinct = encoded.dictionary
        codes = np.array([self._codes.get(addr, -1) for addr in distinct.to_pylist()], np.int64)
        new = np.flatnonzero(codes < 0)
        if len(new):
            new_addrs = distinct.take(pa.array(new))
            found = self.topology.lookup(new_addrs)
            hosts = found["host"].to_pylist()
            host_codes = [self._host_code(host) for host in hosts]
            served = [self._gpus_of_addr.get(addr, 1) for addr in new_addrs.to_pylist()]
            for position, addr in zip(new.tolist(), new_addrs.to_pylist()):
                codes[position] = self._codes[addr] = len(self.addrs)
                self.addrs.append(addr)
            self._host_of = np.r_[self._host_of, np.array(host_codes, np.int64)]
            self._gpus_of = np.r_[self._gpus_of, np.array(served, np.int64)]
            self._gpu_of = np.r_[self._gpu_of, found["gpu"].to_numpy(zero_copy_only=False).astype(np.int64)]
        return codes[encoded.indices.to_numpy(zero_copy_only=False)] if len(codes) else codes

    def _host_code(self, name: str) -> int:
        code = self._host_codes.get(name)
        if code is None:
            code = self._host_codes[name] = len(self.host_names)
            self.host_names.append(name)
        return code

    def nics_of_hosts(self, host_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every GPU NIC of the hosts `host_codes` in the inventory (none without one): their
        codes, and which is each host's first (its lowest GPU), by host then GPU."""
        names = pa.array(sorted({self.host_names[h] for h in host_codes.tolist()}), pa.string())
        rows = self._nic_table.filter(pc.is_in(self._nic_table["host"], value_set=names))
        rows = rows.sort_by([("host", "ascending"), ("gpu", "ascending")])
        host = rows["host"].to_numpy(zero_copy_only=False)
        first = np.r_[True, host[1:] != host[:-1]] if len(host) else np.zeros(0, bool)
        return self.encode(rows["addr"].combine_chunks()), first

    def hosts(self, codes: np.ndarray) -> np.ndarray:
        """Host code of each NIC code."""
        return self._host_of[codes]

    def rails(self, codes: np.ndarray) -> np.ndarray:
        """The rail of each NIC code: the first GPU it serves (-1 for no GPU NIC)."""
        return self._gpu_of[codes]

    def gpus_served(self, codes: np.ndarray) -> np.ndarray:
        """How many GPUs each NIC code serves (1 without an inventory)."""
        return self._gpus_of[codes]

    def on_last_rail(self, codes: np.ndarray) -> np.ndarray:
        """Whether each NIC code serves its host's last GPUs."""
        last = np.array([self._last_rail_of.get(self.host_names[h], -1) for h in self.hosts(codes).tolist()], np.int64)
        return self.rails(codes) == last

    def addr_list(self, codes: np.ndarray) -> list[str]:
        return sorted(self.addrs[c] for c in codes.tolist())

    def host_list(self, codes: np.ndarray) -> list[str]:
        """The hosts of the NICs `codes`, each once, sorted."""
        return sorted({self.host_names[h] for h in self.hosts(codes).tolist()})

    def gpus(self, codes: np.ndarray) -> int:
        """How many GPUs the NICs `codes` serve (one per NIC without an inventory)."""
        return int(self._gpus_of[codes].sum())

    def nics(self, codes: np.ndarray) -> pa.Table:
        """addr, host, gpu (the first it serves) and gpus (how many) of the NICs `codes`, sorted by
        host then gpu."""
        addrs = pa.array(self.addr_list(codes), pa.string())
        if not self.topology.from_inventory:
            one = np.ones(len(addrs), np.int32)
            return pa.table({"addr": addrs, "host": addrs, "gpu": pa.array(one * 0), "gpus": pa.array(one)})
        rows = self._nic_table.filter(pc.is_in(self._nic_table["addr"], value_set=addrs))
        rows = rows.append_column("gpus", pa.array(self._gpus_of[self.encode(rows["addr"].combine_chunks())], pa.int32()))
        return rows.sort_by([("host", "ascending"), ("gpu", "ascending")])
