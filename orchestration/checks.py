"""Asset checks on the warehouse tables.

In a run over hours (scheduled, backfill, late-file re-run) a check looks at those hours; run on
its own (the prism_checks job, or "Execute" in the UI) it looks at every hour on disk. Schema and
row conservation are blocking: an hour whose ingest is wrong is not analyzed. Freshness of the
latest hour runs on its own schedule, since a backfill of old hours says nothing about it.
"""

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetRecordsFilter,
    MetadataValue,
    asset_check,
    multi_asset_check,
)

from orchestration.assets import ANALYSIS_TABLES, INGEST_TABLES, hours_of
from orchestration.resources import Warehouse
from pipelines import storage
from pipelines import warehouse as tables
from prism_core.schema import TABLES


def hours_to_check(context: AssetCheckExecutionContext, root: str, table: str) -> list[datetime]:
    if context.has_partition_key or context.has_partition_key_range:
        return hours_of(context)
    return stored_hours(root, table)


def stored_hours(root: str, table: str) -> list[datetime]:
    """Every hour that has a partition of `table` in the warehouse."""
    return sorted(tables.partition_hour(path)
                  for path in storage.files_matching(storage.join(root, table), f"date=*/hour=*/{tables.DATA_FILE}"))


def footer(location: str) -> pq.FileMetaData:
    with storage.open_input(location) as handle:
        return pq.read_metadata(handle)


def hours_label(hours: list[datetime]) -> str:
    if not hours:
        return "none"
    return f"{tables.hour_key(hours[0])} to {tables.hour_key(hours[-1])} ({len(hours)})"


def schema_differences(found: pa.Schema, expected: pa.Schema) -> list[str]:
    expected_types = {field.name: field.type for field in expected}
    found_types = {field.name: field.type for field in found}
    return (
        [f"missing {name}" for name in expected_types if name not in found_types]
        + [f"unexpected {name}" for name in found_types if name not in expected_types]
        + [
            f"{name} is {found_types[name]}, expected {kind}"
            for name, kind in expected_types.items()
            if name in found_types and not found_types[name].equals(kind)
        ]
    )


def build_schema_check(stage: str, names: tuple[str, ...]) -> AssetChecksDefinition:
    """One step checks the tables that one pipeline stage writes."""

    @multi_asset_check(
        name=f"{stage}_schema",
        specs=[
            AssetCheckSpec(
                "schema",
                asset=name,
                blocking=True,
                description=f"Each partition of {name} exists with the columns and types of prism_core.schema.",
            )
            for name in names
        ],
    )
    def schema(context: AssetCheckExecutionContext, warehouse: Warehouse) -> Iterator[AssetCheckResult]:
        for name in names:
            hours = hours_to_check(context, warehouse.root, name)
            problems = {}
            for hour in hours:
                path = tables.partition_file(warehouse.root, name, hour)
                if not storage.exists(path):
                    problems[tables.hour_key(hour)] = ["partition missing"]
                elif differences := schema_differences(footer(path).schema.to_arrow_schema(), TABLES[name]):
                    problems[tables.hour_key(hour)] = differences
            yield AssetCheckResult(
                asset_key=name,
                check_name="schema",
                passed=not problems,
                metadata={"hours": hours_label(hours), "problems": MetadataValue.json(problems)},
            )

    return schema


def hour_conservation(root: str, hour: datetime) -> dict:
    """An hour's input rows as ingest counted them, against the rows its partitions hold."""
    counts = tables.read_stats(root, hour, "ingest")
    paths = {name: tables.partition_file(root, name, hour) for name in ("flows", "quarantine", "flow_minutes")}
    if counts is None or not all(storage.exists(path) for path in paths.values()):
        return {"conserved": False, "problem": "not ingested"}
    flows = footer(paths["flows"]).num_rows
    quarantine = footer(paths["quarantine"]).num_rows
    aggregated = pc.sum(tables.read_parquet(paths["flow_minutes"], columns=["flows"])["flows"]).as_py() or 0
    return {
        "conserved": (flows, quarantine, aggregated) == (counts["flows"], counts["quarantine"], flows),
        "input": counts["flows"] + counts["quarantine"] + counts["duplicates"],
        "flows": flows,
        "quarantine": quarantine,
        "duplicates": counts["duplicates"],
        "flows_in_flow_minutes": aggregated,
    }


def duplicate_keys(
    root: str, table: str, key: tuple[str, ...], hours: list[datetime], *, per_hour: bool = False
) -> list[dict]:
    """Keys with a row in `hours` that occur more than once in the whole table (a step written by
    two hours is as wrong as one written twice by the same hour), or, with `per_hour`, more than
    once within one hour (an issue has a row in every hour it lasts, under one issue_id)."""
    columns = ", ".join(key + (("partition_hour",) if per_hour else ()))
    query = f"""
        WITH keyed AS (SELECT {", ".join(key)}, date + to_hours(hour) AS partition_hour FROM {table}),
        checked AS (SELECT DISTINCT {columns} FROM keyed WHERE partition_hour IN (SELECT unnest($hours)))
        SELECT {columns}, count(*) AS copies, list(DISTINCT strftime(partition_hour, '%Y-%m-%d-%H:00')) AS hours
        FROM keyed SEMI JOIN checked USING ({columns})
        GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL
    """
    naive_hours = [hour.astimezone(timezone.utc).replace(tzinfo=None) for hour in hours]
    with tables.connect(str(root)) as con:
        result = con.execute(query, {"hours": naive_hours})
        names = [column[0] for column in result.description]
        return [dict(zip(names, row)) for row in result.fetchall()]


