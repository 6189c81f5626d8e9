"""When Prism runs: the jobs, the hourly schedule, the late-file sensor and the freshness schedule."""

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from dagster import (
    AssetChecksDefinition,
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DagsterInstance,
    DefaultSensorStatus,
    HourlyPartitionsDefinition,
    RunRequest,
    ScheduleEvaluationContext,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    schedule,
    sensor,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from orchestration.assets import ANALYSIS_TABLES
from orchestration.resources import FlowSource
from pipelines import warehouse
from pipelines.run import file_time_bounds

# Asset groups that every hourly run materializes; hourly report assets would join here.
HOURLY_GROUPS = ("ingest", "analysis")


def build_jobs(
    partitions: HourlyPartitionsDefinition, pipeline_checks: Sequence[AssetChecksDefinition]
) -> tuple:
    """prism_hourly (assets and their checks) and prism_checks (the checks alone)."""
    checks = AssetSelection.checks(*pipeline_checks)
    hourly = define_asset_job(
        "prism_hourly",
        selection=AssetSelection.groups(*HOURLY_GROUPS).without_checks() | checks,
        partitions_def=partitions,
        description="Ingest and analysis of an hour (or a range of hours, in order), with their checks.",
    )
    checks_only = define_asset_job(
        "prism_checks", selection=checks, description="The asset checks alone, over every hour on disk."
    )
    return hourly, checks_only


def build_hourly_schedule(job, minute: int) -> ScheduleDefinition:
    @schedule(job=job, cron_schedule=f"{minute} * * * *", execution_timezone="UTC")
    def prism_hourly_schedule(context: ScheduleEvaluationContext) -> RunRequest:
        """At HH:minute, the hour that closed at HH:00; the wait lets late flow files arrive."""
        closed = warehouse.hour_key(warehouse.hour_floor(context.scheduled_execution_time) - timedelta(hours=1))
        return RunRequest(run_key=closed, partition_key=closed)

    return prism_hourly_schedule


def ingest_cutoff(instance: DagsterInstance, partition_key: str) -> float | None:
    """When the latest ingest of an hour listed its input files; None if it never ran."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("flows"), asset_partitions=[partition_key]), limit=1
    ).records
    if not records:
        return None
    cutoff = records[0].asset_materialization.metadata.get("input_cutoff")
    return cutoff.value if cutoff is not None else records[0].timestamp


def hours_ingested_before(instance: DagsterInstance, path: str, changed_at: float) -> list[str]:
    """Partition keys of the hours `path` holds flows for that were ingested before it changed."""
    bounds = file_time_bounds(path)
    if bounds is None:  # no valid flow: nothing an hour would gain from it
        return []
    first, last = (datetime.fromtimestamp(ns / 1e9, tz=timezone.utc) for ns in bounds)
    keys = [warehouse.hour_key(hour) for hour in warehouse.hours_between(first, last + timedelta(microseconds=1))]
    return [key for key in keys if (cutoff := ingest_cutoff(instance, key)) is not None and changed_at > cutoff]


def build_late_files_sensor(job) -> SensorDefinition:
    @sensor(job=job, minimum_interval_seconds=300, default_status=DefaultSensorStatus.STOPPED)
    def prism_late_files(context: SensorEvaluationContext, flow_source: FlowSource):
        """Flow files that changed after their hours were ingested: one run re-ingests those hours
        and re-analyzes from the first of them through the last hour already analyzed, in order,
        since every later hour continues the job state of the one before."""
        changed = flow_source.changed_since(float(context.cursor or 0))
        if not changed:
            return SkipReason("no flow file changed")
        context.update_cursor(str(max(changed_at for _, changed_at in changed)))
        stale = sorted(
            {key for path, changed_at in changed for key in hours_ingested_before(context.instance, path, changed_at)}
        )
        if not stale:
            return SkipReason(f"{len(changed)} changed file(s), none for an hour ingested before the change")
        analyzed = context.instance.get_materialized_partitions(AssetKey(ANALYSIS_TABLES[0]))
        last = max([stale[-1], *(key for key in analyzed if key > stale[0])])
        return RunRequest(
            run_key=f"late-files:{stale[0]}:{last}:{context.cursor}",
            tags={ASSET_PARTITION_RANGE_START_TAG: stale[0], ASSET_PARTITION_RANGE_END_TAG: last},
        )

    return prism_late_files


def build_freshness_schedule(freshness_check: AssetChecksDefinition, minute: int) -> ScheduleDefinition:
    """At HH:minute, whether the hour that closed at HH:00 has been materialized."""
    job = define_asset_job("prism_freshness", selection=AssetSelection.checks(freshness_check))
    return ScheduleDefinition(name="prism_freshness_schedule", job=job, cron_schedule=f"{minute} * * * *")
