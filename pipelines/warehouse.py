"""The warehouse: hive-partitioned Parquet per table and hour, and a DuckDB file of views, in a
local directory or under an object store prefix (pipelines/storage.py).

Every file is published atomically (storage.publish): readers, and a run killed at any instant, see
either the previous partition or the new one, never a half-written file. The DuckDB file is built
aside and published the same way, so an analyst holding it open read-only never blocks a run and
never sees a half-built catalog.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import parquet_parts, storage
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


def partition_dir(root: str | Path, table: str, hour: datetime) -> str:
    return storage.join(root, table, f"date={hour:%Y-%m-%d}", f"hour={hour:%H}")


def partition_file(root: str | Path, table: str, hour: datetime) -> str:
    return storage.join(partition_dir(root, table, hour), DATA_FILE)


ROW_GROUP_ROWS = 1 << 20
# A flow's nanosecond times are all but unique: a dictionary overflowed its page limit and was
# dropped again (a third of the `flows` write). They are written as deltas (a minute's flows
# are in start order), uncompressed: plain with zstd, the three took 200 ms of CPU and 22 MB per
# 2^21 flows; as deltas 65 ms and 21 MB (zstd over the deltas: +40% CPU for 3% fewer bytes).
UNIQUE_VALUED = {"time_flow_start_ns", "time_flow_end_ns", "time_received_ns"}
UNIQUE_VALUED_ENCODING = "DELTA_BINARY_PACKED"


def write_partition(root: str | Path, table: str, hour: datetime, rows: pa.Table) -> str:
    """Replace the partition of `table` for `hour` with `rows` (possibly empty)."""
    return write_partition_pieces(root, table, hour, [rows])


def write_partition_pieces(root: str | Path, table: str, hour: datetime, pieces: Iterable[pa.Table],
                           encoders: int = 1) -> str:
    """Replace the partition of `table` for `hour` with the rows of `pieces`, in order, in row
    groups of ROW_GROUP_ROWS. Row groups are encoded on `encoders` threads (pyarrow's writer
    encodes one column after another on one core) and assembled in order into the one file
    (parquet_parts); at most one row group per encoder is held encoding at once."""
    schema = TABLES[table]
    final = partition_file(root, table, hour)

    def write(path: str) -> None:
        with open(path, "wb") as out, ThreadPoolExecutor(encoders) as pool:
            assembled, encoding = parquet_parts.PartsFile(out), deque()
            for rows in row_groups(schema, pieces):
                if len(encoding) == encoders:
                    assembled.add(encoding.popleft().result())
                encoding.append(pool.submit(encode_row_group, rows))
            for part in encoding:
                assembled.add(part.result())
            assembled.close()

    storage.publish(final, write)
    return final


def row_groups(schema: pa.Schema, pieces: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """The rows of `pieces` cast to `schema`, in order, in tables of ROW_GROUP_ROWS rows (the last
    fewer); no rows at all give one empty table, so an empty partition still has its schema."""
    pending, yielded = schema.empty_table(), False
    for piece in pieces:
        pending = pa.concat_tables([pending, piece.cast(schema)])
        while pending.num_rows >= ROW_GROUP_ROWS:
            yield pending.slice(0, ROW_GROUP_ROWS)
            pending, yielded = pending.slice(ROW_GROUP_ROWS), True
    if pending.num_rows or not yielded:
        yield pending


def encode_row_group(rows: pa.Table) -> pa.Buffer:
    """`rows` as one row group of a Parquet file in memory (a part of the partition's file)."""
    schema = rows.schema
    dictionary = [name for name in schema.names if name not in UNIQUE_VALUED]
    deltas = [name for name in schema.names if name in UNIQUE_VALUED]
    part = pa.BufferOutputStream()
    with pq.ParquetWriter(part, schema, use_dictionary=dictionary,
                          compression={name: "none" if name in deltas else "zstd" for name in schema.names},
                          column_encoding=dict.fromkeys(deltas, UNIQUE_VALUED_ENCODING)) as writer:
        writer.write_table(rows, row_group_size=ROW_GROUP_ROWS)
    return part.getvalue()


def read_parquet(location: str, **options) -> pa.Table:
    with storage.open_input(location) as handle:
        return pq.read_table(handle, **options)


def read_partition(root: str | Path, table: str, hour: datetime) -> pa.Table | None:
    path = partition_file(root, table, hour)
    return read_parquet(path) if storage.exists(path) else None


def write_json(path: str, payload: dict) -> None:
    storage.publish(path, lambda tmp: Path(tmp).write_text(json.dumps(payload, indent=2, sort_keys=True)))


def as_read_back(payload: dict) -> dict:
    """`payload` as `read_stats` returns it once `write_json` has written it: JSON's types, keys sorted."""
    return json.loads(json.dumps(payload, sort_keys=True))


def stats_path(root: str | Path, hour: datetime, stage: str) -> str:
    """Per-hour bookkeeping of a stage (row counts, job state handed to the next hour)."""
    return storage.join(root, "_state", f"date={hour:%Y-%m-%d}", f"hour={hour:%H}", f"{stage}.json")


def read_stats(root: str | Path, hour: datetime, stage: str) -> dict | None:
    path = stats_path(root, hour, stage)
    return json.loads(storage.read_bytes(path)) if storage.exists(path) else None


def topology_path(root: str | Path) -> str:
    return storage.join(root, "topology", DATA_FILE)


def write_topology(root: str | Path, inventory: pa.Table) -> None:
    """The NIC inventory the run used, for the reports (not partitioned: it describes the fleet)."""
    storage.publish(topology_path(root), lambda path: pq.write_table(inventory, path))


HOUR_START = pa.timestamp("ns", tz="UTC")


def partition_hour(path: str) -> datetime:
    """The hour a partition's path names (`.../date=YYYY-MM-DD/hour=HH/data.parquet`)."""
    day, hour = path.split("/")[-3:-1]
    return datetime.strptime(f"{day} {hour}", "date=%Y-%m-%d hour=%H").replace(tzinfo=timezone.utc)


def partition_files(root: str | Path, table: str) -> list[str]:
    """The `data.parquet` of every partition of `table`, in hour order."""
    return storage.files_matching(storage.join(root, table), f"*/*/{DATA_FILE}")


def client_columns(schema: pa.Schema) -> str:
    """`*` with every timestamp column cast to TIMESTAMPTZ: the column types of the catalog's views
    and tables are stored with it, and clients before DuckDB 2.0 know no TIMESTAMPTZ_NS."""
    times = [f'CAST("{f.name}" AS TIMESTAMPTZ) AS "{f.name}"' for f in schema if pa.types.is_timestamp(f.type)]
    return f"* REPLACE ({', '.join(times)})" if times else "*"


RANGE_PRUNED_TABLES = ("flows", "flow_minutes")  # see sql/views.sql


def views_sql(root: str | Path) -> str:
    """The DDL of sql/views.sql for this warehouse; tables with no partition yet get an empty
    table of the right columns instead of a view, since DuckDB cannot bind a glob of no files."""
    location = str(Path(root).resolve()) if storage.is_local(root) else str(root).rstrip("/")
    statements = []
    template = (SQL_DIR / "views.sql").read_text()
    for name in TABLES:
        if partition_files(root, name):
            statements.append(template.replace("@TABLE@", name).replace("@WAREHOUSE@", location)
                              .replace("@COLUMNS@", client_columns(TABLES[name]))
                              .replace("@UNION_BY_NAME@", str(name not in RANGE_PRUNED_TABLES).lower()))
    if partition_files(root, "jobs"):
        statements.append((SQL_DIR / "job_latest.sql").read_text())
    if storage.exists(topology_path(root)):
        statements.append((SQL_DIR / "topology.sql").read_text().replace("@WAREHOUSE@", location))
    return "\n".join(statements)


def _register_filesystem(con: duckdb.DuckDBPyConnection, root: str | Path) -> None:
    """Lets DuckDB read a warehouse on an object store (storage.duckdb_filesystem)."""
    filesystem = storage.duckdb_filesystem(root)
    if filesystem is not None:
        con.register_filesystem(filesystem)


def refresh_database(root: str | Path) -> str:
    """Rebuild `prism.duckdb` aside and publish it."""
    final = storage.join(root, DATABASE_FILE)

    def build(path: str) -> None:
        Path(path).unlink(missing_ok=True)
        with duckdb.connect(path, config={"storage_compatibility_version": CLIENT_STORAGE_VERSION}) as con:
            _register_filesystem(con, root)
            con.execute(views_sql(root))
            for name, schema in TABLES.items():
                if not partition_files(root, name):
                    placeholder = schema.empty_table()  # noqa: F841 - read by DuckDB's replacement scan
                    # the partition columns too, so queries read an empty table as they read a view
                    con.execute(f"CREATE TABLE {name} AS SELECT {client_columns(schema)}, "
                                "NULL::DATE AS date, NULL::INTEGER AS hour FROM placeholder")

    storage.publish(final, build)
    return final


def connect(root: str | Path, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """The warehouse's catalog. On an object store, a read-only copy of it, whose views read the
    store's partitions through storage.duckdb_filesystem."""
    if storage.is_local(root):
        return duckdb.connect(str(Path(root) / DATABASE_FILE), read_only=read_only)
    copy = tempfile.NamedTemporaryFile(prefix="prism-", suffix=".duckdb", delete=False)
    with copy:
        copy.write(storage.read_bytes(storage.join(root, DATABASE_FILE)))
    try:
        con = duckdb.connect(copy.name, read_only=True)
    finally:
        os.unlink(copy.name)  # the open connection keeps it readable
    _register_filesystem(con, root)
    return con


def load_tables(root: str | Path) -> dict[str, pa.Table]:
    """Every table of the warehouse over all hours (for scoring and small reports), plus
    `ingest_stats`: the per-hour ingest counts. A job's row per hour holds its life so far
    (`first_seen` from its first hour, `last_seen` may be the end of a record that ran into the
    next hour): `jobs` rows also carry `hour_start`, the hour they describe."""
    tables = {}
    for name, schema in TABLES.items():
        files = partition_files(root, name)
        parts = [read_parquet(f, schema=schema) for f in files]
        if name == "jobs":
            parts = [part.append_column("hour_start", pa.array([partition_hour(f)] * part.num_rows, HOUR_START))
                     for part, f in zip(parts, files)]
        tables[name] = pa.concat_tables(parts) if parts else schema.empty_table()
    state_files = storage.files_matching(storage.join(root, "_state"), "*/*/ingest.json")
    stats = [json.loads(storage.read_bytes(path)) for path in state_files]
    tables["ingest_stats"] = pa.Table.from_pylist(stats) if stats else pa.table({"duplicates": pa.array([], pa.int64())})
    return tables
