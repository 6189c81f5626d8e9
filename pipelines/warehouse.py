"""The warehouse on disk: hive-partitioned Parquet per table and hour, and a DuckDB file of views.

Every write lands under a hidden temporary name in its final directory and is `os.replace`d into
place, so readers (and a run killed at any instant) see either the previous partition or the new
one, never a half-written file. The DuckDB file is rebuilt aside and swapped in the same way, so an
analyst holding it open read-only never blocks a run and never sees a half-built catalog.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from prism_core.schema import TABLES

DATA_FILE = "data.parquet"
DATABASE_FILE = "prism.duckdb"
SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
# The catalog holds only views, so it is written in the oldest storage format that stores them:
# the DuckDB CLIs and clients analysts already have (1.1 and later) open it, not only this one.
CLIENT_STORAGE_VERSION = "v1.1.0"


def hour_floor(instant: datetime) -> datetime:
    instant = instant.astimezone(timezone.utc) if instant.tzinfo else instant.replace(tzinfo=timezone.utc)
    return instant.replace(minute=0, second=0, microsecond=0)


def hours_between(start: datetime, end: datetime) -> list[datetime]:
    """Hours whose start lies in [start, end)."""
    hour, last = hour_floor(start), end
    hours = []
    while hour < last:
        hours.append(hour)
        hour += timedelta(hours=1)
    return hours


def hour_key(hour: datetime) -> str:
    """The Dagster partition key form of an hour, e.g. 2026-11-22-05:00."""
    return hour.strftime("%Y-%m-%d-%H:00")


def partition_dir(root: str | Path, table: str, hour: datetime) -> Path:
    return Path(root) / table / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"


ABANDONED_AFTER_S = 3600  # a temporary file this old belongs to a writer that was killed


def _remove_abandoned(final: Path) -> None:
    """Temporary files of writers killed mid-write; younger ones may be a concurrent writer's."""
    for leftover in final.parent.glob(f".{final.name}.*.tmp"):
        try:
            if time.time() - leftover.stat().st_mtime > ABANDONED_AFTER_S:
                leftover.unlink()
        except FileNotFoundError:
            pass


def _replace_atomically(final: Path, write) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(final)
    temporary = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
    try:
        write(temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)


ROW_GROUP_ROWS = 1 << 20
# Columns written without a dictionary: a flow's nanosecond times are all but unique, so the
# writer built a dictionary for each row group, overflowed its page limit and dropped it again
# (a third of the `flows` write, and the plain pages are smaller).
UNIQUE_VALUED = {"time_flow_start_ns", "time_flow_end_ns", "time_received_ns"}


def write_partition(root: str | Path, table: str, hour: datetime, rows: pa.Table) -> Path:
    """Replace the partition of `table` for `hour` with `rows` (possibly empty)."""
    return write_partition_pieces(root, table, hour, [rows])


def write_partition_pieces(root: str | Path, table: str, hour: datetime, pieces: Iterable[pa.Table]) -> Path:
    """Replace the partition of `table` for `hour` with the rows of `pieces`, in order, streamed
    into row groups of ROW_GROUP_ROWS, so only one row group is ever held at once."""
    schema = TABLES[table]
    final = partition_dir(root, table, hour) / DATA_FILE

    def write(path: Path) -> None:
        dictionary = [name for name in schema.names if name not in UNIQUE_VALUED]
        with pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=dictionary) as writer:
            pending, written = schema.empty_table(), 0
            for piece in pieces:
                pending = pa.concat_tables([pending, piece.cast(schema)])
                while pending.num_rows >= ROW_GROUP_ROWS:
                    writer.write_table(pending.slice(0, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
                    pending, written = pending.slice(ROW_GROUP_ROWS), written + ROW_GROUP_ROWS
            if pending.num_rows or not written:  # an empty partition still gets its empty row group
                writer.write_table(pending, row_group_size=ROW_GROUP_ROWS)

    _replace_atomically(final, write)
    return final


def read_partition(root: str | Path, table: str, hour: datetime) -> pa.Table | None:
    path = partition_dir(root, table, hour) / DATA_FILE
    return pq.read_table(path) if path.exists() else None


def write_json(path: Path, payload: dict) -> None:
    _replace_atomically(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2, sort_keys=True)))


