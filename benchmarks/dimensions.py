"""What each dimension the `sealed` family varies does to Prism today, and how it does on real timings.

    python -m benchmarks.dimensions [--runs baseline,optimizer,...] [--sealed-seeds 0-2] [--whatif DIR]
                                    [--timeout SECONDS] [--seed N --out FILE]

Runs the whole pipeline (default runner, a fresh warehouse) on, and scores against the truth:
- `baseline`: a small hour of the sealed family with every dimension textbook, and one such hour
  per dimension (`prism_core.simulate.variation.DIMENSIONS`) with only that dimension drawn: same
  seed and streams, so the job mix is the baseline's up to what the dimension changes;
- `sealed-<seed>`: the sealed hour itself, every dimension drawn;
- `replay-ar`, `replay-st`, `replay-mix`: the real traces (`prism_core.simulate.replay`).
Scenarios are generated under the system's temporary directory, never the shared benchmark cache
(it is keyed by the simulator's code, which differs between branches). Figures, per run, go to
benchmarks/results/dimensions.json: jobs matched exactly, GPUs per job right, DP and PP pair
precision and recall, steps within 1%, job-hours with the exact step count, issue recall (all
kinds pooled, and per kind) and precision, with the full scorer output beside them.

Seed 0 of the dimension hours and the sealed seeds are the sealed set: measure on them, never tune.
Develop on other seeds (`--seed 1 --out /tmp/dims.json`): same dimensions, other jobs and draws. Each run is a
child process: one that outlasts `--timeout` is stopped and recorded as such (the pipeline's time
is a figure too).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks import write_results
from benchmarks.accuracy import seeds
from prism_core.simulate import SCENARIOS, Scenario, write_scenario
from prism_core.simulate.variation import DIMENSIONS, Variation
from prism_core.truth import TRUTH_FAULT_KINDS

RESULTS = Path(__file__).resolve().parent / "results" / "dimensions.json"
REPLAYS = ("replay-ar", "replay-st", "replay-mix")


def dimension_hour(dimensions: tuple[str, ...]) -> Scenario:
    """A small hour of the sealed family with only `dimensions` drawn."""
    sealed = SCENARIOS["sealed"]
    mix = replace(sealed.fleet, resident=sealed.fleet.resident[1:], arrivals=24)
    name = "-".join(dimensions) or "baseline"
    return replace(sealed, name=name, n_hosts=48, drained=(), fleet=mix, variation=Variation(dimensions))


def runs(names: list[str], sealed_seeds: list[int], seed: int = 0) -> dict[str, tuple[Scenario, int]]:
    """{run name: (scenario, seed)} for the runs asked for; `seed` draws the dimension hours."""
    known = {"baseline": (dimension_hour(()), seed)}
    known |= {dimension: (dimension_hour((dimension,)), seed) for dimension in DIMENSIONS}
    known |= {f"sealed-{seed}": (SCENARIOS["sealed"], seed) for seed in sealed_seeds}
    known |= {name: (SCENARIOS[name], 0) for name in REPLAYS}
    unknown = set(names) - set(known)
    if unknown:
        raise SystemExit(f"unknown runs {sorted(unknown)}; choose from {sorted(known)}")
    return {name: known[name] for name in names} if names else known


def measure_within(timeout_s: float, scenario: Scenario, seed: int, whatif: Path | None) -> dict:
    """`measure` in a child process, stopped after `timeout_s` seconds."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_measure_into, args=(results, scenario, seed, whatif))
    started = time.perf_counter()
    child.start()
    while time.perf_counter() - started < timeout_s:
        try:  # read before joining: a child blocks on exit until its result is read
            result = results.get(timeout=5)
        except queue.Empty:
            if not child.is_alive():
                return {"failed_with_exit_code": child.exitcode}
            continue
        child.join()
        return result
    child.terminate()
    child.join()
    return {"timed_out_after_s": round(time.perf_counter() - started)}


