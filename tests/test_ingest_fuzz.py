"""Property tests for prism_core.ingest: whatever bytes arrive, parse_flow_file never raises,
every record read ends in exactly one place, clean rows are valid, and the Arrow and Python
readers and the three formats agree on what they accept.

The default run is fast (a few hundred examples per property); `-m slow` runs 10,000 files."""

from __future__ import annotations

import codecs
import gzip
import io
import ipaddress
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism_core.ingest import (
    CHECK_ORDER,
    MAX_FLOW_BYTES,
    MAX_TIME_NS,
    MIN_TIME_NS,
    RAW_LIMIT,
    ParsedFile,
    dedupe,
    parse_flow_file,
)
from flow_files import FIELDS, csv_file, field_text, jsonl
from prism_core.minutes import MINUTE_NS
from prism_core.schema import FLOW_OPTIONAL, FLOW_REQUIRED, FLOWS, QUARANTINE

INT64 = (-(2**63), 2**63 - 1)
FAST = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FAST_FEW = settings(FAST, max_examples=60)  # properties that parse several files per example
SLOW = settings(FAST, max_examples=10_000)
REASON = re.compile(
    "|".join(
        [re.escape(reason) for reason in CHECK_ORDER]
        + [r"unparseable:(json_syntax|not_an_object|csv_syntax|field_count|encoding)"]
        + [r"corrupt_file:(gzip|zstd|parquet|encoding|csv_header): .+"]
    )
)

# --- values: plausible flow values mixed with every kind of junk ---------------------------------

times = st.integers(MIN_TIME_NS - 10**18, MAX_TIME_NS + 10**18)
ipv4 = st.integers(0, 2**32 - 1).map(lambda i: str(ipaddress.IPv4Address(i)))
# IPv4-mapped IPv6 addresses (::ffff:0:0/96) are IPv4 once normalized: generated on purpose
# below, so plain IPv6 ones get a bit set that takes them out of that range.
ipv6 = st.integers(0, 2**128 - 1).map(lambda i: str(ipaddress.IPv6Address(i | 1 << 127)))
addresses = st.one_of(
    ipv4,
    ipv6,
    ipv6.map(str.upper),
    ipv4.map(lambda a: f"::ffff:{a}"),
    ipv4.map(lambda a: f" {a} "),
    st.sampled_from(["10.0.0.256", "gpu-17", "", "10.1.2", "fe80::zz", "1.2.3.4.5", "010.1.1.1"]),
)
# Text without control characters (a raw CR or NUL means another thing in CSV than in JSON).
printable = st.one_of(
    st.sampled_from(
        ["", " ", "abc", "1.5", "1e3", "0x10", "+5", "\u22125", "\u0661\u0662", "null", "true",
         "NaN", "10.0.0.1", "UDP", "caf\u00e9", "9223372036854775808", " 42 ", "-0", "a,b", '"hi"']
    ),
    st.text(st.sampled_from("09 .-:abcfxE\u00e9\u4e2d,\""), max_size=8),
)
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    printable,
    st.integers(-(10**20), 10**20).map(lambda i: f" {i}"),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.sampled_from("ab"), st.integers(0, 9), max_size=1),
)


# Strategies are built once: building them per draw costs hypothesis more than the parsing.
plausible = {
    "time_flow_start_ns": times,
    "time_flow_end_ns": times,
    "time_received_ns": times,
    "src_addr": addresses,
    "dst_addr": addresses,
    "sampler_address": addresses,
    "bytes": st.integers(-5, 10**14),
    "packets": st.integers(-5, 10**6),
    "src_port": st.integers(-5, 70_000),
    "dst_port": st.integers(-5, 70_000),
    "proto": st.integers(-1, 300) | st.sampled_from(["UDP", "tcp", "ICMPv6", "FOO", "017"]),
    "sampling_rate": st.integers(-2, 10**6),
}
# One damage to a record: a field set to a plausible or junk value, or dropped.
damages = st.one_of(
    [st.tuples(st.just(name), values | values | junk) for name, values in plausible.items()]
)


