"""The hourly run: every stage for every hour of a range, on any Beam runner.

Ingest and the minute windows run as one Beam pipeline over the whole range (hours are
independent there). Job analysis runs hour after hour, because each hour continues the job ids
and step numbers of the one before it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipelines import warehouse
from pipelines.analyze import AnalyzeHour, WriteAnalysis, previous_hour_state
from pipelines.staging import staging_area
from pipelines.ingest import NAMESPACE, HourRange, IngestFlows, write_hour
from prism_core.ingest import parquet_time_bounds, parse_flow_file
from prism_core.minutes import HOUR_NS
from prism_core.topology import Topology, TopologyError, first_few

log = logging.getLogger(__name__)

NO_INVENTORY = (
    "no NIC inventory: pass --topology FILE (a CSV of addr,host,gpu[,leaf,pod]), or --no-topology to "
    "take every address for its own host, which splits each multi-host job by rail and makes its issues unreliable"
)
WITHOUT_INVENTORY = (
    "no NIC inventory (--no-topology): every address was taken for its own GPU on its own host, so a job "
    "spanning hosts is reported once per rail, and its parallelism and issues are not reliable"
)


class RunError(RuntimeError):
    """A run cannot start or finish; the message is meant for the operator."""


@dataclass
class RunSummary:
    hours: list[datetime]
    counters: dict[str, int] = field(default_factory=dict)  # rows_read, flows, quarantined, ...
    per_hour: dict[str, dict[str, int]] = field(default_factory=dict)  # hour key -> table rows
    warnings: list[str] = field(default_factory=list)  # what the operator must know about the results


def list_flow_files(flows_dir: str) -> list[str]:
    """Every data file below `flows_dir`, sorted; hidden files (temporary writes) are skipped."""
    if "://" in flows_dir:
        matched = FileSystems.match([flows_dir.rstrip("/") + "/**"])[0].metadata_list
        paths = [m.path for m in matched]
    else:
        if not os.path.isdir(flows_dir):
            raise RunError(f"flow directory {flows_dir!r} does not exist or is not a directory")
        paths = [
            os.path.join(top, name)
            for top, dirs, names in os.walk(flows_dir)
            for name in names
            if not name.startswith(".")
        ]
    return sorted(p for p in paths if not os.path.basename(p).startswith("."))


def infer_range(flows_dir: str) -> tuple[datetime, datetime]:
    """The hours the valid flows of a directory span: [first hour, last hour + 1)."""
    bounds = [file_time_bounds(path) for path in list_flow_files(flows_dir)]
    bounds = [b for b in bounds if b is not None]
    if not bounds:
        raise RunError(f"no valid flow records in {flows_dir!r}: nothing to run")
    first_ns = min(b[0] for b in bounds) // HOUR_NS * HOUR_NS
    end_ns = max(b[1] for b in bounds) // HOUR_NS * HOUR_NS + HOUR_NS
    return (
        datetime.fromtimestamp(first_ns / 1e9, tz=timezone.utc),
        datetime.fromtimestamp(end_ns / 1e9, tz=timezone.utc),
    )


def file_time_bounds(path: str) -> tuple[int, int] | None:
    """Earliest and latest valid flow start in a file: from Parquet footer statistics when it has
    them, otherwise by parsing the file."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        bounds = parquet_time_bounds(handle)
        if bounds is None:
            handle.seek(0)
            starts = parse_flow_file(handle.read(), path).clean["time_flow_start_ns"]
            bounds = (pc.min(starts).as_py(), pc.max(starts).as_py()) if len(starts) else None
    return bounds


def pipeline_options(beam_args: Sequence[str] = ()) -> tuple[PipelineOptions, object | None]:
    """Beam options from command-line style arguments. Without --runner, the in-process
    FnApiRunner: Beam's DirectRunner would first try to download its Prism runner binary."""
    options = PipelineOptions(list(beam_args))
    runner = None if options.view_as(StandardOptions).runner else FnApiRunner()
    return options, runner


