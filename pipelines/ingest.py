"""Ingest: flow files -> validated, deduplicated, per-minute flows -> hourly partitions.

Elements are Arrow tables, never single records: a DoFn parses a whole file with vectorized code
and stages one table per event-time minute, and a bundle of files emits one element per minute, so
only a few hundred small elements per hour travel through the minute windows and the hourly
grouping (see DESIGN.md, "Elements are batches"). The flow rows are staged once, as parsed
(pipelines/shuffle_staging.py): only references to them are shuffled, a minute's merge stages just
the order of the rows it keeps, and the sink (pipelines/sink.py) streams the hour's partition
minute by minute from the parsed rows in that order, so memory stays bounded by one minute and
one row group.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from pipelines.shuffle_staging import StagingFile, TableRef, read_staged
from pipelines.sink import HourTables
from prism_core.arrays import group_indices
from prism_core.ingest import deduplicated_order, parquet_time_bounds, parse_flow_file
from prism_core.minutes import HOUR_NS, MINUTE_NS, minute_aggregates
from prism_core.resolution import ExporterTally, exporter_profiles, tally_exporters
from prism_core.schema import FLOW_MINUTES, QUARANTINE

NAMESPACE = "prism.ingest"
QUARANTINE_TAG = "quarantine"


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
    aggregates: pa.Table  # FLOW_MINUTES rows of the minute
    duplicates: int
    exporters: ExporterTally  # what each exporter's kept records of the minute show


def quarantine_hours(parsed_start_ns: np.ndarray, file_starts_ns: np.ndarray, modified_ns: int) -> np.ndarray:
    """The hour each quarantined row belongs to: its own start time when that parsed, else the
    median start time of its file's valid rows, else the hour the file was last modified. Depends
    only on the file, so every run that reads it puts a bad row in the same hour, and only once."""
    fallback_ns = int(np.median(file_starts_ns)) if len(file_starts_ns) else modified_ns
    own = np.where(parsed_start_ns >= 0, parsed_start_ns, fallback_ns)
    return own // HOUR_NS * HOUR_NS


class ParseFlowFiles(beam.DoFn):
    """Reads one file, validates every record, stages the in-range clean rows as one table per
    event-time minute and emits the quarantined rows per hour. The staged minutes of the whole
    bundle go out when it finishes, as one element per minute (timestamped for the minute
    windows) listing its tables: ~60 elements per bundle instead of one per file and minute
    (8.5 k for the fleet hour), which the runner encodes, windows and groups one by one."""

    def __init__(self, hours: HourRange, shuffle_dir: str):
        self.hours, self.shuffle_dir = hours, shuffle_dir
        self.rows_read = Metrics.counter(NAMESPACE, "rows_read")
        self.quarantined = Metrics.counter(NAMESPACE, "quarantined")
        self.out_of_range = Metrics.counter(NAMESPACE, "out_of_range")
        self.files = Metrics.counter(NAMESPACE, "files")
        self.files_skipped = Metrics.counter(NAMESPACE, "files_skipped")

    def start_bundle(self):
        self.staged = StagingFile(self.shuffle_dir)
        self.minutes: dict[int, list[TableRef]] = {}

    def finish_bundle(self):
        self.staged.close()  # its references are readable from here on
        for minute_ns, tables in self.minutes.items():
            hour_ns = minute_ns // HOUR_NS * HOUR_NS
            minute = Timestamp(micros=minute_ns // 1000)
            yield window.GlobalWindows.windowed_value((hour_ns, tables), minute)

    def process(self, path: str):
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            bounds = parquet_time_bounds(handle)
            if bounds is not None and not self.hours.overlaps(*bounds):
                self.files_skipped.inc()  # its footer says no row of it falls in the run's hours
                return
            handle.seek(0)
            parsed = parse_flow_file(handle.read(), path)
        self.files.inc()
        self.rows_read.inc(parsed.rows_read)

        starts = parsed.clean["time_flow_start_ns"].to_numpy()
        in_range = self.hours.contains(starts)
        self.out_of_range.inc(int((~in_range).sum()))
        clean = parsed.clean if in_range.all() else parsed.clean.filter(pa.array(in_range))
        minutes = starts[in_range] // MINUTE_NS * MINUTE_NS
        for minute_ns, rows in minute_runs(clean, minutes):
            self.minutes.setdefault(minute_ns, []).append(self.staged.append(rows))

        if parsed.quarantine.num_rows:
            modified_ns = int(FileSystems.last_updated(path) * 1e9)
            hours = quarantine_hours(parsed.quarantine_start_ns, starts, modified_ns)
            kept = self.hours.contains(hours)
            self.quarantined.inc(int(kept.sum()))
            self.out_of_range.inc(int((~kept).sum()))
            for hour_ns, rows in group_indices(hours[kept]):
                yield beam.pvalue.TaggedOutput(
                    QUARANTINE_TAG, (hour_ns, parsed.quarantine.filter(pa.array(kept)).take(rows))
                )


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


class MergeMinute(beam.DoFn):
    """All of one minute's batches: find the duplicates across files, aggregate per NIC pair, and
    stage the order of the rows to keep for the hour's writer. The rows themselves are not
    copied: the writer takes them from the parsed files (staging them again cost more than
    taking them twice)."""

    def __init__(self, shuffle_dir: str):
        self.shuffle_dir = shuffle_dir
        self.duplicates = Metrics.counter(NAMESPACE, "duplicates")
        self.clean = Metrics.counter(NAMESPACE, "flows")

    def start_bundle(self):
        self.staged = StagingFile(self.shuffle_dir)

    def finish_bundle(self):
        self.staged.close()

    def process(self, element, minute=beam.DoFn.WindowParam):
        hour_ns, tables_per_bundle = element
        parsed = [table for tables in tables_per_bundle for table in tables]
        rows = pa.concat_tables(read_staged(parsed))
        kept = deduplicated_order(rows)
        duplicates = rows.num_rows - len(kept)
        self.duplicates.inc(duplicates)
        self.clean.inc(len(kept))
        counted = np.zeros(rows.num_rows, bool)
        counted[kept] = True
        yield hour_ns, MinuteResult(
            minute_ns=int(minute.start.micros) * 1000,
            flows=StagedFlows(parsed, self.staged.append(pa.table({"row": kept}))),
            aggregates=minute_aggregates(rows, counted),
            duplicates=duplicates,
            exporters=tally_exporters(rows.take(kept)),
        )


class IngestFlows(beam.PTransform):
    """Paths of flow files -> {"minutes": (hour_ns, MinuteResult), "quarantine": (hour_ns, table)},
    both in the global window, keyed by the hour they belong to. Flow rows are staged under
    `shuffle_dir` (pipelines/shuffle_staging.py), which must outlive the pipeline's run."""

    def __init__(self, hours: HourRange, shuffle_dir: str):
        super().__init__()
        self.hours, self.shuffle_dir = hours, shuffle_dir

    def expand(self, paths):
        parsed = paths | "Parse" >> beam.ParDo(ParseFlowFiles(self.hours, self.shuffle_dir)).with_outputs(
            QUARANTINE_TAG, main="clean"
        )
        minutes = (
            parsed.clean
            | "MinuteWindows" >> beam.WindowInto(window.FixedWindows(60))
            | "GroupMinute" >> beam.GroupByKey()
            | "MergeMinute" >> beam.ParDo(MergeMinute(self.shuffle_dir))
            | "BackToGlobal" >> beam.WindowInto(window.GlobalWindows())
        )
        return {"minutes": minutes, "quarantine": parsed[QUARANTINE_TAG]}


