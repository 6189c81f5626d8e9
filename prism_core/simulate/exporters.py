"""What each flow exporter does to the transfers it sees, before its records are written.

Every leaf switch exports the flows entering the fabric through it (`export.FlowSink`). Besides
the scenario's base noise (clock offset, exact 1-in-N division on a few leaves), `Scenario.export`
(`ExportOptions`) gives each exporter, drawn per exporter:

- a flow cache (NetFlow v9 / IPFIX): transfers on one 5-tuple (an RDMA queue pair keeps its
  5-tuple) merge into one record until the flow has been idle for the idle timeout or active for
  the active timeout; a transfer running past the active timeout is split, its bytes shared by time;
- or sFlow sampling: each transfer's packets are sampled 1 in N (binomially); its record holds the
  sampled packets, their bytes (sampled packets x mean packet size) and `sampling_rate` N, which
  the collector scales back. sFlow has no flow start or end, and the contract requires both:
  start = end = the time of the first sampled packet, on the agent's millisecond clock (goflow2
  stamps sFlow with its own receive time instead). A transfer with no sampled packet has no record;
- millisecond timestamps (NetFlow v9), and a clock drift on top of the base clock offset;
- header bytes: every packet's headers (L3, or L2 with Ethernet, per exporter) counted in `bytes`,
  with an extension header on a share of the packets, so equal transfers report unequal bytes;
- record loss: UDP export loses whole datagrams of RECORDS_PER_DATAGRAM records;
- double export: a leaf that also exports the flows it delivers does so from a second agent (its
  own address, clock, header accounting and loss) that reports the same records again. Both
  agents see the same packets, so the copy keeps the first record's cut and samples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cached_property

import numpy as np
import pyarrow as pa

from prism_core.arrays import combination_ids, stable_order, time_segments
from prism_core.simulate.cluster import Cluster
from prism_core.simulate.scenarios import Scenario
from prism_core.simulate.traffic import TCP, UDP, FlowBatch

PAYLOAD = {UDP: 4096, TCP: 1448}  # bytes per packet: RoCE MTU, TCP MSS
L3_HEADERS = {UDP: 20 + 8 + 12 + 4, TCP: 20 + 32}  # IPv4 + UDP + RoCE BTH + ICRC; IPv4 + TCP with timestamps
ETHERNET = 14 + 4  # header and FCS, for exporters that count frames
EXTENSION = 16  # an RDMA extended transport header (RETH), or TCP SACK blocks
EXTENDED_SHARE = 0.25  # packets carrying one
RECORDS_PER_DATAGRAM = 24  # NetFlow v9 records in one ~1,400-byte export datagram
SECOND_AGENT_HOST = 128  # a leaf's second agent: its address's last byte is the leaf's + this
MS = 1_000_000  # ns


@dataclass
class Records(FlowBatch):
    """Flow records as an exporter sends them: transfers' columns (true times), with `nbytes`
    and `packets` as it counts them (sampled where `rate` > 1) and the exporter of each."""

    packets: np.ndarray  # int64
    rate: np.ndarray  # int64: 1-in-N packet sampling
    exporter: np.ndarray  # int32

    dtypes = FlowBatch.dtypes + (np.int64, np.int64, np.int32)

    @staticmethod
    def of_transfers(flows: FlowBatch, exporter: np.ndarray) -> Records:
        payload = np.where(flows.proto == UDP, PAYLOAD[UDP], PAYLOAD[TCP])
        return Records(*(getattr(flows, f.name) for f in fields(FlowBatch)), -(-flows.nbytes // payload),
                       np.ones(len(flows), np.int64), exporter.astype(np.int32))


@dataclass
class ExportCounts:
    transfers: int = 0  # flows of the traffic, before any exporter
    records: int = 0  # records the exporters made of them (flow caches merge, sFlow drops)
    unsampled: int = 0  # transfers no sFlow sample fell on
    copies: int = 0  # records a second agent exported again
    lost: int = 0  # records lost in export


class FlowCache:
    """The flow caches of the exporters that keep one, fed with transfers in time order."""

    def __init__(self, idle_s: np.ndarray, active_s: np.ndarray):
        self.idle_s, self.active_s = idle_s, active_s  # per exporter
        self.open = Records.empty()  # records that can still grow, at most one per 5-tuple

    def update(self, transfers: Records, now_s: float) -> Records:
        """Adds transfers and returns the records that can no longer grow: every transfer still
        to come starts at `now_s` or later."""
        records = self._merge(Records.concat([self.open, transfers]))
        idle, active = self.idle_s[records.exporter], self.active_s[records.exporter]
        growing = (now_s - records.end <= idle) & (now_s < records.start + active)
        self.open = records.take(growing)
        return records.take(~growing)

    def flush(self) -> Records:
        records, self.open = self.open, Records.empty()
        return records

    def _merge(self, records: Records) -> Records:
        """One record per run of a 5-tuple's transfers with no pause above the idle timeout, cut
        every active timeout from the record's first packet."""
        if not len(records):
            return records
        five_tuple = combination_ids(records.proto, records.dst_port, records.src_port, records.dst,
                                     records.src, records.exporter)
        session, *_ = time_segments(five_tuple, records.start, records.end, self.idle_s[records.exporter])
        return _cut_active(records, session, self.active_s[records.exporter])


