"""One hourly partitioned asset per warehouse table, materialized by the pipeline entry points.

Both multi-assets take partition ranges in one run (BackfillPolicy.single_run): ingest because one
Beam pipeline reads the flow files once for any number of hours, analysis because its hours must
run in order (each continues the job ids and step numbers of the one before), which a loop inside
one run guarantees whatever the run coordinator does. A scheduled run is a range of one hour.
"""

import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pyarrow.compute as pc
from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    Failure,
    HourlyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableSchema,
    TimeWindowPartitionMapping,
    multi_asset,
)

from orchestration.resources import BeamOptions, FlowSource, TopologyFile, Warehouse
from pipelines import warehouse as tables
from pipelines.run import RunError, file_time_bounds, run_analysis, run_ingest
from prism_core.schema import TABLES

INGEST_TABLES = ("flows", "quarantine", "flow_minutes")
ANALYSIS_TABLES = tuple(name for name in TABLES if name not in INGEST_TABLES)
PREVIOUS_HOUR = TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)

DESCRIPTIONS = {
    "flows": "Validated, deduplicated flow records, by the hour of their start.",
    "quarantine": "Rejected input records with the reason, the file and the row they came from.",
    "flow_minutes": "Per-minute aggregates of each NIC pair: flows, bytes, distinct flow sizes.",
    "jobs": "Training jobs recognized from who talks to whom: size, parallelism, status.",
    "job_gpus": "The GPUs (NIC addresses) of each job, with pipeline stage, data-parallel rank and "
                "their first and last traffic for the job in the hour.",
    "comm_pairs": "Each job's communicating pairs, classified as dp, pp or other traffic.",
    "steps": "Training steps of each job: start, end, duration; numbers continue across hours.",
    "issues": "Stragglers, slow links, hangs, restarts, slow steps and their wasted GPU time; "
              "jobs whose analysis failed (analysis_error).",
}


def hourly_partitions(start: str, end_offset: int = 0) -> HourlyPartitionsDefinition:
    """Keys like 2026-11-22-05:00, the form of pipelines.warehouse.hour_key."""
    return HourlyPartitionsDefinition(start_date=start, end_offset=end_offset, timezone="UTC")


def hours_of(context) -> list[datetime]:
    """The hours of the run's partition range (an asset's or an asset check's context)."""
    window = context.partition_time_window
    return tables.hours_between(window.start, window.end)


def table_spec(name: str, group: str, deps: list[AssetDep]) -> AssetSpec:
    return AssetSpec(
        name,
        group_name=group,
        deps=deps,
        description=DESCRIPTIONS[name],
        kinds={"parquet", "beam"},
        metadata={
            "dagster/column_schema": TableSchema(
                columns=[TableColumn(field.name, str(field.type)) for field in TABLES[name]]
            ),
            "partitions": f"<warehouse>/{name}/date=YYYY-MM-DD/hour=HH/{tables.DATA_FILE}",
        },
    )


def row_metadata(table: str, rows_per_hour: dict[str, dict[str, int]], hours: list[datetime]) -> dict:
    """What every table reports: its rows in the run's hours, per hour, and the hours covered."""
    by_hour = {key: counts.get(table, 0) for key, counts in rows_per_hour.items()}
    return {
        "dagster/row_count": sum(by_hour.values()),
        "rows_by_hour": MetadataValue.json(by_hour),
        "hours": f"{hours[0]:%Y-%m-%d %H:%M} to {hours[-1] + timedelta(hours=1):%Y-%m-%d %H:%M} UTC",
    }


def flows_time_range(root: str, hours: list[datetime]) -> dict:
    """First and last flow start written, from the partitions' Parquet footers."""
    bounds = [
        file_time_bounds(tables.partition_file(root, "flows", hour)) for hour in hours
    ]
    bounds = [b for b in bounds if b is not None]
    if not bounds:
        return {}
    return {
        "first_flow": MetadataValue.timestamp(min(b[0] for b in bounds) / 1e9),
        "last_flow": MetadataValue.timestamp(max(b[1] for b in bounds) / 1e9),
    }


