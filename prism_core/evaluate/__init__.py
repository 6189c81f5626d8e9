"""Scores a warehouse against the simulator's ground truth, stage by stage.

Each stage module exposes `score(truth, warehouse) -> dict[str, Figure]` over the tables it
needs; a stage whose warehouse tables are absent or empty is left out of the report, so the
scorer grows with the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from prism_core.evaluate import ingest, issues, jobs, steps
from prism_core.evaluate.figures import Figure

Tables = dict[str, pa.Table]

# stage -> (warehouse tables it needs, scorer)
STAGES: dict[str, tuple[tuple[str, ...], Callable[[Tables, Tables, dict], dict[str, Figure]]]] = {
    "ingest": (("flows", "quarantine"), ingest.score),
    "jobs": (("jobs", "job_gpus", "comm_pairs"), jobs.score),
    "steps": (("steps", "job_gpus"), steps.score),
    "issues": (("job_gpus", "issues"), issues.score),
}


def score_warehouse(truth: Tables, noise: dict, warehouse: Tables) -> dict[str, dict[str, dict]]:
    """{stage: {metric: {"value", "target", "ok"}}} for every stage whose tables exist."""
    report = {}
    for stage, (needs, scorer) in STAGES.items():
        if warehouse[needs[0]].num_rows:  # the stage has run
            report[stage] = {name: figure.as_dict() for name, figure in scorer(truth, warehouse, noise).items()}
    return report