def _cut_active(records: Records, session: np.ndarray, active: np.ndarray) -> Records:
    """Records of each session's transfers: a record takes every transfer starting before its
    first packet + `active`, a transfer running on past that is split there (bytes and packets
    shared by time), and the next record starts at the split or at the next transfer. Sessions
    advance together, one record per round."""
    n_sessions = int(session.max()) + 1
    session_active = np.zeros(n_sessions)
    session_active[session] = active
    pieces, piece_session = records.take(np.arange(len(records))), session.copy()
    label = np.full(len(records), -1, np.int64)
    rows = np.lexsort((records.start, session))  # pieces still to place, by (session, start)
    first = np.zeros(n_sessions)
    round_ = 0
    while len(rows):
        ses = piece_session[rows]
        opens = np.r_[True, ses[1:] != ses[:-1]]
        first[ses[opens]] = pieces.start[rows[opens]]
        cut = first[ses] + session_active[ses]
        inside = pieces.start[rows] < cut
        label[rows[inside]] = round_ * n_sessions + ses[inside]
        over = inside & (pieces.end[rows] > cut)
        split, at = rows[over], cut[over]
        tails = pieces.take(split)
        share = (at - tails.start) / (tails.end - tails.start)
        head_bytes = np.floor(tails.nbytes * share).astype(np.int64)
        head_packets = np.floor(tails.packets * share).astype(np.int64)
        tails.start, tails.nbytes, tails.packets = at, tails.nbytes - head_bytes, tails.packets - head_packets
        pieces.end[split], pieces.nbytes[split], pieces.packets[split] = at, head_bytes, head_packets
        new = len(pieces) + np.arange(len(split))
        pieces = Records.concat([pieces, tails])
        piece_session = np.r_[piece_session, ses[over]]
        label = np.r_[label, np.full(len(split), -1, np.int64)]
        # a tail starts at the cut, before any transfer left in its session: stable order keeps it first
        rows = np.r_[new, rows[~inside]]
        rows = rows[stable_order(piece_session[rows])]
        round_ += 1
    order = np.argsort(label, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(label[order]) != 0])
    merged = pieces.take(order[bounds])
    merged.start = np.minimum.reduceat(pieces.start[order], bounds)
    merged.end = np.maximum.reduceat(pieces.end[order], bounds)
    merged.nbytes = np.add.reduceat(pieces.nbytes[order], bounds)
    merged.packets = np.maximum(np.add.reduceat(pieces.packets[order], bounds), 1)
    return merged


