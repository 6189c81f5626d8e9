"""Operator mistakes get one clear message and a non-zero exit, not a traceback."""

import os
import shutil

import pytest
from typer.testing import CliRunner

from prism_cli.main import app

runner = CliRunner()


def run(*args):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result


def test_missing_flow_directory(tmp_path):
    result = run("run", "--flows", str(tmp_path / "nope"), "--warehouse", str(tmp_path / "wh"), "--no-topology",
                 "--start", "2026-11-22T05:00", "--end", "2026-11-22T06:00")
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_unreadable_topology(scenario_dir, tmp_path):
    bad = tmp_path / "topology.csv"
    bad.write_text("addr,host\n10.0.0.1,h1\n")
    result = run("run", "--flows", str(scenario_dir("tiny") / "flows"), "--warehouse", str(tmp_path / "wh"),
                 "--topology", str(bad), "--start", "2026-11-22T05:00", "--end", "2026-11-22T06:00")
    assert result.exit_code == 2
    assert "gpu" in result.output  # names the missing column


def test_empty_hour(scenario_dir, tmp_path):
    result = run("run", "--flows", str(scenario_dir("tiny") / "flows"), "--warehouse", str(tmp_path / "wh"),
                 "--no-topology", "--start", "2020-01-01T00:00", "--end", "2020-01-01T01:00")
    assert result.exit_code == 2
    assert "no valid flow records" in result.output
    assert not (tmp_path / "wh" / "flows").exists()  # refused before anything was written


def test_files_modified_before_the_range_are_named_when_nothing_else_is_left(scenario_dir, tmp_path):
    flows = tmp_path / "flows"
    shutil.copytree(scenario_dir("tiny") / "flows", flows)
    files = [path for path in flows.rglob("*") if path.is_file()]
    for path in files:  # copied with times from before the simulated hour (an archive, a reset clock)
        os.utime(path, (1_000_000_000, 1_000_000_000))
    result = run("run", "--flows", str(flows), "--warehouse", str(tmp_path / "wh"), "--no-topology",
                 "--start", "2026-11-22T05:00", "--end", "2026-11-22T06:00")
    assert result.exit_code == 2
    assert f"{len(files)} of them last modified over an hour before the range and not read" in result.output


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01T00:00"])
def test_bad_time(tmp_path, text):
    result = run("run", "--flows", str(tmp_path), "--start", text, "--end", "2026-11-22T06:00")
    assert result.exit_code == 2
    assert "not a date and time" in result.output


def test_inventory_addresses_match_flows_spelling():
    from prism_core.topology import Topology, TopologyError

    inventory = Topology.from_csv_bytes(b"addr,host,gpu\n::ffff:10.0.0.1,h1,0\nFE80::0001,h1,1\n")
    assert inventory.table["addr"].to_pylist() == ["10.0.0.1", "fe80::1"]
    with pytest.raises(TopologyError, match="not an IP address"):
        Topology.from_csv_bytes(b"addr,host,gpu\nnope,h1,0\n")
    with pytest.raises(TopologyError, match="lists no NIC"):
        Topology.from_csv_bytes(b"addr,host,gpu\n")
