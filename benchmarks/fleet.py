"""Fleet benchmark: one hour of the 2,880-GPU `fleet` scenario through the whole pipeline.

    python -m benchmarks.fleet [--fractions 0.25,0.5,1] [--beam-arg=--direct_running_mode=...]

Generates (and caches) the scenario, then for each fraction of the flow files runs, in a fresh
process so peak memory is its own: the Prism pipeline on the default runner (per-stage wall time,
records per second, peak RSS), and a single-process DuckDB reference of the same ingest and
per-minute stages, and `prism report` over the warehouse it wrote. Figures go to
benchmarks/results/fleet.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results" / "fleet.json"


def scenario(seed: int, name: str = "fleet") -> Path:
    """The cached scenario, generated again when the simulator's code changed since (its
    fingerprint is kept beside the data)."""
    from prism_core.simulate import write_scenario

    out = CACHE / f"{name}-{seed}"
    stamp, simulator = out / "simulator.sha256", _simulator_sha()
    if not (out / "truth" / "noise.json").exists() or not stamp.exists() or stamp.read_text() != simulator:
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        summary = write_scenario(name, out, seed)
        stamp.write_text(simulator)
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


def measure_prism(flows: str, topology: str, root: str, beam_args: list[str]) -> dict:
    from pipelines.run import infer_range, run_hours

    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    clock = {"stage": None, "at": time.perf_counter(), "cpu": cpu_s()}

    def on_stage(stage: str) -> None:
        now, used = time.perf_counter(), cpu_s()
        if clock["stage"]:
            wall[clock["stage"]] = wall.get(clock["stage"], 0.0) + now - clock["at"]
            cpu[clock["stage"]] = cpu.get(clock["stage"], 0.0) + used - clock["cpu"]
        clock.update(stage=stage.split(" ")[0], at=now, cpu=used)

    started, started_cpu = time.perf_counter(), cpu_s()
    first, end = infer_range(flows)
    summary = run_hours(flows, root, first, end, topology_path=topology, beam_args=beam_args, on_stage=on_stage)
    on_stage("done")
    total = time.perf_counter() - started
    records = summary.counters.get("rows_read", 0)
    return {
        "wall_s": round(total, 2),
        "cpu_s": round(cpu_s() - started_cpu, 2),
        "stages_s": {k: round(v, 2) for k, v in wall.items()},
        "stages_cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "records": records,
        "records_per_s": round(records / total),
        "peak_rss_mb": round(peak_rss_mb()),
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
    parser.add_argument("--fractions", default="0.25,0.5,1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beam-arg", action="append", default=[])
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

    data = scenario(options.seed)
    runs = []
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as scratch:
        for fraction in [float(f) for f in options.fractions.split(",")]:
            flows = subset(data / "flows", fraction, Path(scratch) / f"flows-{fraction}")
            load_before = os.getloadavg()[0]
            prism = in_subprocess("prism", str(flows), str(data / "topology.csv"),
                                  str(Path(scratch) / f"wh-{fraction}"), *options.beam_arg)
            report = in_subprocess("report", str(Path(scratch) / f"wh-{fraction}"))
            reference = in_subprocess("reference", str(flows))
            one_thread = in_subprocess("reference", str(flows), "1")
            ingest_s = prism["stages_s"].get("ingest", prism["wall_s"])
            ingest_cpu_s = prism["stages_cpu_s"].get("ingest", prism["cpu_s"])
            # Wall and CPU ratios both: the reference uses every core, the default runner one (so
            # also against DuckDB on one thread), and other users' load moves wall times more
            # than CPU times.
            run = {"fraction": fraction, "prism": prism, "report": report, "reference": reference,
                   "reference_1_thread": one_thread,
                   "ingest_vs_reference": round(ingest_s / reference["wall_s"], 2),
                   "ingest_vs_reference_1_thread": round(ingest_s / one_thread["wall_s"], 2),
                   "ingest_cpu_vs_reference": round(ingest_cpu_s / reference["cpu_s"], 2),
                   "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
            print(json.dumps(run), flush=True)
            runs.append(run)
    full, half = (next((r for r in runs if r["fraction"] == f), None) for f in (1.0, 0.5))
    result = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "beam_args": options.beam_arg,
        "runs": runs,
        "time_ratio_2x_records": round(full["prism"]["wall_s"] / half["prism"]["wall_s"], 2) if full and half else None,
        "cpu_ratio_2x_records": round(full["prism"]["cpu_s"] / half["prism"]["cpu_s"], 2) if full and half else None,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
