"""The Dagster code location of Prism (`[tool.dg.project]` in pyproject.toml).

    dg dev                          # UI on http://127.0.0.1:3000, from the project directory

Environment variables choose the data and the runner (orchestration.resources.resources_from_env,
resolved by Dagster when a run starts) and the partitions and schedules (Settings.from_env, read
here); without any, the demo data of `prism demo` and ./prism-warehouse.
"""

from dagster import ConfigurableResource, Definitions, in_process_executor

from orchestration.assets import build_analysis, build_ingest, hourly_partitions
from orchestration.automation import (
    build_freshness_schedule,
    build_hourly_schedule,
    build_jobs,
    build_late_files_sensor,
)
from orchestration.checks import build_checks, build_freshness_check
from orchestration.resources import Settings, resources_from_env


def build_definitions(settings: Settings, resources: dict[str, ConfigurableResource]) -> Definitions:
    """The code location for `settings`, with `resources` for flow_source, topology, warehouse
    and beam (orchestration.resources)."""
    partitions = hourly_partitions(settings.partition_start, settings.partition_end_offset)
    pipeline_checks = build_checks(settings.max_quarantine_share)
    freshness_check = build_freshness_check(settings.freshness_minute)
    hourly_job, checks_job = build_jobs(partitions, pipeline_checks)
    return Definitions(
        assets=[build_ingest(partitions), build_analysis(partitions)],
        asset_checks=[*pipeline_checks, freshness_check],
        jobs=[hourly_job, checks_job],
        schedules=[
            build_hourly_schedule(hourly_job, settings.schedule_minute),
            build_freshness_schedule(freshness_check, settings.freshness_minute),
        ],
        sensors=[build_late_files_sensor(hourly_job)],
        resources=resources,
        # Beam does the heavy lifting inside a step; a process per step would only add imports.
        executor=in_process_executor,
    )


defs = build_definitions(Settings.from_env(), resources_from_env())
