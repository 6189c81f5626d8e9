"""Fleet benchmark: one hour of the 2,880-GPU platform through the whole pipeline.

    python -m benchmarks.fleet [--scenario fleet|dense] [--fractions 0.25,0.5,1] [--repeat 3] [--beam-arg=--local_workers=1]

`fleet` is the hour of 10 M records, `dense` the same jobs with 5 queue pairs per NCCL channel
(50 M records). Generates (and caches) the scenario, then for each fraction of the flow files runs,
in a fresh process so peak memory is its own: the Prism pipeline on the default runner (wall time,
CPU time and peak memory of every process of the run, per stage: ingest, recognition, analysis,
and the partition writes of the sink inside ingest and analysis), a DuckDB reference of the same
ingest and per-minute stages on every core and on one thread, and `prism report` over the
warehouse it wrote. Figures go to benchmarks/results/<scenario>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results"  # <scenario>.json
SCENARIOS = {"fleet": "0.25,0.5,1", "dense": "1"}  # the benchmark's scenarios and their default fractions


def scenario(seed: int, name: str = "fleet") -> Path:
    """The cached scenario, generated again when the simulator's code changed since (its
    fingerprint is kept beside the data)."""
    from prism_core.simulate import write_scenario

    out = CACHE / f"{name}-{seed}"
    simulator = _simulator_sha()

    def current() -> bool:
        stamp = out / "simulator.sha256"
        return (out / "truth" / "noise.json").exists() and stamp.exists() and stamp.read_text() == simulator

    if not current():
        # Generated beside the cache and moved in whole: two runs asking for one scenario at once
        # must not write into one directory (a reader then saw an hour with minutes missing).
        CACHE.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f".{name}-{seed}-", dir=CACHE) as work:
            fresh = Path(work) / "scenario"
            summary = write_scenario(name, fresh, seed)
            (fresh / "simulator.sha256").write_text(simulator)
            if not current():  # another run may have moved its copy in meanwhile
                shutil.rmtree(out, ignore_errors=True)
                os.replace(fresh, out)
        print(f"generated {name} seed {seed}: {summary.records:,} records, {summary.bytes_written / 1e6:.0f} MB "
              f"in {time.perf_counter() - started:.0f} s", flush=True)
    return out


def _simulator_sha() -> str:
    import prism_core.simulate

    digest = hashlib.sha256()
    for path in sorted(Path(prism_core.simulate.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def subset(flows: Path, fraction: float, into: Path) -> Path:
    """Every k-th flow file (round robin over exporters and times), linked into `into`."""
    files = sorted(flows.iterdir())
    keep = files if fraction >= 1 else files[:: round(1 / fraction)]
    into.mkdir(parents=True, exist_ok=True)
    for path in keep:
        (into / path.name).symlink_to(path)
    return into


def peak_rss_mb() -> float:
    """This process's peak, or a worker's when a multi-process runner's worker peaked higher."""
    return max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024


def cpu_s() -> float:
    """User + system CPU seconds of this process and of its finished workers."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _descendants(pid: int) -> list[int]:
    """Processes below `pid`: the local workers (pipelines/local_workers.py) and their fork server."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process and of its finished children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS


def _pss_mb(pid: int) -> float:
    """Proportional set size: a page shared by n processes (memory-mapped staging files, pages a
    fork shares) counts 1/n in each, so the sum over processes is the memory they hold."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _rss_mb(pid: int) -> float:
    """Resident set size, read without walking the page tables: at least the PSS."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES / 2**20
    except OSError:
        return 0.0


class Usage:
    """CPU and memory of this process and every process below it (local workers), per stage: the
    CPU of live workers is read from /proc (a pool's workers are not children that have ended), and
    memory is sampled every SAMPLE_S as the sum of their proportional set sizes."""

    SAMPLE_S = 0.2
    # Proportional set sizes walk the processes' page tables (in the kernel, beside the run): at
    # most once per WALK_S, unless the resident sizes pass the highest they were at a walk.
    WALK_S = 1.0

    def __init__(self):
        self.pid = os.getpid()
        self.peak_mb = 0.0
        self._walked = (0.0, 0.0)  # (when, resident MB) of the stage's highest walk
        self._lock = threading.Lock()  # a sample taken before a stage ends is that stage's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def cpu_s(self) -> float:
        return cpu_s() + sum(_proc_cpu_s(pid) for pid in _descendants(self.pid))

    def memory_mb(self, pids: list[int] | None = None) -> float:
        return sum(map(_pss_mb, pids or [self.pid, *_descendants(self.pid)]))

    def take_peak_mb(self) -> float:
        """The peak since the last call (at least the memory held now)."""
        with self._lock:
            peak, self.peak_mb = max(self.peak_mb, self.memory_mb()), 0.0
            self._walked = (0.0, 0.0)
        return peak

    def _sample(self) -> None:
        while not self._stop.wait(self.SAMPLE_S):
            with self._lock:
                # A process's PSS is at most its RSS: below the peak, the processes' page tables
                # (smaps_rollup walks them: ~15 s of CPU over the dense hour's analysis; sampled
                # every 0.2 s, ~6 s of CPU beside the fleet hour's ~36 s) need no walk.
                pids = [self.pid, *_descendants(self.pid)]
                resident, now = sum(map(_rss_mb, pids)), time.perf_counter()
                walked_at, walked_resident = self._walked
                if resident > self.peak_mb and (resident > walked_resident or now - walked_at >= self.WALK_S):
                    self.peak_mb = max(self.peak_mb, self.memory_mb(pids))
                    self._walked = (now, max(resident, walked_resident))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class PartitionWrites(logging.Handler):
    """The sink's log of each partition written (pipelines.sink.WRITE_LOG): wall and CPU seconds."""

    def __init__(self):
        from pipelines.sink import WRITE_LOG

        super().__init__(logging.INFO)
        self.message = WRITE_LOG
        self.wall_s = self.cpu_s = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == self.message:
            *_, wall_s, cpu_s = record.args
            self.wall_s += wall_s
            self.cpu_s += cpu_s


