"""`dg dev` on the project serves the UI headless, with an asset for every warehouse table, and
without the warnings issue #20 removed."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from prism_core.schema import TABLES

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 120

QUERY = """
{
  assetNodes { assetKey { path } groupName isPartitioned }
  repositoriesOrError {
    ... on RepositoryConnection { nodes { jobs { name } schedules { name } sensors { name } } }
  }
}
"""


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["data"]


def group_is_gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


def stop(process: subprocess.Popen) -> bool:
    """SIGINT to the whole process group (webserver, daemon, code server), as Ctrl-C would; True
    when all of them exited on it, otherwise they are killed."""
    group = os.getpgid(process.pid)
    os.killpg(group, signal.SIGINT)
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        process.poll()  # reap the leader, or its zombie keeps the group alive
        if group_is_gone(group):
            return True
        time.sleep(0.2)
    os.killpg(group, signal.SIGKILL)
    process.wait()
    return False


def test_dg_dev_serves_every_table_asset(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "orchestration" / "dagster.yaml", home / "dagster.yaml")
    port = free_loopback_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PRISM_WAREHOUSE": str(tmp_path / "warehouse")}
    log_path = tmp_path / "dg-dev.log"
    log = open(log_path, "w")
    started = time.monotonic()
    process = subprocess.Popen(
        ["dg", "dev", "--host", "127.0.0.1", "--port", str(port)],  # code location from pyproject.toml
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so all of its servers can be stopped
        # A shell running us in the background ignores SIGINT; dg dev would inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        data = None
        while data is None:
            assert process.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() - started < STARTUP_TIMEOUT_S, "dg dev did not answer in time"
            try:
                data = graphql(port, QUERY)
            except (urllib.error.URLError, ConnectionError, KeyError, TimeoutError):
                time.sleep(0.5)
        print(f"dg dev answered with the asset graph after {time.monotonic() - started:.1f} s")
    finally:
        stopping = time.monotonic()
        stopped_cleanly = stop(process)
        print(f"and stopped {'cleanly' if stopped_cleanly else 'only when killed'} in {time.monotonic() - stopping:.1f} s")
        log.close()

    assert stopped_cleanly
    output = log_path.read_text()
    assert "apitools not found" not in output and "SupersessionWarning" not in output, output[-3000:]

    assets = {"/".join(node["assetKey"]["path"]): node for node in data["assetNodes"]}
    assert set(assets) == set(TABLES)
    assert all(node["isPartitioned"] for node in assets.values())
    assert {assets[name]["groupName"] for name in ("flows", "quarantine", "flow_minutes")} == {"ingest"}
    (repository,) = data["repositoriesOrError"]["nodes"]
    assert {"prism_hourly", "prism_checks", "prism_freshness"} <= {job["name"] for job in repository["jobs"]}
    assert {s["name"] for s in repository["schedules"]} == {"prism_hourly_schedule", "prism_freshness_schedule"}
    assert {s["name"] for s in repository["sensors"]} == {"prism_late_files"}
