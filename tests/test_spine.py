"""The spine end to end on simulated traffic: simulate -> Beam ingest -> warehouse -> score."""

import json

import duckdb

from pipelines import warehouse
from pipelines.evaluation import evaluate_warehouse
from pipelines.run import infer_range, run_ingest

# The simulator's malformed-row kinds and the quarantine reasons that may stand for each (an
# address that is null is a missing field before it is a bad address).
REASONS_FOR_KIND = {
    "bad_addr": ("bad_addr", "missing_field"),
    "end_before_start": ("end_before_start",),
    "huge_bytes": ("bytes_too_large",),
    "missing_field": ("missing_field",),
    "mixed_family": ("mixed_family",),
    "negative_bytes": ("nonpositive_bytes",),
    "zero_bytes": ("nonpositive_bytes",),
    "bad_type": ("bad_type",),
    "unparseable": ("unparseable",),
}


def ingest(scenario, tmp_path):
    root = tmp_path / "wh"
    first, end = infer_range(str(scenario / "flows"))
    summary = run_ingest(str(scenario / "flows"), str(root), warehouse.hours_between(first, end))
    warehouse.refresh_database(root)
    return root, summary


def test_tiny_rows_are_conserved_and_every_malformed_kind_quarantined(scenario_dir, tmp_path):
    scenario = scenario_dir("tiny")
    noise = json.loads((scenario / "truth" / "noise.json").read_text())
    root, summary = ingest(scenario, tmp_path)
    c = summary.counters
    assert c["rows_read"] == noise["rows_written"]
    assert c["rows_read"] == c["flows"] + c["quarantined"] + c["duplicates"] + c["out_of_range"]
    assert (c["flows"], c["quarantined"], c["duplicates"]) == (
        noise["records"], noise["malformed_total"], noise["duplicates"]
    )
    with duckdb.connect(str(root / "prism.duckdb"), read_only=True) as con:
        reasons = dict(con.execute("SELECT split_part(reason, ':', 1), count(*) FROM quarantine GROUP BY ALL").fetchall())
        assert con.execute("SELECT count(*) FROM flows").fetchone()[0] == noise["records"]
        assert con.execute("SELECT count(DISTINCT hour) FROM flows").fetchone()[0] == 2  # crosses an hour
    expected: dict[tuple, int] = {}
    for kind, count in noise["malformed"].items():
        expected[REASONS_FOR_KIND[kind]] = expected.get(REASONS_FOR_KIND[kind], 0) + count
    for accepted, count in expected.items():
        assert sum(reasons.get(r, 0) for r in accepted) >= count, (accepted, reasons)
    assert sum(reasons.values()) == noise["malformed_total"]

    scores = evaluate_warehouse(scenario / "truth", root)["ingest"]
    assert all(figure["ok"] for figure in scores.values() if figure["ok"] is not None), scores


def test_jsonl_input_gives_the_same_flows_as_parquet(scenario_dir, tmp_path):
    parquet_root, _ = ingest(scenario_dir("tiny"), tmp_path / "p")
    jsonl_root, summary = ingest(scenario_dir("tiny", fmt="jsonl.gz"), tmp_path / "j")
    query = "SELECT * EXCLUDE (time_received_ns, sampler_address) FROM flows ORDER BY ALL"
    with duckdb.connect(str(parquet_root / "prism.duckdb"), read_only=True) as a, duckdb.connect(
        str(jsonl_root / "prism.duckdb"), read_only=True
    ) as b:
        assert a.execute(query).fetchall() == b.execute(query).fetchall()


def test_beam_analysis_equals_the_in_process_one(scenario_dir, tmp_path):
    """The distributed analysis (recognition, flows keyed by job, per-job stages) writes exactly
    what analyze_hour computes in one process from the same partitions and state."""
    from datetime import timedelta

    from pipelines.run import load_topology, run_hours
    from prism_core.analysis import analyze_hour

    scenario = scenario_dir("tiny")
    root = tmp_path / "wh"
    first, end = infer_range(str(scenario / "flows"))
    run_hours(str(scenario / "flows"), str(root), first, end, topology_path=str(scenario / "topology.csv"))
    topology = load_topology(str(scenario / "topology.csv"))
    for hour in warehouse.hours_between(first, end):
        expected = analyze_hour(
            warehouse.read_partition(root, "flows", hour),
            warehouse.read_partition(root, "flow_minutes", hour),
            topology,
            warehouse.read_stats(root, hour - timedelta(hours=1), "analysis"),
            int(hour.timestamp()) * 10**9,
        )
        for name, table in expected.tables.items():
            assert warehouse.read_partition(root, name, hour).equals(table), (hour, name)
        assert json.loads(json.dumps(expected.state)) == warehouse.read_stats(root, hour, "analysis")