def make_valid_record(start, duration, ends, as_text, **optional) -> dict:
    v6, src, dst = ends
    if v6:  # outside ::ffff:0:0/96, whose addresses are IPv4 once normalized
        src, dst = ipaddress.IPv6Address(src | 1 << 127), ipaddress.IPv6Address(dst | 1 << 127)
    else:
        src, dst = ipaddress.IPv4Address(src >> 96), ipaddress.IPv4Address(dst >> 96)
    record = {
        "time_flow_start_ns": start,
        "time_flow_end_ns": start + duration,
        "src_addr": str(src),
        "dst_addr": str(dst),
        **optional,
    }
    if as_text:
        record["bytes"] = str(record["bytes"])
    return {name: value for name, value in record.items() if value is not None}


# Records that pass validation, sometimes with `bytes` written as text.
valid_records = st.builds(
    make_valid_record,
    start=st.integers(MIN_TIME_NS, MAX_TIME_NS - 10**12),
    duration=st.integers(0, 10**11),
    ends=st.tuples(st.booleans(), st.integers(0, 2**128 - 1), st.integers(0, 2**128 - 1)),
    as_text=st.booleans(),
    bytes=st.integers(1, 10**9),
    packets=st.none() | st.integers(0, 10**4),
    src_port=st.none() | st.integers(0, 65535),
    dst_port=st.none() | st.integers(0, 65535),
    proto=st.none() | st.sampled_from(["UDP", "TCP", 17, 6, "icmp"]),
    sampler_address=st.none() | ipv4,
    sampling_rate=st.sampled_from([None, 0, 1, 4, 1000]),
)


def damage(record: dict, changes: list[tuple[str, object]], extra_field: bool) -> dict:
    record = dict(record)
    for name, value in changes:
        if value is None:
            record.pop(name, None)
        else:
            record[name] = value
    if extra_field:
        record["etype"] = "IPv4"
    return record


# Records each mostly valid, some with fields dropped or replaced by junk.
one_record = st.builds(damage, valid_records, st.lists(damages, max_size=3), st.booleans())


def records(max_records: int = 20) -> st.SearchStrategy:
    return st.lists(one_record, max_size=max_records)


# --- files ---------------------------------------------------------------------------------------


def parquet_file(rows: list[dict], columns: tuple[str, ...] = FIELDS, row_group_size=None) -> bytes:
    """Typed columns where the values allow it, text where they mix or do not fit int64."""
    arrays = {}
    for name in columns:
        values = [row.get(name) for row in rows]
        present = [v for v in values if v is not None]
        if all(type(v) is int and INT64[0] <= v <= INT64[1] for v in present):
            arrays[name] = pa.array(values, pa.int64())
        elif all(type(v) is str for v in present):
            arrays[name] = pa.array(values, pa.string())
        else:
            arrays[name] = pa.array([None if v is None else field_text(v) for v in values])
    buffer = io.BytesIO()
    pq.write_table(pa.table(arrays), buffer, row_group_size=row_group_size)
    return buffer.getvalue()


# Parquet columns of every Arrow type a writer might use for a flow field.
ARROW_VALUES = {
    pa.int64(): st.integers(*INT64),
    pa.int16(): st.integers(-(2**15), 2**15 - 1),
    pa.uint64(): st.integers(0, 2**64 - 1),
    pa.float64(): st.floats(),
    pa.bool_(): st.booleans(),
    pa.string(): printable | addresses,
    pa.large_string(): printable | addresses,
    pa.binary(): st.binary(max_size=6),
    pa.list_(pa.int64()): st.lists(st.integers(0, 9), max_size=2),
    pa.struct([("a", pa.int64())]): st.builds(dict, a=st.integers(0, 9)),
    pa.timestamp("ns"): st.integers(0, 2**62),
    pa.duration("ns"): st.integers(0, 2**62),
    pa.null(): st.none(),
}


@st.composite
def typed_parquet_file(draw) -> bytes:
    n = draw(st.integers(1, 6))
    names = FLOW_REQUIRED[: draw(st.integers(3, 5))] + tuple(
        draw(st.lists(st.sampled_from(FLOW_OPTIONAL), unique=True, max_size=4))
    )
    columns = {}
    for name in names:
        arrow_type = draw(st.sampled_from(list(ARROW_VALUES)))
        values = draw(st.lists(st.none() | ARROW_VALUES[arrow_type], min_size=n, max_size=n))
        column = pa.array(values, arrow_type)
        if pa.types.is_string(arrow_type) and draw(st.booleans()):
            column = column.dictionary_encode()
        columns[name] = column
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    return buffer.getvalue()



