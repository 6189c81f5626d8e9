"""Local worker processes (pipelines/local_workers.py): the same warehouse whatever their number,
and `--local_workers` resolved from the runner."""

import multiprocessing
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from benchmarks.golden import warehouse_digest
from pipelines.local_workers import available_cores, discard_ahead, local_workers, run_tasks, start_ahead
from pipelines.run import RunError, infer_range, pipeline_options, run_hours


def test_two_workers_write_what_one_writes(scenario_dir, tmp_path):
    tiny = scenario_dir("tiny")
    first, end = infer_range(str(tiny / "flows"))
    digests = {}
    for workers in ("1", "2"):
        root = tmp_path / f"workers-{workers}"
        run_hours(str(tiny / "flows"), str(root), first, end, topology_path=str(tiny / "topology.csv"),
                  beam_args=[f"--local_workers={workers}"])
        digests[workers] = warehouse_digest(root, tiny / "flows")
    assert digests["2"] == digests["1"]


def test_auto_is_every_core_in_process_and_one_elsewhere():
    assert local_workers(PipelineOptions([])) == available_cores()
    assert local_workers(PipelineOptions(["--local_workers=3"])) == 3
    assert local_workers(PipelineOptions(["--runner=FlinkRunner"])) == 1
    assert local_workers(PipelineOptions(["--direct_running_mode=multi_processing"])) == 1
    with pytest.raises(RunError, match="local_workers"):
        pipeline_options(["--local_workers=0"])


def test_results_come_in_task_order_whatever_runs_first():
    tasks = [(pow, (2, n)) for n in range(6)]
    assert list(run_tasks(2, tasks, costs=[0, 5, 1, 4, 2, 3])) == [2**n for n in range(6)]
    assert list(run_tasks(1, tasks)) == [2**n for n in range(6)]


def test_tasks_whose_costs_exceed_the_limit_together_run_one_after_the_other(tmp_path):
    """Each task notes when it ran; the two costly ones never overlap, the cheap one runs beside them."""
    marks = tmp_path / "marks"
    tasks = [(_note_span, (str(marks), name)) for name in ("big", "cheap", "large")]
    assert list(run_tasks(2, tasks, costs=[10, 1, 9], cost_limit=12)) == ["big", "cheap", "large"]
    spans = {line.split()[0]: tuple(map(float, line.split()[1:])) for line in marks.read_text().splitlines()}
    (big_start, big_end), (large_start, large_end) = spans["big"], spans["large"]
    assert big_end <= large_start or large_end <= big_start


def test_a_negligible_task_runs_beside_a_task_alone_over_the_limit(tmp_path):
    marks = tmp_path / "marks"
    tasks = [(_note_span, (str(marks), name)) for name in ("big", "cheap", "large")]
    assert list(run_tasks(2, tasks, costs=[10, 1, 9], cost_limit=8, negligible_cost=1)) == ["big", "cheap", "large"]
    spans = {line.split()[0]: tuple(map(float, line.split()[1:])) for line in marks.read_text().splitlines()}
    (big_start, big_end), (cheap_start, cheap_end), (large_start, large_end) = (spans[name] for name in
                                                                                ("big", "cheap", "large"))
    assert cheap_start < big_end and big_start < cheap_end
    assert big_end <= large_start or large_end <= big_start


def test_a_task_started_ahead_is_not_run_again(tmp_path):
    marks = tmp_path / "marks"
    tasks = [(_note_span, (str(marks), name)) for name in ("ahead", "not ahead")]
    start_ahead(2, tasks[:1])
    try:
        assert list(run_tasks(2, tasks)) == ["ahead", "not ahead"]
    finally:
        discard_ahead()
    assert [line.split()[0] for line in marks.read_text().splitlines()].count("ahead") == 1


def test_a_task_started_ahead_and_never_asked_for_is_cancelled_or_waited_for_and_forgotten(tmp_path):
    marks = tmp_path / "marks"
    start_ahead(2, [(_note_span, (str(marks), "forgotten"))])
    discard_ahead()
    ran_ahead = len(marks.read_text().splitlines()) if marks.exists() else 0  # not left running
    assert list(run_tasks(2, [(_note_span, (str(marks), "forgotten"))] * 2)) == ["forgotten"] * 2
    assert len(marks.read_text().splitlines()) == ran_ahead + 2  # both run: no result was kept for it


def _note_span(path: str, name: str) -> str:
    import time

    started = time.time()
    time.sleep(0.3)
    with open(path, "a") as marks:
        marks.write(f"{name} {started} {time.time()}\n")
    return name


def _use_the_pool():
    assert list(run_tasks(2, [(abs, (-1,)), (abs, (-2,))])) == [1, 2]


def test_a_process_started_by_multiprocessing_ends_after_using_the_pool():
    """Such a process joins its children before exiting and never runs atexit handlers: the
    benchmarks' per-run children waited for their idle pool workers forever."""
    child = multiprocessing.get_context("spawn").Process(target=_use_the_pool)
    child.start()
    child.join(60)
    alive = child.is_alive()
    child.kill()
    assert not alive and child.exitcode == 0


KILLED_LAUNCHER = """
import os, signal, sys
from pipelines import local_workers
local_workers.start(2)
pool = local_workers._shared_pool(2)
print(" ".join(str(pid) for pid in pool._processes), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_end_with_a_launcher_killed_outright():
    """The OOM killer or `kill -9` runs no shutdown: idle workers would wait for tasks forever,
    holding memory and the launcher's stdout."""
    launcher = subprocess.run([sys.executable, "-c", KILLED_LAUNCHER], capture_output=True, text=True, timeout=60)
    assert launcher.returncode == -signal.SIGKILL
    workers = [int(pid) for pid in launcher.stdout.split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 10
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(running, workers))


def running(pid: int) -> bool:
    """Whether the process lives (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
