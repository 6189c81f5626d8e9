"""The warehouse catalog opens in the DuckDB clients analysts have, not only the one that wrote it.

An older DuckDB (OLDEST_CLIENT) is installed from the package registry into a cache directory
once and run in a subprocess against a catalog this DuckDB wrote. Without the registry the test
skips, except in CI, where it must run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.run import infer_range, run_hours

OLDEST_CLIENT = "1.1.3"
CLIENT_DIR = Path.home() / ".cache" / "prism-tests" / f"duckdb-{OLDEST_CLIENT}"

QUERY = """
import json, sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print(json.dumps({"version": duckdb.__version__,
                  "jobs": con.execute("SELECT count(DISTINCT job_id) FROM jobs").fetchone()[0],
                  "flows": con.execute("SELECT count(*) FROM flows").fetchone()[0]}))
"""


def old_client() -> Path:
    if not (CLIENT_DIR / "duckdb").exists():
        installed = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(CLIENT_DIR),
             f"duckdb=={OLDEST_CLIENT}"],
            capture_output=True, text=True,
        )
        if installed.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot install duckdb {OLDEST_CLIENT}: {installed.stderr[-500:]}")
            pytest.skip(f"duckdb {OLDEST_CLIENT} not installable here (no package registry)")
    return CLIENT_DIR


def test_an_older_duckdb_client_opens_the_catalog(scenario_dir, tmp_path):
    import duckdb

    scenario = scenario_dir("tiny")
    root = tmp_path / "wh"
    first, end = infer_range(str(scenario / "flows"))
    run_hours(str(scenario / "flows"), str(root), first, end, topology_path=str(scenario / "topology.csv"))
    with duckdb.connect(str(root / "prism.duckdb"), read_only=True) as con:
        expected = con.execute("SELECT count(DISTINCT job_id), (SELECT count(*) FROM flows) FROM jobs").fetchone()

    env = {**os.environ, "PYTHONPATH": str(old_client())}
    result = subprocess.run([sys.executable, "-c", QUERY, str(root / "prism.duckdb")],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["version"] == OLDEST_CLIENT
    assert (seen["jobs"], seen["flows"]) == expected and expected[1] > 0
