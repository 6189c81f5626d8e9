"""From simulated flows to the files flow collectors leave behind, with their imperfections.

Each leaf switch exports the flows entering the fabric through it (the source NIC's leaf; the
destination's for flows from servers outside the GPU fabric); what each exporter makes of the
transfers it sees (flow caches, sFlow, clocks, header bytes, loss, second agents) is in
`exporters`. Its records are written one file per `file_minutes`
(`flows/<YYYY-MM-DDTHH-MM>_<exporter>.<ext>`), streamed a minute at a time. The base noise, on
top of that and counted in `NoiseCounts` (a second agent's copy of a record also sent counts as a
duplicate):

- clock skew: every exporter's start/end timestamps are off by a fixed few milliseconds
  (`time_received_ns` is the collector's clock and is not skewed);
- sampling: a few exporters sample 1 in N packets and report bytes and packets divided by N;
- duplicates: exact copies of a record, in the same file or, for about a third, re-sent in the
  exporter's next file;
- malformed rows, of the kinds in `MALFORMED_KINDS` (JSON lines add wrong types and broken lines).
  A huge byte count is one of at least 10**15 (a petabyte in one flow).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism_core.schema import FLOWS
from prism_core.simulate.cluster import Cluster
from prism_core.simulate.exporters import ExportLayer, Records
from prism_core.simulate.scenarios import Scenario
from prism_core.simulate.traffic import TCP, UDP, FlowBatch

FLOW_FILE = pa.schema([f for f in FLOWS if f.name != "minute"])
INTERNAL = [("_exporter", pa.int32()), ("_order", pa.int64())]  # routing and row order, not written
BUFFER = pa.schema(list(FLOW_FILE) + INTERNAL)
MALFORMED_KINDS = {
    "parquet": ("missing_field", "negative_bytes", "zero_bytes", "huge_bytes", "end_before_start",
                "bad_addr", "mixed_family"),
    "jsonl": ("missing_field", "negative_bytes", "zero_bytes", "huge_bytes", "end_before_start",
              "bad_addr", "mixed_family", "wrong_type", "broken_json"),
}
FORMATS = ("parquet", "jsonl", "jsonl.gz")  # what the flow files can be written as
HUGE_BYTES = 10**15
BAD_ADDRS = ("10.0.0.256", "gpu-node-17", "", "10.1.2", "fe80::zz", "10.1.2.3.4")
PROTO_NAMES = {UDP: "UDP", TCP: "TCP"}  # goflow2 prints the protocol by name
JSON_FIELDS = ("time_received_ns", "sampling_rate", "sampler_address", "time_flow_start_ns",
               "time_flow_end_ns", "bytes", "packets", "src_addr", "dst_addr", "proto", "src_port",
               "dst_port")
EXPORT_DELAY_S = (0.05, 1.5)
LATE_DUPLICATE_SHARE = 0.3
BUFFER_ROWS = 1_000_000  # rows held for all exporters before every buffer is written out


@dataclass
class NoiseCounts:
    records: int = 0  # distinct valid records
    duplicates: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    files: int = 0
    bytes_written: int = 0


class FlowSink:
    """Writes each minute's flows to per-exporter files (Parquet or goflow2 JSON lines)."""

    def __init__(self, flows_dir: Path, fmt: str, scenario: Scenario, cluster: Cluster, seed: int):
        self.dir, self.fmt, self.scenario, self.cluster, self.seed = flows_dir, fmt, scenario, cluster, seed
        self.kinds = MALFORMED_KINDS["parquet" if fmt == "parquet" else "jsonl"]
        self.layer = ExportLayer(scenario, cluster, seed)
        self.counts = NoiseCounts(malformed={k: 0 for k in self.kinds})
        self.bucket = None
        self.valid: dict[int, list[pa.Table]] = {}
        self.bad: dict[int, list[dict]] = {}
        self.late: list[pa.Table] = []  # duplicates re-sent in the exporter's next file
        self.buffered = 0
        self.writers: dict[int, object] = {}

    @property
    def exporters(self) -> dict:
        """Per leaf: clock skew and sampling rate (for noise.json)."""
        layer = self.layer
        return {name: {"clock_skew_ns": int(layer.offset_ns[i]), "sampling_rate": int(layer.sampling[i])}
                for i, name in enumerate(self.cluster.leaf_names)}

    def write(self, minute: int, flows: FlowBatch) -> None:
        """Export flows that start within `minute` of the scenario."""
        # files cover wall-clock intervals (10:00-10:10, ...), so none spans an hour boundary
        bucket = (self.scenario.start_ns // 60_000_000_000 + minute) // self.scenario.file_minutes
        if bucket != self.bucket:
            self._close_bucket()
            self.bucket = bucket
            self._route(self.late)
            self.late = []
        self._export(*self.layer.observe(flows, 60.0 * (minute + 1), np.random.default_rng([self.seed, minute, 0xE5])),
                     np.random.default_rng([self.seed, minute, 0xE4]))

    def close(self) -> None:
        end = self.scenario.minutes
        self._export(*self.layer.flush(np.random.default_rng([self.seed, end, 0xE5])),
                     np.random.default_rng([self.seed, end, 0xE4]))
        self._route(self.late)
        self.late = []
        self._close_bucket()

    def _export(self, records: Records, redundant: int, rng: np.random.Generator) -> None:
        """Writes the records an exporter sent, with the base noise's duplicates and malformed rows;
        `redundant` of them are second agents' copies of records also sent."""
        if not len(records):
            return
        records = self._table(records, rng)
        n = records.num_rows
        self.counts.records += n - redundant
        dup = np.sort(rng.choice(n, rng.binomial(n, self.scenario.duplicate_rate), replace=False))
        late = rng.random(len(dup)) < LATE_DUPLICATE_SHARE
        self.counts.duplicates += len(dup) + redundant
        self.late.append(records.take(dup[late]))
        bad = rng.choice(n, rng.binomial(n, self.scenario.malformed_rate), replace=False)
        for row in records.take(np.sort(bad)).to_pylist():
            kind = self.kinds[rng.integers(len(self.kinds))]
            self.counts.malformed[kind] += 1
            self.bad.setdefault(row["_exporter"], []).append(_corrupt(row, kind, rng))
        self._route([records, records.take(dup[~late])])

    def _table(self, records: Records, rng: np.random.Generator) -> pa.Table:
        layer, origin = self.layer, self.scenario.start_ns
        delay_ns = np.round(rng.uniform(*EXPORT_DELAY_S, len(records)) * 1e9).astype(np.int64)
        received = np.round(records.end * 1e9).astype(np.int64) + delay_ns
        start = origin + layer.reported_ns(records.exporter, records.start)
        return pa.table(
            {
                "time_flow_start_ns": start,
                "time_flow_end_ns": origin + layer.reported_ns(records.exporter, records.end),
                "src_addr": self.cluster.addrs.take(records.src),
                "dst_addr": self.cluster.addrs.take(records.dst),
                "bytes": records.nbytes,
                "packets": records.packets,
                "src_port": records.src_port,
                "dst_port": records.dst_port,
                "proto": records.proto,
                "sampler_address": layer.addresses.take(records.exporter),
                "time_received_ns": origin + received,
                "sampling_rate": records.rate,
                "_exporter": records.exporter,
                "_order": start,
            },
            schema=BUFFER,
        )

    def _route(self, tables: list[pa.Table]) -> None:

        tables = [t for t in tables if t.num_rows]
        if not tables:
            return
        table = pa.concat_tables(tables)
        table = table.sort_by([("_exporter", "ascending"), ("_order", "ascending")])
        exporters = table["_exporter"].to_numpy()
        edges = np.flatnonzero(np.diff(exporters)) + 1
        for lo, hi in zip(np.r_[0, edges], np.r_[edges, len(exporters)]):
            exporter = int(exporters[lo])
            self.valid.setdefault(exporter, []).append(table.slice(lo, hi - lo))
        self.buffered += table.num_rows
        if self.buffered >= BUFFER_ROWS:
            self._flush_all()

    def _flush(self, exporter: int) -> None:
        valid = self.valid.pop(exporter, [])
        bad = self.bad.pop(exporter, [])
        if not valid and not bad:
            return
        if exporter not in self.writers:
            self.writers[exporter] = self._open(exporter)
        if self.fmt == "parquet":
            rows = pa.concat_tables(valid + [pa.Table.from_pylist(bad, schema=BUFFER)])
            rows = rows.sort_by("_order").select(FLOW_FILE.names)
            self.writers[exporter].write_table(rows)
            return
        valid = pa.concat_tables(valid) if valid else BUFFER.empty_table()
        lines = pa.chunked_array([_json_lines(valid), pa.array([r["_line"] for r in bad], pa.string())])
        order = pa.chunked_array([valid["_order"].combine_chunks(),
                                  pa.array([r["_order"] for r in bad], pa.int64())])
        lines = pc.binary_join_element_wise(lines.take(pc.sort_indices(order)), "\n", "").combine_chunks()
        offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset: lines.offset + len(lines) + 1]
        self.writers[exporter].write(lines.buffers()[2][offsets[0]: offsets[-1]])

    def _open(self, exporter: int):
        start = datetime.fromtimestamp(self.bucket * self.scenario.file_minutes * 60, timezone.utc)
        path = self.dir / f"{start:%Y-%m-%dT%H-%M}_{self.layer.names[exporter]}.{self.fmt}"
        self.counts.files += 1
        if self.fmt == "parquet":
            return pq.ParquetWriter(path, FLOW_FILE, compression="zstd")
        raw = open(path, "wb")
        if self.fmt == "jsonl":
            return raw
        return _GzipFile(raw)

    def _flush_all(self) -> None:
        for exporter in sorted(set(self.valid) | set(self.bad)):
            self._flush(exporter)
        self.buffered = 0

    def _close_bucket(self) -> None:
        self._flush_all()
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
        self.counts.bytes_written = sum(p.stat().st_size for p in self.dir.iterdir())


