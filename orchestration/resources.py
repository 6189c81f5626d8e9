"""What differs between environments: where flows arrive, the NIC inventory, the warehouse and the
Beam runner, as Dagster resources. In the code location their fields come from PRISM_* variables
through `dagster.EnvVar`, resolved when a run starts (`resources_from_env`); what shapes the
Definitions themselves (partitions, schedules, check thresholds) is `Settings`, read when the code
location loads. See docs/orchestration.md.
"""

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields

from dagster import ConfigurableResource, EnvVar

from pipelines import storage, warehouse
from pipelines.run import list_flow_files, load_topology
from prism_core.topology import Topology

# Without PRISM_FLOWS, the demo environment that `prism demo` writes.
DEMO_FLOWS = "prism-data/tiny/flows"
DEMO_TOPOLOGY = "prism-data/tiny/topology.csv"
DEFAULT_WAREHOUSE = "prism-warehouse"
DEFAULT_PARTITION_START = "2026-11-22-00:00"  # the simulator's day


class FlowSource(ConfigurableResource):
    """The directory (or object store prefix, e.g. s3://bucket/flows) that collectors write into."""

    directory: str

    def changed_since(self, instant: float) -> list[tuple[str, float]]:
        """(path, change time) of every flow file changed at or after `instant` (epoch seconds).
        Locally the change time is the later of mtime and ctime, so a file copied with its old
        mtime preserved (rsync -a, cp -p) still counts as new when it lands."""
        changed = []
        for path in list_flow_files(self.directory):
            if not storage.is_local(path):
                changed_at = storage.modified_ns(path) / 1e9
            else:
                status = os.stat(path)
                changed_at = max(status.st_mtime, status.st_ctime)
            if changed_at >= instant:
                changed.append((path, changed_at))
        return changed


class TopologyFile(ConfigurableResource):
    """The NIC inventory CSV; without one (empty path) the analysis refuses to run, as `prism run`
    does without --topology (pipelines.run.load_topology)."""

    path: str = ""

    def load(self) -> Topology:
        return load_topology(self.path or None)


class Warehouse(ConfigurableResource):
    """Hive-partitioned Parquet tables and the DuckDB file of views over them, in a directory or
    under an object store prefix (pipelines/storage.py)."""

    root: str

    def refresh_views(self) -> str:
        return warehouse.refresh_database(self.root)


class BeamOptions(ConfigurableResource):
    """Beam pipeline options as one shell-quoted command line. Empty: Beam's in-process FnApiRunner."""

    command_line: str = ""

    @property
    def args(self) -> list[str]:
        return shlex.split(self.command_line)


def resources_from_env() -> dict[str, ConfigurableResource]:
    """The code location's resources. A field whose variable is set reads it through
    `dagster.EnvVar`, so a run resolves it when it starts and the UI shows where it comes from;
    an unset one keeps its default: the demo data of `prism demo`, whose inventory goes only with
    the demo flows. Relative paths are relative to the directory the run works in."""

    def setting(variable: str, default: str) -> str:
        return EnvVar(variable) if variable in os.environ else default

    demo = "PRISM_FLOWS" not in os.environ
    return {
        "flow_source": FlowSource(directory=setting("PRISM_FLOWS", DEMO_FLOWS)),
        "topology": TopologyFile(path=setting("PRISM_TOPOLOGY", DEMO_TOPOLOGY if demo else "")),
        "warehouse": Warehouse(root=setting("PRISM_WAREHOUSE", DEFAULT_WAREHOUSE)),
        "beam": BeamOptions(command_line=setting("PRISM_BEAM_ARGS", "")),
    }


@dataclass(frozen=True)
class Settings:
    """What shapes the Definitions themselves, so it is known when the code location loads: the
    partitions, the schedules' minutes and the quarantine check's threshold."""

    partition_start: str = DEFAULT_PARTITION_START
    # Hours after the current one that exist as partitions: simulated data can be stamped later
    # than the clock. Keep 0 in production, or the schedule targets an hour still in progress.
    partition_end_offset: int = 0
    schedule_minute: int = 15  # the schedule waits this long after the hour for late files
    freshness_minute: int = 45  # by then the hour that just closed must be materialized
    max_quarantine_share: float = 0.02

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Settings":
        """Each field from its variable PRISM_<FIELD> (e.g. PRISM_PARTITION_END_OFFSET), else its
        default."""
        values = {}
        for field in fields(cls):
            variable = f"PRISM_{field.name.upper()}"
            if variable in environ:
                values[field.name] = field.type(environ[variable])
        return cls(**values)
