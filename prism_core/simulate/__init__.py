"""Cluster simulator with ground truth: multi-tenant LLM training traffic as flow records.

    from prism_core.simulate import SCENARIOS, write_scenario
    summary = write_scenario("tiny", "/tmp/tiny", seed=0)

writes `flows/` (per-exporter flow files), `topology.csv` and `truth/` (see `writer`). Modules:
`scenarios` (what runs where), `variation` (per-job departures from the textbook job: the `sealed`
family), `cluster` (addresses, leaves, GPU placement), `model` (step-time model, 1F1B),
`traffic` (one step's flows), `schedule` (a job's steps and faults), `replay` (real traces as a
job), `background` (non-job traffic), `export` (exporters, noise, files), `writer` (the streaming
loop and the truth tables).
"""

from prism_core.simulate.export import FORMATS
from prism_core.simulate.scenarios import SCENARIOS, FaultSpec, JobSpec, Scenario
from prism_core.simulate.writer import SimulationSummary, write_scenario

__all__ = ["FORMATS", "SCENARIOS", "FaultSpec", "JobSpec", "Scenario", "SimulationSummary", "write_scenario"]
