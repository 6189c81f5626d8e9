"""Prism on Beam runners other than the in-process one (docs/scale-out.md): Beam's Dask runner on a
local Dask cluster of 2 worker processes and the multi-processing direct runner write the tables
the default runner writes; a Dask worker killed mid-run leaves no partial partition; and the
pipelines translate to Beam's portable representation with standard primitives only, which every
runner (Flink, Spark, Dataflow) executes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from dask.distributed import Client, LocalCluster

from benchmarks.golden import RESULTS, differences, warehouse_digest
from pipelines import warehouse
from pipelines.analyze import previous_hour_state
from pipelines.ingest import HourRange, file_batches
from pipelines.run import (
    NO_COUNTERS, RunSummary, build_analysis, build_ingest, infer_range, list_flow_files, load_topology, run_hours,
)
from prism_core.analysis import recognize
from prism_core.config import DEFAULT_PARAMS
from prism_core.minutes import HOUR_NS

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
# What every runner executes: Beam's Dask runner translates no other primitive (no window_into).
PORTABLE_PRIMITIVES = {
    common_urns.primitives.IMPULSE.urn,
    common_urns.primitives.PAR_DO.urn,
    common_urns.primitives.GROUP_BY_KEY.urn,
    common_urns.primitives.FLATTEN.urn,
}


@pytest.fixture(scope="module")
def dask_cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        yield cluster


def dask_args(cluster: LocalCluster) -> list[str]:
    # Several partitions per step, or Beam's Dask runner puts every element of a step in one task.
    return [f"--runner={DASK_RUNNER}", f"--dask_client_address={cluster.scheduler_address}", "--dask_npartitions=4"]


def run_scenario(data: Path, root: Path, beam_args=()) -> dict[str, dict]:
    return run_scenario_summary(data, root, beam_args)[0]


def run_scenario_summary(data: Path, root: Path, beam_args=()) -> tuple[dict[str, dict], RunSummary]:
    first, end = infer_range(str(data / "flows"))
    summary = run_hours(str(data / "flows"), str(root), first, end, topology_path=str(data / "topology.csv"),
                        beam_args=list(beam_args))
    return warehouse_digest(root, data / "flows"), summary


@pytest.fixture(scope="module")
def demo(scenario_dir, tmp_path_factory):
    """The demo scenario (`tiny`, two hours) and its warehouse written by the default runner."""
    data, root = scenario_dir("tiny"), tmp_path_factory.mktemp("default-runner")
    return data, root, run_scenario(data, root)


def test_the_dask_runner_writes_the_default_runner_tables(demo, dask_cluster, tmp_path):
    data, _, expected = demo
    assert expected["jobs"]["rows"] > 0 and expected["steps"]["rows"] > 0
    digest, summary = run_scenario_summary(data, tmp_path / "dask", dask_args(dask_cluster))
    assert digest == expected
    assert summary.counters == {} and NO_COUNTERS in summary.warnings  # the Dask runner collects no metrics


@pytest.mark.slow  # a pool of SDK worker processes for each of the three pipelines: over a minute
def test_multi_processing_writes_the_default_runner_tables(demo, tmp_path):
    data, _, expected = demo
    args = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    assert run_scenario(data, tmp_path / "multi-processing", args) == expected


@pytest.mark.slow
def test_the_small_hour_writes_the_golden_tables_on_every_runner(scenario_dir, dask_cluster, tmp_path):
    expected = json.loads((RESULTS / "small-0.json").read_text())
    for name, args in {"multi-processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
                       "dask": dask_args(dask_cluster)}.items():
        actual = run_scenario(scenario_dir("small"), tmp_path / name, args)
        assert differences(expected, actual) == [], name


@pytest.mark.slow  # two runs on the Dask cluster
def test_a_dask_worker_killed_mid_run_leaves_no_partial_partition(demo, dask_cluster, tmp_path):
    """The run is the `prism run` command in its own process; once it has staged parsed flows, one
    of the two Dask workers is killed. Whether the run then fails or Dask recomputes the lost tasks,
    every partition in the warehouse is the default runner's, whole; a run again writes all of them."""
    data, reference, expected = demo
    root = tmp_path / "killed"
    command = [sys.executable, "-m", "prism_cli.main", "run", "--flows", str(data / "flows"), "--warehouse",
               str(root), "--topology", str(data / "topology.csv"), *dask_args(dask_cluster)]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        staged = root / "_shuffle_staging"
        while run.poll() is None and not any(staged.glob("*/*.arrow")):
            time.sleep(0.05)
        assert run.poll() is None, "the run ended before a worker could be killed"
        with Client(dask_cluster) as client:
            victim_pid = next(iter(client.run(os.getpid).values()))
        os.kill(victim_pid, signal.SIGKILL)
        run.wait(timeout=300)
    finally:
        run.kill()
    partitions = sorted(p.relative_to(root) for p in root.glob("*/date=*/hour=*/*.parquet"))
    for partition in partitions:
        assert pq.read_table(root / partition).equals(pq.read_table(reference / partition)), partition
    dask_cluster.wait_for_workers(2)
    assert run_scenario(data, root, dask_args(dask_cluster)) == expected


def test_the_pipelines_use_only_primitives_every_runner_executes(demo, tmp_path):
    """Each pipeline's leaf transforms are Impulse, ParDo, GroupByKey and Flatten, and no ParDo needs
    side inputs, state, timers or splitting."""
    data, root, _ = demo
    first, end = infer_range(str(data / "flows"))
    hour = warehouse.hours_between(first, end)[-1]
    hour_ns = int(hour.timestamp()) * 10**9
    ingest = beam.Pipeline(runner=FnApiRunner())
    build_ingest(ingest, file_batches(list_flow_files(str(data / "flows")), batches=4), str(tmp_path),
                 HourRange(hour_ns, hour_ns + HOUR_NS), str(tmp_path), workers=1)
    previous = previous_hour_state(str(root), hour)
    recognition = recognize(warehouse.read_partition(root, "flow_minutes", hour),
                            load_topology(str(data / "topology.csv")), previous, hour_ns, DEFAULT_PARAMS)
    analysis = beam.Pipeline(runner=FnApiRunner())
    flows_path = warehouse.partition_file(str(root), "flows", hour)
    build_analysis(analysis, str(root), hour, flows_path, recognition, previous, str(tmp_path), DEFAULT_PARAMS,
                   workers=1)

    for pipeline in (ingest, analysis):
        proto = pipeline.to_runner_api()
        # Beam's Create of one element ends in an empty composite that passes its input on: no step.
        leaves = [t for t in proto.components.transforms.values()
                  if not t.subtransforms and not set(t.outputs.values()) <= set(t.inputs.values())]
        assert {leaf.spec.urn for leaf in leaves} <= PORTABLE_PRIMITIVES
        assert list(proto.requirements) == []
        for leaf in leaves:
            if leaf.spec.urn == common_urns.primitives.PAR_DO.urn:
                pardo = beam_runner_api_pb2.ParDoPayload.FromString(leaf.spec.payload)
                assert not (pardo.side_inputs or pardo.state_specs or pardo.timer_family_specs
                            or pardo.restriction_coder_id), leaf.unique_name
