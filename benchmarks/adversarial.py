"""Per-job analysis time on one job whose flows are drawn to defeat the step rules, at 1x, 2x, 4x flows.

    python -m benchmarks.adversarial [--base 200000] [--seed 0]

The job: 8 GPUs on 4 hosts, two pipeline stages of four data-parallel ranks. Its syncs come after
random gaps (lognormal, no usual step), their flow sizes drift in three levels over the hour, and
pipeline sends arrive at random with quiet gaps of every length, so the first sync that closes a
step has no usual start to anchor on and the rules look at every quiet gap before it. Doubling
the flows doubles the pipeline sends in the same hour; the syncs stay the same. Each size
runs the per-job analysis (prism_core.analysis.analyze_job: parallelism, timeline, diagnosis) and
then divide_steps alone on the pairs it found, `--repeat` times. The least time per size (wall
and CPU) and the ratio per doubling (the target is at most 2.2) go to
benchmarks/results/adversarial.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from pathlib import Path
from typing import Self

import numpy as np
import pyarrow as pa

from prism_core.analysis import analyze_job
from prism_core.recognition import EVENTS, MEMBERSHIP, Recognition
from prism_core.minutes import HOUR_NS
from prism_core.schema import JOBS
from prism_core.timeline import divide_steps

RESULTS = Path(__file__).resolve().parent / "results" / "adversarial.json"
JOB_ID = "adversarial"
HOUR_START_NS = 10 * HOUR_NS
HOSTS, GPUS_PER_HOST = 4, 2
STAGES = ([0, 1, 4, 5], [2, 3, 6, 7])  # GPU indices of each pipeline stage (its DP group)
SYNC_CHANNELS = 1  # flows per DP pair and sync: the syncs stay the same at every size, the sends grow
SYNC_GAP_NS, SYNC_GAP_SPREAD = 6e9, 0.8  # lognormal gaps between syncs: median and sigma (log)
SYNC_BUCKET_BYTES = 64 << 20
SIZE_LEVELS = (0.25, 0.6, 1.5)  # the sync sizes drift through these over the hour (2.4x apart)
TIMES = ("analyze_job_s", "analyze_job_cpu_s", "divide_steps_s", "divide_steps_cpu_s")


def adversarial_job(n_flows: int, seed: int, span_ns: int = HOUR_NS) -> tuple[pa.Table, pa.Table]:
    """About `n_flows` flows of the job over `span_ns` from HOUR_START_NS, sorted by start, and its
    membership."""
    rng = np.random.default_rng(seed)
    addrs = np.array([f"10.0.{h}.{g}" for h in range(HOSTS) for g in range(GPUS_PER_HOST)])
    pipeline = [(a, b) for a, b in zip(*STAGES)] + [(b, a) for a, b in zip(*STAGES)]
    collective = [(a, b) for group in STAGES for a in group for b in group if a != b]

    # syncs: every DP pair sends within 50 ms, at random gaps, sizes drifting
    sync_gaps = rng.lognormal(np.log(SYNC_GAP_NS), SYNC_GAP_SPREAD, int(4 * span_ns / SYNC_GAP_NS) + 10)
    sync_at = HOUR_START_NS + np.cumsum(sync_gaps)
    sync_at = sync_at[sync_at < HOUR_START_NS + span_ns - 10e9]
    shape = (len(sync_at), len(collective), SYNC_CHANNELS)
    sync_start = (sync_at[:, None, None] + rng.uniform(0, 50e6, shape)).ravel()
    sync_pair = np.broadcast_to(np.arange(len(collective))[None, :, None], shape).ravel()
    level = np.minimum((sync_start - HOUR_START_NS) * len(SIZE_LEVELS) // span_ns, len(SIZE_LEVELS) - 1)
    sync_bytes = SYNC_BUCKET_BYTES * np.asarray(SIZE_LEVELS)[level.astype(np.int64)]
    sync_end = sync_start + rng.uniform(5e6, 40e6, len(sync_start))

    # pipeline sends: one activation size (and a tenth of another), gaps from short to long
    n_sends = n_flows - len(sync_start)
    gaps = rng.exponential(1.0, n_sends) * rng.choice([0.2, 1.0, 5.0], n_sends, p=[0.5, 0.4, 0.1])
    send_start = HOUR_START_NS + np.cumsum(gaps) / gaps.sum() * (span_ns - 5e9)
    send_pair = rng.integers(0, len(pipeline), n_sends)
    send_bytes = np.where(rng.random(n_sends) < 0.9, 12 << 20, 3 << 20)
    send_end = send_start + rng.uniform(1e6, 5e6, n_sends)

    ends = np.array(collective + pipeline)
    pair = np.r_[sync_pair, len(collective) + send_pair]
    start = np.r_[sync_start, send_start].astype(np.int64)
    order = np.argsort(start, kind="stable")
    flows = pa.table({
        "time_flow_start_ns": start[order],
        "time_flow_end_ns": np.r_[sync_end, send_end].astype(np.int64)[order],
        "src_addr": addrs[ends[pair[order], 0]],
        "dst_addr": addrs[ends[pair[order], 1]],
        "bytes": np.r_[sync_bytes, send_bytes].astype(np.int64)[order],
        "sampler_address": np.array(["exporter-a", "exporter-b", "exporter-c"])[rng.integers(0, 3, len(order))],
    })
    members = pa.table({
        "job_id": [JOB_ID] * len(addrs), "addr": addrs,
        "host": [f"host{i // GPUS_PER_HOST}" for i in range(len(addrs))],
        "gpu": [i % GPUS_PER_HOST for i in range(len(addrs))], "gpus": [1] * len(addrs),
        "first_ns": [HOUR_START_NS] * len(addrs),
        "last_ns": [HOUR_START_NS + span_ns] * len(addrs),
    }, schema=MEMBERSHIP)
    return flows, members


def run_size(n_flows: int, seed: int, repeat: int) -> dict:
    """The per-job analysis, then divide_steps alone, on the job at `n_flows` flows: the least
    wall and CPU seconds of each over `repeat` runs (on a shared machine the CPU time is the one
    that compares across sizes)."""
    flows, members = adversarial_job(n_flows, seed)
    recognition = Recognition(JOBS.empty_table(), members, EVENTS.empty_table(), {})
    times = {name: [] for name in TIMES}
    for _ in range(repeat):
        with _Stopwatch(times, "analyze_job"):
            analysis = analyze_job(JOB_ID, [flows], recognition, {}, HOUR_START_NS, HOUR_START_NS + HOUR_NS)
        with _Stopwatch(times, "divide_steps"):
            divide_steps(JOB_ID, flows, analysis.tables["comm_pairs"], None, HOUR_START_NS, HOUR_START_NS + HOUR_NS,
                         job_gpus=analysis.tables["job_gpus"])
    return {"flows": flows.num_rows, **{name: min(values) for name, values in times.items()},
            "steps": analysis.tables["steps"].num_rows, "issues": analysis.tables["issues"].num_rows}


class _Stopwatch:
    """Appends the wall and CPU (this process) seconds of a `with` block to `times`."""

    def __init__(self, times: dict[str, list[float]], name: str):
        self.times, self.name = times, name

    def __enter__(self) -> Self:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_) -> None:
        self.times[f"{self.name}_s"].append(round(time.perf_counter() - self._wall, 2))
        self.times[f"{self.name}_cpu_s"].append(round(time.process_time() - self._cpu, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=200_000, help="flows at 1x")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (the least time counts)")
    args = parser.parse_args()

    sizes = []
    for scale in (1, 2, 4):
        sizes.append({"scale": scale, **run_size(scale * args.base, args.seed, args.repeat)})
        print(json.dumps(sizes[-1]), flush=True)
    ratios = {name: [round(b[name] / a[name], 2) for a, b in itertools.pairwise(sizes)] for name in TIMES}
    result = {"machine": {"python": platform.python_version(), "cpus": 2}, "seed": args.seed, "base_flows": args.base,
              "repeat": args.repeat, "sizes": sizes, "ratio_per_doubling": ratios, "target_ratio": 2.2}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
