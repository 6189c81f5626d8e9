"""The Beam ingest on a real in-process runner: minute windows, dedup across files, quarantine,
hour assignment and the conservation of rows."""

import json
import os
import pickle
from datetime import datetime, timedelta, timezone

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipelines import local_workers, warehouse
from pipelines.ingest import HourRange, IngestFlows, StagedFlows, file_batches
from pipelines import shuffle_staging
from pipelines.shuffle_staging import (
    SHUFFLE_STAGING_DIR, StagedObject, StagingFile, read_staged, read_staged_evictable, stage_object, stage_tables,
)
from pipelines.run import infer_range, run_ingest
from prism_core.minutes import HOUR_NS, MINUTE_NS, minute_of
from prism_core.schema import FLOWS, conform

HOUR0 = datetime(2026, 11, 22, 5, tzinfo=timezone.utc)
T0 = int(HOUR0.timestamp()) * 10**9


def flow(start_ns, src="10.0.0.1", dst="10.0.1.1", size=1000):
    return {
        "time_flow_start_ns": start_ns,
        "time_flow_end_ns": start_ns + 1_000_000,
        "src_addr": src,
        "dst_addr": dst,
        "bytes": size,
        "packets": 1,
        "src_port": 50000,
        "dst_port": 4791,
        "proto": 17,
        "sampling_rate": 1,
    }


def write_inputs(directory):
    """Two files over two hours: 6 good rows, 1 duplicate across files, 2 bad rows, 1 row
    of a third hour (outside the range used below)."""
    directory.mkdir()
    good = [
        flow(T0 + 10 * 10**9),
        flow(T0 + 10 * 10**9 + 5, size=2000),
        flow(T0 + 90 * 10**9),  # minute 1
        flow(T0 + HOUR_NS - 1),  # last instant of hour 0
        flow(T0 + HOUR_NS + 5 * MINUTE_NS),
        flow(T0 + HOUR_NS + 5 * MINUTE_NS, dst="10.0.2.1"),
    ]
    pq.write_table(pa.Table.from_pylist(good[:4]), directory / "a.parquet")
    lines = [json.dumps(r) for r in good[4:] + [good[0], flow(T0 + 3 * HOUR_NS)]]
    lines.append(json.dumps({**flow(T0 + 20 * 10**9), "bytes": -5}))  # bad, hour 0
    lines.append("{not json")  # unparseable: goes to the file's median hour (hour 1)
    (directory / "b.jsonl").write_text("\n".join(lines) + "\n")


def test_ingest_transform_groups_minutes_and_dedupes(tmp_path):
    write_inputs(tmp_path / "in")
    span = HourRange(T0, T0 + 2 * HOUR_NS)
    (tmp_path / "staging").mkdir()
    with BeamTestPipeline(runner="FnApiRunner") as pipeline:
        out = (
            pipeline
            | beam.Create(file_batches(sorted(str(p) for p in (tmp_path / "in").iterdir()), batches=2))
            | IngestFlows(span, str(tmp_path / "staging"))
        )
        minute_rows = out["minutes"] | beam.Map(
            lambda kv: (kv[0], kv[1].minute_ns, kv[1].flows.num_rows, kv[1].duplicates)
        )
        assert_that(
            minute_rows,
            equal_to(
                [
                    (T0, T0, 2, 1),  # the duplicate of the first flow came from the other file
                    (T0, T0 + MINUTE_NS, 1, 0),
                    (T0, T0 + 59 * MINUTE_NS, 1, 0),
                    (T0 + HOUR_NS, T0 + HOUR_NS + 5 * MINUTE_NS, 2, 0),
                ]
            ),
            label="minutes",
        )
        reasons = out["quarantine"] | beam.FlatMap(
            lambda kv: [(kv[0], r.split(":")[0]) for r in kv[1].read()["reason"].to_pylist()]
        )
        assert_that(
            reasons, equal_to([(T0, "nonpositive_bytes"), (T0 + HOUR_NS, "unparseable")]), label="quarantine"
        )


