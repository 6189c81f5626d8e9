"""Every core for the in-process runner: worker processes that the heavy DoFns hand their elements to.

Beam's in-process FnApiRunner (the default runner) calls every DoFn on one core. Its own
multi-processing mode (`--direct_running_mode=multi_processing`) starts SDK workers for every
pipeline, loads the side inputs in each and sends elements through gRPC: no faster than one core
on 2 cores (docs/performance.md). Here the DoFns whose elements are independent (parse a batch of
files, merge a minute, split a row group, analyze a job, write a partition) defer each element to
a task, and when the bundle finishes the tasks run in a pool of worker processes and the results
go out in input order: the tables are the same whatever the number of workers. Flow rows never
cross the pool: tasks get paths and staged-table references and return references
(pipelines/shuffle_staging.py), so what is pickled is small. Where the launcher knows a stage's
tasks before the runner gets there (the ingest's parses, and its merges once every batch is
parsed), it starts them ahead (`start_ahead`), so the workers do not wait for the runner's own
work between stages, and the stage takes their results.

`--local_workers` (a pipeline option, `LocalWorkerOptions`): `auto` (the default) is every core
this process may use with the in-process runner, and 1 (no pool) with any other runner, whose own
workers spread the elements; `1` runs the tasks in the launching process, one after another, as
they come (the least memory).

The pool is started once per process, before the first pipeline runs (`start`, from
pipelines/run.py: the launcher has no runner threads yet, whose locks a fork could copy held), and
reused by every pipeline of the run. Its workers are forks of the launcher: they start in
milliseconds with every module imported (a fork server or spawned workers would import the
pipeline modules again, and the launcher's main module too: the `prism` command, Dagster, pytest).
"""

from __future__ import annotations

import atexit
import ctypes
import math
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.utils.windowed_value import WindowedValue

AUTO = "auto"


class LocalWorkerOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--local_workers", default=AUTO,
            help="worker processes for the in-process runner's parsing, minute merges, job analyses and "
                 "partition writes: 'auto' (every available core with the in-process runner, 1 with any "
                 "other) or a number; 1 runs them in the launching process",
        )


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0))


def local_workers(options: PipelineOptions) -> int:
    """The number of worker processes `options` ask for (`--local_workers`)."""
    chosen = options.view_as(LocalWorkerOptions).local_workers
    if chosen != AUTO:
        workers = int(chosen)
        if workers < 1:
            raise ValueError(f"--local_workers must be 'auto' or at least 1, not {chosen!r}")
        return workers
    return available_cores() if in_process(options) else 1


def in_process(options: PipelineOptions) -> bool:
    """Whether `options` choose the in-process runner, which calls every DoFn in this process."""
    return (options.view_as(StandardOptions).runner is None
            and options.view_as(DirectOptions).direct_running_mode in (None, "in_memory"))


_pool: tuple[int, ProcessPoolExecutor] | None = None


def start(workers: int) -> None:
    """Starts the pool of `workers` processes now, unless it runs already (one worker: none)."""
    if workers > 1:
        _shared_pool(workers)


def _shared_pool(workers: int) -> ProcessPoolExecutor:
    global _pool
    if _pool is None or _pool[0] != workers:
        shutdown()
        # a worker's death signal follows the thread that forked it: the main thread lives as long as the launcher
        in_main_thread = threading.current_thread() is threading.main_thread()
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                   initializer=_start_worker, initargs=(in_main_thread,))
        pool.submit(int).result()  # a fork context starts every worker with the first task
        _pool = (workers, pool)
        # A process started by multiprocessing (a benchmark's child) ends without running atexit
        # handlers, after joining its children: the pool's idle workers would be waited for forever.
        multiprocessing.util.Finalize(pool, shutdown, exitpriority=10)
    return _pool[1]


def _start_worker(end_with_launcher: bool) -> None:
    """In a new worker: its malloc tuned for tasks, its resident size at start noted (what
    `_run_and_release` compares with), and its end tied to the launcher's where the thread that
    forked it lives as long."""
    global _resident_at_start
    _keep_freed_memory_within_tasks()
    _resident_at_start = _resident_bytes() or 0
    if end_with_launcher:
        _end_with_launcher()


def _end_with_launcher() -> None:
    """In a worker: be killed when the launcher dies. A launcher killed outright (the OOM killer,
    `kill -9`) runs no shutdown, and its idle workers would wait for tasks forever, holding their
    memory and the launcher's stdout (a `prism run | tail` would never end). Linux only."""
    if not hasattr(_C_LIBRARY, "prctl"):  # not Linux: the pool's shutdown at exit still ends them
        return
    _C_LIBRARY.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher died before the request took effect
        os._exit(1)


