"""Benchmarks: each writes its figures to benchmarks/results/."""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from pathlib import Path


def stamp() -> dict:
    """When and on what figures were measured."""
    return {"measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()}}


def write_results(path: Path, figures: dict) -> None:
    """A benchmark's figures as JSON at `path`, stamped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**stamp(), **figures}, indent=1, sort_keys=True) + "\n")
