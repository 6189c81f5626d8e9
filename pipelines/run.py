"""The hourly run: every stage for every hour of a range, on any Beam runner.

Ingest and the grouping by minute run as one Beam pipeline over the whole range (hours are
independent there). Job analysis runs hour after hour, because each hour continues the job ids
and step numbers of the one before it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineResult

from pipelines import analyze, ingest, local_workers, storage, warehouse
from pipelines.analyze import AnalyzeHour, analysis_tables, previous_hour_state
from pipelines.ingest import HourRange, IngestFlows, hour_tables, written_before
from pipelines.shuffle_staging import shuffle_staging_area
from pipelines.sink import WriteTables
from prism_core.analysis import RecognitionError, recognize
from prism_core.config import DEFAULT_PARAMS, PrismParams
from prism_core.ingest import parquet_time_bounds, parse_flow_file
from prism_core.minutes import HOUR_NS
from prism_core.recognition import Recognition
from prism_core.topology import Topology, TopologyError, first_few

log = logging.getLogger(__name__)

BATCHES_PER_WORKER = 4  # with the in-process runner, so that a slow batch of files does not idle a core
NO_INVENTORY = (
    "no NIC inventory: pass --topology FILE (a CSV of addr,host,gpu[,leaf,pod]), or --no-topology to "
    "take every address for its own host, which splits each multi-host job by rail and makes its issues unreliable"
)
NO_COUNTERS = (
    "the runner collects no Beam counters, so the records read, quarantined and dropped as duplicates and "
    "the failed job analyses are not counted here: the tables hold them (quarantine, analysis_error issues)"
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
    # Beam counters: rows_read, flows, quarantined, ... of ingest; analysis_errors, ... of analysis
    counters: dict[str, int] = field(default_factory=dict)
    per_hour: dict[str, dict[str, int]] = field(default_factory=dict)  # hour key -> table rows
    warnings: list[str] = field(default_factory=list)  # what the operator must know about the results


def list_flow_files(flows_dir: str) -> list[str]:
    """Every data file below `flows_dir` (a directory or an object store prefix), sorted; hidden
    files (temporary writes) are skipped."""
    if storage.is_local(flows_dir) and not os.path.isdir(flows_dir):
        raise RunError(f"flow directory {flows_dir!r} does not exist or is not a directory")
    return [path for path in storage.files_below(flows_dir) if not storage.base_name(path).startswith(".")]


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
    with storage.open_input(path) as handle:
        bounds = parquet_time_bounds(handle)
        if bounds is None:
            handle.seek(0)
            starts = parse_flow_file(handle.read(), path).clean["time_flow_start_ns"]
            bounds = (pc.min(starts).as_py(), pc.max(starts).as_py()) if len(starts) else None
    return bounds


def pipeline_options(beam_args: Sequence[str] = ()) -> tuple[PipelineOptions, object | None, int]:
    """Beam options from command-line style arguments, the runner and the number of local worker
    processes (`--local_workers`, pipelines/local_workers.py). Without --runner, the in-process
    FnApiRunner: Beam's DirectRunner would first try to download its Prism runner binary."""
    options = PipelineOptions(list(beam_args))
    runner = None if options.view_as(StandardOptions).runner else FnApiRunner()
    try:
        workers = local_workers.local_workers(options)
    except ValueError as error:
        raise RunError(str(error)) from None
    local_workers.start(workers)
    return options, runner, workers


def finished(result: PipelineResult) -> PipelineResult:
    """`result` once its pipeline has finished."""
    try:
        result.wait_until_finish()
    finally:
        # Beam's Dask runner connects a client for each pipeline and leaves it open, retrying the
        # scheduler for as long as the process lives.
        client = getattr(result, "client", None)
        if client is not None:
            client.close()
    return result


def counters(result: PipelineResult, namespace: str) -> dict[str, int] | None:
    """The committed values of a finished pipeline's counters in `namespace`, by name; None when
    the runner collects no metrics (Beam's Dask runner)."""
    try:
        found = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    except NotImplementedError:
        return None
    return {counter.key.metric.name: counter.committed for counter in found}


