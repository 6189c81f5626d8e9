"""Scores a warehouse against the simulator's ground truth, stage by stage.

Each stage module exposes `score(truth, warehouse, noise) -> dict[str, Figure]` over the tables
it needs. Every stage is scored, even when its tables are empty: a stage that found nothing
scores zero recall rather than vanishing from the report.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from prism_core.evaluate import ingest, issues, jobs, steps
from prism_core.evaluate.figures import Figure

Tables = dict[str, pa.Table]

STAGES: dict[str, Callable[[Tables, Tables, dict], dict[str, Figure]]] = {
    "ingest": ingest.score,
    "jobs": jobs.score,
    "steps": steps.score,
    "issues": issues.score,
}


def score_warehouse(truth: Tables, noise: dict, warehouse: Tables) -> dict[str, dict[str, dict]]:
    """{stage: {metric: {"value", "target", "ok"}}}."""
    return {
        stage: {name: figure.as_dict() for name, figure in scorer(truth, warehouse, noise).items()}
        for stage, scorer in STAGES.items()
    }
