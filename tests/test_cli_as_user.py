"""The `prism` command as a user calls it: a mistake is one line on stderr, exit code 2, and
nothing half-made left behind; a flag does what its help says."""

import subprocess
import sys

import pytest


def prism(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_cli.main", *args], capture_output=True, text=True, cwd=cwd)


def refused(result: subprocess.CompletedProcess, says: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr


def test_simulate_with_an_unknown_format_leaves_nothing(tmp_path):
    refused(prism("simulate", "--out", "sim", "--format", "csv", cwd=tmp_path), "unknown format 'csv'")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("warehouse", ["a-file", "a-file/below"])
def test_run_into_a_warehouse_that_is_a_file(tmp_path, warehouse):
    (tmp_path / "a-file").write_text("")
    refused(prism("run", "--flows", "flows", "--warehouse", warehouse, cwd=tmp_path), "is a file, not a directory")


@pytest.mark.parametrize("command", [["report"], ["run", "--flows", "flows"]])
def test_a_range_that_ends_before_it_starts(tmp_path, command):
    start, end = ("--from", "--to") if command == ["report"] else ("--start", "--end")
    result = prism(*command, start, "2026-11-22T10:00", end, "2026-11-22T09:00", cwd=tmp_path)
    refused(result, "the range is empty")


def test_json_is_a_flag_without_a_value(tmp_path):
    json_help = [line for line in prism("evaluate", "--help", cwd=tmp_path).stdout.splitlines() if "--json" in line]
    assert len(json_help) == 1 and "<bool>" not in json_help[0]
    refused(prism("evaluate", "--truth", "missing", "--warehouse", "missing", "--json", cwd=tmp_path), "")
