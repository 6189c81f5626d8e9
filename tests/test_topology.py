"""Inventories as operators keep them (prism_core.topology), and runs with and without one
(pipelines.run.load_topology, run_hours, the `prism run` command)."""

import logging

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_recognition import ring, table
from typer.testing import CliRunner

from pipelines import warehouse
from pipelines.run import RunError, infer_range, inventory_warnings, load_topology, run_hours
from prism_cli.main import app
from prism_core import recognition
from prism_core.topology import Topology, TopologyError

HEADER = "addr,host,gpu,leaf,pod\n"
GPU_HOST = "".join(f"10.0.0.{g},gpu01,{g},leaf{g},pod0\n" for g in range(8))
# The simulator's background endpoints, as its writer documents them: storage and management.
STORAGE_ROWS = "".join(f"10.200.0.{i},storage{i:02d},,leaf-s,storage\n" for i in range(1, 9))
CPU_ROWS = "".join(f"10.250.0.{i},cpu01,,leaf-m,mgmt\n" for i in (1, 2))
ANALYSIS_TABLES = ("jobs", "job_gpus", "comm_pairs", "steps", "issues")


def inventory(text: str) -> Topology:
    return Topology.from_csv_bytes(text.encode())


def test_storage_rows_are_listed_endpoints_without_a_gpu():
    topology = inventory(HEADER + GPU_HOST + STORAGE_ROWS)
    addrs = ["10.0.0.3", "10.200.0.1", "10.9.9.9"]
    assert topology.is_gpu_nic(addrs).tolist() == [True, False, False]
    assert topology.unlisted(addrs).to_pylist() == ["10.9.9.9"]  # storage is listed, not unknown
    assert topology.table.num_rows == 8
    storage = topology.inventory.filter(pc.starts_with(topology.inventory["host"], "storage"))
    assert storage.num_rows == 8 and storage["gpu"].null_count == 8
    assert topology.topology_problems == ()


def test_cpu_hosts_and_a_gpu_hosts_frontend_nic_are_no_job_members():
    """A GPU host's NIC with an empty gpu (its frontend port) is not one of the job's GPUs."""
    text = HEADER + CPU_ROWS + "".join(
        f"10.0.{h}.{r},host{h:02d},{r},leaf{r},pod0\n" for h in range(2) for r in range(4)
    ) + "10.100.0.1,host00,,frontend,pod0\n"
    topology = inventory(text)
    assert topology.is_gpu_nic(["10.250.0.1", "10.100.0.1", "10.0.1.3"]).tolist() == [False, False, True]
    (found,) = recognition.recognize_minute(table(ring([0, 1], [0], 4 << 20, rails=range(4))), topology)
    assert found.tolist() == sorted(f"10.0.{h}.{r}" for h in range(2) for r in range(4))


@pytest.mark.parametrize("shared_nics", [
    HEADER + "".join(f"10.0.{h}.{r},host{h:02d},{2 * r};{2 * r + 1},leaf{r},pod0\n" for h in range(3) for r in range(4)),
    HEADER.replace("\n", ",gpus_per_nic\n")
    + "".join(f"10.0.{h}.{r},host{h:02d},{2 * r},leaf{r},pod0,2\n" for h in range(3) for r in range(4)),
    HEADER + "".join(f"10.0.{h}.{r},host{h:02d},{2 * r + g},leaf{r},pod0\n" for h in range(3) for r in range(4) for g in (0, 1)),
], ids=["gpu list", "gpus_per_nic", "a row per gpu"])
def test_a_nic_serving_two_gpus(shared_nics):
    """Hosts with 4 NICs for 8 GPUs, in each of the three spellings."""
    topology = inventory(shared_nics)
    assert topology.topology_problems == ()
    nic = topology.inventory.filter(pc.equal(topology.inventory["addr"], "10.0.1.2"))
    assert nic["gpu"].to_pylist() == [4, 5] and nic["host"].to_pylist() == ["host01"] * 2
    assert topology.inventory.num_rows == 3 * 8
    # recognition sees each NIC once, with the first GPU it serves
    assert topology.table.num_rows == 12
    assert topology.lookup(["10.0.1.2"])["gpu"].to_pylist() == [4]
    (found,) = recognition.recognize_minute(table(ring([0, 1, 2], [0], 4 << 20, rails=range(4))), topology)
    assert len(found) == 12


def test_unusable_rows_are_skipped_with_their_line():
    text = (
        HEADER
        + "10.0.0.1,gpu01,0,leaf0,pod0\n"
        + "10.0.0.x,gpu01,1,leaf1,pod0\n"  # line 3: not an address
        + "\n"
        + "10.0.0.1,gpu02,0,leaf0,pod0\n"  # line 5: the address is gpu01's
        + "10.0.0.3,gpu01,first,leaf3,pod0\n"  # line 6: not a GPU index
        + "10.0.0.4,gpu01\n"  # line 7: too few fields
        + "10.0.0.5,,5,leaf5,pod0\n"  # line 8: no host
        + "10.0.0.1,gpu01,0,leaf0,pod0\n"  # the same row again: harmless
        + "10.0.0.6,gpu01,6,leaf6,pod0\n"
    )
    topology = inventory(text)
    assert topology.topology_problems == (
        "line 3: '10.0.0.x' is not an IP address",
        "line 5: 10.0.0.1 is on host 'gpu01' at line 2",
        "line 6: gpu 'first' is not a GPU index (or indexes separated by ';')",
        "line 7: 2 fields where the header has 5",
        "line 8: no host",
    )
    assert topology.table.to_pylist() == [
        {"addr": "10.0.0.1", "host": "gpu01", "gpu": 0, "leaf": "leaf0", "pod": "pod0"},
        {"addr": "10.0.0.6", "host": "gpu01", "gpu": 6, "leaf": "leaf6", "pod": "pod0"},
    ]


