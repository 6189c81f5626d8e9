"""Traffic that is not a training job's, and must not be mistaken for one.

- storage: data-loader reads (RDMA from storage servers to the NICs of a job while it trains, a
  trickle to idle, hung or relaunching hosts) and small NFS writes (logs);
- management: monitoring scrapes every 15 s (TCP 9100), telemetry pushes (443), ssh sessions (22),
  between management servers and rail-0 NICs of every host in service (drained hosts are silent);
- cross-job transfers: a few one-off RDMA copies between hosts of two *different* running jobs
  (a checkpoint copied to a sibling job, say), rail-aligned like real NCCL traffic. A naive
  union-find over communicating NICs glues the two jobs together through them.
"""

from __future__ import annotations

import numpy as np

from prism_core.simulate.cluster import GPUS_PER_HOST, Cluster
from prism_core.simulate.model import MIB, align
from prism_core.simulate.schedule import JobPlan
from prism_core.simulate.scenarios import Scenario
from prism_core.simulate.traffic import ROCE_PORT, TCP, UDP, FlowBatch, roce_port

SCRAPE_EVERY_S = 15.0
READS_PER_MINUTE = (2.0, 0.05)  # per host: running a job, idle
NFS_WRITES_PER_MINUTE = 0.3  # per host running a job
SSH_PER_MINUTE = 0.01  # per host
STORAGE_RATE = (5e9, 20e9)  # bytes/s a storage flow gets


class Background:
    def __init__(self, scenario: Scenario, cluster: Cluster, plans: list[JobPlan], seed: int):
        self.cluster = cluster
        self.seed = seed
        in_service = np.ones(cluster.n_hosts, bool)
        in_service[list(scenario.drained)] = False
        self.in_service = np.flatnonzero(in_service)
        self.scrape_phase = np.random.default_rng([seed, 0xB6]).uniform(0, SCRAPE_EVERY_S, cluster.n_hosts)
        # hosts training, per minute: a hung or relaunching job's data loaders are quiet
        minute_mid = 60.0 * np.arange(scenario.minutes) + 30.0
        self.running = np.zeros((scenario.minutes, cluster.n_hosts), bool)
        for plan in plans:
            for hosts, (start, stop) in zip(plan.hosts, plan.attempt_spans):
                live = (start <= minute_mid) & (minute_mid < stop)
                self.running[np.ix_(live, hosts)] = True
        self.transfers, self.cross_job = _cross_job_transfers(scenario, cluster, plans, seed)

    def minute(self, w: int) -> FlowBatch:
        rng = np.random.default_rng([self.seed, w, 0xB6])
        t0 = 60.0 * w
        cluster = self.cluster
        hosts = self.in_service
        running = self.running[w, hosts]
        parts = []

        # monitoring scrape: request to the node exporter and its response
        scrapes = np.arange(0, 60, SCRAPE_EVERY_S)
        at = (t0 + self.scrape_phase[hosts][:, None] + scrapes[None, :]).ravel()
        scraped = np.repeat(hosts, len(scrapes))
        nic = scraped * GPUS_PER_HOST
        mgmt = cluster.mgmt_base + scraped % cluster.n_mgmt
        ephemeral = rng.integers(32768, 61000, len(at)).astype(np.int32)
        parts.append(_flows(at, at + rng.uniform(5e-4, 3e-3, len(at)), mgmt, nic,
                            rng.integers(180, 400, len(at)), ephemeral, 9100, TCP))
        reply = at + rng.uniform(1e-3, 5e-3, len(at))
        parts.append(_flows(reply, reply + rng.uniform(2e-3, 2e-2, len(at)), nic, mgmt,
                            rng.integers(8_000, 120_000, len(at)), np.full(len(at), 9100), ephemeral, TCP))
        # telemetry push, once a minute
        at = t0 + rng.uniform(0, 60, len(hosts))
        parts.append(_flows(at, at + rng.uniform(1e-3, 1e-2, len(at)), hosts * GPUS_PER_HOST,
                            cluster.mgmt_base + hosts % cluster.n_mgmt, rng.integers(1_000, 30_000, len(at)),
                            rng.integers(32768, 61000, len(at)), 443, TCP))
        # ssh sessions
        who = hosts[rng.random(len(hosts)) < SSH_PER_MINUTE]
        at = t0 + rng.uniform(0, 60, len(who))
        parts.append(_flows(at, at + rng.uniform(1, 60, len(who)), cluster.mgmt_base + who % cluster.n_mgmt,
                            who * GPUS_PER_HOST, rng.integers(2_000, 2_000_000, len(who)),
                            rng.integers(32768, 61000, len(who)), 22, TCP))
        # data-loader reads over RDMA
        reads = rng.poisson(np.where(running, *READS_PER_MINUTE))
        reader = cluster.gpu_nic[np.repeat(hosts, reads) * GPUS_PER_HOST + rng.integers(0, GPUS_PER_HOST, reads.sum())]
        server = cluster.storage_base + rng.integers(0, cluster.n_storage, len(reader))
        size = align(rng.lognormal(np.log(16 * MIB), 1.0, len(reader)), 1)
        at = t0 + rng.uniform(0, 60, len(reader))
        parts.append(_flows(at, at + size / rng.uniform(*STORAGE_RATE, len(reader)), server, reader,
                            size, roce_port(server, reader, 0, 0), ROCE_PORT, UDP))
        # log and metric files over NFS
        writes = rng.poisson(NFS_WRITES_PER_MINUTE * running)
        writer = np.repeat(hosts, writes) * GPUS_PER_HOST
        size = rng.integers(4_000, 4_000_000, len(writer))
        at = t0 + rng.uniform(0, 60, len(writer))
        parts.append(_flows(at, at + size / 1e9, writer, cluster.storage_base + writer % cluster.n_storage,
                            size, rng.integers(32768, 61000, len(writer)), 2049, TCP))

        in_minute = (self.transfers.start >= t0) & (self.transfers.start < t0 + 60)
        parts.append(self.transfers.take(in_minute))
        return FlowBatch.concat(parts)


