"""Per-job analysis profile: CPU time and memory of each stage of `analyze_job` on an hour's
largest jobs, from a warehouse the pipeline already wrote (e.g. the dense hour's).

    python -m benchmarks.job_profile prepare WAREHOUSE TOPOLOGY HOUR CACHE [--jobs 3]
    python -m benchmarks.job_profile run CACHE [--job JOB] [--profile OUT.prof] [--hour-wall-s S]

`prepare` recognizes HOUR (e.g. 2026-11-22T10) as the pipeline does, splits its `flows` partition
by job and keeps the largest jobs' flows (Arrow IPC), the recognition, the previous hour's state
and the exporter profiles in CACHE, so that `run` measures the analysis alone. `run` analyzes
each cached job in turn and prints, per stage, CPU seconds (process time), the peak resident
memory (`peak_rss_mb`: the kernel's high-water mark, reset per stage) and that peak above what the
process held before the stage, then the same for the job's whole analysis (its flows included),
then the process's peak; with `--profile`, a cProfile (CPU time) of the whole run.
The first `run` records a digest of every job's output in CACHE and later runs compare against it:
a change meant to keep the output must print `output unchanged`.

Issue #19 asks that no job's analysis take more than 5% of the hour's time unless it holds more
than 5% of the hour's flows. With `--hour-wall-s` (the hour's end-to-end wall time, from
`benchmarks.fleet`), `run` ends with the jobs that break that rule (`over_their_share`), judged
on each job's CPU seconds (a worker analyzes one job at a time, so its CPU is its wall) and its
share of the hour's flows that belong to a job (`prepare` records them; a cache of every job,
`--jobs 1000`, judges them all).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pickle
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from prism_core import analysis, diagnosis, parallelism, resolution, timeline

STAGES = ((parallelism, "identify_parallelism"), (resolution, "job_resolution"), (timeline, "divide_steps"),
          (diagnosis, "diagnose_job"))


def prepare(root: str, topology_path: str, hour_text: str, cache: Path, jobs: int) -> None:
    from pipelines import warehouse
    from pipelines.run import load_topology

    hour = datetime.fromisoformat(hour_text).replace(tzinfo=UTC)
    hour_ns = int(hour.timestamp()) * 10**9
    topology = load_topology(topology_path)
    # The previous hour's state is computed afresh (from no state before it), so that a warehouse
    # written by older code still serves: its stored states may have another version.
    before = hour - timedelta(hours=1)
    previous = {}
    if warehouse.read_partition(root, "flows", before) is not None:
        previous = analysis.analyze_hour(warehouse.read_partition(root, "flows", before),
                                         warehouse.read_partition(root, "flow_minutes", before), topology, None,
                                         hour_ns - 3600 * 10**9).state
    recognition = analysis.recognize(warehouse.read_partition(root, "flow_minutes", hour), topology, previous, hour_ns)
    exporters = (warehouse.read_stats(root, hour, "exporters") or {}).get("exporters", [])
    flows = pq.read_table(warehouse.partition_file(root, "flows", hour),
                          columns=list(analysis.JOB_FLOW_COLUMNS))
    by_job = dict(analysis.split_flows_by_job(flows, analysis.open_membership(recognition, hour_ns)))
    jobs_flows = sum(table.num_rows for table in by_job.values())
    largest = sorted(by_job, key=lambda j: -by_job[j].num_rows)[:jobs]
    cache.mkdir(parents=True, exist_ok=True)
    for job_id in largest:
        with pa.OSFile(str(cache / f"{job_id}.arrow"), "wb") as sink, pa.ipc.new_file(sink, by_job[job_id].schema) as out:
            out.write_table(by_job[job_id].combine_chunks())
    context = {"recognition": recognition, "previous": previous, "hour_start_ns": hour_ns, "exporters": exporters,
               "jobs": largest, "flows": {j: by_job[j].num_rows for j in largest}, "jobs_flows": jobs_flows}
    (cache / "context.pickle").write_bytes(pickle.dumps(context))
    print(json.dumps(context["flows"]))


class PeakRss:
    """The process's peak resident memory: the kernel's high-water mark (VmHWM), reset by
    /proc/self/clear_refs, so exact and without a sampling thread (a sampling thread of its own
    made the process keep ~0.3-0.6 GB more of freed memory), since the last `reset` (`stage`), the
    last `reset_job` (`job`) and the start (`process`)."""

    def __init__(self):
        self.job_before = self.process_before = 0  # the highest marks that resets cleared

    @staticmethod
    def _status(field: str) -> int:
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
        return int(line.split()[1]) * 1024

    def stage(self) -> int:
        return self._status("VmHWM:")

    def job(self) -> int:
        return max(self.job_before, self.stage())

    def process(self) -> int:
        return max(self.process_before, self.job())

    def reset(self) -> int:
        """Start a stage's mark; the resident memory now."""
        self.job_before = self.job()
        self.process_before = max(self.process_before, self.job_before)
        Path("/proc/self/clear_refs").write_text("5")
        return self._status("VmRSS:")

    def reset_job(self) -> int:
        resident = self.reset()  # the marks so far kept in `process`
        self.job_before = 0
        return resident


