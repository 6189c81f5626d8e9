"""Analysis of one hour: job recognition over the hour's flow_minutes, then the flows keyed by job.

Recognition runs on one small element (the hour's per-minute pair aggregates). The hour's flows
are read as Parquet row groups, split by job with the recognition as a side input, grouped by
job_id, and each job is analyzed on its own, so jobs spread over workers on a distributed runner.
The split flows are staged (pipelines/staging.py): the grouping by job moves references only.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipelines import warehouse
from pipelines.staging import read_staged, stage_tables
from prism_core.analysis import (
    JOB_FLOW_COLUMNS, analyze_job, assemble_hour, jobs_to_analyze, open_membership, split_flows_by_job,
)
from prism_core.recognition import recognize_hour
from prism_core.topology import Topology

NAMESPACE = "prism.analyze"


def concat(parts: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def row_groups(path: str) -> list[tuple[str, int]]:
    """(path, index) of each row group of a Parquet file, so that workers read them in parallel."""
    with FileSystems.open(path) as handle:
        return [(path, index) for index in range(pq.ParquetFile(handle).num_row_groups)]


class ReadRowGroups(beam.DoFn):
    """A Parquet file -> its row groups, one Arrow table each."""

    def process(self, path: str):
        with FileSystems.open(path) as handle:
            parquet = pq.ParquetFile(handle)
            for index in range(parquet.num_row_groups):
                yield parquet.read_row_group(index)


class SplitByJob(beam.DoFn):
    """A row group of the hour's flows -> (job_id, (row group index, staged flows of the job)), by
    the spans each job holds its hosts for (prism_core.analysis.open_membership)."""

    def __init__(self, staging_dir: str):
        self.staging_dir = staging_dir
        self.unassigned = Metrics.counter(NAMESPACE, "flows_without_job")

    def process(self, row_group: tuple[str, int], membership: pa.Table):
        path, index = row_group
        with FileSystems.open(path) as handle:
            flows = pq.ParquetFile(handle).read_row_group(index, columns=list(JOB_FLOW_COLUMNS))
        staged = stage_tables(self.staging_dir, split_flows_by_job(flows, membership))
        for job_id, rows in staged:
            yield job_id, (index, rows)
        self.unassigned.inc(flows.num_rows - sum(rows.num_rows for _, rows in staged))


class AnalyzeJob(beam.DoFn):
    def __init__(self, previous: dict | None, hour_start_ns: int, hour_end_ns: int):
        self.previous = previous or {}
        self.hour = (hour_start_ns, hour_end_ns)

    def process(self, element, recognition):
        job_id, pieces = element
        # In file order whatever order the runner grouped them in.
        pieces = sorted((p for p in pieces if p is not None), key=lambda piece: piece[0])
        batches = read_staged([rows for _, rows in pieces])
        yield analyze_job(job_id, batches, recognition, self.previous, *self.hour)


class AnalyzeHour(beam.PTransform):
    """An hour's flow_minutes and flows partitions -> one HourAnalysis element."""

    def __init__(self, minutes_path: str, flows_path: str, topology: Topology, previous: dict | None,
                 hour_start_ns: int, hour_end_ns: int, staging_dir: str):
        super().__init__()
        self.paths, self.staging_dir = (minutes_path, flows_path), staging_dir
        self.topology, self.previous = topology, previous or {}
        self.hour = (hour_start_ns, hour_end_ns)

    def expand(self, pipeline):
        minutes_path, flows_path = self.paths
        recognition = (
            pipeline
            | "MinutesFile" >> beam.Create([minutes_path])
            | "ReadMinutes" >> beam.ParDo(ReadRowGroups())
            | "OneTable" >> beam.combiners.ToList()
            | "Recognize" >> beam.Map(
                lambda parts: recognize_hour(
                    concat(parts), self.topology, self.previous.get("jobs"), self.hour[0]
                )
            )
        )
        recognition_side = beam.pvalue.AsSingleton(recognition)
        spans = recognition | "HeldSpans" >> beam.Map(open_membership, self.hour[0])
        # Every job to analyze gets a key even without flows (None), so silent jobs are seen.
        every_job = recognition | "EveryJob" >> beam.FlatMap(
            lambda rec: [(job_id, None) for job_id in jobs_to_analyze(rec, self.previous)]
        )
        job_flows = (
            pipeline
            | "FlowsRowGroups" >> beam.Create(row_groups(flows_path))
            | "SplitByJob" >> beam.ParDo(SplitByJob(self.staging_dir), beam.pvalue.AsSingleton(spans))
        )
        return (
            (every_job, job_flows)
            | "WithEveryJob" >> beam.Flatten()
            | "GroupByJob" >> beam.GroupByKey()
            | "AnalyzeJob" >> beam.ParDo(AnalyzeJob(self.previous, *self.hour), recognition_side)
            | "AllJobs" >> beam.combiners.ToList()
            | "AssembleHour" >> beam.Map(assemble_hour, recognition_side)
        )


class WriteAnalysis(beam.DoFn):
    """Writes the hour's analysis tables and the state the next hour continues from."""

    def __init__(self, root: str, hour: datetime):
        self.root, self.hour = root, hour

    def process(self, analysis):
        for name, rows in analysis.tables.items():
            warehouse.write_partition(self.root, name, self.hour, rows)
        counts = {name: rows.num_rows for name, rows in analysis.tables.items()}
        warehouse.write_json(warehouse.stats_path(self.root, self.hour, "analysis_counts"), counts)
        # Written last: the next hour continues only from an hour whose tables are all in place.
        warehouse.write_json(warehouse.stats_path(self.root, self.hour, "analysis"), analysis.state)
        yield counts


def previous_hour_state(root: str, hour: datetime) -> dict | None:
    return warehouse.read_stats(root, hour - timedelta(hours=1), "analysis")