def _flows(start, end, src, dst, nbytes, src_port, dst_port, proto) -> FlowBatch:
    n = len(start)
    return FlowBatch(
        start=np.asarray(start, float),
        end=np.asarray(end, float),
        src=np.broadcast_to(src, n).astype(np.int32),
        dst=np.broadcast_to(dst, n).astype(np.int32),
        nbytes=np.broadcast_to(nbytes, n).astype(np.int64),
        src_port=np.broadcast_to(src_port, n).astype(np.int32),
        dst_port=np.broadcast_to(dst_port, n).astype(np.int32),
        proto=np.full(n, proto, np.int16),
    )


def _cross_job_transfers(
    scenario: Scenario, cluster: Cluster, plans: list[JobPlan], seed: int
) -> tuple[FlowBatch, list[dict]]:
    """A few RDMA copies between two running network jobs' hosts, and their record for noise.json."""
    rng = np.random.default_rng([seed, 0xC0B])
    networked = [p for p in plans if p.has_network]
    parts, records = [], []
    for _ in range(scenario.cross_job_transfers):
        for _attempt in range(100):
            t = float(rng.uniform(30, scenario.window_s - 60))
            live = [p for p in networked if p.start_s + 10 <= t < p.end_s - 30 and p.restarts == 0]
            if len(live) >= 2:
                break
        else:
            continue
        a, b = (live[i] for i in rng.choice(len(live), 2, replace=False))
        rail = int(rng.integers(GPUS_PER_HOST))
        # a NIC of each job's own GPUs (a shared host's other NICs serve other jobs)
        src = cluster.nic_near(a.placements[0].gpus, int(rng.choice(a.hosts[0])), rail)
        dst = cluster.nic_near(b.placements[0].gpus, int(rng.choice(b.hosts[0])), rail)
        n = int(rng.integers(2, 6))
        size = align(rng.uniform(64 * MIB, 2048 * MIB, n), 1)
        took = size / rng.uniform(*STORAGE_RATE, n)
        start = t + np.concatenate([[0.0], np.cumsum(took + rng.uniform(0.2, 2.0, n))[:-1]])
        parts.append(_flows(start, start + took, src, dst, size, roce_port(src, dst, 0, 0), ROCE_PORT, UDP))
        records.append({
            "src_addr": cluster.addrs[src].as_py(),
            "dst_addr": cluster.addrs[dst].as_py(),
            "jobs": [a.job_id, b.job_id],
            "start_s": round(t, 3),
            "flows": n,
        })
    return (FlowBatch.concat(parts) if parts else FlowBatch.empty()), records