def test_merges_started_ahead_are_the_ones_the_pipeline_asks_for(tmp_path):
    """With local workers, the bundle that parsed every batch starts the minutes' merges ahead
    (ParseFlowFiles): the merge stage takes each of them rather than running it again."""
    write_inputs(tmp_path / "in")
    (tmp_path / "staging").mkdir()
    batches = file_batches(sorted(str(p) for p in (tmp_path / "in").iterdir()), batches=2)
    try:
        with BeamTestPipeline(runner="FnApiRunner") as pipeline:
            out = (
                pipeline
                | beam.Create(batches, reshuffle=False)
                | IngestFlows(HourRange(T0, T0 + 2 * HOUR_NS), str(tmp_path / "staging"), 2, len(batches))
            )
            assert_that(out["minutes"] | beam.Map(lambda kv: kv[1].minute_ns),
                        equal_to([T0, T0 + MINUTE_NS, T0 + 59 * MINUTE_NS, T0 + HOUR_NS + 5 * MINUTE_NS]))
        assert local_workers._started_ahead == {}
    finally:
        local_workers.discard_ahead()


def test_run_ingest_conserves_rows_and_is_idempotent(tmp_path):
    write_inputs(tmp_path / "in")
    hours = [HOUR0, datetime(2026, 11, 22, 6, tzinfo=timezone.utc)]
    root = tmp_path / "wh"
    summary = run_ingest(str(tmp_path / "in"), str(root), hours)
    c = summary.counters
    assert c["rows_read"] == 10
    assert (c["flows"], c["quarantined"], c["duplicates"], c["out_of_range"]) == (6, 2, 1, 1)
    assert c["rows_read"] == c["flows"] + c["quarantined"] + c["duplicates"] + c["out_of_range"]
    assert summary.per_hour["2026-11-22-05:00"] == {"flows": 4, "flow_minutes": 3, "quarantine": 1, "duplicates": 1}
    # the hour's exporter profile counts the kept records (records without an exporter are one)
    [exporter] = warehouse.read_stats(root, HOUR0, "exporters")["exporters"]
    assert (exporter["sampler_address"], exporter["records"], exporter["kind"]) == ("", 4, "unknown")
    first = {t: warehouse.read_partition(root, t, HOUR0) for t in ("flows", "flow_minutes", "quarantine")}
    run_ingest(str(tmp_path / "in"), str(root), hours)
    for name, table in first.items():
        assert warehouse.read_partition(root, name, HOUR0).equals(table), name


def test_infer_range_covers_valid_flows(tmp_path):
    write_inputs(tmp_path / "in")
    first, end = infer_range(str(tmp_path / "in"))
    assert first == HOUR0
    assert end == datetime(2026, 11, 22, 9, tzinfo=timezone.utc)  # the stray row at hour 3


def test_parquet_files_outside_the_hours_are_skipped_unread(tmp_path):
    write_inputs(tmp_path / "in")
    later = datetime(2026, 11, 22, 6, tzinfo=timezone.utc)
    summary = run_ingest(str(tmp_path / "in"), str(tmp_path / "wh"), [later])
    assert summary.counters["files_skipped"] == 1  # a.parquet holds hour 5 only
    assert summary.counters["files"] == 1
    assert summary.per_hour["2026-11-22-06:00"]["flows"] == 2


def test_run_leaves_no_staged_files(tmp_path):
    write_inputs(tmp_path / "in")
    run_ingest(str(tmp_path / "in"), str(tmp_path / "wh"), [HOUR0])
    assert list((tmp_path / "wh" / SHUFFLE_STAGING_DIR).iterdir()) == []


def flows_table(rows: list[dict]) -> pa.Table:
    table = pa.Table.from_pylist(rows)
    return conform(table.append_column("minute", minute_of(table["time_flow_start_ns"])), FLOWS)


def staged_flows(directory, parsed: list[pa.Table], kept: list[int]) -> StagedFlows:
    [(_, kept_ref)] = stage_tables(directory, [(0, pa.table({"row": np.array(kept, np.int64)}))])
    return StagedFlows([ref for _, ref in stage_tables(directory, enumerate(parsed))], kept_ref)


def test_a_minute_s_flows_are_its_kept_rows_of_the_parsed_tables_in_order(tmp_path):
    first = flows_table([flow(T0 + i, size=100 + i) for i in range(3)])
    second = flows_table([flow(T0 + i, size=200 + i) for i in range(2)])
    minute = staged_flows(str(tmp_path), [first, second], kept=[3, 0, 4, 2])
    assert minute.num_rows == 4
    assert minute.read()["bytes"].to_pylist() == [200, 100, 201, 102]
    assert minute.read().schema == FLOWS


