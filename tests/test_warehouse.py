"""The warehouse's partitions are replaced atomically, even when the writer is killed."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import storage, warehouse
from prism_core.schema import QUARANTINE

HOUR = datetime(2026, 11, 22, 5, tzinfo=timezone.utc)


def quarantine_rows(n: int, reason: str) -> pa.Table:
    return pa.table(
        {"source": ["f"] * n, "row": list(range(n)), "reason": [reason] * n, "raw": ["{}"] * n},
        schema=QUARANTINE,
    )


def test_partition_is_replaced_not_appended(tmp_path):
    warehouse.write_partition(tmp_path, "quarantine", HOUR, quarantine_rows(5, "old"))
    warehouse.write_partition(tmp_path, "quarantine", HOUR, quarantine_rows(3, "new"))
    table = warehouse.read_partition(tmp_path, "quarantine", HOUR)
    assert table.num_rows == 3 and set(table["reason"].to_pylist()) == {"new"}
    assert [p.name for p in Path(warehouse.partition_dir(tmp_path, "quarantine", HOUR)).iterdir()] == ["data.parquet"]


def test_views_read_partitions_with_typed_hive_columns(tmp_path):
    warehouse.write_partition(tmp_path, "quarantine", HOUR, quarantine_rows(2, "x"))
    warehouse.refresh_database(tmp_path)
    with warehouse.connect(tmp_path) as con:
        assert con.execute("SELECT date, hour, count(*) FROM quarantine GROUP BY ALL").fetchall() == [
            (HOUR.date(), 5, 2)
        ]
        assert con.execute("SELECT count(*) FROM jobs").fetchone() == (0,)  # placeholder, typed
        assert "job_id" in [row[0] for row in con.execute("DESCRIBE jobs").fetchall()]


def test_views_read_partitions_written_before_a_column_was_added(tmp_path):
    later = HOUR.replace(hour=6)
    old = Path(warehouse.partition_dir(tmp_path, "quarantine", HOUR))
    old.mkdir(parents=True)
    pq.write_table(quarantine_rows(2, "old").drop_columns(["raw"]), old / "data.parquet")
    warehouse.write_partition(tmp_path, "quarantine", later, quarantine_rows(1, "new"))
    warehouse.refresh_database(tmp_path)
    with warehouse.connect(tmp_path) as con:
        assert con.execute("SELECT hour, reason, raw FROM quarantine ORDER BY hour, row").fetchall() == [
            (5, "old", None), (5, "old", None), (6, "new", "{}")
        ]


def test_database_rebuild_does_not_wait_for_readers(tmp_path):
    warehouse.write_partition(tmp_path, "quarantine", HOUR, quarantine_rows(2, "x"))
    warehouse.refresh_database(tmp_path)
    reader = duckdb.connect(str(tmp_path / "prism.duckdb"), read_only=True)
    warehouse.write_partition(tmp_path, "quarantine", HOUR, quarantine_rows(4, "y"))
    warehouse.refresh_database(tmp_path)  # swapped in beside the open reader
    assert reader.execute("SELECT count(*) FROM quarantine").fetchone() == (4,)
    reader.close()


def test_writer_killed_mid_write_leaves_previous_partition(tmp_path):
    warehouse.write_partition(tmp_path, "quarantine", HOUR, quarantine_rows(7, "before"))
    script = textwrap.dedent(
        f"""
        import sys
        from datetime import datetime, timezone
        import pyarrow as pa
        from pipelines import warehouse
        from prism_core.schema import QUARANTINE
        n = 3_000_000
        rows = pa.table({{"source": pa.array(["x" * 40] * n), "row": pa.array(range(n)),
                          "reason": pa.array(["after"] * n), "raw": pa.array(["y" * 60] * n)}}, schema=QUARANTINE)
        print("writing", flush=True)
        while True:
            warehouse.write_partition({str(tmp_path)!r}, "quarantine",
                                      datetime(2026, 11, 22, 5, tzinfo=timezone.utc), rows.slice(0, n // 2))
            warehouse.write_partition({str(tmp_path)!r}, "quarantine",
                                      datetime(2026, 11, 22, 5, tzinfo=timezone.utc), rows)
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=os.getcwd())
    assert writer.stdout.readline().strip() == b"writing"
    directory = Path(warehouse.partition_dir(tmp_path, "quarantine", HOUR))
    deadline = time.monotonic() + 60
    while not list(directory.glob(".data.parquet.*.tmp")):  # kill while a temporary file is open
        assert time.monotonic() < deadline, "writer never started a write"
        time.sleep(0.005)
    writer.send_signal(signal.SIGKILL)
    writer.wait()

    table = warehouse.read_partition(tmp_path, "quarantine", HOUR)  # a complete file, old or new
    assert table.num_rows in (7, 1_500_000, 3_000_000)
    warehouse.refresh_database(tmp_path)
    with warehouse.connect(tmp_path) as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == table.num_rows
    # A killed writer's temporary file is hidden from readers, and removed once it is old enough
    # to be nobody's.
    leftovers = list(directory.glob(".data.parquet.*.tmp"))
    hour_ago = time.time() - storage.ABANDONED_AFTER_S - 1
    for leftover in leftovers:
        os.utime(leftover, (hour_ago, hour_ago))
    warehouse.write_partition(tmp_path, "quarantine", HOUR, quarantine_rows(2, "next"))
    assert sorted(p.name for p in directory.iterdir()) == ["data.parquet"]


def test_job_latest_has_one_row_per_job_as_of_its_latest_hour(tmp_path):
    """A job seen in two hours: one job_latest row with the second hour's status, the first
    hour's first_seen and hours_seen 2."""
    from prism_core.schema import JOBS

    def row(hour: int, status: str) -> dict:
        start = datetime(2026, 11, 22, hour, 5, tzinfo=timezone.utc)
        return {"job_id": "job-a", "first_seen": start, "last_seen": start, "n_gpus": 16, "n_hosts": 2,
                "dp": 2, "pp": 1, "tp": 8, "status": status, "restarts": 0, "hosts": ["h1", "h2"]}

    for hour, status in ((9, "running"), (10, "ended")):
        when = datetime(2026, 11, 22, hour, tzinfo=timezone.utc)
        warehouse.write_partition(tmp_path, "jobs", when, pa.Table.from_pylist([row(hour, status)], JOBS))
    warehouse.refresh_database(tmp_path)
    with warehouse.connect(tmp_path) as con:
        rows = con.execute("SELECT job_id, status, hour(first_seen), hours_seen FROM job_latest").fetchall()
    assert rows == [("job-a", "ended", 9, 2)]


def test_a_partition_encoded_on_several_threads_is_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setattr(warehouse, "ROW_GROUP_ROWS", 4)
    pieces = [quarantine_rows(3, "a"), quarantine_rows(6, "b"), quarantine_rows(2, "c")]
    files = [Path(warehouse.write_partition_pieces(tmp_path / f"by{encoders}", "quarantine", HOUR, pieces, encoders))
             for encoders in (1, 3)]
    assert files[0].read_bytes() == files[1].read_bytes()
    written = pq.ParquetFile(files[0])
    assert [written.metadata.row_group(i).num_rows for i in range(written.num_row_groups)] == [4, 4, 3]
    assert written.read().equals(pa.concat_tables(pieces))
