"""Exporters as they are: Prism's figures when the flows come through real exporters' habits.

    python -m benchmarks.exporters [--alone-seeds 0] [--realistic-seeds 0-2] [--runs NAME,...] [--out FILE]

Each export perturbation alone (one `ExportOptions` field on, on every exporter, with its values
drawn per exporter as the `realistic` family draws them) on small's jobs, the same hour without
any (`none`), issue #18's per-transfer combination (`per_transfer`), and the `realistic` family
over a few seeds: each is simulated into a temporary
directory (not benchmarks/.cache: that cache is keyed by the simulator's code), run through the
whole pipeline on the default runner and scored. A run that fails records its error. Figures go
to benchmarks/results/exporters.json (per run, and pooled per perturbation) and a table is
printed: the baseline that work on the inference is measured against.

The `realistic` seeds 0-2 are the held-out ones: develop on others (`--runs realistic
--realistic-seeds 3-5 --out /tmp/exporters.json`) and measure 0-2 once, at the end. The same
holds for small's seed 0 (`--alone-seeds 1-10` to develop on: seeds 5-10 joined in round 21).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks import write_results
from prism_core.simulate.scenarios import REALISTIC, SMALL, ExportOptions, Scenario

RESULTS = Path(__file__).resolve().parent / "results" / "exporters.json"
ALONE = {
    "none": ExportOptions(),
    "flow_cache": ExportOptions(flow_cache=1.0),
    # the setting issue #18 names: every leaf's cache with a 1 s idle and a 60 s active timeout
    "flow_cache_1s": ExportOptions(flow_cache=1.0, idle_timeout_s=(1.0, 1.0), active_timeout_s=(60.0, 60.0)),
    "milliseconds": ExportOptions(milliseconds=1.0),
    "sflow": ExportOptions(sflow=1.0),
    "loss": ExportOptions(loss=REALISTIC.export.loss),
    "double_export": ExportOptions(double_export=1.0),
    "clock_drift": ExportOptions(drift_ppm=REALISTIC.export.drift_ppm),
    "header_bytes": ExportOptions(header_bytes=True),
}
# on small's jobs too: issue #18's first target, records per transfer kept, with millisecond clocks,
# 1% loss, 1:1024 binomial sampling on a fifth of the leaves, double export and drifting clocks at once
SMALL_RUNS = {
    **ALONE,
    "per_transfer": ExportOptions(milliseconds=1.0, sflow=0.2, sflow_rate=(1024, 1024), loss=(0.01, 0.01),
                                  double_export=0.3, drift_ppm=REALISTIC.export.drift_ppm),
}
# (column, stage, metric): shares of `prism evaluate`
COLUMNS = (
    ("jobs exact", "jobs", "jobs_matched_exactly"),
    ("PP P", "jobs", "pp_pair_precision"),
    ("PP R", "jobs", "pp_pair_recall"),
    ("DP P", "jobs", "dp_pair_precision"),
    ("DP R", "jobs", "dp_pair_recall"),
    ("steps 1%", "steps", "steps_within_1pct"),
    ("exact counts", "steps", "job_hours_exact_count"),
    ("steps P", "steps", "prism_steps_within_1pct"),
    ("periods 5%", "steps", "periods_within_5pct"),
    ("periods 1%", "steps", "periods_within_1pct"),
    ("no period", "steps", "job_hours_without_period"),  # job-hours with steps reporting neither
    ("issues P", "issues", "precision"),
    ("issues R", "issues", "recall"),
    ("records kept", "ingest", "records_kept"),
    ("dups dropped", "ingest", "duplicates_dropped"),
)


def run_one(scenario: Scenario, seed: int) -> dict:
    """Simulate, run and score one hour; {"figures", "export", "seconds"} or {"error", ...}."""
    from pipelines.evaluation import evaluate_warehouse
    from pipelines.run import infer_range, run_hours
    from prism_core.simulate import write_scenario

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"prism-exporters-{scenario.name}-{seed}-") as work:
        data, root = Path(work) / "data", Path(work) / "warehouse"
        summary = write_scenario(scenario, data, seed)
        export = json.loads((data / "truth" / "export.json").read_text())["counts"]
        result = {"records": summary.records, "duplicates": summary.duplicates, "export": export}
        try:
            first, end = infer_range(str(data / "flows"))
            run_hours(str(data / "flows"), str(root), first, end, topology_path=str(data / "topology.csv"))
            result["figures"] = evaluate_warehouse(data / "truth", root)
        except Exception as error:  # a benchmark row, not a stop: the other runs still tell
            frame = traceback.extract_tb(error.__traceback__)[-1]
            result["error"] = f"{type(error).__name__}: {error} ({Path(frame.filename).name}:{frame.lineno})"
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{scenario.name} seed {seed}: {result.get('error', 'scored')} in {result['seconds']:.0f} s", flush=True)
    return result


def table(results: dict[str, dict]) -> str:
    """One line per perturbation: its pooled figures, or its runs' errors."""
    lines = [" | ".join(["perturbation", "runs", *(c for c, _, _ in COLUMNS)])]
    lines.append(" | ".join(["---"] * (len(COLUMNS) + 2)))
    for name, result in results.items():
        pooled, runs = result.get("pooled"), result["runs"]
        cells = [name, str(len(runs))]
        if pooled is None:
            errors = sorted({r["error"] for r in runs.values()})
            lines.append(" | ".join(cells + ["failed: " + "; ".join(errors)]))
            continue
        for _, stage, metric in COLUMNS:
            figure = pooled[stage][metric]
            value = figure.get("value")
            cells.append(str(int(figure["total"])) if "total" in figure else "n/a" if value is None else f"{value:.3f}")
        failed = sum("error" in r for r in runs.values())
        lines.append(" | ".join(cells) + (f" ({failed} failed)" if failed else ""))
    return "\n".join(lines)


def main() -> None:
    from benchmarks.accuracy import seeds
    from prism_core.evaluate.figures import pool

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alone-seeds", default="0", help="seeds of the runs on small's jobs")
    parser.add_argument("--realistic-seeds", default="0-2")
    parser.add_argument("--runs", default=",".join([*SMALL_RUNS, "realistic"]),
                        help="which perturbations (and `realistic`) to run, comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the figures go")
    args = parser.parse_args()
    runs = args.runs.split(",")
    unknown = sorted(set(runs) - {*SMALL_RUNS, "realistic"})
    if unknown:
        parser.error(f"unknown runs: {', '.join(unknown)}")
    plan = [(name, replace(SMALL, name=f"small-{name}", export=options), seeds(args.alone_seeds))
            for name, options in SMALL_RUNS.items() if name in runs]
    if "realistic" in runs:
        plan.append(("realistic", REALISTIC, seeds(args.realistic_seeds)))
    results: dict[str, dict] = {}
    for name, scenario, seed_list in plan:
        runs = {str(seed): run_one(scenario, seed) for seed in seed_list}
        scored = [r["figures"] for r in runs.values() if "figures" in r]
        results[name] = {"options": asdict(scenario.export), "runs": runs,
                         "pooled": pool(scored) if scored else None}
    write_results(args.out, {"results": results})
    print(table(results))
    print(f"figures in {args.out}")


if __name__ == "__main__":
    main()