def test_staged_tables_read_back_whatever_their_chunks(tmp_path):
    """References count record batches: tables of several chunks, or none, side by side in one
    file, read back as they were, in any order and from two files at once."""
    tables = [
        pa.table({"a": [1, 2, 3]}),
        pa.concat_tables([pa.table({"a": [4]}), pa.table({"a": [5, 6]}), pa.table({"a": [7]})]),
        pa.table({"a": pa.array([], pa.int64())}),
        pa.table({"a": [8]}),
    ]
    first = stage_tables(str(tmp_path), enumerate(tables))
    second = stage_tables(str(tmp_path), [("other", pa.table({"a": [9, 10]}))])
    assert [ref.num_rows for _, ref in first] == [3, 4, 0, 1]
    refs = [first[3][1], second[0][1], first[1][1], first[2][1], first[0][1]]
    read = read_staged(refs)
    assert [t["a"].to_pylist() for t in read] == [[8], [9, 10], [4, 5, 6, 7], [], [1, 2, 3]]
    # evicted from memory, the pages are read again when touched
    evictable, evict = read_staged_evictable(refs)
    assert [t["a"].to_pylist() for t in evictable] == [[8], [9, 10], [4, 5, 6, 7], [], [1, 2, 3]]
    evict()
    assert [t["a"].to_pylist() for t in evictable] == [[8], [9, 10], [4, 5, 6, 7], [], [1, 2, 3]]


def test_a_staging_file_holds_every_table_appended_until_closed(tmp_path):
    """One file per bundle: it is written when the first table comes and readable once closed."""
    unused = StagingFile(str(tmp_path))
    unused.close()
    assert list(tmp_path.iterdir()) == []
    staged = StagingFile(str(tmp_path))
    refs = [staged.append(pa.table({"a": values})) for values in ([1, 2], [3], [4, 5, 6])]
    staged.close()
    assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(staged.path)]
    assert [t["a"].to_pylist() for t in read_staged(refs[::-1])] == [[4, 5, 6], [3], [1, 2]]


def test_a_staged_object_is_read_from_its_file_once_per_process(tmp_path, monkeypatch):
    """What every step of an hour needs is staged once and steps carry its path: a process that
    did not stage it (a worker) reads the file on the first get and keeps what it read; the one
    that staged it never reads it."""
    value = {"recognition": pa.table({"job_id": ["a", "b"]}), "previous": {"timeline": {"a": [1, 2]}}}
    staged = stage_object(str(tmp_path), value)
    assert staged.get() is value and len(pickle.dumps(staged)) < 200
    monkeypatch.setattr(shuffle_staging, "_last_loaded", None)  # as in a worker that did not stage it
    again = StagedObject(staged.path)
    read = again.get()
    assert read["recognition"].equals(value["recognition"]) and read["previous"] == value["previous"]
    assert again.get() is read


def test_a_file_without_valid_rows_is_quarantined_once(tmp_path):
    """Its rows have no time of their own: they go to the hour the file was written, so runs of
    other hours do not quarantine them again; a run of hours that began more than an hour after
    it was written skips it unopened."""
    directory = tmp_path / "in"
    directory.mkdir()
    garbage = directory / "garbage.jsonl"
    garbage.write_text("{not json\n[1, 2]\n")
    os.utime(garbage, (T0 / 1e9 + 600, T0 / 1e9 + 600))  # modified in the first hour
    counts = [
        run_ingest(str(directory), str(tmp_path / "wh"), [hour]).counters
        for hour in (HOUR0, HOUR0 + timedelta(hours=2))
    ]
    assert [c.get("quarantined", 0) for c in counts] == [2, 0]
    assert [c.get("files_skipped", 0) for c in counts] == [0, 1]
    assert [c.get("rows_read", 0) for c in counts] == [2, 0]
    # of the hour after it was written: opened, its rows out of the range
    next_hour = run_ingest(str(directory), str(tmp_path / "wh"), [HOUR0 + timedelta(hours=1)]).counters
    assert (next_hour["quarantined"], next_hour["out_of_range"]) == (0, 2)


def test_file_batches_are_runs_of_consecutive_files_of_about_equal_size(tmp_path):
    sizes = [4000, 100, 100, 100, 100, 3000, 2000, 100, 100, 100] * 3
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i:02d}.parquet"
        path.write_bytes(b"x" * size * 1024)
        paths.append(str(path))
    batches = file_batches(paths, 4)
    assert [path for batch in batches for path in batch] == paths
    costs = [sum(size + 256 for size, path in zip(sizes, paths) if path in batch) for batch in batches]
    assert len(batches) == 4 and max(costs) - min(costs) <= max(sizes) + 256
    assert file_batches(paths[1:4], 8) == [[path] for path in paths[1:4]]  # no more batches than files
    assert file_batches([], 4) == []
