"""Flows and warehouse in an S3 bucket, on a real S3 server: moto's, started here on 127.0.0.1 (an
HTTP server speaking the S3 API, installed from PyPI with the test extra), reached through the
standard AWS variables as a production store would be. See docs/object-storage.md."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from benchmarks.golden import RESULTS, differences, warehouse_digest
from pipelines import local_workers, storage, warehouse
from pipelines.run import infer_range, run_hours
from prism_core.schema import QUARANTINE

BUCKET = "prism-test"
HOUR = datetime(2026, 11, 22, 5, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def s3():
    """An empty bucket on a new S3 server, and the AWS variables that reach it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    environment = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "prism-test",
        "AWS_SECRET_ACCESS_KEY": "prism-test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        # Local workers are forked once, with the environment of their first use: an earlier
        # test's would not know the server.
        local_workers.shutdown()
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client
        local_workers.shutdown()
    server.stop()


def upload(local: Path, key: str) -> str:
    """Copies the directory `local` to the bucket under `key`; returns its URI."""
    filesystem, path = storage.resolve(f"s3://{BUCKET}/{key}")
    pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)
    return f"s3://{BUCKET}/{key}"


def downloaded_digest(root: str, flows: str, local: Path) -> dict:
    """benchmarks.golden's digest of the warehouse at `root`, copied to `local`. A quarantined row
    names its flow file, so its `source` is a URI under `flows`: it is written as under a local
    directory, because the digest compares rows as DuckDB prints them, and DuckDB quotes a
    string with a colon inside a row."""
    filesystem, path = storage.resolve(root)
    pafs.copy_files(path, str(local), source_filesystem=filesystem, destination_filesystem=pafs.LocalFileSystem())
    for partition in warehouse.partition_files(local, "quarantine"):
        rows = pq.read_table(partition)
        sources = pc.replace_substring(rows["source"], flows, str(STAND_IN_FLOWS))
        pq.write_table(rows.set_column(rows.schema.get_field_index("source"), "source", sources), partition)
    return warehouse_digest(local, STAND_IN_FLOWS)


STAND_IN_FLOWS = Path("/flows")


def run_in_bucket(scenario: Path, name: str) -> tuple[str, str]:
    """The whole pipeline with flows, inventory and warehouse in the bucket; (flows, warehouse)."""
    flows = upload(scenario / "flows", f"{name}/flows")
    inventory = upload(scenario / "topology.csv", f"{name}/topology.csv")
    root = f"s3://{BUCKET}/{name}/wh"
    first, end = infer_range(flows)
    run_hours(flows, root, first, end, topology_path=inventory)
    return flows, root


def test_demo_hour_in_a_bucket_gives_the_tables_of_a_local_run(s3, scenario_dir, tmp_path):
    tiny = scenario_dir("tiny")
    first, end = infer_range(str(tiny / "flows"))
    run_hours(str(tiny / "flows"), str(tmp_path / "local"), first, end, topology_path=str(tiny / "topology.csv"))
    flows, root = run_in_bucket(tiny, "tiny")

    # Every table and state file, row for row (flow file paths written as <flows>).
    local = warehouse_digest(tmp_path / "local", tiny / "flows")
    assert differences(local, downloaded_digest(root, flows, tmp_path / "copy")) == []
    assert local["flows"]["rows"] > 0 and local["jobs"]["rows"] > 0
    # Nothing but the warehouse is left in the bucket: shuffle staging stayed on this machine.
    listed = client_keys(s3, "tiny/wh/")
    assert listed and not [key for key in listed if "_shuffle_staging" in key or ".tmp" in key]

    # Prism's own readers and DuckDB's views read the bucket.
    in_bucket, on_disk = warehouse.load_tables(root), warehouse.load_tables(tmp_path / "local")
    assert {name: t.num_rows for name, t in in_bucket.items()} == {name: t.num_rows for name, t in on_disk.items()}
    query = "SELECT job_id, n_gpus, dp, pp, tp, status FROM job_latest ORDER BY job_id"
    with warehouse.connect(root) as remote, warehouse.connect(tmp_path / "local") as disk:
        assert remote.execute(query).fetchall() == disk.execute(query).fetchall() != []
        assert remote.execute("SELECT count(*), sum(bytes) FROM flows").fetchall() == (
            disk.execute("SELECT count(*), sum(bytes) FROM flows").fetchall())


def test_small_hour_in_a_bucket_gives_the_recorded_tables(s3, scenario_dir, tmp_path):
    """The golden digest of `small` is that of a local run (tests/test_golden.py)."""
    flows, root = run_in_bucket(scenario_dir("small"), "small")
    expected = json.loads((RESULTS / "small-0.json").read_text())
    assert differences(expected, downloaded_digest(root, flows, tmp_path / "copy")) == []


def client_keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def test_writer_killed_mid_upload_leaves_the_previous_partition(s3):
    root = f"s3://{BUCKET}/killed/wh"
    before = pa.Table.from_pylist([{"source": "f", "row": i, "reason": "before", "raw": "{}"} for i in range(7)],
                                  QUARANTINE)
    warehouse.write_partition(root, "quarantine", HOUR, before)
    # Random text does not compress: the partition is several upload parts of 10 MB.
    script = textwrap.dedent(
        f"""
        import os
        from datetime import datetime, timezone
        import pyarrow as pa
        from pipelines import warehouse
        from prism_core.schema import QUARANTINE
        n = 600_000
        rows = pa.table({{"source": pa.array(["f"] * n), "row": pa.array(range(n)),
                          "reason": pa.array(["after"] * n), "raw": pa.array([os.urandom(40).hex() for _ in range(n)])}},
                        schema=QUARANTINE)
        print("writing", flush=True)
        while True:
            warehouse.write_partition({root!r}, "quarantine", datetime(2026, 11, 22, 5, tzinfo=timezone.utc), rows)
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=os.getcwd())
    assert writer.stdout.readline().strip() == b"writing"
    deadline = time.monotonic() + 60
    while not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads"):  # kill while an upload is open
        assert time.monotonic() < deadline, "writer never started an upload"
        time.sleep(0.005)
    writer.send_signal(signal.SIGKILL)
    writer.wait()

    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")  # the parts sent, seen by no reader
    table = warehouse.read_partition(root, "quarantine", HOUR)  # a complete object, old or new
    assert table.num_rows in (7, 600_000)
    assert client_keys(s3, "killed/wh/quarantine/") == ["killed/wh/quarantine/date=2026-11-22/hour=05/data.parquet"]
    warehouse.refresh_database(root)
    with warehouse.connect(root) as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == table.num_rows


def test_a_bucket_is_listed_as_a_local_directory_is(s3, tmp_path):
    names = ["t/date=1/hour=2/data.parquet", "t/date=1/hour=2/deeper/data.parquet", "t/data.parquet", "t/date=1/x.json"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    bucket = upload(tmp_path / "t", "listed/t")

    def relative(found: list[str], base) -> list[str]:
        return [path[len(str(base)) + 1:] for path in found]

    for pattern in ("*/*/data.parquet", "*/x.json", "data.parquet"):
        local = relative(storage.files_matching(tmp_path / "t", pattern), tmp_path / "t")
        assert relative(storage.files_matching(bucket, pattern), bucket) == local != []
    assert relative(storage.files_below(bucket), bucket) == relative(storage.files_below(tmp_path / "t"), tmp_path / "t")
    assert storage.files_below(f"s3://{BUCKET}/nothing-here") == []
    assert storage.read_bytes(f"{bucket}/date=1/x.json") == b"t/date=1/x.json"