def build_checks(max_quarantine_share: float) -> list[AssetChecksDefinition]:
    """The checks that run with every materialization, and on their own in the prism_checks job."""

    # It reads quarantine and flow_minutes too, written by the same step as flows. Declaring them
    # as deps would let their blocking schema check skip this one when the checks run alone.
    @asset_check(asset="flows", blocking=True)
    def rows_conserved(context: AssetCheckExecutionContext, warehouse: Warehouse) -> AssetCheckResult:
        """Per hour, input rows = flows + quarantine + duplicates: the flows and quarantine
        partitions hold exactly the rows ingest counted, and flow_minutes aggregates every flow."""
        hours = hours_to_check(context, warehouse.root, "flows")
        by_hour = {tables.hour_key(hour): hour_conservation(warehouse.root, hour) for hour in hours}
        return AssetCheckResult(
            passed=all(entry["conserved"] for entry in by_hour.values()),
            metadata={"hours": hours_label(hours), "rows_by_hour": MetadataValue.json(by_hour)},
        )

    @asset_check(asset="quarantine")
    def quarantine_share(context: AssetCheckExecutionContext, warehouse: Warehouse) -> AssetCheckResult:
        """The share of input rows rejected stays under PRISM_MAX_QUARANTINE_SHARE; more usually
        means an exporter changed its format."""
        hours = hours_to_check(context, warehouse.root, "quarantine")
        shares = {}
        for hour in hours:
            counts = tables.read_stats(warehouse.root, hour, "ingest") or {}
            total = sum(counts.get(name, 0) for name in ("flows", "quarantine", "duplicates"))
            shares[tables.hour_key(hour)] = counts.get("quarantine", 0) / total if total else 0.0
        return AssetCheckResult(
            passed=all(share <= max_quarantine_share for share in shares.values()),
            severity=AssetCheckSeverity.WARN,
            metadata={
                "hours": hours_label(hours),
                "share_by_hour": MetadataValue.json(shares),
                "threshold": max_quarantine_share,
            },
        )

    def unique_key_check(table: str, key: tuple[str, ...], name: str, per_hour: bool = False) -> AssetChecksDefinition:
        scope = "within an hour" if per_hour else "anywhere"
        @asset_check(
            asset=table,
            name=name,
            description=f"No ({', '.join(key)}) of the checked hours appears twice {scope} in {table}.",
        )
        def unique(context: AssetCheckExecutionContext, warehouse: Warehouse) -> AssetCheckResult:
            hours = hours_to_check(context, warehouse.root, table)
            duplicates = duplicate_keys(warehouse.root, table, key, hours, per_hour=per_hour)
            return AssetCheckResult(
                passed=not duplicates,
                metadata={
                    "hours": hours_label(hours),
                    "duplicates": len(duplicates),
                    "examples": MetadataValue.json(duplicates[:10]),
                },
            )

        return unique

    return [
        build_schema_check("ingest", INGEST_TABLES),
        build_schema_check("analysis", ANALYSIS_TABLES),
        rows_conserved,
        quarantine_share,
        unique_key_check("steps", ("job_id", "step"), "unique_steps"),
        unique_key_check("issues", ("issue_id",), "unique_issue_ids", per_hour=True),
    ]


def due_hour(now: datetime, deadline_minute: int) -> datetime:
    """The latest hour that must be materialized at `now`: the one that closed before the last
    deadline (HH:deadline_minute) passed."""
    last_deadline = now.replace(minute=deadline_minute, second=0, microsecond=0)
    if last_deadline > now:
        last_deadline -= timedelta(hours=1)
    return tables.hour_floor(last_deadline) - timedelta(hours=1)


def build_freshness_check(deadline_minute: int) -> AssetChecksDefinition:
    @multi_asset_check(
        specs=[AssetCheckSpec("latest_hour_materialized", asset=name) for name in TABLES],
        description=f"The hour that closed before the last HH:{deadline_minute:02d} is materialized.",
        can_subset=True,
    )
    def freshness(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        due = tables.hour_key(due_hour(datetime.now(timezone.utc), deadline_minute))
        for check_key in context.selected_asset_check_keys:
            materialized = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=check_key.asset_key, asset_partitions=[due]), limit=1
            ).records
            yield AssetCheckResult(
                asset_key=check_key.asset_key,
                check_name=check_key.name,
                passed=bool(materialized),
                metadata={"due_hour": due},
            )

    return freshness