def stats_path(root: str | Path, hour: datetime, stage: str) -> Path:
    """Per-hour bookkeeping of a stage (row counts, job state handed to the next hour)."""
    return Path(root) / "_state" / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}" / f"{stage}.json"


def read_stats(root: str | Path, hour: datetime, stage: str) -> dict | None:
    path = stats_path(root, hour, stage)
    return json.loads(path.read_text()) if path.exists() else None


def topology_path(root: str | Path) -> Path:
    return Path(root) / "topology" / DATA_FILE


def write_topology(root: str | Path, inventory: pa.Table) -> None:
    """The NIC inventory the run used, for the reports (not partitioned: it describes the fleet)."""
    _replace_atomically(topology_path(root), lambda path: pq.write_table(inventory, path))


def client_columns(schema: pa.Schema) -> str:
    """`*` with every timestamp column cast to TIMESTAMPTZ: the column types of the catalog's views
    and tables are stored with it, and clients before DuckDB 2.0 know no TIMESTAMPTZ_NS."""
    times = [f'CAST("{f.name}" AS TIMESTAMPTZ) AS "{f.name}"' for f in schema if pa.types.is_timestamp(f.type)]
    return f"* REPLACE ({', '.join(times)})" if times else "*"


RANGE_PRUNED_TABLES = ("flows", "flow_minutes")  # see sql/views.sql


def views_sql(root: str | Path) -> str:
    """The DDL of sql/views.sql for this warehouse; tables with no partition yet get an empty
    table of the right columns instead of a view, since DuckDB cannot bind a glob of no files."""
    root = Path(root).resolve()
    statements = []
    template = (SQL_DIR / "views.sql").read_text()
    for name in TABLES:
        if any((root / name).glob(f"*/*/{DATA_FILE}")):
            statements.append(template.replace("@TABLE@", name).replace("@WAREHOUSE@", str(root))
                              .replace("@COLUMNS@", client_columns(TABLES[name]))
                              .replace("@UNION_BY_NAME@", str(name not in RANGE_PRUNED_TABLES).lower()))
    if any((root / "jobs").glob(f"*/*/{DATA_FILE}")):
        statements.append((SQL_DIR / "job_latest.sql").read_text())
    if topology_path(root).exists():
        statements.append((SQL_DIR / "topology.sql").read_text().replace("@WAREHOUSE@", str(root)))
    return "\n".join(statements)


def refresh_database(root: str | Path) -> Path:
    """Rebuild `prism.duckdb` aside and swap it in."""
    root = Path(root)
    final = root / DATABASE_FILE

    def build(path: Path) -> None:
        path.unlink(missing_ok=True)
        with duckdb.connect(str(path), config={"storage_compatibility_version": CLIENT_STORAGE_VERSION}) as con:
            con.execute(views_sql(root))
            for name, schema in TABLES.items():
                if not any((root / name).glob(f"*/*/{DATA_FILE}")):
                    placeholder = schema.empty_table()  # noqa: F841 - read by DuckDB's replacement scan
                    # the partition columns too, so queries read an empty table as they read a view
                    con.execute(f"CREATE TABLE {name} AS SELECT {client_columns(schema)}, "
                                "NULL::DATE AS date, NULL::INTEGER AS hour FROM placeholder")

    _replace_atomically(final, build)
    return final


def connect(root: str | Path, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(Path(root) / DATABASE_FILE), read_only=read_only)


def load_tables(root: str | Path) -> dict[str, pa.Table]:
    """Every table of the warehouse over all hours (for scoring and small reports), plus
    `ingest_stats`: the per-hour ingest counts."""
    root = Path(root)
    tables = {}
    for name, schema in TABLES.items():
        files = sorted((root / name).glob(f"*/*/{DATA_FILE}"))
        tables[name] = pa.concat_tables([pq.read_table(f, schema=schema) for f in files]) if files else schema.empty_table()
    stats = [json.loads(p.read_text()) for p in sorted((root / "_state").glob("*/*/ingest.json"))]
    tables["ingest_stats"] = pa.Table.from_pylist(stats) if stats else pa.table({"duplicates": pa.array([], pa.int64())})
    return tables
