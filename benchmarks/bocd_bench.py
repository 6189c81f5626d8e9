"""BOCD benchmark: throughput on long synthetic series, and the TCPD scores of the default setting.

    python -m benchmarks.bocd_bench [--sizes 10000,100000,1000000] [--tcpd-dir DIR]

Synthetic series: piecewise-constant mean and standard deviation (segments of 50 to 2,000 points,
levels in [-2, 2) at least 1 apart, noise sd 0.2 to 0.6), z-scored, segmented with BOCD's defaults
(lambda 100, prior mu 0 / kappa 1 / alpha 1 / beta 1, pruning below 1e-4, MAP segmentation).
Figures: points per second (process CPU time, and wall time: the machine may be shared), the
largest number of live run lengths, and how many true change points were found exactly or within
2 points. Written to benchmarks/results/bocd.json.

TCPD: the same default setting on every series of the TCPD directory, scored with the TCPDBench
protocol (``prism_core.tcpd``). Written to benchmarks/results/tcpd.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from prism_core import tcpd
from prism_core.bocd import bocd

RESULTS = Path(__file__).resolve().parent / "results"
# ../shared beside the repository, as CI lays it out.
TCPD_DIR = Path(os.environ.get("PRISM_TCPD_DIR", Path(__file__).resolve().parents[2] / "shared" / "data" / "tcpd"))
# BOCPD default setting in van den Burg & Williams (2020), mean over the paper's univariate series:
# a floor for the 31 series here, not a like-for-like comparison (the sets differ)
PUBLISHED_F1 = 0.662
PUBLISHED_COVER = 0.594


def synthetic_series(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A z-scored piecewise-constant series of ``n`` points and its true segment starts."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 2001, n // 50 + 1)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), n) + 1]
    # steps of 1 to 3 around a circle of circumference 4: levels in [-2, 2), consecutive ones >= 1 apart
    levels = np.cumsum(rng.uniform(1.0, 3.0, len(lengths))) % 4.0 - 2.0
    noise = rng.uniform(0.2, 0.6, len(lengths))
    x = (np.repeat(levels, lengths) + np.repeat(noise, lengths) * rng.standard_normal(lengths.sum()))[:n]
    starts = np.cumsum(lengths)[:-1]
    return (x - x.mean()) / x.std(ddof=1), starts[starts < n]


def time_bocd(n: int, seed: int = 0) -> dict:
    x, truth = synthetic_series(n, seed)
    wall, cpu = time.perf_counter(), time.process_time()
    result = bocd(x)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    found = result.changepoints
    nearest = np.abs(truth[:, None] - found[None, :]).min(axis=1) if len(found) else np.full(len(truth), n)
    return {
        "points": n,
        "points_per_second_cpu": round(n / cpu),
        "points_per_second_wall": round(n / wall),
        "seconds_cpu": round(cpu, 2),
        "max_live_runs": result.max_live_runs,
        "true_changepoints": len(truth),
        "found_changepoints": len(found),
        "true_found_exactly": int((nearest == 0).sum()),
        "true_found_within_2": int((nearest <= 2).sum()),
    }


def tcpd_summary(root: Path = TCPD_DIR) -> dict:
    """BOCD's default setting on every TCPD series, scored with the TCPDBench protocol."""
    summary = tcpd.summarize(tcpd.evaluate(tcpd.load_all(root), lambda z: bocd(z).changepoints))
    summary["published_bocpd_default_univariate"] = {"mean_f1": PUBLISHED_F1, "mean_cover": PUBLISHED_COVER}
    return summary


def write_json(path: Path, figures: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated series lengths")
    parser.add_argument("--tcpd-dir", type=Path, default=TCPD_DIR)
    args = parser.parse_args()

    runs = []
    for n in (int(float(size)) for size in args.sizes.split(",")):
        runs.append(time_bocd(n))
        print(json.dumps(runs[-1]))
    write_json(
        RESULTS / "bocd.json",
        {
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "numpy": np.__version__},
            "setting": "hazard_lambda=100, prior 0/1/1/1, prune_below=1e-4, MAP segmentation, z-scored input",
            "runs": runs,
        },
    )
    summary = tcpd_summary(args.tcpd_dir)
    write_json(RESULTS / "tcpd.json", summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "series"}))


if __name__ == "__main__":
    main()