class _GzipFile(gzip.GzipFile):
    """gzip without a timestamp or name in the header, so output is byte-identical per seed."""

    def __init__(self, raw):
        super().__init__(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=1)  # fast: output volume, not size, is the point
        self.raw = raw

    def close(self) -> None:
        super().close()
        self.raw.close()


def _corrupt(row: dict, kind: str, rng: np.random.Generator) -> dict:
    """A broken copy of a record; carries `_order` (and `_line` for JSON lines)."""
    row = dict(row)
    order = row["_order"]
    side = ("src_addr", "dst_addr")[rng.integers(2)]
    if kind == "missing_field":
        row[("time_flow_start_ns", "time_flow_end_ns", "src_addr", "dst_addr", "bytes")[rng.integers(5)]] = None
    elif kind == "negative_bytes":
        row["bytes"] = -row["bytes"]
    elif kind == "zero_bytes":
        row["bytes"] = 0
    elif kind == "huge_bytes":
        row["bytes"] = int(rng.integers(HUGE_BYTES, 1000 * HUGE_BYTES))
    elif kind == "end_before_start":
        row["time_flow_end_ns"] = row["time_flow_start_ns"] - int(rng.integers(1_000_000, 1_000_000_000))
    elif kind == "bad_addr":
        row[side] = BAD_ADDRS[rng.integers(len(BAD_ADDRS))]
    elif kind == "mixed_family":
        row[side] = f"fd00::{int(rng.integers(1, 0xFFFF)):x}"
    elif kind == "wrong_type":
        field_name = ("bytes", "time_flow_start_ns", "src_port")[rng.integers(3)]
        row[field_name] = {"bytes": f"{row['bytes'] / 1e6:.1f}MB",
                           "time_flow_start_ns": "2026-11-22T10:00:00Z", "src_port": "roce"}[field_name]
    line = _json_record(row)
    if kind == "broken_json":
        line = line[: int(rng.integers(10, len(line) - 1))]
    row["_line"] = line
    row["_order"] = order
    return row


def _json_record(row: dict) -> str:
    """One goflow2 JSON line, for the few records formatted one at a time (malformed ones)."""
    record = {"type": "IPFIX", "etype": "IPv4"}
    for name in JSON_FIELDS:
        if row.get(name) is not None:
            record[name] = PROTO_NAMES.get(row[name], row[name]) if name == "proto" else row[name]
    return json.dumps(record, separators=(",", ":"))


def _json_lines(table: pa.Table) -> pa.Array:
    """goflow2 JSON lines of valid records, built column-wise."""
    parts: list = ['{"type":"IPFIX","etype":"IPv4"']
    for name in JSON_FIELDS:
        if name == "proto":
            value = pc.if_else(pc.equal(table[name], UDP), PROTO_NAMES[UDP], PROTO_NAMES[TCP])
        else:
            value = pc.cast(table[name], pa.string())
        quote = '"' if name == "proto" or FLOW_FILE.field(name).type == pa.string() else ""
        parts += [f',"{name}":{quote}', value, quote]
    parts.append("}")
    return pc.binary_join_element_wise(*parts, "").combine_chunks()
