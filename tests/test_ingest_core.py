"""prism_core.ingest: formats, reason codes, conservation, typing, dedupe and footer bounds."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from prism_core.ingest import (
    CHECK_ORDER,
    RAW_LIMIT,
    ParsedFile,
    dedupe,
    deduplicated_order,
    parquet_time_bounds,
    parse_flow_file,
)
from flow_files import FIELDS, csv_file, field_text, jsonl
from prism_core.minutes import minute_aggregates
from prism_core.schema import FLOW_REQUIRED, FLOWS, QUARANTINE

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def record(**overrides) -> dict:
    """A valid goflow2-style record; an override of None removes the field."""
    base = {
        "type": "IPFIX",
        "time_received_ns": T0 + 2_000_000,
        "sequence_num": 7,
        "sampling_rate": 0,
        "sampler_address": "10.255.0.1",
        "time_flow_start_ns": T0 + 1_000,
        "time_flow_end_ns": T0 + 501_000,
        "bytes": 4096,
        "packets": 4,
        "src_addr": "10.1.2.3",
        "dst_addr": "10.1.2.4",
        "etype": "IPv4",
        "proto": "UDP",
        "src_port": 49152,
        "dst_port": 4791,
    }
    base.update(overrides)
    return {key: value for key, value in base.items() if value is not None}


def as_parquet(records: list[dict], columns: tuple[str, ...] = FIELDS, **options) -> bytes:
    """Typed columns where the values agree on a type, text columns where they do not."""
    arrays = {}
    for name in columns:
        values = [r.get(name) for r in records]
        kinds = {type(v) for v in values if v is not None}
        if kinds <= {int}:
            arrays[name] = pa.array(values, pa.int64())
        elif kinds <= {str}:
            arrays[name] = pa.array(values, pa.string())
        else:
            arrays[name] = pa.array([None if v is None else field_text(v) for v in values])
    buffer = io.BytesIO()
    pq.write_table(pa.table(arrays), buffer, **options)
    return buffer.getvalue()


ENCODERS = {"jsonl": jsonl, "csv": csv_file, "parquet": as_parquet}


def parse(payload: bytes, source: str) -> ParsedFile:
    """parse_flow_file, checking what must hold for every file."""
    parsed = parse_flow_file(payload, source)
    assert parsed.clean.schema == FLOWS
    assert parsed.quarantine.schema == QUARANTINE
    assert parsed.rows_read == parsed.clean.num_rows + parsed.quarantine.num_rows
    assert len(parsed.quarantine_start_ns) == parsed.quarantine.num_rows
    assert parsed.quarantine_start_ns.dtype == np.int64
    return parsed


def quarantined(parsed: ParsedFile) -> list[tuple[int, str]]:
    return list(zip(parsed.quarantine["row"].to_pylist(), parsed.quarantine["reason"].to_pylist()))


# --- one crafted bad record, in every format ------------------------------------------------------

BAD_RECORDS = [
    *((f"missing_field:{name}", {name: None}) for name in FLOW_REQUIRED),
    ("missing_field:bytes", {"bytes": "  "}),
    ("bad_type:time_flow_start_ns", {"time_flow_start_ns": "abc"}),
    ("bad_type:time_flow_end_ns", {"time_flow_end_ns": "1767225600000000000x"}),
    ("bad_type:bytes", {"bytes": "abc"}),
    ("bad_type:bytes", {"bytes": 1.5}),
    ("bad_type:bytes", {"bytes": 1500.0}),
    ("bad_type:bytes", {"bytes": True}),
    ("bad_type:bytes", {"bytes": "0x10"}),
    ("bad_type:bytes", {"bytes": "99999999999999999999"}),
    ("bad_type:bytes", {"bytes": "9223372036854775808"}),  # one above int64
    ("time_out_of_range", {"time_flow_end_ns": " 9223372036854775807"}),  # int64 max parses
    ("bad_addr:src_addr", {"src_addr": "10.0.0.256"}),
    ("bad_addr:src_addr", {"src_addr": "010.0.0.1"}),
    ("bad_addr:dst_addr", {"dst_addr": "gpu-7"}),
    ("time_out_of_range", {"time_flow_start_ns": 5, "time_flow_end_ns": 10}),
    ("time_out_of_range", {"time_flow_end_ns": 4_200_000_000 * 10**9}),
    ("end_before_start", {"time_flow_end_ns": T0}),
    ("nonpositive_bytes", {"bytes": 0}),
    ("nonpositive_bytes", {"bytes": -5}),
    ("mixed_family", {"dst_addr": "fd00::4"}),
    ("bad_type:packets", {"packets": "four"}),
    ("bad_type:src_port", {"src_port": 1.5}),
    ("bad_type:dst_port", {"dst_port": "roce"}),
    ("bad_type:time_received_ns", {"time_received_ns": "yesterday"}),
    ("bad_type:sampling_rate", {"sampling_rate": "1/100"}),
    ("bad_proto", {"proto": "FOO"}),
    ("bad_proto", {"proto": 256}),
    ("bad_proto", {"proto": -1}),
    ("bad_port:src_port", {"src_port": 70000}),
    ("bad_port:dst_port", {"dst_port": -1}),
    ("negative_packets", {"packets": -1}),
    ("negative_sampling_rate", {"sampling_rate": -100}),
    ("bad_addr:sampler_address", {"sampler_address": "exporter-1"}),
    ("bytes_too_large", {"bytes": 10**13 + 1}),
    ("bytes_too_large", {"bytes": 10**7, "sampling_rate": 10**7}),
    ("packets_too_large", {"packets": 10**14}),
]


# Text files of a few lines are parsed in Python; longer runs of lines are read by Arrow.
@pytest.mark.parametrize("neighbours", [1, 40], ids=["python", "arrow"])
@pytest.mark.parametrize("file_format", ENCODERS)
@pytest.mark.parametrize(("reason", "overrides"), BAD_RECORDS, ids=[r for r, _ in BAD_RECORDS])
def test_each_reason_code_in_each_format(file_format, reason, overrides, neighbours):
    records = [record()] * neighbours + [record(**overrides)] + [record(src_port=5)] * neighbours
    parsed = parse(ENCODERS[file_format](records), f"flows.{file_format}")
    assert quarantined(parsed) == [(neighbours, reason)]
    assert parsed.clean["src_port"].to_pylist() == [49152] * neighbours + [5] * neighbours


def test_every_reason_code_is_covered():
    assert {reason for reason, _ in BAD_RECORDS} == set(CHECK_ORDER)


def test_first_problem_in_check_order_is_reported():
    bad = record(src_addr=None, bytes=-5, proto="FOO")
    parsed = parse(jsonl([bad]), "f.jsonl")
    assert quarantined(parsed) == [(0, "missing_field:src_addr")]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"bytes": 5', "unparseable:json_syntax"),
        (b"[1, 2, 3]", "unparseable:not_an_object"),
        (b"42", "unparseable:not_an_object"),
        (b'{"a": 1}{"b": 2}', "unparseable:json_syntax"),
        ('{"src_addr": "caf\xe9"}'.encode("latin-1"), "unparseable:encoding"),
    ],
)
def test_unparseable_json_lines_are_quarantined_alone(line, reason):
    payload = jsonl([record()]) + line + b"\n" + jsonl([record(), record()])
    parsed = parse(payload, "f.jsonl")
    assert quarantined(parsed) == [(1, reason)]
    assert parsed.quarantine["raw"][0].as_py() == line.decode("utf-8", "backslashreplace")
    assert parsed.quarantine_start_ns.tolist() == [-1]
    assert parsed.clean.num_rows == 3


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"1,2,3", "unparseable:field_count"),
        (b'"unterminated,2', "unparseable:csv_syntax"),
        ("caf\xe9".encode("latin-1"), "unparseable:encoding"),
    ],
)
def test_unparseable_csv_rows_are_quarantined_alone(line, reason):
    header, first = csv_file([record()]).splitlines(keepends=True)
    payload = header + first + line + b"\n" + csv_file([record()]).splitlines(keepends=True)[1]
    parsed = parse(payload, "f.csv")
    assert quarantined(parsed) == [(1, reason)]
    assert parsed.clean.num_rows == 2


def test_rows_count_records_not_blank_lines():
    payload = b"\n  \n" + jsonl([record()]) + b"\r\n\n" + jsonl([record(bytes=-1)]) + b"\n"
    parsed = parse(payload, "f.jsonl")
    assert parsed.rows_read == 2
    assert quarantined(parsed) == [(1, "nonpositive_bytes")]
    assert parsed.quarantine["raw"][0].as_py() == json.dumps(record(bytes=-1))


def test_a_few_bad_lines_among_many_are_found_and_the_rest_kept():
    records = [record(bytes=1000 + i) for i in range(5000)]
    lines = jsonl(records).splitlines()
    for row in (0, 1234, 1235, 4999):
        lines[row] = b'{"bytes": oops'
    lines[3000] = json.dumps(record(bytes=1.5)).encode()  # a float makes Arrow read doubles
    parsed = parse(b"\n".join(lines), "f.jsonl")
    assert quarantined(parsed) == [
        (0, "unparseable:json_syntax"),
        (1234, "unparseable:json_syntax"),
        (1235, "unparseable:json_syntax"),
        (3000, "bad_type:bytes"),
        (4999, "unparseable:json_syntax"),
    ]
    expected = [1000 + i for i in range(5000) if i not in (0, 1234, 1235, 3000, 4999)]
    assert parsed.clean["bytes"].to_pylist() == expected


@pytest.mark.parametrize("every", [2, 3, 17, 40])
def test_clusters_of_bad_lines(every):
    lines = jsonl([record(bytes=i + 1) for i in range(3000)]).splitlines()
    bad = set(range(5, 3000, every)) | {2999}
    breakers = [b'{"bytes": oops', b'{"bytes": "12.5MB"}', b'{"bytes": 1.5}', b"", b"[]"]
    for i in bad:
        lines[i] = breakers[i % len(breakers)]
    parsed = parse(b"\n".join(lines), "f.jsonl")
    blank = {i for i in bad if i % len(breakers) == 3}
    position = {line: line - sum(b < line for b in blank) for line in range(3000)}
    assert [row for row, _ in quarantined(parsed)] == sorted(position[i] for i in bad - blank)
    assert parsed.clean["bytes"].to_pylist() == [i + 1 for i in range(3000) if i not in bad]


def test_several_records_on_one_line_in_a_long_file():
    lines = jsonl([record(bytes=i + 1) for i in range(500)]).splitlines()
    lines[300] = lines[300] + b" " + lines[301]
    parsed = parse(b"\n".join(lines), "f.jsonl")
    assert quarantined(parsed) == [(300, "unparseable:json_syntax")]
    assert parsed.clean.num_rows == 499


def test_csv_bad_rows_in_a_long_file():
    header, *rows = csv_file([record(bytes=i + 1) for i in range(2000)]).splitlines()
    rows[10] = b"1,2,3"
    rows[1500] = rows[1500].replace(b",", b"\r", 1)  # a bare CR ends a row for Arrow
    rows[1999] = b'"unterminated,' + rows[1999]
    parsed = parse(b"\n".join([header, *rows]), "f.csv")
    assert quarantined(parsed) == [
        (10, "unparseable:field_count"),
        (1500, "unparseable:csv_syntax"),
        (1999, "unparseable:csv_syntax"),
    ]
    assert parsed.clean.num_rows == 1997


def test_json_types_that_change_along_the_file_are_all_read():
    # The first 1000 lines teach the fast reader text protocols and int bytes; later lines differ.
    records = [record(bytes=100 + i) for i in range(1500)]
    records += [record(proto=6, bytes=str(5000 + i), packets=None) for i in range(1500)]
    records += [record(packets=9)]
    parsed = parse(jsonl(records), "f.jsonl")
    assert parsed.quarantine.num_rows == 0
    assert parsed.clean["proto"].to_pylist() == [17] * 1500 + [6] * 1500 + [17]
    assert parsed.clean["bytes"].to_pylist()[1499:1501] == [1599, 5000]
    assert parsed.clean["packets"].to_pylist()[-2:] == [None, 9]


def test_a_field_first_seen_after_the_sample_is_kept():
    records = [record(packets=None) for _ in range(1200)] + [record(packets=3)]
    parsed = parse(jsonl(records), "f.jsonl")
    assert parsed.clean["packets"].to_pylist()[-2:] == [None, 3]


# --- whole files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_schema_without_a_required_column_rejects_the_file(file_format):
    columns = tuple(c for c in FIELDS if c != "dst_addr")
    payload = ENCODERS[file_format]([record(), record()], columns)
    parsed = parse(payload, f"f.{file_format}")
    assert parsed.rows_read == 1
    assert quarantined(parsed) == [(-1, "missing_field:dst_addr")]
    assert "src_addr" in parsed.quarantine["raw"][0].as_py()


def test_json_lines_without_a_required_field_quarantine_each_record():
    parsed = parse(jsonl([record(dst_addr=None)] * 3), "f.jsonl")
    assert quarantined(parsed) == [(i, "missing_field:dst_addr") for i in range(3)]


def zstd(payload: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(payload)


def parquet_bytes() -> bytes:
    return as_parquet([record(bytes=100 + i) for i in range(500)])


@pytest.mark.parametrize(
    ("payload", "source", "stage"),
    [
        (parquet_bytes()[: len(parquet_bytes()) // 2], "f.parquet", "parquet"),
        (parquet_bytes()[:-9], "f.parquet", "parquet"),
        (b"PAR1" + b"\x07" * 300, "f.dat", "parquet"),
        (gzip.compress(jsonl([record()] * 50))[:-12], "f.jsonl.gz", "gzip"),
        (gzip.compress(jsonl([record()]))[:5] + b"\xff" * 40, "f.jsonl.gz", "gzip"),
        (jsonl([record()]), "f.jsonl.gz", "gzip"),
        (zstd(jsonl([record()] * 50))[:-7], "f.jsonl.zst", "zstd"),
        (gzip.compress(parquet_bytes())[:-30], "f.parquet.gz", "gzip"),
        (jsonl([record()]) + b"\x00\x00", "f.jsonl", "encoding"),
        (codecs.BOM_UTF16_LE + b"\x00\xd8", "f.csv", "encoding"),
    ],
    ids=[
        "parquet-half",
        "parquet-footer",
        "parquet-garbage",
        "gzip-truncated",
        "gzip-corrupt",
        "gzip-suffix-plain-bytes",
        "zstd-truncated",
        "parquet-gz-truncated",
        "nul-bytes",
        "bad-utf16",
    ],
)
def test_corrupt_file_is_one_quarantine_row(payload, source, stage):
    parsed = parse(payload, source)
    assert parsed.rows_read == 1
    assert parsed.clean.num_rows == 0
    [(row, reason)] = quarantined(parsed)
    assert row == -1
    assert reason.startswith(f"corrupt_file:{stage}:")
    first_bytes = payload[:RAW_LIMIT].decode("utf-8", "backslashreplace")
    assert parsed.quarantine["raw"][0].as_py() == first_bytes
    assert parsed.quarantine_start_ns.tolist() == [-1]


@pytest.mark.parametrize(
    ("payload", "source"),
    [
        (b"", "f.jsonl"),
        (b"", "f.parquet"),
        (b"", "f.csv.zst"),
        (b"\n \r\n\n", "f.jsonl"),
        (csv_file([]), "f.csv"),
        (csv_file([], ("a", "b")), "f.csv"),  # a bare header lacking columns: still nothing read
        (gzip.compress(b""), "f.jsonl.gz"),
        (as_parquet([]), "f.parquet"),
        (codecs.BOM_UTF8, "f.jsonl"),
    ],
)
def test_empty_file_reads_nothing(payload, source):
    parsed = parse(payload, source)
    assert parsed.rows_read == 0
    assert parsed.quarantine.num_rows == 0


# --- typing and normalization --------------------------------------------------------------------


def clean_one(file_format: str = "jsonl", **overrides) -> dict:
    parsed = parse(ENCODERS[file_format]([record(**overrides)]), f"f.{file_format}")
    assert parsed.quarantine.num_rows == 0, quarantined(parsed)
    return parsed.clean.to_pylist()[0]


@pytest.mark.parametrize("file_format", ENCODERS)
def test_sampling_rate_scales_bytes_and_packets(file_format):
    scaled = clean_one(file_format, bytes=1500, packets=3, sampling_rate=100)
    assert (scaled["bytes"], scaled["packets"], scaled["sampling_rate"]) == (150_000, 300, 100)
    unknown = clean_one(file_format, bytes=1500, packets=3, sampling_rate=0)
    assert (unknown["bytes"], unknown["packets"], unknown["sampling_rate"]) == (1500, 3, 1)
    absent = clean_one(file_format, bytes=1500, packets=None, sampling_rate=None)
    assert (absent["bytes"], absent["packets"], absent["sampling_rate"]) == (1500, None, 1)
    one = clean_one(file_format, bytes=1500, sampling_rate=1)
    assert one["bytes"] == 1500


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("FD00:0:0:0::0001", "fd00::1"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        (" 10.1.2.3 ", "10.1.2.3"),
        ("10.1.2.3", "10.1.2.3"),
    ],
)
def test_addresses_are_normalized(written, stored):
    other = "fd00::2" if ":" in stored else "10.9.9.9"
    flow = clean_one(src_addr=written, dst_addr=other)
    assert flow["src_addr"] == stored


def test_ipv4_mapped_and_plain_ipv4_are_one_family():
    flow = clean_one(
        src_addr="::ffff:10.0.0.1", dst_addr="10.0.0.2", sampler_address="::ffff:1.2.3.4"
    )
    assert (flow["src_addr"], flow["sampler_address"]) == ("10.0.0.1", "1.2.3.4")


@pytest.mark.parametrize(
    ("proto", "number"),
    [("UDP", 17), ("tcp", 6), ("ICMPv6", 58), (17, 17), ("6", 6), (" gre ", 47)],
)
def test_protocol_names_and_numbers(proto, number):
    assert clean_one(proto=proto)["proto"] == number


@pytest.mark.parametrize("file_format", ENCODERS)
def test_integer_text_is_accepted_like_integers(file_format):
    flow = clean_one(file_format, bytes=" 1500 ", packets="007", src_port="4791")
    assert (flow["bytes"], flow["packets"], flow["src_port"]) == (1500, 7, 4791)


def test_parquet_column_of_the_wrong_type_fails_every_row():
    records = [record(bytes=1000 + i) for i in range(4)]
    table = pa.Table.from_pylist(records).set_column(
        list(records[0]).index("bytes"), "bytes", pa.array([1000.0, 1001.0, 1002.5, None])
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    parsed = parse(buffer.getvalue(), "f.parquet")
    assert [reason for _, reason in quarantined(parsed)] == ["bad_type:bytes"] * 3 + [
        "missing_field:bytes"
    ]
    assert json.loads(parsed.quarantine["raw"][2].as_py())["bytes"] == 1002.5


def test_parquet_time_columns_are_bad_types_with_readable_raw():
    # Python's datetime has no nanoseconds: `raw` shows Arrow's text of the time.
    table = pa.Table.from_pylist([record()])
    name = "time_flow_start_ns"
    column = pa.array([T0 + 1], pa.int64()).cast(pa.timestamp("ns", tz="UTC"))
    table = table.set_column(table.column_names.index(name), name, column)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    parsed = parse(buffer.getvalue(), "f.parquet")
    assert quarantined(parsed) == [(0, "bad_type:time_flow_start_ns")]
    raw = json.loads(parsed.quarantine["raw"][0].as_py())
    assert raw[name] == "2026-01-01 00:00:00.000000001Z"


def test_parquet_unsigned_and_narrow_integer_columns():
    table = pa.Table.from_pylist([record(), record()])
    for name, values in (
        ("bytes", pa.array([5, 2**64 - 1], pa.uint64())),
        ("src_port", pa.array([-3, 80], pa.int16())),
    ):
        table = table.set_column(table.column_names.index(name), name, values)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    parsed = parse(buffer.getvalue(), "f.parquet")
    assert quarantined(parsed) == [(0, "bad_port:src_port"), (1, "bad_type:bytes")]


def test_clean_rows_are_typed_and_have_their_minute():
    flow = clean_one(time_flow_start_ns=T0 + 61 * 10**9 + 5, time_flow_end_ns=T0 + 62 * 10**9)
    assert flow["minute"].timestamp() == T0 / 1e9 + 60
    assert (flow["proto"], flow["dst_port"], flow["time_received_ns"]) == (17, 4791, T0 + 2_000_000)


def test_quarantine_start_is_the_valid_start_or_minus_one():
    records = [
        record(bytes=-1),
        record(time_flow_start_ns="soon"),
        record(time_flow_start_ns=5, time_flow_end_ns=6),
        record(bytes=None, time_flow_start_ns=T0 + 77),
    ]
    parsed = parse(jsonl(records), "f.jsonl")
    assert parsed.quarantine_start_ns.tolist() == [T0 + 1_000, -1, -1, T0 + 77]


def test_raw_is_truncated():
    huge = record(bytes="9" * 10_000)
    parsed = parse(jsonl([huge]), "f.jsonl")
    assert quarantined(parsed) == [(0, "bad_type:bytes")]
    assert len(parsed.quarantine["raw"][0].as_py()) == RAW_LIMIT


# --- formats agree -------------------------------------------------------------------------------


def mixed_records() -> list[dict]:
    rows = [
        record(
            time_flow_start_ns=T0 + i * 7_000_000_001,
            time_flow_end_ns=T0 + i * 7_000_000_001 + 1000,
            bytes=1 + i * 131,
            src_addr=f"10.0.{i % 5}.{i % 7}",
            dst_addr=f"10.1.{i % 3}.{i % 11}",
            packets=None if i % 4 == 0 else i,
            proto=["UDP", "TCP", 17][i % 3],
            src_port=None if i % 6 == 0 else 1000 + i,
            sampling_rate=[0, 1, 10][i % 3],
            sampler_address=None if i % 5 == 0 else "10.255.0.1",
        )
        for i in range(60)
    ]
    rows += [record(src_addr="FD00::1", dst_addr="fd00::0:2")]
    rows += [record(bytes=-4), record(dst_port=99999)]
    return rows


def test_csv_jsonl_and_parquet_give_the_same_tables():
    records = mixed_records()
    results = {
        fmt: parse(encode(records), f"flows.{fmt}") for fmt, encode in ENCODERS.items()
    }
    reference = results["parquet"]
    assert reference.clean.num_rows == 61
    assert quarantined(reference) == [(61, "nonpositive_bytes"), (62, "bad_port:dst_port")]
    for fmt, parsed in results.items():
        assert parsed.clean.equals(reference.clean), fmt
        assert quarantined(parsed) == quarantined(reference), fmt


@pytest.mark.parametrize(
    ("wrap", "source"),
    [
        (gzip.compress, "flows.jsonl.gz"),
        (zstd, "flows.jsonl.zst"),
        (lambda b: zstd(b[:300]) + zstd(b[300:]), "flows.ndjson.zst"),  # two frames
        (gzip.compress, "flows"),  # compressed by magic bytes, JSON by content
        (lambda b: b, "flows.txt"),
        (lambda b: codecs.BOM_UTF8 + b, "flows.json"),
        (lambda b: codecs.BOM_UTF16_LE + b.decode().encode("utf-16-le"), "flows.jsonl"),
    ],
)
def test_compression_and_encodings(wrap, source):
    reference = parse(jsonl(mixed_records()), "flows.jsonl")
    parsed = parse(wrap(jsonl(mixed_records())), source)
    assert parsed.clean.equals(reference.clean)
    assert quarantined(parsed) == quarantined(reference)


@pytest.mark.parametrize(
    ("payload", "source"),
    [
        (lambda: csv_file(mixed_records()), "flows"),
        (lambda: gzip.compress(csv_file(mixed_records())), "flows.csv.gz"),
        (lambda: codecs.BOM_UTF16_BE + csv_file(mixed_records()).decode().encode("utf-16-be"), "c"),
        (lambda: as_parquet(mixed_records()), "flows.bin"),
        (lambda: zstd(as_parquet(mixed_records())), "x.parquet.zst"),
    ],
)
def test_csv_and_parquet_by_content(payload, source):
    reference = parse(as_parquet(mixed_records()), "flows.parquet")
    parsed = parse(payload(), source)
    assert parsed.clean.equals(reference.clean)


def test_csv_header_order_extra_columns_and_duplicates():
    columns = ("dst_addr", "note", *FIELDS[::-1], "bytes")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    values = record(note="x", bytes=77)
    writer.writerow([field_text(values.get(name)) for name in columns[:-1]] + ["oops"])
    parsed = parse(out.getvalue().encode(), "f.csv")
    assert parsed.clean["bytes"].to_pylist() == [77]


# --- dedupe --------------------------------------------------------------------------------------


def flows_table(records: list[dict]) -> pa.Table:
    parsed = parse(jsonl(records), "f.jsonl")
    assert parsed.quarantine.num_rows == 0
    return parsed.clean


def test_dedupe_drops_flows_reported_by_two_exporters():
    a = record(bytes=100)
    records = [
        a,
        # The same flow from another exporter, received earlier.
        record(bytes=100, sampler_address="10.255.0.2", time_received_ns=T0 + 1_500_000),
        record(bytes=150),  # a size beyond what header accounting explains: a different flow
        a,
        record(bytes=100, src_port=None),
        record(bytes=100, src_port=None, sampler_address="10.255.0.9"),
    ]
    table, dropped = dedupe(flows_table(records))
    assert dropped == 3
    assert table.num_rows == 3
    # Of two exporters' reports, the first exporter's stays (whichever arrived first).
    kept = table.filter(pa.compute.equal(table["bytes"], 100)).to_pylist()
    assert [(r["src_port"], r["sampler_address"]) for r in kept] == [
        (49152, "10.255.0.1"),
        (None, "10.255.0.1"),
    ]


def test_dedupe_output_does_not_depend_on_input_order():
    records = mixed_records()[:-3] * 2
    table = flows_table(records)
    shuffled = table.take(np.random.default_rng(3).permutation(table.num_rows))
    first, dropped_first = dedupe(table)
    second, dropped_second = dedupe(shuffled)
    assert dropped_first == dropped_second == 60
    assert first.equals(second)
    starts = first["time_flow_start_ns"].to_numpy()
    assert (np.diff(starts) >= 0).all()
    assert first.schema == FLOWS


def test_minute_aggregates_of_rows_with_their_duplicates_masked_out():
    """The pipeline aggregates a minute's rows as read, not a deduplicated copy: masking out the
    duplicates must give the aggregates of the deduplicated rows."""
    repeated_size = [
        record(time_flow_start_ns=T0 + i * 1_000_000, time_flow_end_ns=T0 + i * 1_000_000 + 10, bytes=4096)
        for i in range(5)
    ]
    records = (mixed_records()[:-3] + repeated_size) * 2 + repeated_size[:2]
    table = flows_table(records)
    table = table.take(np.random.default_rng(5).permutation(table.num_rows))
    deduplicated, dropped = dedupe(table)
    kept = deduplicated_order(table)
    assert table.num_rows - len(kept) == dropped == 67
    assert table.take(kept).equals(deduplicated)
    counted = np.zeros(table.num_rows, bool)
    counted[kept] = True
    aggregates = minute_aggregates(table, counted)
    assert aggregates.equals(minute_aggregates(deduplicated))
    repeated = aggregates.filter(pa.compute.equal(aggregates["top_size"], 4096))
    assert repeated["top_size_flows"].to_pylist() == [5]


def exported_twice(offset_ns: int, lost_first: tuple[int, ...] = (), lost_second: tuple[int, ...] = (),
                   every_ns: int = 2_000_000) -> list[dict]:
    """Eight transfers `every_ns` apart on one queue pair, each reported by two exporters whose
    clocks differ by `offset_ns`, the second counting 18 more header bytes per packet; the
    transfers in `lost_*` are missing from that exporter."""
    records = []
    for k in range(8):
        start = T0 + k * every_ns
        if k not in lost_first:
            records.append(record(time_flow_start_ns=start, time_flow_end_ns=start + 400_000, bytes=40_960,
                                  packets=10, sampler_address="10.255.0.1"))
        if k not in lost_second:
            records.append(record(time_flow_start_ns=start + offset_ns, time_flow_end_ns=start + offset_ns + 400_000,
                                  bytes=40_960 + 180, packets=10, sampler_address="10.255.0.2"))
    return records


# clocks further apart than the transfers: sorted by reported start, the exporters interleave
@pytest.mark.parametrize("offset_ns", [0, 3_000_000, -4_500_000, 7_000_000])
def test_dedupe_counts_once_a_flow_two_exporters_report_with_their_own_clocks(offset_ns):
    table, dropped = dedupe(flows_table(exported_twice(offset_ns)))
    assert dropped == 8
    # of each pair, the first exporter's record stays, so its clock is the one kept
    assert table["sampler_address"].to_pylist() == ["10.255.0.1"] * 8
    assert table["time_flow_start_ns"].to_pylist() == [T0 + k * 2_000_000 for k in range(8)]


def test_dedupe_keeps_the_copy_of_a_record_its_first_exporter_lost():
    records = exported_twice(3_000_000, lost_first=(2, 5), lost_second=(6,), every_ns=10_000_000)
    table, dropped = dedupe(flows_table(records))
    assert dropped == 5
    assert table.num_rows == 8
    assert table["sampler_address"].to_pylist().count("10.255.0.2") == 2


def test_dedupe_output_of_copies_does_not_depend_on_input_order():
    table = flows_table(exported_twice(3_000_000, lost_first=(4,)))
    shuffled = table.take(np.random.default_rng(1).permutation(table.num_rows))
    assert dedupe(table)[0].equals(dedupe(shuffled)[0])


@pytest.mark.parametrize(
    "second",
    [
        {"sampler_address": "10.255.0.1"},  # one exporter: two transfers, not a copy
        {"sampler_address": None},  # no exporter: nothing tells the reports apart
        {"bytes": 60_000},  # beyond what header accounting explains
        {"time_flow_start_ns": T0 + 2_000_000_000, "time_flow_end_ns": T0 + 2_000_400_000},
        {"dst_port": 4792},
    ],
)
def test_dedupe_keeps_records_that_are_not_copies(second):
    first = record(time_flow_start_ns=T0, time_flow_end_ns=T0 + 400_000, bytes=40_960)
    other = dict(first, sampler_address="10.255.0.2", bytes=40_980)
    other.update(second)
    table, dropped = dedupe(flows_table([first, {k: v for k, v in other.items() if v is not None}]))
    assert dropped == 0 and table.num_rows == 2


def alike_transfers_at_milliseconds(exporter: str, offset_ms: int, received_ns: int) -> list[dict]:
    """Three transfers on one queue pair within one millisecond, of one size: at a millisecond
    clock their records are identical but for when the collector received each."""
    start = T0 + (5 + offset_ms) * 1_000_000
    return [record(time_flow_start_ns=start, time_flow_end_ns=start, bytes=40_960, packets=10,
                   sampler_address=exporter, time_received_ns=received_ns + k * 1_700)
            for k in range(3)]


def test_dedupe_keeps_transfers_one_exporter_reports_identically_at_milliseconds():
    records = alike_transfers_at_milliseconds("10.255.0.1", 0, T0 + 9_000_000)
    table, dropped = dedupe(flows_table(records + records[:1]))  # and one record delivered twice
    assert dropped == 1
    assert table.num_rows == 3


def test_dedupe_drops_every_copy_of_alike_transfers_from_an_exporter_with_another_clock():
    # a second exporter 2 ms behind reports the same three transfers, and a few others the two
    # share tell the offset
    first = alike_transfers_at_milliseconds("10.255.0.1", 0, T0 + 9_000_000)
    second = alike_transfers_at_milliseconds("10.255.0.2", -2, T0 + 9_500_000)
    shared = [record(time_flow_start_ns=T0 + k * 10**9 + shift, time_flow_end_ns=T0 + k * 10**9 + shift,
                     dst_port=4791 + k, sampler_address=exporter)
              for k in range(1, 4) for exporter, shift in (("10.255.0.1", 0), ("10.255.0.2", -2_000_000))]
    table, dropped = dedupe(flows_table(first + second + shared))
    assert dropped == 6
    assert table["sampler_address"].to_pylist() == ["10.255.0.1"] * 6
    assert table.num_rows == 6


def test_dedupe_drops_every_copy_of_an_all_to_alls_transfers_of_several_sizes_in_one_millisecond():
    # an all-to-all sends four sizes on one queue pair within a millisecond, every 0.5 s; a second
    # exporter's millisecond clock runs 2.3 ms behind, so its copies start 2 or 3 ms later: sorted
    # by time alone, each exporter's four sit together and only the two in the middle meet
    sizes = (3_932_160, 5_242_880, 6_553_600, 7_864_320)
    records = []
    for k in range(6):
        start = T0 + k * 500_000_000 + 400_000 * k
        for exporter, offset in (("10.255.0.1", 0), ("10.255.0.2", 2_300_000)):
            for size in sizes:
                at = (start + offset) // 1_000_000 * 1_000_000
                records.append(record(time_flow_start_ns=at, time_flow_end_ns=at + 1_000_000, bytes=size,
                                      packets=size // 4096, sampler_address=exporter))
    table, dropped = dedupe(flows_table(records))
    assert dropped == 24
    assert table["sampler_address"].to_pylist() == ["10.255.0.1"] * 24


def test_dedupe_of_empty_and_single_tables():
    assert dedupe(FLOWS.empty_table()) == (FLOWS.empty_table(), 0)
    one = flows_table([record()])
    table, dropped = dedupe(one)
    assert dropped == 0 and table.equals(one)
    assert deduplicated_order(FLOWS.empty_table()).tolist() == []
    assert deduplicated_order(one).tolist() == [0]


# --- footer statistics ---------------------------------------------------------------------------


def test_parquet_time_bounds_from_footer():
    starts = [T0 + i * 10**9 for i in range(100)]
    records = [record(time_flow_start_ns=t, time_flow_end_ns=t + 1) for t in starts]
    payload = as_parquet(records, row_group_size=30)
    assert parquet_time_bounds(io.BytesIO(payload)) == (T0, T0 + 99 * 10**9)
    assert parquet_time_bounds(pa.BufferReader(payload)) == (T0, T0 + 99 * 10**9)


@pytest.mark.parametrize(
    "payload",
    [
        jsonl([record()]),
        gzip.compress(as_parquet([record()])),
        as_parquet([record()], write_statistics=False),
        as_parquet([record(), record(time_flow_start_ns=3, time_flow_end_ns=4)]),
        as_parquet([record(time_flow_start_ns="1767225600000000000")]),
        as_parquet([record()])[:-20],
        b"",
    ],
    ids=["json", "gzip", "no-statistics", "invalid-times", "text-column", "truncated", "empty"],
)
def test_parquet_time_bounds_unknown(payload):
    assert parquet_time_bounds(io.BytesIO(payload)) is None


def test_core_does_not_import_beam_or_dagster():
    import prism_core.ingest as ingest

    for module in pathlib.Path(ingest.__file__).parent.glob("*.py"):
        source = module.read_text()
        assert "apache_beam" not in source and "dagster" not in source, module.name


def test_a_pair_changing_its_flow_sizes_across_a_silence_is_a_row_per_side():
    """One job handing its hosts to the next within a minute: the pair's row splits where its
    sizes change across a silence, so no row spans both jobs. A pause with the same sizes after
    it (a job's own checkpoint save) and one-off sizes (management traffic) keep one row."""
    second = 1_000_000_000

    def flow(src, at_s, size):
        start = T0 + int(at_s * second)
        return record(src_addr=src, time_flow_start_ns=start, time_flow_end_ns=start + 1_000_000, bytes=size)

    handover = [flow("10.1.0.1", t, 4096) for t in range(1, 11)] + [flow("10.1.0.1", t, 8192) for t in range(20, 51)]
    handover.append(flow("10.1.0.1", 30.5, 777))  # a one-off size rides with the side it falls in
    save_pause = [flow("10.1.0.2", t, 4096) for t in (*range(1, 11), *range(40, 51))]
    management = [flow("10.1.0.3", t, 100 + t) for t in (1, 2, 30, 31)]
    aggregates = minute_aggregates(flows_table(handover + save_pause + management))

    rows = {}
    for row in aggregates.to_pylist():
        rows.setdefault(row["src_addr"], []).append(row)
    sides = [(r["top_size"], r["flows"], r["distinct_sizes"], (r["first_start_ns"] - T0) // second, (r["last_end_ns"] - T0) // second)
             for r in rows["10.1.0.1"]]
    assert sides == [(4096, 10, 1, 1, 10), (8192, 32, 2, 20, 50)]
    assert [r["flows"] for r in rows["10.1.0.2"]] == [21]
    assert [r["flows"] for r in rows["10.1.0.3"]] == [4]
    assert pa.compute.sum(aggregates["flows"]).as_py() == len(handover + save_pause + management)
