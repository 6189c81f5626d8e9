"""Physical layout of the simulated platform: GPU hosts, rail NICs, leaf switches, servers.

Every endpoint that can appear in a flow has an integer index, so traffic is generated as integer
arrays and turned into address strings only when it is written:

    [0, n_nics)                      GPU NICs, index = host * 8 + rail (rail k serves GPU k)
    [n_nics, n_nics + n_storage)     storage servers (10.200.0.x)
    [.., + n_mgmt)                   management / monitoring servers (10.250.0.x)

Hosts are grouped in pods; each pod has one leaf switch per rail (rail-optimized fabric), and that
leaf is the flow exporter for its NICs. Storage and management servers are not GPU NICs, so they
are left out of the topology inventory (`topology()`): an operator's GPU inventory does not list
them, and Prism must treat their traffic as background.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from prism_core.schema import TOPOLOGY

GPUS_PER_HOST = 8


@dataclass(frozen=True)
class Cluster:
    n_hosts: int
    pod_hosts: int = 32
    n_storage: int = 8
    n_mgmt: int = 2

    @property
    def n_nics(self) -> int:
        return self.n_hosts * GPUS_PER_HOST

    @property
    def n_pods(self) -> int:
        return -(-self.n_hosts // self.pod_hosts)

    @property
    def n_leaves(self) -> int:
        return self.n_pods * GPUS_PER_HOST

    @property
    def storage_base(self) -> int:
        return self.n_nics

    @property
    def mgmt_base(self) -> int:
        return self.n_nics + self.n_storage

    @property
    def n_endpoints(self) -> int:
        return self.mgmt_base + self.n_mgmt

    def host_name(self, host: int) -> str:
        return f"gpu{host:04d}"

    @cached_property
    def addrs(self) -> pa.Array:
        """Address text of every endpoint, by endpoint index."""
        host = np.repeat(np.arange(self.n_hosts), GPUS_PER_HOST)
        rail = np.tile(np.arange(GPUS_PER_HOST), self.n_hosts)
        pod, slot = np.divmod(host, self.pod_hosts)
        gpu_nics = [f"10.{p + 1}.{r}.{s + 1}" for p, r, s in zip(pod, rail, slot)]
        storage = [f"10.200.{i // 250}.{i % 250 + 1}" for i in range(self.n_storage)]
        mgmt = [f"10.250.0.{i + 1}" for i in range(self.n_mgmt)]
        return pa.array(gpu_nics + storage + mgmt, pa.string())

    @cached_property
    def endpoint_leaf(self) -> np.ndarray:
        """Leaf switch index of every endpoint; -1 for servers outside the GPU fabric."""
        nic = np.arange(self.n_nics)
        host, rail = np.divmod(nic, GPUS_PER_HOST)
        leaf = (host // self.pod_hosts) * GPUS_PER_HOST + rail
        return np.concatenate([leaf, np.full(self.n_storage + self.n_mgmt, -1)]).astype(np.int32)

    @cached_property
    def leaf_names(self) -> list[str]:
        return [f"leaf-p{p:02d}-r{r}" for p in range(self.n_pods) for r in range(GPUS_PER_HOST)]

    @cached_property
    def leaf_addrs(self) -> pa.Array:
        """Exporter (`sampler_address`) of each leaf switch."""
        return pa.array(
            [f"172.31.{p}.{r + 1}" for p in range(self.n_pods) for r in range(GPUS_PER_HOST)],
            pa.string(),
        )

    def topology(self) -> pa.Table:
        """The operator's GPU NIC inventory (contract "Topology inventory")."""
        host = np.repeat(np.arange(self.n_hosts), GPUS_PER_HOST)
        rail = np.tile(np.arange(GPUS_PER_HOST), self.n_hosts)
        leaves = self.leaf_names
        return pa.table(
            {
                "addr": self.addrs.slice(0, self.n_nics),
                "host": pa.array([self.host_name(h) for h in host], pa.string()),
                "gpu": pa.array(rail, pa.int32()),
                "leaf": pa.array([leaves[i] for i in self.endpoint_leaf[: self.n_nics]], pa.string()),
                "pod": pa.array([f"pod{h // self.pod_hosts:02d}" for h in host], pa.string()),
            },
            schema=TOPOLOGY,
        )
