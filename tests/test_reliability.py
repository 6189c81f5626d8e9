"""Re-runs, late files and concurrent runs leave the warehouse exact."""

import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import warehouse
from pipelines.run import run_ingest

TABLES = ("flows", "flow_minutes", "quarantine")


def tiny_hours(scenario):
    truth = pq.read_table(scenario / "truth" / "steps.parquet")
    first = truth["start"].to_pylist()
    start = min(first).replace(minute=0, second=0, microsecond=0)
    return [start, start.replace(hour=start.hour + 1)]


def snapshot(root, hours):
    return {(t, h): warehouse.read_partition(root, t, h) for t in TABLES for h in hours}


def test_late_file_adds_exactly_its_rows(scenario_dir, tmp_path):
    scenario = scenario_dir("tiny")
    hours = tiny_hours(scenario)
    files = sorted((scenario / "flows").iterdir())
    flows = tmp_path / "flows"
    flows.mkdir()
    late = files[-1]
    for path in files[:-1]:
        shutil.copy(path, flows)
    root = tmp_path / "wh"
    before = run_ingest(str(flows), str(root), hours)
    shutil.copy(late, flows)
    after = run_ingest(str(flows), str(root), hours)
    every = run_ingest(str(late.parent), str(tmp_path / "all"), hours)  # reference: all files at once
    assert after.counters["rows_read"] - before.counters["rows_read"] == late_rows(late)
    assert after.counters["flows"] > before.counters["flows"]
    assert every.counters == after.counters
    reference = snapshot(tmp_path / "all", hours)
    for key, table in snapshot(root, hours).items():
        assert same_rows(table, reference[key]), key


def same_rows(a, b):
    """Equal tables, quarantine sources compared by file name (the directories differ)."""
    if "source" in a.column_names:
        a, b = (t.set_column(0, "source", pa.array([os.path.basename(s) for s in t["source"].to_pylist()]))
                for t in (a, b))
    return a.equals(b)


def late_rows(path):
    from prism_core.ingest import parse_flow_file

    return parse_flow_file(path.read_bytes(), str(path)).rows_read


def test_rerun_gives_identical_tables(scenario_dir, tmp_path):
    scenario = scenario_dir("tiny")
    hours = tiny_hours(scenario)
    run_ingest(str(scenario / "flows"), str(tmp_path / "wh"), hours)
    first = snapshot(tmp_path / "wh", hours)
    run_ingest(str(scenario / "flows"), str(tmp_path / "wh"), hours)
    for key, table in snapshot(tmp_path / "wh", hours).items():
        assert table.equals(first[key]), key


def test_hours_run_concurrently_match_one_run_and_readers_keep_reading(scenario_dir, tmp_path):
    scenario = scenario_dir("tiny")
    hours = tiny_hours(scenario)
    run_ingest(str(scenario / "flows"), str(tmp_path / "together"), hours)
    root = tmp_path / "apart"
    run_ingest(str(scenario / "flows"), str(root), hours[:1])
    warehouse.refresh_database(root)
    analyst = duckdb.connect(str(root / "prism.duckdb"), read_only=True)
    script = (
        "import sys; from datetime import datetime; from pipelines.run import run_ingest; "
        "from pipelines import warehouse; h = datetime.fromisoformat(sys.argv[2]); "
        "run_ingest(sys.argv[1], sys.argv[3], [h]); warehouse.refresh_database(sys.argv[3])"
    )
    workers = [
        subprocess.Popen([sys.executable, "-c", script, str(scenario / "flows"), h.isoformat(), str(root)])
        for h in hours
    ]
    counted = []
    while any(w.poll() is None for w in workers):  # read for as long as the runs write
        counted.append(analyst.execute("SELECT count(*) FROM flows").fetchone()[0])
    assert [w.returncode for w in workers] == [0, 0]
    assert len(counted) > 10 and min(counted) > 0  # the analyst read complete partitions throughout
    analyst.close()
    for key, table in snapshot(root, hours).items():
        assert same_rows(table, warehouse.read_partition(tmp_path / "together", *key)), key
    with duckdb.connect(str(root / "prism.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(DISTINCT hour) FROM flows").fetchone()[0] == 2