@atexit.register
def shutdown() -> None:
    """Stops the worker processes (they are started again when needed)."""
    global _pool
    if _pool is not None:
        _pool[1].shutdown()
        _pool = None


Task = tuple[Callable, tuple]  # a module-level function (pickled by name) and its arguments


def run_tasks(workers: int, tasks: Sequence[Task], costs: Sequence[float] | None = None,
              cost_limit: float = math.inf, negligible_cost: float = 0.0) -> Iterator:
    """The result of each task, in task order. With one worker each task runs here when its result
    is asked for. With more, tasks start costliest first (`costs`: so that the largest jobs do not
    start last and leave one core idle at the end), each as soon as a worker is free (`QUEUED_AHEAD`)
    and the costs of the tasks running or queued stay within `cost_limit` with it (a task alone runs
    whatever its cost), so that two tasks whose memory grows with their cost do not run at once when
    together they would not fit. Tasks costing at most `negligible_cost` count nothing: they run
    beside any other, so that a task alone over the limit does not leave the other workers idle.
    A task started ahead (`start_ahead`) is not started again: its result is taken from there."""
    started = _take_started_ahead(tasks)
    if (workers <= 1 or len(tasks) <= 1) and not started:
        yield from (task(*args) for task, args in tasks)
        return
    pool = _shared_pool(workers)
    costs = costs if costs is not None else [0.0] * len(tasks)
    counted = [cost if cost > negligible_cost else 0.0 for cost in costs]
    waiting = sorted((i for i in range(len(tasks)) if i not in started), key=lambda i: -costs[i])
    running: dict[Future, int] = {future: i for i, future in started.items()}  # started or queued for a worker
    done: dict[int, object] = {}

    def start_waiting() -> None:
        for i in list(waiting):
            if len(running) == workers + QUEUED_AHEAD:
                break
            if not running or not counted[i] or sum(counted[r] for r in running.values()) + counted[i] <= cost_limit:
                waiting.remove(i)
                running[pool.submit(_run_and_release, *tasks[i])] = i

    start_waiting()
    for next_result in range(len(tasks)):
        while next_result not in done:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                done[running.pop(future)] = future.result()
            start_waiting()  # before a result goes out: the launcher's work on its outputs must not idle a worker
        yield done.pop(next_result)


# Tasks queued beyond the workers, in the pool's call queue (it holds one more than the workers): a
# worker that finishes takes the next at once, not after a round trip through the launcher.
QUEUED_AHEAD = 1


# by `start_ahead`, not yet taken by `run_tasks`: (args, future) by `_ahead_key`
_started_ahead: dict[tuple, list[tuple[tuple, Future]]] = {}


def start_ahead(workers: int, tasks: Sequence[Task]) -> None:
    """Starts `tasks` on the local workers now, before the pipeline stage that defers the same
    tasks (PooledDoFn: the same function, equal arguments) runs: `run_tasks` then takes each one's
    result from here instead of starting it again, so the workers need not wait for what the
    launcher alone does before (the ingest: ~0.5 s of building and starting its pipeline on the
    fleet hour, while Beam imports IPython and translates it). Whoever starts tasks ahead calls
    `discard_ahead` once that pipeline has run. With one worker, nothing is started."""
    if workers > 1:
        pool = _shared_pool(workers)
        for task in tasks:
            _started_ahead.setdefault(_ahead_key(task), []).append((task[1], pool.submit(_run_and_release, *task)))


def discard_ahead() -> None:
    """Forgets the tasks started ahead that no pipeline took (one that failed before): those not
    started yet are cancelled, the others waited for, so that none still writes into a staging area
    about to be removed. Their errors are not raised: no one asked for their results."""
    futures = [future for started in _started_ahead.values() for _, future in started]
    _started_ahead.clear()
    for future in futures:
        future.cancel()
    wait(futures)


def _take_started_ahead(tasks: Sequence[Task]) -> dict[int, Future]:
    """The futures of those of `tasks` that were started ahead, by task index, no longer held there.
    Each is looked for among those of its key only: a long ingest starts thousands (a minute's
    merge each), and a search of all for each would grow with their square."""
    found = {}
    for i, task in enumerate(tasks):
        key = _ahead_key(task)
        started = _started_ahead.get(key, [])
        for j, (args, future) in enumerate(started):
            if args == task[1]:
                found[i] = future
                del started[j]
                if not started:
                    del _started_ahead[key]
                break
    return found


def _ahead_key(task: Task) -> tuple:
    """A task's function and first argument (a minute, a batch's files as a tuple): equal tasks
    share it, and tasks of one stage seldom do."""
    function, args = task
    head = args[0] if args else None
    return function, tuple(head) if isinstance(head, list) else head