def measure_prism(flows: str, topology: str, root: str, beam_args: list[str]) -> dict:
    """The whole run, per stage (ingest, then recognition and analysis of each hour, DuckDB views):
    wall and CPU seconds (workers included) and the peak memory of every process of the run; and
    the partition writes (the sink, inside ingest and analysis) as the sink logs them."""
    from pipelines import local_workers
    from pipelines.run import infer_range, run_hours

    usage, writes = Usage(), PartitionWrites()
    sink_log = logging.getLogger("pipelines.sink")
    sink_log.addHandler(writes)
    sink_log.setLevel(logging.INFO)
    stages: dict[str, dict[str, float]] = {}
    clock = {"stage": None, "at": time.perf_counter(), "cpu": usage.cpu_s()}
    usage.take_peak_mb()

    def on_stage(stage: str) -> None:
        now, used, peak = time.perf_counter(), usage.cpu_s(), usage.take_peak_mb()
        if clock["stage"]:
            figures = stages.setdefault(clock["stage"], {"wall_s": 0.0, "cpu_s": 0.0, "peak_mb": 0.0})
            figures["wall_s"] += now - clock["at"]
            figures["cpu_s"] += used - clock["cpu"]
            figures["peak_mb"] = max(figures["peak_mb"], peak)
        clock.update(stage=stage.split(" ")[0], at=now, cpu=used)

    started, started_cpu = time.perf_counter(), usage.cpu_s()
    first, end = infer_range(flows)
    summary = run_hours(flows, root, first, end, topology_path=topology, beam_args=beam_args, on_stage=on_stage)
    on_stage("done")
    total, total_cpu = time.perf_counter() - started, usage.cpu_s() - started_cpu
    local_workers.shutdown()
    usage.stop()
    records = summary.counters.get("rows_read", 0)
    stages["sink"] = {"wall_s": writes.wall_s, "cpu_s": writes.cpu_s}  # summed over partitions, some at once
    return {
        "wall_s": round(total, 2),
        "cpu_s": round(total_cpu, 2),
        "stages": {name: {k: round(v, 2) for k, v in figures.items()} for name, figures in stages.items()},
        "records": records,
        "records_per_s": round(records / total),
        "peak_mb": round(max(figures.get("peak_mb", 0.0) for figures in stages.values())),
        "peak_rss_mb": round(peak_rss_mb()),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def measure_reference(flows: str, threads: int | None = None) -> dict:
    """Ingest + per-minute aggregation written directly in DuckDB: read, validate the basics,
    drop duplicates, group by (minute, src, dst); on `threads` threads (default: every core)."""
    import duckdb

    started, started_cpu = time.perf_counter(), cpu_s()
    con = duckdb.connect(config={"threads": threads} if threads else {})
    con.execute(f"""
        CREATE TABLE flows AS
        SELECT DISTINCT time_flow_start_ns, time_flow_end_ns, src_addr, dst_addr, bytes, packets,
               src_port, dst_port, proto, sampling_rate,
               time_flow_start_ns // 60000000000 AS minute
        FROM read_parquet('{flows}/*.parquet', union_by_name = true)
        WHERE bytes > 0 AND time_flow_end_ns >= time_flow_start_ns
          AND src_addr IS NOT NULL AND dst_addr IS NOT NULL
    """)
    rows = con.execute("""
        SELECT count(*) FROM (
            SELECT minute, src_addr, dst_addr, count(*), sum(bytes), count(DISTINCT bytes)
            FROM flows GROUP BY ALL)
    """).fetchone()[0]
    con.execute("COPY flows TO '/dev/null' (FORMAT parquet)")
    total = time.perf_counter() - started
    return {"wall_s": round(total, 2), "cpu_s": round(cpu_s() - started_cpu, 2), "minute_rows": rows,
            "peak_rss_mb": round(peak_rss_mb())}


REPORT_TARGET = {"wall_s": 10.0, "peak_rss_mb": 1024}  # issue #20: a fleet report in <= 10 s and <= 1 GB


def measure_report(root: str) -> dict:
    """`prism report` over the warehouse the pipeline just wrote: wall, CPU and peak memory."""
    from pipelines.reports import build_report

    started, started_cpu = time.perf_counter(), cpu_s()
    with tempfile.TemporaryDirectory(prefix="prism-report-") as out:
        build_report(root, None, None, Path(out) / "report.html")
    figures = {"wall_s": round(time.perf_counter() - started, 2), "cpu_s": round(cpu_s() - started_cpu, 2),
               "peak_rss_mb": round(peak_rss_mb())}
    return figures | {"within_target": all(figures[k] <= limit for k, limit in REPORT_TARGET.items())}


def in_subprocess(kind: str, *args: str) -> dict:
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.fleet", "--measure", kind, "--", *args],  # "--": Beam flags are arguments here
        check=True, capture_output=True, text=True, cwd=HERE.parent,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=SCENARIOS, default="fleet",
                        help="fleet (10 M records) or dense (the same jobs, 5 queue pairs per channel: 50 M)")
    parser.add_argument("--fractions", help="of the flow files; default: 0.25,0.5,1 for fleet, 1 for dense")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beam-arg", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per fraction, one after the other: the same code's wall time moves by a fifth "
                             "between runs on a shared machine, so the summary gives each fraction's median")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.measure == "prism":
        print(json.dumps(measure_prism(*options.args[:3], beam_args=options.args[3:])))
        return
    if options.measure == "report":
        print(json.dumps(measure_report(options.args[0])))
        return
    if options.measure == "reference":
        print(json.dumps(measure_reference(options.args[0], int(options.args[1]) if len(options.args) > 1 else None)))
        return

    data = scenario(options.seed, options.scenario)
    runs = []
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as scratch:
        fractions = [float(f) for f in (options.fractions or SCENARIOS[options.scenario]).split(",")]
        for fraction, attempt in ((f, a) for f in fractions for a in range(options.repeat)):
            flows = Path(scratch) / f"flows-{fraction}"
            if not attempt:
                subset(data / "flows", fraction, flows)
            shutil.rmtree(Path(scratch) / f"wh-{fraction}", ignore_errors=True)  # each run writes afresh
            load_before = os.getloadavg()[0]
            prism = in_subprocess("prism", str(flows), str(data / "topology.csv"),
                                  str(Path(scratch) / f"wh-{fraction}"), *options.beam_arg)
            report = in_subprocess("report", str(Path(scratch) / f"wh-{fraction}"))
            reference = in_subprocess("reference", str(flows))
            one_thread = in_subprocess("reference", str(flows), "1")
            ingest_s, ingest_cpu_s = prism["stages"]["ingest"]["wall_s"], prism["stages"]["ingest"]["cpu_s"]
            # Wall and CPU ratios both, against DuckDB on every core and on one thread: other
            # users' load moves wall times more than CPU times.
            run = {"fraction": fraction, "prism": prism, "report": report, "reference": reference,
                   "reference_1_thread": one_thread,
                   "ingest_vs_reference": round(ingest_s / reference["wall_s"], 2),
                   "ingest_vs_reference_1_thread": round(ingest_s / one_thread["wall_s"], 2),
                   "ingest_cpu_vs_reference": round(ingest_cpu_s / reference["cpu_s"], 2),
                   "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
            print(json.dumps(run), flush=True)
            runs.append(run)
    medians = {str(f): _medians([r for r in runs if r["fraction"] == f]) for f in fractions}
    full, half = (medians.get(str(f)) for f in (1.0, 0.5))
    result = {
        "scenario": options.scenario,
        "seed": options.seed,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "beam_args": options.beam_arg,
        "runs": runs,
        "medians": medians,
        "time_ratio_2x_records": round(full["prism_wall_s"] / half["prism_wall_s"], 2) if full and half else None,
        "cpu_ratio_2x_records": round(full["prism_cpu_s"] / half["prism_cpu_s"], 2) if full and half else None,
    }
    written = RESULTS / f"{options.scenario}.json"
    RESULTS.mkdir(exist_ok=True)
    written.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {written}")


def _medians(runs: list[dict]) -> dict:
    """The median over a fraction's runs of the figures a target is read from."""
    def median(values) -> float:
        return round(float(statistics.median(values)), 2)

    return {
        "runs": len(runs),
        "prism_wall_s": median(r["prism"]["wall_s"] for r in runs),
        "prism_cpu_s": median(r["prism"]["cpu_s"] for r in runs),
        "prism_wall_s_range": [min(r["prism"]["wall_s"] for r in runs), max(r["prism"]["wall_s"] for r in runs)],
        "ingest_wall_s": median(r["prism"]["stages"]["ingest"]["wall_s"] for r in runs),
        "analysis_wall_s": median(r["prism"]["stages"]["analysis"]["wall_s"] for r in runs),
        "peak_mb": max(r["prism"]["peak_mb"] for r in runs),
        "report_wall_s": median(r["report"]["wall_s"] for r in runs),
        "ingest_vs_reference": median(r["ingest_vs_reference"] for r in runs),
        "ingest_vs_reference_1_thread": median(r["ingest_vs_reference_1_thread"] for r in runs),
    }


if __name__ == "__main__":
    main()