@st.composite
def damaged_text(draw, payload: bytes) -> bytes:
    """Lines replaced by garbage, truncated, blank, latin-1 or with CRLF ends."""
    lines = payload.split(b"\n")
    for _ in range(draw(st.integers(0, 3))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = draw(
            st.one_of(
                st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
                st.just(lines[at][: len(lines[at]) // 2]),
                st.just(b"   "),
                st.just(lines[at].replace(b"1", "\u00e9".encode("latin-1"))),
                st.just(lines[at] + b"\r"),
                st.just(lines[at] + b" " + lines[at]),
                st.just(b"[1, 2]"),
            )
        )
    return b"\n".join(lines)


@st.composite
def flow_files(draw) -> tuple[bytes, str]:
    """A flow file in any format, possibly damaged, encoded oddly, compressed or truncated."""
    rows = draw(records(max_records=12))
    kind = draw(st.sampled_from(["jsonl", "csv", "parquet", "typed_parquet", "random"]))
    if kind == "typed_parquet":
        payload, suffix = draw(typed_parquet_file()), ".parquet"
    elif kind == "random":
        payload = draw(st.binary(max_size=300))
        suffix = draw(st.sampled_from([".jsonl", ".csv", ".parquet", ""]))
    elif kind == "parquet":
        columns = tuple(draw(st.permutations(FIELDS)))
        if draw(st.booleans()):  # maybe without a required column
            columns = columns[:-1]
        payload = parquet_file(rows, columns, draw(st.sampled_from([None, 1, 7])))
        suffix = draw(st.sampled_from([".parquet", ".pq", ".bin", ""]))
    else:
        columns = tuple(draw(st.permutations(FIELDS)))
        payload = jsonl(rows) if kind == "jsonl" else csv_file(rows, columns)
        payload = draw(damaged_text(payload))
        suffix = draw(st.sampled_from([f".{kind}", ".ndjson" if kind == "jsonl" else ".txt", ""]))
        bom = draw(st.sampled_from(["", "utf-8", "utf-16"]))
        if bom == "utf-8":
            payload = codecs.BOM_UTF8 + payload
        elif bom == "utf-16":
            payload = payload.decode("utf-8", "replace").encode("utf-16")
    compression = draw(st.sampled_from(["", ".gz", ".zst"]))
    if compression == ".gz":
        payload = gzip.compress(payload)
    elif compression == ".zst":
        payload = zstandard.ZstdCompressor().compress(payload)
    if draw(st.integers(0, 5)) == 0:
        payload = payload[: draw(st.integers(0, len(payload)))]
    if payload and draw(st.integers(0, 7)) == 0:
        at = draw(st.integers(0, len(payload) - 1))
        payload = payload[:at] + bytes([payload[at] ^ 0x55]) + payload[at + 1 :]
    return payload, f"flows{suffix}{compression}"


# --- what must hold for every file --------------------------------------------------------------


def check_invariants(parsed: ParsedFile) -> None:
    clean, quarantine = parsed.clean, parsed.quarantine
    assert clean.schema == FLOWS
    assert quarantine.schema == QUARANTINE
    assert parsed.rows_read == clean.num_rows + quarantine.num_rows
    assert len(parsed.quarantine_start_ns) == quarantine.num_rows

    rows = quarantine["row"].to_numpy()
    assert (np.diff(rows) > 0).all(), "one quarantine row per record, in file order"
    assert ((rows >= -1) & (rows < parsed.rows_read)).all()
    if (rows == -1).any():
        assert parsed.rows_read == 1 and clean.num_rows == 0
    for reason, raw in zip(quarantine["reason"].to_pylist(), quarantine["raw"].to_pylist()):
        assert REASON.fullmatch(reason), reason
        assert len(raw) <= 4 * RAW_LIMIT
    starts = parsed.quarantine_start_ns
    assert ((starts == -1) | ((starts >= MIN_TIME_NS) & (starts < MAX_TIME_NS))).all()

    flows = clean.to_pydict()
    for i in range(clean.num_rows):
        start, end = flows["time_flow_start_ns"][i], flows["time_flow_end_ns"][i]
        assert MIN_TIME_NS <= start <= end < MAX_TIME_NS
        assert 0 < flows["bytes"][i] <= MAX_FLOW_BYTES
        assert flows["sampling_rate"][i] >= 1
        src, dst = flows["src_addr"][i], flows["dst_addr"][i]
        assert (str(ipaddress.ip_address(src)), str(ipaddress.ip_address(dst))) == (src, dst)
        assert ipaddress.ip_address(src).version == ipaddress.ip_address(dst).version
        for port in (flows["src_port"][i], flows["dst_port"][i]):
            assert port is None or 0 <= port <= 65535
        assert flows["proto"][i] is None or 0 <= flows["proto"][i] <= 255
        assert flows["packets"][i] is None or flows["packets"][i] >= 0
    minutes = clean["minute"].cast(pa.int64()).to_numpy()
    assert (minutes == clean["time_flow_start_ns"].to_numpy() // MINUTE_NS * MINUTE_NS).all()


def outcome(parsed: ParsedFile) -> tuple[list[dict], list[tuple[int, str]]]:
    rows, reasons = parsed.quarantine["row"].to_pylist(), parsed.quarantine["reason"].to_pylist()
    return parsed.clean.to_pylist(), list(zip(rows, reasons))


# --- properties ---------------------------------------------------------------------------------


FILLER = {
    "time_flow_start_ns": MIN_TIME_NS,
    "time_flow_end_ns": MIN_TIME_NS,
    "src_addr": "10.0.0.1",
    "dst_addr": "10.0.0.2",
    "bytes": 1,
}


def never_raises_and_conserves(file: tuple[bytes, str]) -> None:
    payload, source = file
    check_invariants(parse_flow_file(payload, source))


@FAST
@given(flow_files())
def test_any_file_parses_and_conserves_records(file):
    never_raises_and_conserves(file)


@pytest.mark.slow
@SLOW
@given(flow_files())
def test_any_file_parses_and_conserves_records_10000_files(file):
    never_raises_and_conserves(file)


@FAST
@given(st.binary(max_size=2000), st.sampled_from(["f.jsonl", "f.csv", "f.parquet", "f.gz", "f"]))
def test_random_bytes(payload, source):
    check_invariants(parse_flow_file(payload, source))


@FAST_FEW
@given(records(max_records=6), st.integers(17, 40), st.sampled_from(["jsonl", "csv"]))
def test_arrow_and_python_readers_agree(rows, padding, file_format):
    """Records read by Arrow (in a long file) get the outcome they get when parsed alone (short
    files are parsed in Python)."""
    encode = jsonl if file_format == "jsonl" else csv_file
    filler = [FILLER] * padding
    long_file = parse_flow_file(encode(filler + rows), f"f.{file_format}")
    check_invariants(long_file)
    clean, quarantined = outcome(long_file)
    expected_clean = clean[:padding]
    expected_quarantine = []
    for i, row in enumerate(rows):
        alone_clean, alone_quarantined = outcome(parse_flow_file(encode([row]), f"f.{file_format}"))
        expected_clean += alone_clean
        expected_quarantine += [(padding + i, reason) for _, reason in alone_quarantined]
    assert clean == expected_clean
    assert quarantined == expected_quarantine


@FAST_FEW
@given(records(max_records=10))
def test_formats_agree(rows):
    """The same records as JSON lines, CSV and Parquet: the same clean table, the same reasons."""
    outcomes = {
        "jsonl": outcome(parse_flow_file(jsonl(rows), "f.jsonl")),
        "csv": outcome(parse_flow_file(csv_file(rows), "f.csv")),
        "parquet": outcome(parse_flow_file(parquet_file(rows), "f.parquet")),
    }
    if not rows:
        return
    assert outcomes["csv"] == outcomes["jsonl"]
    assert outcomes["parquet"] == outcomes["jsonl"]


@FAST_FEW
@given(st.lists(valid_records, max_size=15), st.randoms())
def test_dedupe_is_idempotent_and_order_free(rows, random):
    flows = parse_flow_file(jsonl(rows + rows[: len(rows) // 2]), "f.jsonl").clean
    order = random.sample(range(flows.num_rows), flows.num_rows)
    shuffled = flows.take(pa.array(order, pa.int64()))
    once, dropped = dedupe(flows)
    assert dedupe(shuffled)[0].equals(once)
    assert dedupe(once) == (once, 0)
    assert once.num_rows + dropped == flows.num_rows
    assert dropped >= len(rows) // 2
