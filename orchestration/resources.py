"""What differs between environments: where flows arrive, the NIC inventory, the warehouse and the
Beam runner. Environment variables select them (see `Settings.from_env` and docs/orchestration.md).
"""

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from apache_beam.io.filesystems import FileSystems
from dagster import ConfigurableResource

from pipelines import warehouse
from pipelines.run import list_flow_files, load_topology
from prism_core.topology import Topology

# Without PRISM_FLOWS, the demo environment that `prism demo` writes.
DEMO_FLOWS = "prism-data/tiny/flows"
DEMO_TOPOLOGY = "prism-data/tiny/topology.csv"
DEFAULT_WAREHOUSE = "prism-warehouse"
DEFAULT_PARTITION_START = "2026-11-22-00:00"  # the simulator's day


class FlowSource(ConfigurableResource):
    """The directory (or Beam filesystem URL, e.g. gs://bucket/flows) that collectors write into."""

    directory: str

    def changed_since(self, instant: float) -> list[tuple[str, float]]:
        """(path, change time) of every flow file changed at or after `instant` (epoch seconds).
        Locally the change time is the later of mtime and ctime, so a file copied with its old
        mtime preserved (rsync -a, cp -p) still counts as new when it lands."""
        changed = []
        for path in list_flow_files(self.directory):
            if "://" in path:
                changed_at = FileSystems.match([path])[0].metadata_list[0].last_updated_in_seconds
            else:
                status = os.stat(path)
                changed_at = max(status.st_mtime, status.st_ctime)
            if changed_at >= instant:
                changed.append((path, changed_at))
        return changed


class TopologyFile(ConfigurableResource):
    """The NIC inventory CSV; without one every address is its own GPU on its own host."""

    path: str | None = None

    def load(self) -> Topology:
        return load_topology(self.path)


class Warehouse(ConfigurableResource):
    """Hive-partitioned Parquet tables and the DuckDB file of views over them."""

    root: str

    def refresh_views(self) -> Path:
        return warehouse.refresh_database(self.root)


class BeamOptions(ConfigurableResource):
    """Beam pipeline options as command-line arguments. Empty: Beam's in-process FnApiRunner."""

    args: list[str] = []


@dataclass(frozen=True)
class Settings:
    flows: str
    topology: str | None
    warehouse: str
    beam_args: tuple[str, ...] = ()
    partition_start: str = DEFAULT_PARTITION_START
    # Hours after the current one that exist as partitions: simulated data can be stamped later
    # than the clock. Keep 0 in production, or the schedule targets an hour still in progress.
    partition_end_offset: int = 0
    schedule_minute: int = 15  # the schedule waits this long after the hour for late files
    freshness_minute: int = 45  # by then the hour that just closed must be materialized
    max_quarantine_share: float = 0.02

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Settings":
        flows = env.get("PRISM_FLOWS")
        topology = env.get("PRISM_TOPOLOGY")
        if flows is None:
            flows, topology = DEMO_FLOWS, DEMO_TOPOLOGY if topology is None else topology
        return cls(
            flows=absolute(flows),
            topology=absolute(topology) if topology else None,
            warehouse=absolute(env.get("PRISM_WAREHOUSE", DEFAULT_WAREHOUSE)),
            beam_args=tuple(shlex.split(env.get("PRISM_BEAM_ARGS", ""))),
            partition_start=env.get("PRISM_PARTITION_START", DEFAULT_PARTITION_START),
            partition_end_offset=int(env.get("PRISM_PARTITION_END_OFFSET", "0")),
            schedule_minute=int(env.get("PRISM_SCHEDULE_MINUTE", "15")),
            freshness_minute=int(env.get("PRISM_FRESHNESS_MINUTE", "45")),
            max_quarantine_share=float(env.get("PRISM_MAX_QUARANTINE_SHARE", "0.02")),
        )

    def resources(self) -> dict[str, ConfigurableResource]:
        return {
            "flow_source": FlowSource(directory=self.flows),
            "topology": TopologyFile(path=self.topology),
            "warehouse": Warehouse(root=self.warehouse),
            "beam": BeamOptions(args=list(self.beam_args)),
        }


def absolute(path: str) -> str:
    """Local paths are made absolute (relative to the directory Dagster starts in); URLs stay."""
    return path if "://" in path else str(Path(path).resolve())