@contextmanager
def staging_area(root: str, remover: Executor | None = None) -> Iterator[str]:
    """A shuffle staging area for one pipeline (pipelines/shuffle_staging.py). With `remover`, the
    area of a pipeline that finished is removed there, beside the run's next steps: unlinking the
    fleet hour's 0.8-1.2 GB of staged files waits 0.05-0.35 s on the disk. A failed pipeline's is
    removed at once."""
    with ExitStack() as area:
        yield area.enter_context(shuffle_staging_area(root))
        if remover is not None:
            remover.submit(area.pop_all().close)


def run_ingest(
    flows_dir: str, root: str, hours: list[datetime], beam_args: Sequence[str] = (), remover: Executor | None = None
) -> RunSummary:
    """The ingest of `hours`; `remover`: see `staging_area`."""
    paths = list_flow_files(flows_dir)
    if not paths:
        raise RunError(f"no flow files in {flows_dir!r}")
    span = HourRange(int(hours[0].timestamp()) * 10**9, int(hours[-1].timestamp()) * 10**9 + HOUR_NS)
    options, runner, workers = pipeline_options(beam_args)
    # The in-process runner: a few batches per local worker, each one staging file and one element
    # per minute (docs/performance.md). Any other: a file per batch, which its workers spread.
    in_process = local_workers.in_process(options)
    batches = ingest.file_batches(paths, workers * BATCHES_PER_WORKER if in_process else len(paths))
    with staging_area(root, remover) as shuffle_dir:
        if in_process:  # the local workers parse while this process builds and starts the pipeline
            local_workers.start_ahead(workers, [ingest.parse_task(batch, span, shuffle_dir) for batch in batches])
        try:
            pipeline = beam.Pipeline(runner=runner, options=options)
            build_ingest(pipeline, batches, root, span, shuffle_dir, workers)
            result = finished(pipeline.run())
        finally:
            local_workers.discard_ahead()
    per_hour = {warehouse.hour_key(h): warehouse.read_stats(root, h, "ingest") for h in hours}
    found = counters(result, ingest.NAMESPACE)
    if found is None:
        log.warning(NO_COUNTERS)
    return RunSummary(hours=hours, counters=found or {}, per_hour=per_hour,
                      warnings=[NO_COUNTERS] if found is None else [])


def build_ingest(pipeline: beam.Pipeline, batches: list[list[str]], root: str, span: HourRange,
                 shuffle_dir: str, workers: int) -> None:
    """Adds to `pipeline` the ingest of the batches of flow files (`ingest.file_batches`) for the
    hours of `span`, and the writes of their partitions and ingest state under `root`."""
    # The local workers parse the batches whatever bundle they come in; any other runner spreads
    # them by the Create's reshuffle. The hours only go to a grouping, which needs none.
    ingested = (
        pipeline
        | "Files" >> beam.Create(batches, reshuffle=workers == 1)
        | "Ingest" >> IngestFlows(span, shuffle_dir, workers, len(batches))
    )
    every_hour = pipeline | "Hours" >> beam.Create([(h, None) for h in span.hours()], reshuffle=False)
    (
        {"hour": every_hour, "minutes": ingested["minutes"], "quarantine": ingested["quarantine"]}
        | "ByHour" >> beam.CoGroupByKey()
        | "HourTables" >> beam.MapTuple(
            lambda hour_ns, grouped: hour_tables(hour_ns, list(grouped["minutes"]), list(grouped["quarantine"]))
        )
        | "Write" >> WriteTables(str(root), workers)
    )


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
    params: PrismParams = DEFAULT_PARAMS,
) -> RunSummary:
    """Without `topology_path` the run is refused unless `no_topology` asks for it. `params`: the
    inference's thresholds (prism_core.config; `prism run --config FILE`)."""
    hours = warehouse.hours_between(start, end)
    if not hours:
        raise RunError(f"empty hour range: {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}")
    topology = load_topology(topology_path, no_topology=no_topology)
    storage.make_dirs(root)
    on_stage("checking the input")
    require_flows_in(flows_dir, hours)
    on_stage("ingest")
    # The staging areas are removed by one thread beside the next steps, all before the run returns.
    # The inventory's warnings are read on another, beside the first hour's recognition and analysis:
    # before them, their ~0.1 s delayed the start of the next hour's recognition (RecognitionsAhead).
    with (ThreadPoolExecutor(1, thread_name_prefix="prism-staging-removal") as remover,
          ThreadPoolExecutor(1, thread_name_prefix="prism-inventory-check") as beside):
        summary = run_ingest(flows_dir, root, hours, beam_args, remover)
        unlisted = beside.submit(inventory_warnings, topology, root, hours)
        workers = local_workers.local_workers(PipelineOptions(list(beam_args)))  # valid: the ingest took them
        recognitions = RecognitionsAhead(root, hours, topology, params, workers)
        for hour in hours:
            on_stage(f"recognition {hour:%Y-%m-%d %H}:00")
            rows, analysis_counters = run_analysis(root, hour, topology, beam_args, params, on_stage, remover,
                                                   recognitions)
            summary.per_hour[warehouse.hour_key(hour)].update(rows)
            for name, value in analysis_counters.items():
                summary.counters[name] = summary.counters.get(name, 0) + value
        summary.warnings += unlisted.result()
        on_stage("warehouse")
        warehouse.refresh_database(root)
    return summary