def quarantine_reasons(root: str, hours: list[datetime]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for hour in hours:
        rows = tables.read_partition(root, "quarantine", hour)
        if rows is None:
            continue
        for entry in pc.value_counts(rows["reason"]).to_pylist():
            counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def build_ingest(partitions: HourlyPartitionsDefinition):
    @multi_asset(
        name="ingest",
        specs=[table_spec(name, "ingest", deps=[]) for name in INGEST_TABLES],
        partitions_def=partitions,
        backfill_policy=BackfillPolicy.single_run(),
    )
    def ingest(
        context: AssetExecutionContext, flow_source: FlowSource, warehouse: Warehouse, beam: BeamOptions
    ) -> Iterator[MaterializeResult]:
        """Reads every flow file once and writes the flows, quarantine and flow_minutes
        partitions of the run's hours."""
        hours = hours_of(context)
        # Files changed after this instant may be missing from these partitions (late-file sensor).
        input_cutoff = time.time()
        summary = run_ingest(flow_source.directory, warehouse.root, hours, beam.args)
        warehouse.refresh_views()
        counters, per_hour = summary.counters, summary.per_hour
        yield MaterializeResult(
            asset_key="flows",
            metadata={
                **row_metadata("flows", per_hour, hours),
                **flows_time_range(warehouse.root, hours),
                **{f"run_{name}": counters.get(name, 0) for name in
                   ("files", "rows_read", "flows", "quarantined", "duplicates", "out_of_range")},
                "input_cutoff": MetadataValue.timestamp(input_cutoff),
            },
        )
        quarantined = sum(c["quarantine"] for c in per_hour.values())
        rows_in = sum(c["flows"] + c["quarantine"] + c["duplicates"] for c in per_hour.values())
        yield MaterializeResult(
            asset_key="quarantine",
            metadata={
                **row_metadata("quarantine", per_hour, hours),
                "quarantine_share": quarantined / rows_in if rows_in else 0.0,
                "reasons": MetadataValue.json(quarantine_reasons(warehouse.root, hours)),
            },
        )
        yield MaterializeResult(
            asset_key="flow_minutes", metadata=row_metadata("flow_minutes", per_hour, hours)
        )

    return ingest


def build_analysis(partitions: HourlyPartitionsDefinition):
    def analysis_deps(name: str) -> list[AssetDep]:
        return [AssetDep("flows"), AssetDep("flow_minutes"), AssetDep(name, partition_mapping=PREVIOUS_HOUR)]

    @multi_asset(
        name="analysis",
        specs=[table_spec(name, "analysis", analysis_deps(name)) for name in ANALYSIS_TABLES],
        partitions_def=partitions,
        backfill_policy=BackfillPolicy.single_run(),
    )
    def analysis(
        context: AssetExecutionContext, warehouse: Warehouse, topology: TopologyFile, beam: BeamOptions
    ) -> Iterator[MaterializeResult]:
        """Job recognition, parallelism, steps and issues, hour after hour in order."""
        hours = hours_of(context)
        rows_per_hour, errors_per_hour = {}, {}
        try:  # no inventory, or the previous hour not analyzed yet: one message, no traceback
            inventory = topology.load()
            for hour in hours:
                context.log.info(f"analysis of {tables.hour_key(hour)}")
                rows, counters = run_analysis(warehouse.root, hour, inventory, beam.args)
                rows_per_hour[tables.hour_key(hour)] = rows
                errors_per_hour[tables.hour_key(hour)] = counters.get("analysis_errors", 0)
        except RunError as error:
            raise Failure(str(error)) from None
        warehouse.refresh_views()
        for name in ANALYSIS_TABLES:
            metadata = row_metadata(name, rows_per_hour, hours)
            if name == "issues":  # jobs whose analysis raised: their analysis_error issues
                metadata["analysis_errors_by_hour"] = MetadataValue.json(errors_per_hour)
            yield MaterializeResult(asset_key=name, metadata=metadata)

    return analysis