class WriteIngestHour(beam.DoFn):
    def __init__(self, root: str):
        self.root = root

    def process(self, element):
        hour_ns, grouped = element
        counts = write_hour(self.root, hour_ns, list(grouped["minutes"]), list(grouped["quarantine"]))
        hour = datetime.fromtimestamp(hour_ns / 1e9, tz=timezone.utc)
        warehouse.write_json(warehouse.stats_path(self.root, hour, "ingest"), counts)


def run_ingest(
    flows_dir: str, root: str, hours: list[datetime], beam_args: Sequence[str] = ()
) -> RunSummary:
    paths = list_flow_files(flows_dir)
    if not paths:
        raise RunError(f"no flow files in {flows_dir!r}")
    span = HourRange(int(hours[0].timestamp()) * 10**9, int(hours[-1].timestamp()) * 10**9 + HOUR_NS)
    options, runner = pipeline_options(beam_args)
    with staging_area(root) as staging_dir:
        pipeline = beam.Pipeline(runner=runner, options=options)
        ingested = (
            pipeline
            | "Files" >> beam.Create(paths)
            | "Spread" >> beam.Reshuffle()
            | "Ingest" >> IngestFlows(span, staging_dir)
        )
        every_hour = pipeline | "Hours" >> beam.Create([(h, None) for h in span.hours()])
        (
            {"hour": every_hour, "minutes": ingested["minutes"], "quarantine": ingested["quarantine"]}
            | "ByHour" >> beam.CoGroupByKey()
            | "Write" >> beam.ParDo(WriteIngestHour(str(root)))
        )
        result = pipeline.run()
        result.wait_until_finish()
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    }
    per_hour = {warehouse.hour_key(h): warehouse.read_stats(root, h, "ingest") for h in hours}
    return RunSummary(hours=hours, counters=counters, per_hour=per_hour)


def run_hours(
    flows_dir: str,
    root: str,
    start: datetime,
    end: datetime,
    *,
    topology_path: str | None = None,
    no_topology: bool = False,
    beam_args: Sequence[str] = (),
    on_stage: Callable[[str], None] = lambda stage: None,
) -> RunSummary:
    """Without `topology_path` the run is refused unless `no_topology` asks for it."""
    hours = warehouse.hours_between(start, end)
    if not hours:
        raise RunError(f"empty hour range: {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}")
    topology = load_topology(topology_path, no_topology=no_topology)
    Path(root).mkdir(parents=True, exist_ok=True)
    on_stage("checking the input")
    require_flows_in(flows_dir, hours)
    on_stage("ingest")
    summary = run_ingest(flows_dir, root, hours, beam_args)
    summary.warnings = inventory_warnings(topology, root, hours)
    for hour in hours:
        on_stage(f"analysis {hour:%Y-%m-%d %H}:00")
        summary.per_hour[warehouse.hour_key(hour)].update(run_analysis(root, hour, topology, beam_args))
    on_stage("warehouse")
    warehouse.refresh_database(root)
    return summary


def require_flows_in(flows_dir: str, hours: list[datetime]) -> None:
    """Refuse a range no flow file reaches before anything is written: a mistyped directory or
    range must not replace good partitions with empty ones."""
    span = HourRange(int(hours[0].timestamp()) * 10**9, int(hours[-1].timestamp()) * 10**9 + HOUR_NS)
    paths = list_flow_files(flows_dir)
    if not any(bounds and span.overlaps(*bounds) for bounds in map(file_time_bounds, paths)):
        raise RunError(
            f"no valid flow records between {hours[0]:%Y-%m-%d %H}:00 and {hours[-1]:%Y-%m-%d %H}:59 "
            f"in {flows_dir!r} ({len(paths)} files): nothing written"
        )


