"""Ingest: flow files -> validated, deduplicated, per-minute flows -> hourly partitions.

Elements are Arrow tables, never single records: a DoFn parses a whole file with vectorized code
and stages one table per event-time minute, and a batch of files emits one element per minute, so
only a few hundred small elements per hour travel through the grouping by minute and by hour (see
DESIGN.md, "Elements are batches"). The flow rows are staged once, as parsed
(pipelines/shuffle_staging.py): only references to them are shuffled, a minute's merge stages just
the order of the rows it keeps and its per-minute aggregates, and the sink (pipelines/sink.py)
streams the hour's partitions minute by minute from the staged rows, so memory stays bounded by
one minute and one row group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from pipelines import storage
from pipelines.local_workers import PooledDoFn, Task, start_ahead
from pipelines.shuffle_staging import StagedObject, StagingFile, TableRef, read_staged, stage_object, stage_tables
from pipelines.sink import HourTables
from prism_core.arrays import CODES_SUFFIX, column_hash, group_indices, with_codes
from prism_core.ingest import deduplicated_order, parquet_time_bounds, parse_flow_file
from prism_core.minutes import HOUR_NS, MINUTE_NS, minute_aggregates
from prism_core.resolution import exporter_profiles, merge_tallies, tally_exporters
from prism_core.schema import FIVE_TUPLE, QUARANTINE

NAMESPACE = "prism.ingest"


@dataclass(frozen=True)
class HourRange:
    """Hours [first_ns, end_ns) of a run, as epoch nanoseconds on hour boundaries."""

    first_ns: int
    end_ns: int

    def contains(self, start_ns: np.ndarray) -> np.ndarray:
        return (start_ns >= self.first_ns) & (start_ns < self.end_ns)

    def overlaps(self, low_ns: int, high_ns: int) -> bool:
        return low_ns < self.end_ns and high_ns >= self.first_ns

    def hours(self) -> list[int]:
        return list(range(self.first_ns, self.end_ns, HOUR_NS))


@dataclass(frozen=True)
class StagedFlows:
    """A minute's flows, left in the shuffle staging files until the hour's partition is written."""

    parsed: list[TableRef]  # the minute's rows of each file that has some, as parsed
    kept: TableRef  # column "row": the minute's flows (deduplicated, sorted) as rows of `parsed`

    @property
    def num_rows(self) -> int:
        return self.kept.num_rows

    def read(self) -> pa.Table:
        """The kept rows of the parsed tables concatenated, in order."""
        [kept] = read_staged([self.kept])
        return pa.concat_tables(read_staged(self.parsed)).take(kept["row"])


@dataclass
class MinuteResult:
    minute_ns: int
    flows: StagedFlows
    aggregates: TableRef  # FLOW_MINUTES rows of the minute, staged
    duplicates: int
    # the ExporterTally of the minute's kept records (what each exporter's records show), staged:
    # its two histograms (~285 kB a minute for the fleet hour) were pickled ~7 times on the way
    exporters: StagedObject


def quarantine_hours(parsed_start_ns: np.ndarray, file_starts_ns: np.ndarray, modified_ns: int) -> np.ndarray:
    """The hour each quarantined row belongs to: its own start time when that parsed, else the
    median start time of its file's valid rows, else the hour the file was last modified. Depends
    only on the file, so every run that reads it puts a bad row in the same hour, and only once."""
    fallback_ns = int(np.median(file_starts_ns)) if len(file_starts_ns) else modified_ns
    own = np.where(parsed_start_ns >= 0, parsed_start_ns, fallback_ns)
    return own // HOUR_NS * HOUR_NS


@dataclass
class ParsedFiles:
    """What `parse_files` made of a batch of files: each minute's staged tables (in file order),
    the batch's quarantined rows of each hour, staged, and the counters' increments."""

    minutes: dict[int, list[TableRef]]
    quarantine: list[tuple[int, TableRef]]
    counts: dict[str, int]


def parse_files(paths: list[str], hours: HourRange, shuffle_dir: str) -> ParsedFiles:
    """Reads each file, validates every record, stages its in-range clean rows as one table per
    event-time minute (all the batch's tables in one staging file) and its quarantined rows as one
    table per hour. Staged, the quarantined rows (~6 MB of text for the fleet hour, one table per
    file) are not pickled on each of their ~5 ways to the writer, nor are they ~500 elements."""
    parsed_files = ParsedFiles({}, [], dict.fromkeys(COUNTERS, 0))
    quarantined: dict[int, list[pa.Table]] = {}
    staged = StagingFile(shuffle_dir)
    try:
        for path in paths:
            parse_file(path, hours, staged, parsed_files, quarantined)
    finally:
        staged.close()  # its references are readable from here on
    parsed_files.quarantine = stage_tables(
        shuffle_dir, [(hour_ns, pa.concat_tables(tables)) for hour_ns, tables in sorted(quarantined.items())])
    return parsed_files


def written_before(path: str, hours: HourRange) -> bool:
    """Whether the file was last written well before the run's first hour began: a flow's record
    is written after the flow starts, so no row of the run's hours can be in it. Skipping such
    files unopened keeps an hourly run over a directory that keeps every past file from reading
    (JSON lines: parsing) the whole history again each hour."""
    return storage.modified_ns(path) < hours.first_ns - EXPORTER_CLOCK_LEAD_NS


def parse_file(path: str, hours: HourRange, staged: StagingFile, into: ParsedFiles,
               quarantined: dict[int, list[pa.Table]]) -> None:
    """`parse_files` of one file: its minutes' tables staged into `staged`, its quarantined rows
    added to `quarantined` by hour."""
    counts = into.counts
    if written_before(path, hours):
        counts["files_skipped"] += 1
        return
    with storage.open_input(path) as handle:
        bounds = parquet_time_bounds(handle)
        if bounds is not None and not hours.overlaps(*bounds):
            counts["files_skipped"] += 1  # its footer says no row of it falls in the run's hours
            return
        handle.seek(0)
        parsed = parse_flow_file(handle.read(), path)
    counts["files"] += 1
    counts["rows_read"] += parsed.rows_read

    starts = parsed.clean["time_flow_start_ns"].to_numpy()
    in_range = hours.contains(starts)
    counts["out_of_range"] += int((~in_range).sum())
    clean = parsed.clean if in_range.all() else parsed.clean.filter(pa.array(in_range))
    minutes = starts[in_range] // MINUTE_NS * MINUTE_NS
    for minute_ns, rows in minute_runs(clean, minutes):
        into.minutes.setdefault(minute_ns, []).append(staged.append(rows))

    if parsed.quarantine.num_rows:
        modified_ns = storage.modified_ns(path)
        quarantined_hours = quarantine_hours(parsed.quarantine_start_ns, starts, modified_ns)
        kept = hours.contains(quarantined_hours)
        counts["quarantined"] += int(kept.sum())
        counts["out_of_range"] += int((~kept).sum())
        for hour_ns, rows in group_indices(quarantined_hours[kept]):
            quarantined.setdefault(hour_ns, []).append(parsed.quarantine.filter(pa.array(kept)).take(rows))


EXPORTER_CLOCK_LEAD_NS = HOUR_NS  # how far ahead of the file system's clock an exporter's may run, at most
COUNTERS = ("rows_read", "quarantined", "out_of_range", "files", "files_skipped")


def file_batches(paths: list[str], batches: int) -> list[list[str]]:
    """The files in `batches` runs of consecutive files (fewer when there are fewer files), each
    an element that `parse_files` takes, of about equal parse cost where the files are local: a
    file costs its bytes and a fixed PARSE_COST_PER_FILE_BYTES (the fleet hour's files differ ~2.5x
    in size, and equal counts gave batches of 18-39 MB: 0.55-0.89 s of CPU each, so one core
    waited for the last). Files on an object store, whose sizes would cost a request each, count
    alike."""
    batches = max(1, min(len(paths), batches))
    if not paths or not all(storage.is_local(path) for path in paths):
        return [list(batch) for batch in np.array_split(np.array(paths, object), batches) if len(batch)]
    costs = np.array([os.path.getsize(path) for path in paths]) + PARSE_COST_PER_FILE_BYTES
    middles = np.cumsum(costs) - costs / 2
    # a batch ends before the first file whose middle lies past its share of the whole cost
    bounds = np.searchsorted(middles, np.arange(1, batches) * costs.sum() / batches)
    return [list(batch) for batch in np.split(np.array(paths, object), bounds) if len(batch)]


# what parsing a flow file costs beyond its bytes (opening, footer, validation's fixed steps), as
# bytes: the fleet hour's batches of ~68 files took ~0.27 s + ~16 ms per MB of CPU
PARSE_COST_PER_FILE_BYTES = 256 << 10


def parse_task(paths: list[str], hours: HourRange, shuffle_dir: str) -> Task:
    """The local workers' task that parses a batch of files (`ParseFlowFiles`; `local_workers.start_ahead`)."""
    return parse_files, (paths, hours, shuffle_dir)


class ParseFlowFiles(PooledDoFn):
    """A batch of flow files -> what `parse_files` made of them (ParsedFiles), on the local workers
    (pipelines/local_workers.py). A bundle that held all `batches` of the ingest (the in-process
    runner's one) knows every minute's tables once it is parsed, and starts their merges
    (`MergeMinute`'s tasks) on the workers ahead of the grouping by minute (local_workers.start_ahead):
    between the last batch parsed and the first merge the fleet hour's launcher alone took ~0.2 s."""

    def __init__(self, hours: HourRange, shuffle_dir: str, workers: int = 1, batches: int = 0):
        super().__init__(workers)
        self.hours, self.shuffle_dir, self.batches = hours, shuffle_dir, batches
        self.counters = {name: Metrics.counter(NAMESPACE, name) for name in COUNTERS}

    def process(self, paths: list[str], window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        yield from self.defer(*parse_task(paths, self.hours, self.shuffle_dir), window, timestamp, cost=len(paths))

    def outputs(self, parsed: ParsedFiles):
        for name, value in parsed.counts.items():
            self.counters[name].inc(value)
        yield parsed

    def finish_bundle(self):
        parsed = []
        for output in super().finish_bundle():
            parsed.append(output.value)
            yield output
        if parsed and len(parsed) == self.batches:
            start_ahead(self.workers, merge_tasks(parsed, self.shuffle_dir))


def minute_runs(rows: pa.Table, minutes: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """(minute, its rows in file order) in minute order. Exporters mostly write in time order, so
    the rows are reordered only when they are not (one take, not one per minute: ~8x cheaper)."""
    if np.any(minutes[1:] < minutes[:-1]):
        order = np.argsort(minutes, kind="stable")
        rows, minutes = rows.take(order), minutes[order]
    bounds = np.flatnonzero(np.diff(minutes)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(minutes)]):
        if stop > start:
            yield int(minutes[start]), rows.slice(start, stop - start)


def merge_minute(minute_ns: int, parsed: list[TableRef], shuffle_dir: str) -> MinuteResult:
    """All of one minute's staged tables: find the duplicates across files, aggregate per NIC
    pair, and stage the order of the rows to keep and the aggregates for the hour's writer. The
    rows themselves are not copied: the writer takes them from the parsed files (staging them
    again cost more than taking them twice). The aggregates (~7 k rows a minute) and the exporters'
    tally are staged rather than carried: as an element they were pickled ~5 times on the way to
    the writer, ~1 s of CPU for the fleet hour, most of it the launcher's while both workers waited."""
    # the addresses hashed once, to codes, and the 5-tuples once, which the duplicates' check and
    # the exporters' tally share
    rows = with_codes(pa.concat_tables(read_staged(parsed)), ADDRESS_COLUMNS)
    five_tuples = column_hash(rows, FIVE_TUPLE)
    kept = deduplicated_order(rows, five_tuples)
    counted = np.zeros(rows.num_rows, bool)
    counted[kept] = True
    return MinuteResult(
        minute_ns=minute_ns,
        flows=StagedFlows(parsed, stage_tables(shuffle_dir, [(None, pa.table({"row": kept}))])[0][1]),
        aggregates=stage_tables(shuffle_dir, [(None, minute_aggregates(rows, counted))])[0][1],
        duplicates=rows.num_rows - len(kept),
        exporters=stage_object(shuffle_dir, tally_exporters(rows.select(TALLIED_COLUMNS).take(kept),
                                                            five_tuples=five_tuples[kept])),
    )


ADDRESS_COLUMNS = ("src_addr", "dst_addr", "sampler_address")
# what `tally_exporters` reads given the 5-tuples' hashes: the exporter as its codes only, so the kept
# rows' text is not copied
TALLIED_COLUMNS = ("time_flow_start_ns", "time_flow_end_ns", "bytes", "sampling_rate", "sampler_address" + CODES_SUFFIX)


def merge_cost(parsed: list[TableRef]) -> int:
    return sum(table.num_rows for table in parsed)


def merge_tasks(batches: list[ParsedFiles], shuffle_dir: str) -> list[Task]:
    """The tasks of `MergeMinute` for the minutes of the parsed `batches` (in the order they were
    parsed, as the grouping by minute hands them on), costliest first."""
    minutes: dict[int, list[TableRef]] = {}
    for batch in batches:
        for minute_ns, tables in batch.minutes.items():
            minutes.setdefault(minute_ns, []).extend(tables)
    by_cost = sorted(minutes.items(), key=lambda minute: -merge_cost(minute[1]))
    return [(merge_minute, (minute_ns, parsed, shuffle_dir)) for minute_ns, parsed in by_cost]


class MergeMinute(PooledDoFn):
    """(minute, the tables of its batches) -> (hour, MinuteResult), by `merge_minute` on the local
    workers."""

    def __init__(self, shuffle_dir: str, workers: int = 1):
        super().__init__(workers)
        self.shuffle_dir = shuffle_dir
        self.duplicates = Metrics.counter(NAMESPACE, "duplicates")
        self.clean = Metrics.counter(NAMESPACE, "flows")

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        minute_ns, tables_per_batch = element
        parsed = [table for tables in tables_per_batch for table in tables]
        yield from self.defer(merge_minute, (minute_ns, parsed, self.shuffle_dir), window, timestamp,
                              cost=merge_cost(parsed))

    def outputs(self, result: MinuteResult):
        self.duplicates.inc(result.duplicates)
        self.clean.inc(result.flows.num_rows)
        yield result.minute_ns // HOUR_NS * HOUR_NS, result


class IngestFlows(beam.PTransform):
    """Batches of flow files (`file_batches`) -> {"minutes": (hour_ns, MinuteResult), "quarantine":
    (hour_ns, TableRef of quarantined rows)}, keyed by the hour they belong to. Flow rows and
    quarantined rows are staged under `shuffle_dir` (pipelines/shuffle_staging.py), which must
    outlive the pipeline's run. Files are parsed and minutes merged on `workers` local worker
    processes (pipelines/local_workers.py); `batches`, the number of batches when known, lets the
    minutes' merges start ahead (`ParseFlowFiles`): whoever runs the pipeline then calls
    `local_workers.discard_ahead` once it has run.

    Only portable primitives, so that every runner executes it alike (Beam's Dask runner has no
    windows and no tagged outputs): a flow's event-time minute is the key its tables are grouped
    by, and the minutes and the quarantined rows are two selections of the parsed batches."""

    def __init__(self, hours: HourRange, shuffle_dir: str, workers: int = 1, batches: int = 0):
        super().__init__()
        self.hours, self.shuffle_dir, self.workers, self.batches = hours, shuffle_dir, workers, batches

    def expand(self, batches):
        parsed = batches | "Parse" >> beam.ParDo(
            ParseFlowFiles(self.hours, self.shuffle_dir, self.workers, self.batches))
        minutes = (
            parsed
            | "ByMinute" >> beam.FlatMap(lambda batch: batch.minutes.items())
            | "GroupMinute" >> beam.GroupByKey()
            | "MergeMinute" >> beam.ParDo(MergeMinute(self.shuffle_dir, self.workers))
        )
        quarantine = parsed | "Quarantine" >> beam.FlatMap(lambda batch: batch.quarantine)
        return {"minutes": minutes, "quarantine": quarantine}


def hour_tables(hour_ns: int, minutes: list[MinuteResult], quarantine: list[TableRef]) -> HourTables:
    """The hour's `flows`, `flow_minutes` and `quarantine` partitions (in a deterministic row
    order), and its ingest state: their row counts and the duplicates dropped; and what each
    exporter's records of the hour show (`exporters`, prism_core.resolution)."""
    hour = datetime.fromtimestamp(hour_ns / 1e9, tz=timezone.utc)
    minutes = sorted(minutes, key=lambda result: result.minute_ns)
    rejected = (
        pa.concat_tables(read_staged(quarantine)).sort_by([("source", "ascending"), ("row", "ascending")])
        if quarantine
        else QUARANTINE.empty_table()
    )
    counts = {
        "flows": sum(m.flows.num_rows for m in minutes),
        "flow_minutes": sum(m.aggregates.num_rows for m in minutes),
        "quarantine": rejected.num_rows,
        "duplicates": sum(m.duplicates for m in minutes),
    }
    tally = merge_tallies([minute.exporters.get() for minute in minutes])
    return HourTables(
        hour,
        tables={"flows": [m.flows for m in minutes], "flow_minutes": [m.aggregates for m in minutes],
                "quarantine": [rejected]},
        # ingest.json last: it marks the hour ingested
        state={"exporters": {"exporters": [p.to_json() for p in exporter_profiles(tally)]}, "ingest": counts},
    )
