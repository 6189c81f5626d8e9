"""Shared fixtures: simulated scenarios are generated once per test session."""

from pathlib import Path

import pytest

from prism_core.simulate import write_scenario


@pytest.fixture(scope="session")
def scenario_dir(tmp_path_factory):
    """scenario_dir(name, seed=0, fmt="parquet") -> directory with flows/, topology.csv, truth/."""
    made: dict[tuple, Path] = {}

    def make(name: str, seed: int = 0, fmt: str = "parquet") -> Path:
        key = (name, seed, fmt)
        if key not in made:
            out = tmp_path_factory.mktemp(f"{name}-{seed}-{fmt.replace('.', '')}")
            write_scenario(name, out, seed, fmt=fmt)
            made[key] = out
        return made[key]

    return make
