"""One job's trouble never costs the hour; a failed recognition fails it cleanly.

A stage made to raise for one job (the stage function replaced by one that raises for that job
id: what is under test is the isolation around it, not the stage) gives that job one
`analysis_error` issue and no other rows, and leaves every other job's rows as a clean run has
them, in process and through the Beam pipeline with its counter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipelines import warehouse
from pipelines.run import infer_range, load_topology, run_analysis, run_hours
from pipelines.shuffle_staging import SHUFFLE_STAGING_DIR
from prism_cli.main import app
from prism_core import analysis, diagnosis, parallelism, timeline
from prism_core.analysis import ANALYSIS_TABLES
from prism_core.minutes import HOUR_NS
from test_analysis_robustness import analyze, tiny  # noqa: F401 - tiny is a fixture

STAGES = {"parallelism": (parallelism, "identify_parallelism"), "timeline": (timeline, "divide_steps"),
          "diagnosis": (diagnosis, "diagnose_job")}


def poison(monkeypatch, stage: str, job_id: str) -> None:
    """The stage's function raises for `job_id` and works as before for every other job."""
    module, name = STAGES[stage]
    real = getattr(module, name)

    def raising(analyzed_job_id, *args, **kwargs):
        if analyzed_job_id == job_id:
            raise RuntimeError(f"{name} poisoned for {job_id}")
        return real(analyzed_job_id, *args, **kwargs)

    monkeypatch.setattr(module, name, raising)


def without_job(table: pa.Table, job_id: str) -> pa.Table:
    return table.filter(pc.not_equal(table["job_id"], job_id))


def assert_only_the_job_failed(clean: dict[str, pa.Table], poisoned: dict[str, pa.Table], job_id: str, stage: str):
    """`job_id` has one analysis_error issue and no other row; every other job's rows are clean's."""
    for name in ANALYSIS_TABLES[1:]:
        assert without_job(poisoned[name], job_id).equals(without_job(clean[name], job_id)), name
    for name in ANALYSIS_TABLES[1:-1]:
        assert job_id in clean[name]["job_id"].to_pylist() and job_id not in poisoned[name]["job_id"].to_pylist(), name
    issues = poisoned["issues"].filter(pc.equal(poisoned["issues"]["job_id"], job_id))
    (error,) = issues.drop_columns(["start", "end"]).to_pylist()
    assert (error["kind"], error["subject"]) == ("analysis_error", job_id)
    assert (error["severity"], error["confidence"], error["wasted_gpu_s"]) == (None, None, 0.0)
    _, name = STAGES[stage]
    assert json.loads(error["evidence"]) == {"stage": stage, "exception": "RuntimeError",
                                             "message": f"{name} poisoned for {job_id}"}
    # the job keeps its row, without the degrees its failed analysis did not find
    jobs_table = poisoned["jobs"]
    assert without_job(jobs_table, job_id).equals(without_job(clean["jobs"], job_id))
    (row,) = jobs_table.filter(pc.equal(jobs_table["job_id"], job_id)).select(["dp", "pp", "tp"]).to_pylist()
    assert (row["dp"], row["pp"], row["tp"]) == (None, None, None)


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_that_raises_for_one_job_costs_only_that_job(tiny, monkeypatch, stage):  # noqa: F811
    """The scenario's second hour, continuing from the first: one job's stage raises."""
    hour_ns = tiny.first_hour_ns + HOUR_NS
    clean = analyze(tiny.flows, tiny.topology, tiny.first_hour_state, hour_ns)
    job_id = clean.tables["steps"]["job_id"][0].as_py()
    poison(monkeypatch, stage, job_id)
    poisoned = analyze(tiny.flows, tiny.topology, tiny.first_hour_state, hour_ns)

    assert_only_the_job_failed(clean.tables, poisoned.tables, job_id, stage)
    for name in ("timeline", "diagnosis"):  # the job goes on from what it had before the hour
        others = {job: state for job, state in clean.state[name].items() if job != job_id}
        assert {job: state for job, state in poisoned.state[name].items() if job != job_id} == others
        assert poisoned.state[name].get(job_id) == tiny.first_hour_state[name].get(job_id)