def submit(workers: int, task: Callable, args: tuple) -> Future:
    """`task(*args)` started on a local worker beside whatever else runs, its result or error in
    the Future; with one worker, run here at once."""
    if workers > 1:
        return _shared_pool(workers).submit(_run_and_release, task, args)
    done = Future()
    try:
        done.set_result(task(*args))
    except Exception as error:
        done.set_exception(error)
    return done


def _run_and_release(task: Callable, args: tuple):
    """In a worker: the task, then, if the worker now holds over RETAINED_BYTES more than it
    started with, the memory freed handed back to the system (Arrow's allocator and malloc's
    both keep freed pages for reuse), so a worker that analyzed the largest job does not hold that
    job's peak through every later task and pipeline of the run. Below that the next task reuses
    the pages: handing back a minute merge's every time made the next one fault them in again
    (the fleet hour's merges: ~25% more CPU)."""
    try:
        return task(*args)
    finally:
        resident = _resident_bytes()
        if resident is None or resident - _resident_at_start > RETAINED_BYTES:
            pa.default_memory_pool().release_unused()
            if _LIBC is not None:
                _LIBC.malloc_trim(0)


RETAINED_BYTES = 256 << 20  # a minute merge leaves ~100-150 MB; a large job's analysis, GBs
_resident_at_start = 0  # set in each worker by `_start_worker`
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes() -> int | None:
    """This process's resident set size; None without /proc (not Linux: then the memory is handed
    back after every task)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except OSError:
        return None


_C_LIBRARY = ctypes.CDLL(None)  # the process's C library: malloc tuning, prctl
# glibc's, whose malloc (numpy's) can be tuned and trimmed; else None
_LIBC = _C_LIBRARY if hasattr(_C_LIBRARY, "mallopt") and hasattr(_C_LIBRARY, "malloc_trim") else None
PR_SET_PDEATHSIG = 1  # linux/prctl.h
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (malloc.h)
# Every array comes from the heap, however large (a large job's are ~100 MB), and at most
# TRIM_THRESHOLD_BYTES of free heap top is kept: 512 MB took ~7 s more of system CPU off the
# dense hour's analysis but raised the fleet hour's peak (sum of PSS) by 0.15-0.25 GB; 1 GB raised
# the dense hour's by 0.5 GB.
TRIM_THRESHOLD_BYTES = 64 << 20


def _keep_freed_memory_within_tasks() -> None:
    """A worker's malloc keeps what a task frees for the task's later arrays: by default an
    array above 128 kB-32 MB (a threshold glibc moves) is a fresh mapping, whose every page
    faults in again (zeroed by the kernel), and the heap's top is trimmed as soon as it is free.
    The fleet hour's merges faulted ~450 k pages; with the heap ~70 k, and cost ~15-25% less CPU.
    A dense job's analysis of 10 M flows spent ~45% of its CPU zeroing its mapped arrays' pages;
    on the heap its system time fell by ~2/3. `_run_and_release` hands the memory back after a
    task that left much."""
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_MAX, 0)
        _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


class PooledDoFn(beam.DoFn):
    """A DoFn whose elements are worked on by tasks on the local workers. `process` yields from
    `defer` with the task of its element, and `outputs` turns each result into the element's
    outputs. With a pool, the tasks wait for the bundle to finish, then run together (`run_tasks`)
    and their outputs are emitted in each element's window and at its timestamp. With one worker
    (any runner but the in-process one) the task runs at once and its outputs come from `process`:
    some runners (Beam's Dask runner) drop what `finish_bundle` emits. Counters are incremented in
    `outputs`, in this process. `cost_limit`: the most cost (`defer`) at once on the workers, not
    counting tasks of at most `negligible_cost` (`run_tasks`)."""

    cost_limit = math.inf
    negligible_cost = 0.0

    def __init__(self, workers: int):
        self.workers = workers

    def start_bundle(self):
        self._deferred: list[tuple[WindowedValue, Task, float]] = []

    def defer(self, task: Callable, args: tuple, window, timestamp, cost: float = 0.0) -> Iterator:
        if self.workers == 1:
            yield from self.outputs(task(*args))
        else:
            self._deferred.append((WindowedValue(None, timestamp, [window]), (task, args), cost))

    def outputs(self, result) -> Iterator:
        yield result

    def finish_bundle(self):
        deferred, self._deferred = self._deferred, []
        results = run_tasks(self.workers, [task for _, task, _ in deferred], [cost for *_, cost in deferred],
                            self.cost_limit, self.negligible_cost)
        for (where, _, _), result in zip(deferred, results):
            for output in self.outputs(result):
                yield where.with_value(output)