def _measure_into(results, scenario: Scenario, seed: int, whatif: Path | None) -> None:
    results.put(measure(scenario, seed, whatif))


def measure(scenario: Scenario, seed: int, whatif: Path | None) -> dict:
    from pipelines.evaluation import evaluate_warehouse
    from pipelines.run import infer_range, run_hours

    with tempfile.TemporaryDirectory(prefix=f"prism-dimensions-{scenario.name}-{seed}-") as tmp:
        data, root = Path(tmp) / "data", Path(tmp) / "warehouse"
        simulated = write_scenario(scenario, data, seed, whatif_dir=whatif)
        started = time.perf_counter()
        first, end = infer_range(str(data / "flows"))
        run_hours(str(data / "flows"), str(root), first, end, topology_path=str(data / "topology.csv"))
        pipeline_s = time.perf_counter() - started
        scored = evaluate_warehouse(data / "truth", root)
    return {"records": simulated.records, "pipeline_s": round(pipeline_s, 1), "figures": _figures(scored),
            "scored": scored}


def _figures(scored: dict) -> dict:
    """The figures of the table, each a share with its counts."""
    jobs, steps, issues = scored["jobs"], scored["steps"], scored["issues"]

    def share(figure: dict) -> dict:
        return {k: figure.get(k) for k in ("value", "count", "of")}

    return {
        "jobs_exact": share(jobs["jobs_matched_exactly"]),
        "gpus_per_job": share(jobs["gpus_exact"]),
        **{f"{kind}_pair_{what}": share(jobs[f"{kind}_pair_{what}"]) for kind in ("dp", "pp")
           for what in ("precision", "recall")},
        "steps_within_1pct": share(steps["steps_within_1pct"]),
        "exact_step_counts": share(steps["job_hours_exact_count"]),
        "issue_recall": share(issues["recall"]),
        "issue_recall_by_kind": {kind: share(issues[f"recall_{kind}"]) for kind in TRUTH_FAULT_KINDS},
        "issue_precision": share(issues["precision"]),
    }


def table(results: dict[str, dict]) -> str:
    """The figures as a Markdown table, one row per run."""
    columns = ("jobs_exact", "gpus_per_job", "dp_pair_precision", "dp_pair_recall", "pp_pair_precision",
               "pp_pair_recall", "steps_within_1pct", "exact_step_counts", "issue_recall", "issue_precision")
    lines = ["| run | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, result in results.items():
        if "figures" not in result:
            lines.append(f"| {name} | " + " | ".join([json.dumps(result)] + [""] * (len(columns) - 1)) + " |")
            continue
        cells = []
        for column in columns:
            figure = result["figures"][column]
            cells.append("-" if figure["value"] is None else f"{figure['value']:.0%} ({figure['count']}/{figure['of']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="", help="comma-separated run names (default: all)")
    parser.add_argument("--sealed-seeds", default="0-2")
    parser.add_argument("--whatif", type=Path, default=None, help="the What-if traces (default: beside the repo)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="wall seconds one run may take")
    parser.add_argument("--seed", type=int, default=0, help="seed of the dimension hours (0: the sealed one)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the figures go")
    args = parser.parse_args()
    chosen = runs(list(filter(None, args.runs.split(","))), seeds(args.sealed_seeds), args.seed)
    results = json.loads(args.out.read_text())["runs"] if args.out.exists() else {}
    for name, (scenario, seed) in chosen.items():
        results[name] = {"scenario": scenario.name, "seed": seed,
                         **measure_within(args.timeout, scenario, seed, args.whatif)}
        print(f"{name}: {results[name]}" if "figures" not in results[name] else
              f"{name}: {results[name]['pipeline_s']} s of pipeline for {results[name]['records']:,} records",
              flush=True)
        write_results(args.out, {"runs": results})
    print(table(results))


if __name__ == "__main__":
    main()
