"""Dagster orchestration on the tiny scenario: a real instance in a temporary DAGSTER_HOME, real
Beam runs, real Parquet and DuckDB.

One module-scoped warehouse goes through what an operator does: one scheduled hour, a backfill
of three hours from the CLI, a re-run of the middle hour. It must end up identical to a single
ordered run of the pipeline without Dagster.
"""

import os
import shutil
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, build_schedule_context, build_sensor_context
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from orchestration.assets import ANALYSIS_TABLES, INGEST_TABLES
from orchestration.checks import due_hour
from orchestration.definitions import build_definitions
from orchestration.resources import (
    DEFAULT_WAREHOUSE, DEMO_FLOWS, DEMO_TOPOLOGY, BeamOptions, FlowSource, Settings, TopologyFile, Warehouse,
    resources_from_env,
)
from pipelines import warehouse
from pipelines.run import infer_range, run_hours
from prism_core.schema import TABLES

REPO = Path(__file__).resolve().parent.parent
INSTANCE_TEMPLATE = REPO / "orchestration" / "dagster.yaml"


def hour_offset(hour: datetime) -> int:
    """Partitions after the current hour needed for `hour` to exist: the simulator stamps its
    traffic on a fixed day, which may still lie ahead of the clock."""
    current = warehouse.hour_floor(datetime.now(timezone.utc))
    return max(0, (hour - current) // timedelta(hours=1) + 1)


def make_home(path: Path) -> Path:
    path.mkdir(parents=True)
    shutil.copy(INSTANCE_TEMPLATE, path / "dagster.yaml")
    return path


def definitions_for(tiny: Path, root: Path, hours: list[datetime], flows: Path | None = None, **settings):
    """The code location over `hours` of the tiny scenario, with its resources set per test."""
    resources = {
        "flow_source": FlowSource(directory=str(flows or tiny / "flows")),
        "topology": TopologyFile(path=str(tiny / "topology.csv")),
        "warehouse": Warehouse(root=str(root)),
        "beam": BeamOptions(),
    }
    partitions = {"partition_start": warehouse.hour_key(hours[0]), "partition_end_offset": hour_offset(hours[-1])}
    return build_definitions(Settings(**{**partitions, **settings}), resources)


def run_job(defs, instance, job: str, **kwargs):
    return defs.resolve_job_def(job).execute_in_process(instance=instance, raise_on_error=False, **kwargs)


def check_results(result) -> dict[tuple[str, str], bool]:
    return {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}


def failed_checks(result) -> dict[tuple[str, str], dict]:
    return {
        (e.asset_key.to_user_string(), e.check_name): {k: v.value for k, v in e.metadata.items()}
        for e in result.get_asset_check_evaluations()
        if not e.passed
    }


@pytest.fixture(scope="module")
def tiny(scenario_dir) -> Path:
    return scenario_dir("tiny")


@pytest.fixture(scope="module")
def hours(tiny) -> list[datetime]:
    """The scenario's two hours and the empty one after them."""
    first, _ = infer_range(str(tiny / "flows"))
    return [first + timedelta(hours=i) for i in range(3)]


@pytest.fixture(scope="module")
def reference(tiny, hours, tmp_path_factory) -> Path:
    """The three hours run in order by the pipeline alone."""
    root = tmp_path_factory.mktemp("reference") / "warehouse"
    run_hours(str(tiny / "flows"), str(root), hours[0], hours[-1] + timedelta(hours=1),
              topology_path=str(tiny / "topology.csv"))
    return root


@pytest.fixture(scope="module")
def orchestrated(tiny, hours, tmp_path_factory):
    """One hour as the schedule would run it, the three hours as a CLI backfill, then the middle
    hour again, all on one instance; records what each step returned."""
    base = tmp_path_factory.mktemp("orchestrated")
    home, root = make_home(base / "dagster_home"), base / "warehouse"
    defs = definitions_for(tiny, root, hours)
    instance = DagsterInstance.local_temp(str(home))
    keys = [warehouse.hour_key(hour) for hour in hours]

    first_hour = run_job(defs, instance, "prism_hourly", partition_key=keys[0])

    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PRISM_FLOWS": str(tiny / "flows"),
        "PRISM_TOPOLOGY": str(tiny / "topology.csv"),
        "PRISM_WAREHOUSE": str(root),
        "PRISM_PARTITION_START": keys[0],
        "PRISM_PARTITION_END_OFFSET": str(hour_offset(hours[-1])),
    }
    started = time.monotonic()
    backfill = subprocess.run(  # as docs/orchestration.md gives it; dg finds the project in pyproject.toml
        ["dg", "launch", "--job", "prism_hourly", "--partition-range", f"{keys[0]}...{keys[-1]}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    backfill_seconds = time.monotonic() - started
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    # The noise issue #20 removed: Beam's GCP import warning and Dagster's advice to use dg.
    output = backfill.stdout + backfill.stderr
    assert "apitools not found" not in output and "SupersessionWarning" not in output, output[-3000:]

    middle_again = run_job(defs, instance, "prism_hourly", partition_key=keys[1])
    yield {
        "defs": defs, "instance": instance, "root": root, "keys": keys,
        "first_hour": first_hour, "middle_again": middle_again, "backfill_seconds": backfill_seconds,
    }
    instance.dispose()


def test_one_hour_reports_rows_time_range_and_quarantine(orchestrated, reference, hours):
    result = orchestrated["first_hour"]
    assert result.success
    metadata = {
        e.asset_key.to_user_string(): {k: v.value for k, v in e.step_materialization_data.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }
    assert set(metadata) == set(TABLES)
    with warehouse.connect(reference) as con:
        for table in TABLES:
            (rows,) = con.execute(f"SELECT count(*) FROM {table} WHERE hour = ?", [hours[0].hour]).fetchone()
            assert metadata[table]["dagster/row_count"] == rows, table
        first, last = con.execute("SELECT min(time_flow_start_ns), max(time_flow_start_ns) FROM flows WHERE hour = ?",
                                  [hours[0].hour]).fetchone()
    flows = metadata["flows"]
    assert flows["dagster/row_count"] > 0 and metadata["quarantine"]["dagster/row_count"] > 0
    assert flows["first_flow"] == pytest.approx(first / 1e9) and flows["last_flow"] == pytest.approx(last / 1e9)
    # The run read every file; rows of the next hour are out of its range, not lost.
    assert flows["run_rows_read"] == (flows["run_flows"] + flows["run_quarantined"] + flows["run_duplicates"]
                                      + flows["run_out_of_range"])
    assert flows["run_out_of_range"] > 0
    assert sum(metadata["quarantine"]["reasons"].values()) == metadata["quarantine"]["dagster/row_count"]
    assert 0 < metadata["quarantine"]["quarantine_share"] < 0.02
    assert len(check_results(result)) == len(TABLES) + 4 and failed_checks(result) == {}


def test_backfill_and_rerun_equal_one_ordered_run(orchestrated, reference):
    assert orchestrated["middle_again"].success
    with duckdb.connect() as con:
        con.execute(f"ATTACH '{orchestrated['root'] / warehouse.DATABASE_FILE}' AS dagster (READ_ONLY)")
        con.execute(f"ATTACH '{reference / warehouse.DATABASE_FILE}' AS reference (READ_ONLY)")
        for table in TABLES:
            (rows,) = con.execute(f"SELECT count(*) FROM reference.{table}").fetchone()
            (extra,) = con.execute(f"SELECT count(*) FROM (FROM dagster.{table} EXCEPT ALL FROM reference.{table})").fetchone()
            (missing,) = con.execute(f"SELECT count(*) FROM (FROM reference.{table} EXCEPT ALL FROM dagster.{table})").fetchone()
            assert (extra, missing) == (0, 0), (table, rows, extra, missing)
        assert con.execute("SELECT count(DISTINCT hour) FROM dagster.flows").fetchone() == (2,)


def test_job_ids_continue_across_the_hour(orchestrated, tiny, hours):
    truth = pq.read_table(tiny / "truth" / "jobs.parquet").to_pylist()
    boundary = hours[1]
    spanning = [job for job in truth if job["has_network"] and job["start"] < boundary < job["end"]]
    with warehouse.connect(orchestrated["root"]) as con:
        continued = con.execute(
            """SELECT a.job_id, a.first_seen = b.first_seen, b.hosts FROM jobs a JOIN jobs b USING (job_id)
               WHERE a.hour = ? AND b.hour = ?""",
            [hours[0].hour, hours[1].hour],
        ).fetchall()
    # Every job running across the boundary keeps its id (a job that ended just before it may
    # also have its closing row in the second hour).
    continued_hosts = [sorted(hosts) for _, _, hosts in continued]
    assert len(spanning) >= 1
    assert all(sorted(job["hosts"]) in continued_hosts for job in spanning), (spanning, continued)
    assert all(same_start for _, same_start, _ in continued)


def test_instance_knows_every_hour_and_the_backfill_was_one_run(orchestrated):
    instance, keys = orchestrated["instance"], orchestrated["keys"]
    for table in TABLES:
        assert instance.get_materialized_partitions(AssetKey(table)) == set(keys), table
    ranged = [
        run for run in instance.get_runs()
        if run.tags.get(ASSET_PARTITION_RANGE_START_TAG) == keys[0] and run.tags.get(ASSET_PARTITION_RANGE_END_TAG) == keys[-1]
    ]
    assert len(ranged) == 1 and ranged[0].is_success
    print(f"CLI backfill of {len(keys)} hours: {orchestrated['backfill_seconds']:.1f} s")


@pytest.fixture
def copied_warehouse(orchestrated, tmp_path) -> Path:
    root = tmp_path / "warehouse"
    shutil.copytree(orchestrated["root"], root)
    warehouse.refresh_database(root)  # views point at the copy's files
    return root


def test_checks_pass_on_good_data_and_fail_on_a_broken_partition(orchestrated, copied_warehouse, tiny, hours, tmp_path):
    defs = definitions_for(tiny, copied_warehouse, hours)
    with DagsterInstance.local_temp(str(make_home(tmp_path / "home"))) as instance:
        good = run_job(defs, instance, "prism_checks")
        assert len(check_results(good)) == len(TABLES) + 4 and failed_checks(good) == {}

        first = hours[0]
        flows = warehouse.read_partition(copied_warehouse, "flows", first)
        warehouse.write_partition(copied_warehouse, "flows", first, flows.slice(0, flows.num_rows - 5))
        steps = warehouse.read_partition(copied_warehouse, "steps", first)
        warehouse.write_partition(copied_warehouse, "steps", hours[1], steps.slice(0, 1))  # a step twice
        quarantine = warehouse.read_partition(copied_warehouse, "quarantine", first)
        pq.write_table(quarantine.drop_columns(["raw"]), warehouse.partition_file(copied_warehouse, "quarantine", first))
        warehouse.refresh_database(copied_warehouse)

        result = run_job(defs, instance, "prism_checks")
        broken = check_results(result)
    failed = {key for key, passed in broken.items() if not passed}
    assert failed == {("flows", "rows_conserved"), ("steps", "unique_steps"), ("quarantine", "schema")}, broken
    evaluations = {(e.asset_key.to_user_string(), e.check_name): e.metadata for e in result.get_asset_check_evaluations()}
    first_key = warehouse.hour_key(first)
    assert evaluations[("quarantine", "schema")]["problems"].value == {first_key: ["missing raw"]}
    lost = evaluations[("flows", "rows_conserved")]["rows_by_hour"].value[first_key]
    assert (lost["conserved"], lost["flows"], lost["flows_in_flow_minutes"] - lost["flows"]) == (False, flows.num_rows - 5, 5)
    examples = evaluations[("steps", "unique_steps")]["examples"].value
    assert len(examples) == 1 and examples[0]["copies"] == 2


def test_analysis_does_not_start_over_after_an_unanalyzed_hour(copied_warehouse, tiny, hours, tmp_path):
    Path(warehouse.stats_path(copied_warehouse, hours[1], "analysis")).unlink()
    defs = definitions_for(tiny, copied_warehouse, hours)
    before = warehouse.read_partition(copied_warehouse, "jobs", hours[2])
    with DagsterInstance.local_temp(str(make_home(tmp_path / "home"))) as instance:
        result = run_job(defs, instance, "prism_hourly", partition_key=warehouse.hour_key(hours[2]),
                         asset_selection=[AssetKey(name) for name in ANALYSIS_TABLES])
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.message
    assert f"hour {warehouse.hour_key(hours[1])} is ingested but not analyzed" in failure
    assert warehouse.read_partition(copied_warehouse, "jobs", hours[2]).equals(before)


def shifted(flows: pa.Table, offset_ns: int) -> pa.Table:
    for column in ("time_flow_start_ns", "time_flow_end_ns"):
        index = flows.schema.get_field_index(column)
        flows = flows.set_column(index, column, pc.add(flows[column], offset_ns))
    return flows


def test_late_file_reruns_its_hour_and_the_analyzed_hours_after(orchestrated, copied_warehouse, tiny, hours, tmp_path):
    flows_dir = tmp_path / "flows"
    shutil.copytree(tiny / "flows", flows_dir)
    defs, instance, keys = orchestrated["defs"], orchestrated["instance"], orchestrated["keys"]
    sensor = defs.resolve_sensor_def("prism_late_files")

    def evaluate(cursor):
        context = build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                       resources={"flow_source": FlowSource(directory=str(flows_dir))})
        return sensor.evaluate_tick(context)

    arrived_before = str(time.time())
    assert evaluate(arrived_before).skip_message  # the copies arrived before the cursor
    # Late rows of the middle hour (copies of some, shifted to be new), and a file of an hour no
    # run has seen yet: that one is the schedule's business.
    late_rows = pq.read_table(sorted(flows_dir.glob("*.parquet"))[0]).slice(0, 20)
    hour_ns = 3600 * 10**9
    for name, offset in (("late.parquet", hour_ns), ("future.parquet", 10 * hour_ns)):
        pq.write_table(shifted(late_rows, offset), flows_dir / name)
    data = evaluate(arrived_before)
    (request,) = data.run_requests
    assert request.tags[ASSET_PARTITION_RANGE_START_TAG] == keys[1]
    assert request.tags[ASSET_PARTITION_RANGE_END_TAG] == keys[2]  # the last hour analyzed
    assert float(data.cursor) > float(arrived_before)

    # The requested run, on a copy of the warehouse: the middle hour gains exactly the late rows.
    def rows_in(hour):
        counts = warehouse.read_stats(copied_warehouse, hour, "ingest")
        return counts["flows"] + counts["quarantine"] + counts["duplicates"]

    before = rows_in(hours[1])
    rerun = definitions_for(tiny, copied_warehouse, hours, flows=flows_dir)
    with DagsterInstance.local_temp(str(make_home(tmp_path / "home"))) as fresh:
        result = run_job(rerun, fresh, "prism_hourly", tags=request.tags)
        assert result.success
        assert fresh.get_materialized_partitions(AssetKey("jobs")) == set(keys[1:])
    assert rows_in(hours[1]) == before + late_rows.num_rows
    assert failed_checks(result) == {}


def test_schedule_runs_the_hour_that_closed_after_the_delay(tiny, hours, tmp_path):
    defs = definitions_for(tiny, tmp_path, hours, schedule_minute=20)
    schedule = defs.resolve_schedule_def("prism_hourly_schedule")
    assert schedule.cron_schedule == "20 * * * *"
    tick = hours[1] + timedelta(minutes=20)
    with DagsterInstance.ephemeral() as instance:
        context = build_schedule_context(instance=instance, scheduled_execution_time=tick,
                                         repository_def=defs.get_repository_def())
        data = schedule.evaluate_tick(context)
    (request,) = data.run_requests
    assert request.partition_key == warehouse.hour_key(hours[0]) and schedule.job_name == "prism_hourly"


def test_freshness_wants_the_hour_that_closed_before_the_deadline(tiny, hours, tmp_path):
    assert due_hour(datetime(2026, 11, 22, 11, 44, tzinfo=timezone.utc), 45) == datetime(2026, 11, 22, 9, tzinfo=timezone.utc)
    assert due_hour(datetime(2026, 11, 22, 11, 45, tzinfo=timezone.utc), 45) == datetime(2026, 11, 22, 10, tzinfo=timezone.utc)
    due = due_hour(datetime.now(timezone.utc), 45)
    defs = definitions_for(tiny, tmp_path, [due], freshness_minute=45)
    due = warehouse.hour_key(due)
    with DagsterInstance.local_temp(str(make_home(tmp_path / "home"))) as instance:
        stale = check_results(run_job(defs, instance, "prism_freshness"))
        for name in INGEST_TABLES:
            instance.report_runless_asset_event(AssetMaterialization(name, partition=due))
        partly = check_results(run_job(defs, instance, "prism_freshness"))
    assert len(stale) == len(TABLES) and not any(stale.values())
    assert {name for (name, _), passed in partly.items() if passed} == set(INGEST_TABLES)


def test_partitions_and_schedules_come_from_the_environment_when_the_code_location_loads():
    assert Settings.from_env({}) == Settings()
    production = Settings.from_env({"PRISM_SCHEDULE_MINUTE": "20", "PRISM_PARTITION_END_OFFSET": "12",
                                    "PRISM_MAX_QUARANTINE_SHARE": "0.05"})
    assert (production.schedule_minute, production.partition_end_offset, production.max_quarantine_share) == (20, 12, 0.05)
    defs = build_definitions(production, resources_from_env())
    assert defs.resolve_schedule_def("prism_hourly_schedule").cron_schedule == "20 * * * *"


VARIABLES = ("PRISM_FLOWS", "PRISM_TOPOLOGY", "PRISM_WAREHOUSE", "PRISM_BEAM_ARGS")


def test_resources_default_to_the_demo_data_without_variables(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    demo = resources_from_env()
    assert (demo["flow_source"].directory, demo["topology"].path) == (DEMO_FLOWS, DEMO_TOPOLOGY)
    assert demo["warehouse"].root == DEFAULT_WAREHOUSE and demo["beam"].args == []
    monkeypatch.setenv("PRISM_FLOWS", "gs://flows/cluster-a")
    production = resources_from_env()
    assert production["flow_source"].directory.env_var_name == "PRISM_FLOWS"
    assert production["topology"].path == ""  # the demo inventory goes only with the demo flows


def test_resources_resolve_their_variables_when_a_run_starts(orchestrated, copied_warehouse, tiny, hours, tmp_path,
                                                              monkeypatch):
    """The code location loads with one warehouse in PRISM_WAREHOUSE; a run started after it
    changed checks the warehouse it names then."""
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PRISM_WAREHOUSE", str(tmp_path / "not-this-one"))
    defs = build_definitions(Settings(warehouse.hour_key(hours[0]), hour_offset(hours[-1])), resources_from_env())
    monkeypatch.setenv("PRISM_WAREHOUSE", str(copied_warehouse))
    with DagsterInstance.local_temp(str(make_home(tmp_path / "home"))) as instance:
        result = run_job(defs, instance, "prism_checks")
    assert result.success and failed_checks(result) == {}
    labels = {e.metadata["hours"].value for e in result.get_asset_check_evaluations() if "hours" in e.metadata}
    assert labels == {f"{orchestrated['keys'][0]} to {orchestrated['keys'][-1]} (3)"}
