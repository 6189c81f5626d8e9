"""Golden check: a digest of every warehouse table and of the state carried between hours.

    python -m benchmarks.golden record [--fleet-seeds 0,3] [--small-seeds 0]
    python -m benchmarks.golden check  [--fleet-seeds 0,3] [--small-seeds 0]

A refactor that must not change Prism's output is checked here: `record` runs the whole pipeline
on simulated hours and writes one digest per scenario to benchmarks/results/golden/; `check` runs
them again and names every table whose rows differ. A digest is, per table, its row count and an
MD5 of the sums of its rows' MD5s (rows as DuckDB prints them), so it ignores row order and file
layout but not one value, in constant memory. Paths of the input directory are written as `<flows>` so that digests are portable.
tests/test_golden.py holds the `small` seed 0 digest as a unit test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "golden"
STATE_FILES = ("analysis", "ingest", "analysis_counts")


def warehouse_digest(root: str | Path, flows_dir: str | Path) -> dict[str, dict]:
    """{table or _state/<file>: {"rows": n, "md5": hex}} for every table and state file."""
    import duckdb

    root, digest = Path(root), {}
    con = duckdb.connect()
    for table in sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        files = sorted(str(p) for p in (root / table).rglob("*.parquet"))
        # the sums of each row's MD5 halves: independent of row order like a sorted concatenation,
        # but in constant memory (the fleet hour's `flows` as one sorted string took 13 GB)
        rows, md5 = con.execute(
            "SELECT count(*), md5(coalesce(sum(md5_number_lower(line))::VARCHAR, '') || '-'"
            " || coalesce(sum(md5_number_upper(line))::VARCHAR, '')) FROM ("
            " SELECT replace(t::VARCHAR, ?, '<flows>') AS line FROM read_parquet(?, hive_partitioning=false) t)",
            [str(flows_dir), files],
        ).fetchone()
        digest[table] = {"rows": rows, "md5": md5}
    for name in STATE_FILES:
        for path in sorted((root / "_state").rglob(f"{name}.json")):
            hour = path.parent.relative_to(root / "_state").as_posix()
            text = json.dumps(json.loads(path.read_text()), sort_keys=True).replace(str(flows_dir), "<flows>")
            digest[f"_state/{hour}/{name}"] = {"rows": 1, "md5": hashlib.md5(text.encode()).hexdigest()}
    return digest


def run_scenario(data: Path, root: Path) -> dict[str, dict]:
    """The whole pipeline on one simulated scenario directory, on the default runner."""
    from pipelines.run import infer_range, run_hours

    first, end = infer_range(str(data / "flows"))
    run_hours(str(data / "flows"), str(root), first, end, topology_path=str(data / "topology.csv"))
    return warehouse_digest(root, data / "flows")


def differences(expected: dict[str, dict], actual: dict[str, dict]) -> list[str]:
    """One line per table whose digest differs, is missing or is new."""
    lines = []
    for name in sorted(set(expected) | set(actual)):
        want, got = expected.get(name), actual.get(name)
        if want != got:
            lines.append(f"{name}: expected {want}, got {got}")
    return lines


def main() -> None:
    from benchmarks.accuracy import seeds
    from benchmarks.fleet import scenario

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("--fleet-seeds", default="0,3")
    parser.add_argument("--small-seeds", default="0")
    args = parser.parse_args()
    runs = [("small", s) for s in seeds(args.small_seeds)] + [("fleet", s) for s in seeds(args.fleet_seeds)]
    failed = False
    for name, seed in runs:
        with tempfile.TemporaryDirectory(prefix=f"prism-golden-{name}-{seed}-") as root:
            actual = run_scenario(scenario(seed, name), Path(root))
        path = RESULTS / f"{name}-{seed}.json"
        if args.action == "record":
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
            print(f"{name} seed {seed}: recorded {path}")
            continue
        lines = differences(json.loads(path.read_text()), actual)
        failed |= bool(lines)
        print(f"{name} seed {seed}: " + ("identical" if not lines else "DIFFERS\n  " + "\n  ".join(lines)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