def require_previous_hour_analyzed(root: str, hour: datetime) -> None:
    """An hour continues the job state of the hour before; starting over when that hour has
    flows but no analysis would silently give its running jobs new ids."""
    previous = hour - timedelta(hours=1)
    if warehouse.read_stats(root, previous, "ingest") is not None and previous_hour_state(root, hour) is None:
        raise RunError(
            f"hour {warehouse.hour_key(previous)} is ingested but not analyzed, and hour "
            f"{warehouse.hour_key(hour)} continues its jobs: analyze {warehouse.hour_key(previous)} "
            "first (hours run in order)"
        )


def load_topology(path: str | None, *, no_topology: bool = False) -> Topology:
    """The inventory at `path`; without one, a refusal unless `no_topology` (every address its own
    host). Rows the inventory could not use are logged."""
    if path is None:
        if not no_topology:
            raise RunError(NO_INVENTORY)
        return Topology.empty()
    if no_topology:
        raise RunError("--topology and --no-topology exclude each other")
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            payload = handle.read()
    except (OSError, IOError) as error:
        raise RunError(f"cannot read topology file {path!r}: {error}") from None
    try:
        topology = Topology.from_csv_bytes(payload, path)
    except TopologyError as error:
        raise RunError(str(error)) from None
    if topology.topology_problems:
        log.warning("%s: %s", path, skipped_rows(topology))
    return topology


def skipped_rows(topology: Topology) -> str:
    problems = list(topology.topology_problems)
    return f"{len(problems)} inventory row{'s' if len(problems) > 1 else ''} skipped ({first_few(problems)})"


def inventory_warnings(topology: Topology, root: str, hours: list[datetime]) -> list[str]:
    """What the run summary says about the inventory: none used, rows it skipped (logged when it
    was loaded), and the addresses of the ingested hours it does not list at all."""
    if not topology.from_inventory:
        log.warning(WITHOUT_INVENTORY)
        return [WITHOUT_INVENTORY]
    warnings = [skipped_rows(topology)] if topology.topology_problems else []
    paths = [warehouse.partition_dir(root, "flow_minutes", hour) / warehouse.DATA_FILE for hour in hours]
    minutes = pa.concat_tables(pq.read_table(path, columns=["src_addr", "dst_addr"]) for path in paths)
    unlisted = topology.unlisted(pa.chunked_array(minutes["src_addr"].chunks + minutes["dst_addr"].chunks, pa.string()))
    if len(unlisted):
        warnings.append(
            f"{len(unlisted)} addresses in the flows are not in the inventory and were analyzed as non-GPU "
            f"endpoints (jobs on a GPU host it lacks are not found): {first_few(unlisted.to_pylist())}"
        )
        log.warning(warnings[-1])
    return warnings


def run_analysis(root: str, hour: datetime, topology: Topology, beam_args: Sequence[str] = ()) -> dict[str, int]:
    """Job analysis of one hour, continuing from the previous hour's state; the hour's ingest
    partitions must exist. Returns the rows written per table."""
    paths = [warehouse.partition_dir(root, t, hour) / warehouse.DATA_FILE for t in ("flow_minutes", "flows")]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise RunError(f"hour {hour:%Y-%m-%d %H}:00 has not been ingested: {', '.join(missing)} missing")
    require_previous_hour_analyzed(root, hour)
    # The inventory this analysis used, for the capacity reports; none without one.
    if topology.from_inventory:
        warehouse.write_topology(root, topology.inventory)
    else:
        warehouse.topology_path(root).unlink(missing_ok=True)
    hour_ns = int(hour.timestamp()) * 10**9
    options, runner = pipeline_options(beam_args)
    with staging_area(root) as staging_dir:
        pipeline = beam.Pipeline(runner=runner, options=options)
        (
            pipeline
            | "Analyze" >> AnalyzeHour(
                str(paths[0]), str(paths[1]), topology, previous_hour_state(root, hour), hour_ns,
                hour_ns + HOUR_NS, staging_dir,
            )
            | "Write" >> beam.ParDo(WriteAnalysis(str(root), hour))
        )
        pipeline.run().wait_until_finish()
    return warehouse.read_stats(root, hour, "analysis_counts")
