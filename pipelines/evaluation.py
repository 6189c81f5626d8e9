"""Loads a simulator truth directory and a warehouse, and scores one against the other."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from pipelines import storage, warehouse
from prism_core.evaluate import score_warehouse
from prism_core.truth import TRUTH_TABLES


class EvaluationError(ValueError):
    """The truth or the warehouse cannot be scored; the message says why."""


def evaluate_warehouse(truth_dir: str | Path, root: str | Path) -> dict[str, dict[str, dict]]:
    truth_dir = Path(truth_dir)
    if not (truth_dir / "noise.json").exists():
        raise EvaluationError(f"{truth_dir} is not a simulator truth directory (no noise.json)")
    if not storage.exists(storage.join(root, warehouse.DATABASE_FILE)):
        raise EvaluationError(f"{root} is not a Prism warehouse (no {warehouse.DATABASE_FILE}): run `prism run` first")
    truth = {name: pq.read_table(truth_dir / f"{name}.parquet", schema=schema) for name, schema in TRUTH_TABLES.items()}
    noise = json.loads((truth_dir / "noise.json").read_text())
    return score_warehouse(truth, noise, warehouse.load_tables(root))