@pytest.fixture(scope="module")
def clean_run(scenario_dir, tmp_path_factory):
    scenario = scenario_dir("tiny")
    root = tmp_path_factory.mktemp("clean") / "warehouse"
    first, end = infer_range(str(scenario / "flows"))
    summary = run_hours(str(scenario / "flows"), str(root), first, end, topology_path=str(scenario / "topology.csv"))
    return scenario, root, warehouse.hours_between(first, end), summary


def test_the_pipeline_writes_every_other_job_and_counts_the_failed_one(clean_run, tmp_path, monkeypatch):
    scenario, clean_root, hours, clean_summary = clean_run
    # a job with steps in both hours
    job_id = min(set.intersection(*(set(warehouse.read_partition(clean_root, "steps", hour)["job_id"].to_pylist())
                                    for hour in hours)))
    poison(monkeypatch, "timeline", job_id)
    root = tmp_path / "warehouse"
    # one local worker: the poisoned stage is patched in this process only
    result = CliRunner().invoke(app, ["run", "--flows", str(scenario / "flows"), "--warehouse", str(root),
                                      "--topology", str(scenario / "topology.csv"), "--local_workers=1"])

    assert result.exit_code == 0, result.output
    assert f"{len(hours)} job analyses failed" in result.output and clean_summary.counters["analysis_errors"] == 0
    for hour in hours:
        clean = {name: warehouse.read_partition(clean_root, name, hour) for name in ANALYSIS_TABLES}
        poisoned = {name: warehouse.read_partition(root, name, hour) for name in ANALYSIS_TABLES}
        assert_only_the_job_failed(clean, poisoned, job_id, "timeline")


def test_a_failed_recognition_fails_the_hour_with_a_clear_message(scenario_dir, tmp_path, monkeypatch):
    scenario, root = scenario_dir("tiny"), tmp_path / "warehouse"
    first, _ = infer_range(str(scenario / "flows"))

    def unrecognizable(*args, **kwargs):
        raise ValueError("flow_minutes lost its addresses")

    monkeypatch.setattr(analysis, "recognize_hour", unrecognizable)
    # one local worker: the poisoned stage is patched in this process only
    result = CliRunner().invoke(app, ["run", "--flows", str(scenario / "flows"), "--warehouse", str(root),
                                      "--topology", str(scenario / "topology.csv"), "--local_workers=1"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (f"hour {warehouse.hour_key(first)} not analyzed, nothing written: job recognition failed: "
            "ValueError: flow_minutes lost its addresses") in " ".join(result.output.split())
    assert warehouse.read_stats(root, first, "ingest") is not None
    assert warehouse.read_partition(root, "jobs", first) is None  # nothing of the hour's analysis
    assert warehouse.read_stats(root, first, "analysis") is None
    assert list((root / SHUFFLE_STAGING_DIR).iterdir()) == []


def test_a_failed_analysis_run_leaves_no_shuffle_staging_and_no_state(clean_run, tmp_path):
    """A flows partition without a column the job split reads fails the pipeline mid-way."""
    scenario, clean_root, hours, _ = clean_run
    root = tmp_path / "warehouse"
    shutil.copytree(clean_root, root)
    Path(warehouse.stats_path(root, hours[1], "analysis")).unlink()
    path = warehouse.partition_file(root, "flows", hours[1])
    pq.write_table(pq.read_table(path).drop_columns(["sampler_address"]), path)
    with pytest.raises(Exception, match="sampler_address"):
        run_analysis(str(root), hours[1], load_topology(str(scenario / "topology.csv")))
    assert list((root / SHUFFLE_STAGING_DIR).iterdir()) == []
    assert warehouse.read_stats(root, hours[1], "analysis") is None