def test_an_inventory_without_a_usable_row_is_refused():
    with pytest.raises(TopologyError, match="lists no NIC that can be used .line 2: no host"):
        inventory(HEADER + "10.0.0.1,,0,leaf0,pod0\n")


def test_load_topology_logs_the_rows_it_skipped(tmp_path, caplog):
    path = tmp_path / "topology.csv"
    path.write_text(HEADER + GPU_HOST + "".join(f"10.0.1.{i},gpu02,{i},leaf,pod0,extra\n" for i in range(7)))
    with caplog.at_level(logging.WARNING, logger="pipelines.run"):
        topology = load_topology(str(path))
    assert len(topology.topology_problems) == 7
    (message,) = [record.getMessage() for record in caplog.records if record.name == "pipelines.run"]
    assert message.startswith(f"{path}: 7 inventory rows skipped (line 10: 6 fields where the header has 5;")
    assert message.endswith("line 14: 6 fields where the header has 5; and 2 more)")


# --- runs -----------------------------------------------------------------------------------------


def test_no_inventory_is_refused_unless_asked_for(scenario_dir, tmp_path):
    tiny = scenario_dir("tiny")
    first, end = infer_range(str(tiny / "flows"))
    with pytest.raises(RunError, match="--topology FILE") as refused:
        run_hours(str(tiny / "flows"), str(tmp_path / "wh"), first, end)
    assert "\n" not in str(refused.value) and "--no-topology" in str(refused.value)
    assert not (tmp_path / "wh").exists()
    with pytest.raises(RunError, match="exclude each other"):
        load_topology(str(tiny / "topology.csv"), no_topology=True)
    assert not load_topology(None, no_topology=True).from_inventory


def test_prism_run_without_topology_is_one_line_on_stderr(scenario_dir, tmp_path):
    result = CliRunner().invoke(app, ["run", "--flows", str(scenario_dir("tiny") / "flows"),
                                      "--warehouse", str(tmp_path / "wh"),
                                      "--start", "2026-11-22T09:00", "--end", "2026-11-22T10:00"])
    assert result.exit_code == 2
    (line,) = [text for text in result.output.splitlines() if "error" in text]
    assert "no NIC inventory: pass --topology FILE" in line
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def plain_run(scenario_dir, tmp_path_factory):
    """The tiny scenario with the simulator's inventory (GPU NICs only)."""
    tiny = scenario_dir("tiny")
    root = tmp_path_factory.mktemp("plain") / "wh"
    first, end = infer_range(str(tiny / "flows"))
    summary = run_hours(str(tiny / "flows"), str(root), first, end, topology_path=str(tiny / "topology.csv"))
    return root, summary


def analysis_tables(root, hours) -> dict:
    return {(name, hour): warehouse.read_partition(root, name, hour) for name in ANALYSIS_TABLES for hour in hours}


def test_storage_and_cpu_rows_leave_the_jobs_as_they_were(scenario_dir, tmp_path, plain_run):
    """An inventory that also lists storage servers, CPU hosts, a frontend NIC on a GPU host and
    a broken row gives the same analysis as the GPU-only one, and no unknown addresses."""
    tiny = scenario_dir("tiny")
    plain_root, plain = plain_run
    # the plain inventory lacks exactly the simulator's storage and management servers
    (unknown,) = plain.warnings
    assert unknown.startswith("10 addresses in the flows are not in the inventory")
    extended = tmp_path / "topology.csv"
    text = (tiny / "topology.csv").read_text() + STORAGE_ROWS + CPU_ROWS + "10.100.0.1,gpu0000,,frontend,pod00\n"
    extended.write_text(text + "10.100.0.2,gpu0001,0;x,leaf,pod00\n")
    root = tmp_path / "wh"
    first, end = infer_range(str(tiny / "flows"))
    summary = run_hours(str(tiny / "flows"), str(root), first, end, topology_path=str(extended))
    bad_line = text.count("\n") + 1
    assert summary.warnings == [
        f"1 inventory row skipped (line {bad_line}: gpu '0;x' is not a GPU index (or indexes separated by ';'))"
    ]
    hours = warehouse.hours_between(first, end)
    assert analysis_tables(root, hours) == analysis_tables(plain_root, hours)
    assert pq.read_table(warehouse.topology_path(root))["gpu"].null_count == 8 + 2 + 1


def test_a_host_missing_from_the_inventory_is_named_and_left_out(scenario_dir, tmp_path, plain_run):
    tiny = scenario_dir("tiny")
    lines = (tiny / "topology.csv").read_text().splitlines(keepends=True)
    partial = tmp_path / "topology.csv"
    partial.write_text("".join(line for line in lines if ",gpu0001," not in line))
    missing = sorted(line.split(",")[0] for line in lines if ",gpu0001," in line)
    result = CliRunner().invoke(app, ["run", "--flows", str(tiny / "flows"), "--warehouse", str(tmp_path / "wh"),
                                      "--topology", str(partial)])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "warning: 18 addresses in the flows are not in the inventory" in output
    assert missing[0] in output  # the missing host's NICs come first in address order
    members = [warehouse.read_partition(tmp_path / "wh", "job_gpus", hour) for hour in plain_run[1].hours]
    assert not set(missing) & {addr for part in members for addr in part["addr"].to_pylist()}
    assert any(part.num_rows for part in members)  # the other hosts' jobs are still found


def test_the_summary_says_when_there_was_no_inventory(plain_run):
    root, summary = plain_run
    (warning,) = inventory_warnings(Topology.empty(), str(root), summary.hours)
    assert warning.startswith("no NIC inventory (--no-topology): every address was taken for its own GPU")
