"""Validation: every check on every record at once, the first failed one in CHECK_ORDER as its
quarantine reason, and the clean rows typed to FLOWS."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from prism_core.ingest.addresses import _address_column, _Addresses
from prism_core.ingest.columns import _Column, _int_columns, _protocol_column
from prism_core.ingest.records import ADDRESS_FIELDS, INT_FIELDS, _Records
from prism_core.minutes import minute_of
from prism_core.schema import FLOW_REQUIRED, FLOWS, QUARANTINE

MAX_FLOW_BYTES = 10**13  # 10 TB in one flow record is a counter bug, not traffic
MAX_FLOW_PACKETS = 10**13
MIN_TIME_NS = 946_684_800 * 10**9  # 2000-01-01
MAX_TIME_NS = 4_102_444_800 * 10**9  # 2100-01-01

# Reasons in the order they are checked: a record is reported under the first that applies.
CHECK_ORDER = (
    *(f"missing_field:{name}" for name in FLOW_REQUIRED),
    "bad_type:time_flow_start_ns",
    "bad_type:time_flow_end_ns",
    "bad_type:bytes",
    "bad_addr:src_addr",
    "bad_addr:dst_addr",
    "time_out_of_range",
    "end_before_start",
    "nonpositive_bytes",
    "mixed_family",
    "bad_type:packets",
    "bad_type:src_port",
    "bad_type:dst_port",
    "bad_type:time_received_ns",
    "bad_type:sampling_rate",
    "bad_proto",
    "bad_port:src_port",
    "bad_port:dst_port",
    "negative_packets",
    "negative_sampling_rate",
    "bad_addr:sampler_address",
    "bytes_too_large",
    "packets_too_large",
)


@dataclass
class ParsedFile:
    clean: pa.Table  # schema FLOWS
    quarantine: pa.Table  # schema QUARANTINE, ordered by row
    quarantine_start_ns: np.ndarray  # per quarantine row: its valid start time, else -1
    rows_read: int


def _whole_file_rejected(source: str, reason: str, raw: str) -> ParsedFile:
    quarantine = pa.table(
        {"source": [source], "row": [-1], "reason": [reason], "raw": [raw]}, schema=QUARANTINE
    )
    return ParsedFile(FLOWS.empty_table(), quarantine, np.array([-1], dtype=np.int64), 1)


def _validate(records: _Records, source: str) -> ParsedFile:
    n = records.num_parsed
    columns = records.columns
    ints = _int_columns(columns, n)
    addresses = {name: _address_column(columns.get(name, []), n) for name in ADDRESS_FIELDS}
    proto = _protocol_column(columns.get("proto", []), n)

    start, end, size = ints["time_flow_start_ns"], ints["time_flow_end_ns"], ints["bytes"]
    packets, rate = ints["packets"], ints["sampling_rate"]
    src, dst = addresses["src_addr"], addresses["dst_addr"]
    scale = np.where(rate.ok & (rate.values > 1), rate.values, 1)
    start_in_range = (start.values >= MIN_TIME_NS) & (start.values < MAX_TIME_NS)
    end_in_range = (end.values >= MIN_TIME_NS) & (end.values < MAX_TIME_NS)
    failures = {
        **{f"missing_field:{name}": ~_present(name, ints, addresses) for name in FLOW_REQUIRED},
        **{f"bad_type:{name}": ints[name].present & ~ints[name].ok for name in INT_FIELDS},
        **{f"bad_addr:{name}": a.present & ~a.ok for name, a in addresses.items()},
        "time_out_of_range": ~(start_in_range & end_in_range),
        "end_before_start": end.values < start.values,
        "nonpositive_bytes": size.values <= 0,
        "mixed_family": src.family != dst.family,
        "bad_proto": proto.present & ~proto.ok,
        **{
            f"bad_port:{name}": _out_of_port_range(ints[name])
            for name in ("src_port", "dst_port")
        },
        "negative_packets": packets.ok & (packets.values < 0),
        "negative_sampling_rate": rate.ok & (rate.values < 0),
        "bytes_too_large": size.values * scale.astype(np.float64) > MAX_FLOW_BYTES,
        "packets_too_large": packets.values * scale.astype(np.float64) > MAX_FLOW_PACKETS,
    }
    reason = np.full(n, -1, dtype=np.int16)
    for code in reversed(range(len(CHECK_ORDER))):  # last to first: the first failed check wins
        reason[failures[CHECK_ORDER[code]]] = code

    good = reason < 0
    bad = np.flatnonzero(~good)
    clean = _clean_table(good, ints, addresses, proto, scale)
    clean_positions = records.positions[good]
    if np.any(np.diff(clean_positions) < 0):  # lines read in Python come last: restore file order
        clean = clean.take(np.argsort(clean_positions, kind="stable"))
    quarantine_starts = np.where(start.ok & start_in_range, start.values, -1)[bad]
    reasons = np.array(CHECK_ORDER, dtype=object)[reason[bad]]
    quarantine = _quarantine_table(source, records, bad, reasons)
    starts = np.concatenate([quarantine_starts, np.full(len(records.unparseable), -1, np.int64)])
    order = np.argsort(quarantine["row"].to_numpy(), kind="stable")
    return ParsedFile(
        clean,
        quarantine.take(order),
        starts[order],
        n + len(records.unparseable),
    )


def _out_of_port_range(port: _Column) -> np.ndarray:
    return port.ok & ((port.values < 0) | (port.values > 65535))


def _present(name: str, ints: dict[str, _Column], addresses: dict[str, _Addresses]) -> np.ndarray:
    return ints[name].present if name in ints else addresses[name].present


def _clean_table(
    good: np.ndarray,
    ints: dict[str, _Column],
    addresses: dict[str, _Addresses],
    proto: _Column,
    scale: np.ndarray,
) -> pa.Table:
    everything = bool(good.all())  # the common case: skip the copies that selection makes

    def kept(values: np.ndarray) -> np.ndarray:
        return values if everything else values[good]

    def optional(column: _Column, values: np.ndarray, data_type: pa.DataType) -> pa.Array:
        absent = ~kept(column.present)
        return pa.array(kept(values), type=data_type, mask=absent if absent.any() else None)

    def address(name: str) -> pa.Array:
        normalized = addresses[name].normalized
        return normalized if everything else normalized.filter(pa.array(good))

    start = kept(ints["time_flow_start_ns"].values)
    packets, received = ints["packets"], ints["time_received_ns"]
    # Built at FLOWS' types, so only the addresses are cast (decoded), not every column.
    return pa.table(
        {
            "time_flow_start_ns": start,
            "time_flow_end_ns": kept(ints["time_flow_end_ns"].values),
            "src_addr": address("src_addr"),
            "dst_addr": address("dst_addr"),
            "bytes": kept(ints["bytes"].values * scale),
            "packets": optional(packets, packets.values * scale, pa.int64()),
            "src_port": optional(ints["src_port"], ints["src_port"].values, pa.int32()),
            "dst_port": optional(ints["dst_port"], ints["dst_port"].values, pa.int32()),
            "proto": optional(proto, proto.values, pa.int16()),
            "sampler_address": address("sampler_address"),
            "time_received_ns": optional(received, received.values, pa.int64()),
            "sampling_rate": kept(scale),
            "minute": minute_of(pa.array(start, pa.int64())),
        },
        schema=FLOWS,
    )


def _quarantine_table(
    source: str, records: _Records, bad: np.ndarray, reasons: np.ndarray
) -> pa.Table:
    unparseable = records.unparseable
    rows = np.concatenate([records.positions[bad], np.array([u[0] for u in unparseable], np.int64)])
    return pa.table(
        {
            "source": pa.array([source] * len(rows), pa.string()),
            "row": rows,
            "reason": reasons.tolist() + [u[1] for u in unparseable],
            "raw": records.render(bad) + [u[2] for u in unparseable],
        },
        schema=QUARANTINE,
    )