class ExportLayer:
    """Every exporter's properties, and what they make of each minute's transfers."""

    def __init__(self, scenario: Scenario, cluster: Cluster, seed: int):
        self.cluster, self.options = cluster, scenario.export
        n = cluster.n_leaves
        # base noise, in its own stream as it always was
        rng = np.random.default_rng([seed, 0xE4])
        offset_ns = np.round(rng.normal(0, scenario.clock_skew_ms * 1e6, n)).astype(np.int64)
        self.sampling = np.ones(n, np.int64)
        self.sampling[rng.choice(n, min(scenario.sampled_leaves, n), replace=False)] = scenario.sampling_rate
        # export options: leaves, then their second agents; every draw made whatever is on
        o, draw = self.options, np.random.default_rng([seed, 0xE5])
        kind = draw.random(n)
        lowest, highest = np.log2(o.sflow_rate).astype(int)
        self.sflow_rate = np.where(kind < o.sflow, 2 ** draw.integers(lowest, highest + 1, n), 1)
        self.cached = (kind >= o.sflow) & (kind < o.sflow + o.flow_cache)
        self.cache = FlowCache(_log_uniform(draw, o.idle_timeout_s, n), _log_uniform(draw, o.active_timeout_s, n))
        self.double = draw.random(n) < o.double_export
        self.offset_ns = np.r_[offset_ns, np.round(draw.normal(0, scenario.clock_skew_ms * 1e6, n)).astype(np.int64)]
        self.drift_ppm = draw.normal(0, 1, 2 * n) * o.drift_ppm
        self.milliseconds = (draw.random(2 * n) < o.milliseconds) | np.r_[self.sflow_rate > 1, np.zeros(n, bool)]
        self.ethernet = o.header_bytes & (draw.random(2 * n) < 0.5)
        self.loss = draw.uniform(*o.loss, 2 * n)
        self.counts = ExportCounts()

    @cached_property
    def names(self) -> list[str]:
        return self.cluster.leaf_names + [f"{leaf}-second" for leaf in self.cluster.leaf_names]

    @cached_property
    def addresses(self) -> pa.Array:
        pods, rails = self.cluster.n_pods, self.cluster.n_leaves // self.cluster.n_pods
        second = [f"172.31.{p}.{SECOND_AGENT_HOST + r + 1}" for p in range(pods) for r in range(rails)]
        return pa.concat_arrays([self.cluster.leaf_addrs, pa.array(second, pa.string())])

    def observe(self, flows: FlowBatch, now_s: float, rng: np.random.Generator) -> tuple[Records, int]:
        """The records the exporters send of transfers starting before `now_s` (the flow caches
        keep growing flows for later), and how many of them repeat a record sent too."""
        leaf = self.cluster.endpoint_leaf
        transfers = Records.of_transfers(flows, np.where(leaf[flows.src] >= 0, leaf[flows.src], leaf[flows.dst]))
        self.counts.transfers += len(transfers)
        sflow = self.sflow_rate[transfers.exporter] > 1
        cached = self.cached[transfers.exporter]
        parts = [self._divided(transfers.take(~sflow & ~cached))]
        if sflow.any():
            parts.append(self._sampled(transfers.take(sflow), rng))
        if self.cached.any():
            parts.append(self._divided(self.cache.update(transfers.take(cached), now_s)))
        return self._sent(Records.concat(parts) if len(parts) > 1 else parts[0], rng)

    def flush(self, rng: np.random.Generator) -> tuple[Records, int]:
        """The records of the flows still in the caches when the scenario ends."""
        return self._sent(self._divided(self.cache.flush()), rng)

    def reported_ns(self, exporter: np.ndarray, true_s: np.ndarray) -> np.ndarray:
        """A time (s from the scenario start) in ns as the exporter's clock tells it: offset,
        drift, and milliseconds where it keeps them."""
        true_ns = np.round(true_s * 1e9).astype(np.int64)
        drift = np.round(self.drift_ppm[exporter] * 1e-6 * true_ns).astype(np.int64)
        reported = true_ns + self.offset_ns[exporter] + drift
        return np.where(self.milliseconds[exporter], reported // MS * MS, reported)

    def describe(self) -> dict:
        """The options, the counts, and what each exporter in use did (truth/export.json)."""
        n = self.cluster.n_leaves
        in_use = np.flatnonzero(np.r_[np.ones(n, bool), self.double])
        return {
            "options": asdict(self.options),
            "counts": asdict(self.counts),
            "exporters": {self.names[i]: self._exporter(i) for i in in_use},
        }

    def _exporter(self, i: int) -> dict:
        n = self.cluster.n_leaves
        clock = {
            "clock_offset_ns": int(self.offset_ns[i]),
            "clock_drift_ppm": float(self.drift_ppm[i]),
            "milliseconds": bool(self.milliseconds[i]),
            "header_bytes": ("l2" if self.ethernet[i] else "l3") if self.options.header_bytes else None,
            "loss_rate": float(self.loss[i]),
        }
        if i >= n:
            return {"kind": "second_agent", "of": self.names[i - n], **clock}
        cached = bool(self.cached[i])
        return {
            "kind": "sflow" if self.sflow_rate[i] > 1 else "flow_cache" if cached else "per_transfer",
            "sflow_rate": int(self.sflow_rate[i]),
            "idle_timeout_s": float(self.cache.idle_s[i]) if cached else None,
            "active_timeout_s": float(self.cache.active_s[i]) if cached else None,
            "base_sampling_rate": int(self.sampling[i]),
            "double_export": bool(self.double[i]),
            **clock,
        }

    def _divided(self, records: Records) -> Records:
        """Records of the base noise's sampled leaves: bytes and packets divided by the rate."""
        rate = self.sampling[records.exporter]
        records.nbytes = np.maximum(records.nbytes // rate, 1)
        records.packets = np.maximum(-(-records.packets // rate), 1)
        records.rate = rate
        return records

    def _sampled(self, transfers: Records, rng: np.random.Generator) -> Records:
        rate = self.sflow_rate[transfers.exporter]
        sampled = rng.binomial(transfers.packets, 1 / rate)
        hit = sampled > 0
        self.counts.unsampled += int((~hit).sum())
        records, sampled, rate = transfers.take(hit), sampled[hit], rate[hit]
        # the first of `sampled` uniform packet times
        first = records.start + (records.end - records.start) * rng.beta(1, sampled)
        records.nbytes = np.maximum(np.round(sampled * records.nbytes / records.packets).astype(np.int64), 1)
        records.start, records.end, records.packets, records.rate = first, first, sampled, rate
        return records

    def _sent(self, records: Records, rng: np.random.Generator) -> tuple[Records, int]:
        """Header bytes, second agents' copies and loss; the number of copies whose record survived."""
        self.counts.records += len(records)
        if self.options.header_bytes:
            # extension headers ride on packets, so a second agent sees the same ones
            records.nbytes = records.nbytes + EXTENSION * rng.binomial(records.packets, EXTENDED_SHARE)
        delivering = self.cluster.endpoint_leaf[records.dst]
        copied = np.flatnonzero((delivering >= 0) & self.double[np.maximum(delivering, 0)])
        original = np.full(len(records), -1)
        if len(copied):
            copies = records.take(copied)
            copies.exporter = (self.cluster.n_leaves + delivering[copied]).astype(np.int32)
            self.counts.copies += len(copies)
            records, original = Records.concat([records, copies]), np.r_[original, copied]
        if self.options.header_bytes:
            per_packet = np.where(records.proto == UDP, L3_HEADERS[UDP], L3_HEADERS[TCP])
            records.nbytes = records.nbytes + records.packets * (per_packet + ETHERNET * self.ethernet[records.exporter])
        if not self.loss.any():
            return records, len(copied)
        kept = self._delivered(records, rng)
        self.counts.lost += int((~kept).sum())
        redundant = int(np.sum(kept & (original >= 0) & kept[np.maximum(original, 0)]))
        return records.take(kept), redundant

    def _delivered(self, records: Records, rng: np.random.Generator) -> np.ndarray:
        """Which records arrive: each exporter's datagrams (its records in time order) are lost
        at its loss rate."""
        order = np.lexsort((records.start, records.exporter))
        exporter = records.exporter[order]
        first_of_exporter = np.r_[True, exporter[1:] != exporter[:-1]]
        starts = np.flatnonzero(first_of_exporter)
        position = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        datagram_opens = first_of_exporter | (position % RECORDS_PER_DATAGRAM == 0)
        datagram = np.cumsum(datagram_opens) - 1
        lost = rng.random(int(datagram_opens.sum())) < self.loss[exporter[datagram_opens]]
        kept = np.empty(len(order), bool)
        kept[order] = ~lost[datagram]
        return kept


def _log_uniform(rng: np.random.Generator, bounds: tuple[float, float], n: int) -> np.ndarray:
    return np.exp(rng.uniform(*np.log(bounds), n))
