"""Physical layout of the simulated platform: GPU hosts, rail NICs, leaf switches, servers.

Every endpoint that can appear in a flow has an integer index, so traffic is generated as integer
arrays and turned into address strings only when it is written:

    [0, n_nics)                      GPU NIC slots, index = host * 8 + rail (rail k serves GPU k)
    [n_nics, n_nics + n_storage)     storage servers (10.200.0.x)
    [.., + n_mgmt)                   management / monitoring servers (10.250.0.x)

A host has 8 NICs, one per GPU, or 4 (`four_nic_hosts`): NIC k of such a host serves GPUs 2k and
2k + 1 and takes the slot of GPU 2k, so its other slots are never used. GPUs are numbered over the
cluster like the slots (host * 8 + local GPU); `gpu_nic` maps each to the NIC that serves it.

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
    four_nic_hosts: tuple[int, ...] = ()

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

    @cached_property
    def gpus_per_nic(self) -> np.ndarray:
        """(n_hosts,) GPUs each NIC of a host serves: 1, or 2 on a 4-NIC host."""
        per_nic = np.ones(self.n_hosts, np.int64)
        per_nic[list(self.four_nic_hosts)] = 2
        return per_nic

    @cached_property
    def gpu_nic(self) -> np.ndarray:
        """NIC endpoint of every cluster GPU (host * 8 + local GPU)."""
        gpu = np.arange(self.n_nics)
        return gpu - gpu % GPUS_PER_HOST % np.repeat(self.gpus_per_nic, GPUS_PER_HOST)

    def nic_near(self, job_gpus: np.ndarray, host: int, rail: int) -> int:
        """The NIC of the job's GPU on `host` whose local index is nearest `rail`."""
        local = job_gpus[job_gpus // GPUS_PER_HOST == host] % GPUS_PER_HOST
        return int(self.gpu_nic[host * GPUS_PER_HOST + local[np.argmin(np.abs(local - rail))]])

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
        """The operator's GPU NIC inventory (contract "Topology inventory"): one row per NIC, `gpu`
        the first GPU it serves; with 4-NIC hosts, also `gpus_per_nic`."""
        nic = np.unique(self.gpu_nic)
        host, rail = np.divmod(nic, GPUS_PER_HOST)
        leaves = self.leaf_names
        table = pa.table(
            {
                "addr": self.addrs.take(nic),
                "host": pa.array([self.host_name(h) for h in host], pa.string()),
                "gpu": pa.array(rail, pa.int32()),
                "leaf": pa.array([leaves[i] for i in self.endpoint_leaf[nic]], pa.string()),
                "pod": pa.array([f"pod{h // self.pod_hosts:02d}" for h in host], pa.string()),
            },
            schema=TOPOLOGY,
        )
        if self.four_nic_hosts:
            table = table.append_column("gpus_per_nic", pa.array(self.gpus_per_nic[host], pa.int32()))
        return table


@dataclass(frozen=True)
class Placement:
    """Where one attempt of a job runs: rank slot r on GPU `first_gpu + r % per_host` of the job's
    host r // per_host (which rank a slot holds is the job's rank order)."""

    hosts: np.ndarray  # cluster hosts, in rank order
    first_gpu: np.ndarray  # the first of the job's GPUs on each host
    per_host: int  # GPUs the job holds on each host

    @staticmethod
    def of(hosts, first_gpu: tuple[int, ...] | None, per_host: int | None) -> Placement:
        hosts = np.asarray(hosts, np.int64)
        first = np.zeros(len(hosts), np.int64) if first_gpu is None else np.asarray(first_gpu, np.int64)
        return Placement(hosts, first, per_host or GPUS_PER_HOST)

    @cached_property
    def gpus(self) -> np.ndarray:
        """Cluster GPU (host * 8 + local GPU) of each rank slot."""
        slot = np.arange(len(self.hosts) * self.per_host)
        return self.hosts[slot // self.per_host] * GPUS_PER_HOST + self.first_gpu[slot // self.per_host] + slot % self.per_host

    def slots_on(self, host_index: int) -> np.ndarray:
        """Rank slots on the job's `host_index`-th host."""
        return np.arange(self.per_host) + self.per_host * host_index