def hour_tables(hour_ns: int, minutes: list[MinuteResult], quarantine: list[pa.Table]) -> HourTables:
    """The hour's `flows`, `flow_minutes` and `quarantine` partitions (in a deterministic row
    order), and its ingest state: their row counts and the duplicates dropped; and what each
    exporter's records of the hour show (`exporters`, prism_core.resolution)."""
    hour = datetime.fromtimestamp(hour_ns / 1e9, tz=timezone.utc)
    minutes = sorted(minutes, key=lambda result: result.minute_ns)
    aggregates = (
        pa.concat_tables([m.aggregates for m in minutes]) if minutes else FLOW_MINUTES.empty_table()
    )
    rejected = (
        pa.concat_tables(quarantine).sort_by([("source", "ascending"), ("row", "ascending")])
        if quarantine
        else QUARANTINE.empty_table()
    )
    counts = {
        "flows": sum(m.flows.num_rows for m in minutes),
        "flow_minutes": aggregates.num_rows,
        "quarantine": rejected.num_rows,
        "duplicates": sum(m.duplicates for m in minutes),
    }
    tally = ExporterTally()
    for minute in minutes:
        tally = tally.merge(minute.exporters)
    return HourTables(
        hour,
        tables={"flows": [m.flows for m in minutes], "flow_minutes": [aggregates], "quarantine": [rejected]},
        # ingest.json last: it marks the hour ingested
        state={"exporters": {"exporters": [p.to_json() for p in exporter_profiles(tally)]}, "ingest": counts},
    )