def _timed(stage: str, function, figures: dict, memory: PeakRss):
    def wrapper(*args, **kwargs):
        cpu, base = time.process_time(), memory.reset()
        try:
            return function(*args, **kwargs)
        finally:
            figures[stage] = {"cpu_s": round(time.process_time() - cpu, 2),
                              "peak_above_start_mb": round((memory.stage() - base) / 2**20),
                              "peak_rss_mb": round(memory.stage() / 2**20)}
    return wrapper


def digest(result: analysis.JobAnalysis) -> str:
    """Every table, degree and state of a job's analysis."""
    hashed = hashlib.sha256()
    for name in sorted(result.tables):
        hashed.update(name.encode())
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, result.tables[name].schema) as out:
            out.write_table(result.tables[name].combine_chunks())
        hashed.update(sink.getvalue())
    hashed.update(json.dumps([result.degrees, result.state, result.resolution, result.step_period_s, result.failed_stage],
                             sort_keys=True, default=str).encode())
    return hashed.hexdigest()


def run(cache: Path, only: str | None, profile_to: str | None, hour_wall_s: float | None = None) -> None:
    context = pickle.loads((cache / "context.pickle").read_bytes())
    exporters = analysis.profiles_by_address([resolution.ExporterProfile.from_json(v) for v in context["exporters"]])
    hour_start = context["hour_start_ns"]
    memory, figures = PeakRss(), {}
    for module, name in STAGES:
        setattr(module, name, _timed(name, getattr(module, name), figures, memory))
    digests_path = cache / "digests.json"
    recorded = json.loads(digests_path.read_text()) if digests_path.exists() else {}
    profiler = cProfile.Profile(time.process_time) if profile_to else None  # CPU time: other load does not count
    report = {}
    for job_id in [only] if only else context["jobs"]:
        flows = pa.ipc.open_file(pa.memory_map(str(cache / f"{job_id}.arrow"))).read_all()
        flows = flows.combine_chunks()  # read into memory (the pipeline hands a job its staged pieces)
        figures.clear()
        cpu, base = time.process_time(), memory.reset_job()
        if profiler:
            profiler.enable()
        result = analysis.analyze_job(job_id, [flows], context["recognition"], context["previous"], hour_start,
                                      hour_start + 3600 * 10**9, exporters=exporters)
        if profiler:
            profiler.disable()
        total = {"cpu_s": round(time.process_time() - cpu, 2), "peak_above_start_mb": round((memory.job() - base) / 2**20),
                 "peak_rss_mb": round(memory.job() / 2**20)}
        found = digest(result)
        check = "recorded" if job_id not in recorded else ("output unchanged" if recorded[job_id] == found else "OUTPUT CHANGED")
        recorded.setdefault(job_id, found)
        report[job_id] = {"flows": flows.num_rows, "total": total, **dict(figures), "check": check,
                          "failed_stage": result.failed_stage}
        print(json.dumps({job_id: report[job_id]}), flush=True)
        del flows, result
    print(json.dumps({"peak_rss_mb": round(memory.process() / 2**20)}))
    if hour_wall_s:
        jobs_flows = context.get("jobs_flows") or sum(context["flows"].values())  # an older cache: its own jobs'
        print(json.dumps({"over_their_share": over_their_share(report, jobs_flows, hour_wall_s)}))
    digests_path.write_text(json.dumps(recorded, indent=1))
    if profiler:
        profiler.dump_stats(profile_to)


def over_their_share(report: dict, jobs_flows: int, hour_wall_s: float, share: float = 0.05) -> dict:
    """{job_id: (CPU share of the hour's wall, share of the hour's job flows)} of the jobs whose
    analysis took more than `share` of the hour's time without holding more than `share` of its
    flows."""
    shares = {job_id: (figures["total"]["cpu_s"] / hour_wall_s, figures["flows"] / jobs_flows)
              for job_id, figures in report.items()}
    return {job_id: (round(time_share, 4), round(flow_share, 4)) for job_id, (time_share, flow_share) in shares.items()
            if time_share > share and flow_share <= share}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare")
    for name in ("warehouse", "topology", "hour", "cache"):
        prep.add_argument(name)
    prep.add_argument("--jobs", type=int, default=3)
    measure = commands.add_parser("run")
    measure.add_argument("cache")
    measure.add_argument("--job")
    measure.add_argument("--profile")
    measure.add_argument("--hour-wall-s", type=float)
    options = parser.parse_args()
    if options.command == "prepare":
        prepare(options.warehouse, options.topology, options.hour, Path(options.cache), options.jobs)
    else:
        run(Path(options.cache), options.job, options.profile, options.hour_wall_s)


if __name__ == "__main__":
    main()