def require_flows_in(flows_dir: str, hours: list[datetime]) -> None:
    """Refuse a range no flow file reaches before anything is written: a mistyped directory or
    range must not replace good partitions with empty ones."""
    span = HourRange(int(hours[0].timestamp()) * 10**9, int(hours[-1].timestamp()) * 10**9 + HOUR_NS)
    paths = list_flow_files(flows_dir)
    candidates = [path for path in paths if not written_before(path, span)]
    if not any(bounds and span.overlaps(*bounds) for bounds in map(file_time_bounds, candidates)):
        older = len(paths) - len(candidates)
        raise RunError(
            f"no valid flow records between {hours[0]:%Y-%m-%d %H}:00 and {hours[-1]:%Y-%m-%d %H}:59 "
            f"in {flows_dir!r} ({len(paths)} files"
            + (f", {older} of them last modified over an hour before the range and not read" if older else "")
            + "): nothing written"
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
        payload = storage.read_bytes(path)
    except OSError as error:
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
    paths = [warehouse.partition_file(root, "flow_minutes", hour) for hour in hours]
    minutes = pa.concat_tables(warehouse.read_parquet(path, columns=["src_addr", "dst_addr"]) for path in paths)
    unlisted = topology.unlisted(pa.chunked_array(minutes["src_addr"].chunks + minutes["dst_addr"].chunks, pa.string()))
    if len(unlisted):
        warnings.append(
            f"{len(unlisted)} addresses in the flows are not in the inventory and were analyzed as non-GPU "
            f"endpoints (jobs on a GPU host it lacks are not found): {first_few(unlisted.to_pylist())}"
        )
        log.warning(warnings[-1])
    return warnings


def recognize_ingested(root: str, hour: datetime, topology: Topology, previous: dict,
                       params: PrismParams = DEFAULT_PARAMS) -> Recognition:
    """The recognition of an ingested hour from its flow_minutes partition, continuing the jobs of
    `previous` (the previous hour's analysis state; prism_core.analysis.recognize)."""
    flow_minutes = warehouse.read_partition(root, "flow_minutes", hour)
    return recognize(flow_minutes, topology, previous, int(hour.timestamp()) * 10**9, params)


class RecognitionsAhead:
    """The recognition of each hour of a run, each hour's but the first started on a local worker
    (local_workers.submit) as soon as the hour before's is known, so that it runs beside that
    hour's analysis rather than between the two pipelines with a core idle (the fleet hour's:
    ~0.6 s). An hour's recognition continues only the jobs of the hour before's (its state's
    `jobs`, which the analysis writes as the recognition gave them), so it needs nothing of that
    hour's analysis; its failure fails its own hour, when the run gets there, as before."""

    def __init__(self, root: str, hours: list[datetime], topology: Topology, params: PrismParams, workers: int):
        self.root, self.hours, self.topology, self.params, self.workers = root, hours, topology, params, workers
        self.started: dict[datetime, Future] = {}

    def of(self, hour: datetime, previous: dict) -> Recognition:
        """The recognition of `hour`; `previous`: the previous hour's analysis state, for an hour
        whose recognition was not started ahead (the run's first)."""
        started = self.started.pop(hour, None)
        if started is None:
            recognition = recognize_ingested(self.root, hour, self.topology, previous, self.params)
        else:
            recognition = started.result()
        following = hour + timedelta(hours=1)
        if following in self.hours:
            # The state as the next hour would read it back from this hour's analysis state.
            carried = warehouse.as_read_back({"jobs": recognition.state})
            self.started[following] = local_workers.submit(
                self.workers, recognize_ingested, (self.root, following, self.topology, carried, self.params))
        return recognition


def run_analysis(
    root: str, hour: datetime, topology: Topology, beam_args: Sequence[str] = (),
    params: PrismParams = DEFAULT_PARAMS, on_stage: Callable[[str], None] = lambda stage: None,
    remover: Executor | None = None, recognitions: RecognitionsAhead | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """Job analysis of one hour, continuing from the previous hour's state; the hour's ingest
    partitions must exist. Returns the rows written per table and the analysis counters
    (`analysis_errors`: jobs whose analysis raised, each written as an analysis_error issue).
    A failed job recognition fails the hour before anything is written. `on_stage` hears when the
    per-job analysis starts, after the recognition; `remover`: see `staging_area`; `recognitions`:
    where the recognition is taken from in a run of several hours (`RecognitionsAhead`)."""
    paths = [warehouse.partition_file(root, t, hour) for t in ("flow_minutes", "flows")]
    missing = [p for p in paths if not storage.exists(p)]
    if missing:
        raise RunError(f"hour {hour:%Y-%m-%d %H}:00 has not been ingested: {', '.join(missing)} missing")
    require_previous_hour_analyzed(root, hour)
    previous = previous_hour_state(root, hour)
    try:
        if recognitions is None:
            recognition = recognize_ingested(root, hour, topology, previous or {}, params)
        else:
            recognition = recognitions.of(hour, previous or {})
    except RecognitionError as error:
        raise RunError(f"hour {warehouse.hour_key(hour)} not analyzed, nothing written: {error}") from None
    # The inventory this analysis used, for the capacity reports; none without one.
    if topology.from_inventory:
        warehouse.write_topology(root, topology.inventory)
    else:
        storage.delete(warehouse.topology_path(root))
    on_stage(f"analysis {hour:%Y-%m-%d %H}:00")
    options, runner, workers = pipeline_options(beam_args)
    with staging_area(root, remover) as shuffle_dir:
        pipeline = beam.Pipeline(runner=runner, options=options)
        build_analysis(pipeline, root, hour, paths[1], recognition, previous, shuffle_dir, params, workers)
        result = finished(pipeline.run())
    # A counter never incremented is not reported: no failed job is a count of 0, not a gap.
    found = counters(result, analyze.NAMESPACE)
    analysis_counters = {} if found is None else {"analysis_errors": 0, **found}
    return warehouse.read_stats(root, hour, "analysis_counts"), analysis_counters


def build_analysis(pipeline: beam.Pipeline, root: str, hour: datetime, flows_path: str, recognition: Recognition,
                   previous: dict | None, shuffle_dir: str, params: PrismParams, workers: int) -> None:
    """Adds to `pipeline` the analysis of the ingested `hour` under `root` (its `flows` partition
    at `flows_path`), given its recognition and the state of the hour before, and the writes of its
    tables and state."""
    hour_ns = int(hour.timestamp()) * 10**9
    (
        pipeline
        | "Analyze" >> AnalyzeHour(recognition, flows_path, previous, hour_ns, hour_ns + HOUR_NS, shuffle_dir,
                                   params, warehouse.read_stats(root, hour, "exporters"), workers)
        | "HourTables" >> beam.Map(analysis_tables, hour)
        | "Write" >> WriteTables(str(root), workers)
    )
