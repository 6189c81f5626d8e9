"""Accuracy over many simulated hours: every figure of `prism evaluate`, per scenario and pooled.

    python -m benchmarks.accuracy [--fleet-seeds 0-9] [--small-seeds 0-4]

One seed's hour holds a handful of faults of each kind and a few dozen job-hours, so a figure on
it is a small sample, and figures tuned on a few seeds flatter the code. This generates (and
caches, under benchmarks/.cache) every seed asked for, runs the whole pipeline on each (the
default runner, a fresh warehouse), scores it, and pools the scenarios: shares add their counts
(exact job-hours, faults found, issues right, ...), other figures give their range. Figures go to
benchmarks/results/accuracy.json. The default set takes about 12 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.fleet import scenario

RESULTS = Path(__file__).resolve().parent / "results" / "accuracy.json"


def seeds(text: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7]."""
    found: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        found += list(range(int(lo), int(hi or lo) + 1))
    return found


def score_one(name: str, seed: int) -> dict:
    from pipelines.evaluation import evaluate_warehouse
    from pipelines.run import infer_range, run_hours

    data = scenario(seed, name)
    with tempfile.TemporaryDirectory(prefix=f"prism-accuracy-{name}-{seed}-") as root:
        started = time.perf_counter()
        first, end = infer_range(str(data / "flows"))
        run_hours(str(data / "flows"), root, first, end, topology_path=str(data / "topology.csv"))
        scored = evaluate_warehouse(data / "truth", root)
    print(f"{name} seed {seed}: {time.perf_counter() - started:.0f} s", flush=True)
    return scored


def main() -> None:
    from prism_core.evaluate.figures import pool

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet-seeds", default="0-9")
    parser.add_argument("--small-seeds", default="0-4")
    args = parser.parse_args()
    runs = [("small", s) for s in seeds(args.small_seeds)] + [("fleet", s) for s in seeds(args.fleet_seeds)]
    scored = {f"{name}-{seed}": score_one(name, seed) for name, seed in runs}
    by_scenario = {name: [s for key, s in scored.items() if key.startswith(f"{name}-")] for name in ("small", "fleet")}
    result = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
        "pooled": pool(list(scored.values())),
        "pooled_by_scenario": {name: pool(runs) for name, runs in by_scenario.items() if runs},
        "scenarios": scored,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"figures in {RESULTS}")


if __name__ == "__main__":
    main()
