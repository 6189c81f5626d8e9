"""Analysis of one hour: the flows keyed by job, given the hour's job recognition.

Recognition (over the hour's small flow_minutes) runs before the pipeline, outside it (in the
launching process; in a run of several hours, each later hour's on a local worker beside the
analysis of the hour before), so that its failure fails the hour with a clear error
(pipelines/run.py). The hour's flows
are read as Parquet row groups, split by job by the spans the recognition gives each job,
grouped by job_id, and each job is analyzed on its own, so jobs spread over workers on a
distributed runner. The split flows are staged for the shuffle (pipelines/shuffle_staging.py):
the grouping by job moves references only. The result goes to the warehouse through
pipelines/sink.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from pipelines import storage, warehouse
from pipelines.local_workers import PooledDoFn
from pipelines.shuffle_staging import StagedObject, TableRef, read_staged_evictable, stage_object, stage_tables
from pipelines.sink import HourTables
from prism_core.analysis import (
    ADDRESS_COLUMNS, JOB_FLOW_COLUMNS, HourAnalysis, JobAnalysis, analyze_job, assemble_hour, jobs_to_analyze,
    open_membership, profiles_by_address, split_flows_by_job,
)
from prism_core.config import DEFAULT_PARAMS, PrismParams
from prism_core.recognition import Recognition
from prism_core.resolution import ExporterProfile

NAMESPACE = "prism.analyze"
# A job's analysis peaked at 250-450 bytes per flow in a worker (the dense hour's largest jobs:
# 2.1-2.9 GB at 4.9-11.6 M flows), beside the launcher (~0.3 GB) and the other worker; a job whose
# transfers come on several queue pairs is now read at a fraction of its records
# (prism_core.queue_pairs.coalesced_channels) and peaks lower. Jobs whose flows together exceed
# ANALYZED_FLOWS_AT_ONCE are not analyzed at once, so that the hour stays below 4 GB (the dense
# hour's two largest, 11.6 M and 10.2 M, stay apart: 3.7 GB at 16 M, 5.0 GB at 22 M), and jobs of
# at most SMALL_JOB_FLOWS (~0.5 GB) are analyzed beside any other job.
ANALYZED_FLOWS_AT_ONCE = 16_000_000
SMALL_JOB_FLOWS = 1_000_000


def row_groups(path: str) -> list[tuple[str, int]]:
    """(path, index) of each row group of a Parquet file, so that workers read them in parallel."""
    with storage.open_input(path) as handle:
        return [(path, index) for index in range(pq.ParquetFile(handle).num_row_groups)]


@dataclass
class HourContext:
    """What every step of an hour's analysis needs beside its element: the recognition, the
    membership the flows are split by, the previous hour's state and the exporter profiles. Staged
    once (shuffle_staging.stage_object), so the steps carry only its file's path."""

    recognition: Recognition
    membership: pa.Table
    previous: dict
    exporters: dict[str, ExporterProfile]


def split_row_group(path: str, index: int, context: StagedObject, shuffle_dir: str
                    ) -> tuple[list[tuple[str, tuple[int, TableRef]]], int]:
    """A row group of the hour's flows split by job (prism_core.analysis.split_flows_by_job) and
    staged: (job_id, (row group index, staged flows of the job)) for each job, and the number of
    flows of no job. The addresses are read dictionary-encoded, as Parquet stores them: the split
    and the analysis's codes go through their few distinct values, and only each job's rows are
    decoded to text, never the whole row group's."""
    with storage.open_input(path) as handle:
        flows = pq.ParquetFile(handle, read_dictionary=ADDRESS_COLUMNS).read_row_group(
            index, columns=list(JOB_FLOW_COLUMNS))
    staged = stage_tables(shuffle_dir, split_flows_by_job(flows, context.get().membership))
    return [(job_id, (index, rows)) for job_id, rows in staged], flows.num_rows - sum(r.num_rows for _, r in staged)


class SplitByJob(PooledDoFn):
    """A row group of the hour's flows -> (job_id, (row group index, staged flows of the job)), by
    the spans each job holds its hosts for (prism_core.analysis.open_membership, staged in the
    HourContext); on the local workers."""

    def __init__(self, context: StagedObject, shuffle_dir: str, workers: int = 1):
        super().__init__(workers)
        self.context, self.shuffle_dir = context, shuffle_dir
        self.unassigned = Metrics.counter(NAMESPACE, "flows_without_job")

    def process(self, row_group: tuple[str, int], window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        path, index = row_group
        yield from self.defer(split_row_group, (path, index, self.context, self.shuffle_dir), window, timestamp)

    def outputs(self, result):
        pieces, unassigned = result
        self.unassigned.inc(unassigned)
        yield from pieces


def analyze_staged_job(job_id: str, pieces: list[tuple[int, TableRef]], context: StagedObject,
                       hour_start_ns: int, hour_end_ns: int, params: PrismParams) -> JobAnalysis:
    """prism_core.analysis.analyze_job over the job's staged flows, taken in file order whatever
    order the runner grouped them in, memory-mapped and evicted while the analysis does not read
    them."""
    hour: HourContext = context.get()
    pieces = sorted(pieces, key=lambda piece: piece[0])
    batches, evict = read_staged_evictable([rows for _, rows in pieces])
    return analyze_job(job_id, batches, hour.recognition, hour.previous, hour_start_ns, hour_end_ns, params,
                       hour.exporters, evict_flows=evict)


class AnalyzeJob(PooledDoFn):
    """(job_id, its staged flows) -> the job's JobAnalysis, on the local workers, the jobs with the
    most flows first; counts the jobs whose analysis raised (reported as analysis_error issues;
    prism_core.analysis.analyze_job)."""

    cost_limit, negligible_cost = ANALYZED_FLOWS_AT_ONCE, SMALL_JOB_FLOWS

    def __init__(self, context: StagedObject, hour_start_ns: int, hour_end_ns: int, params: PrismParams,
                 workers: int = 1):
        super().__init__(workers)
        self.context, self.params = context, params
        self.hour = (hour_start_ns, hour_end_ns)
        self.errors = Metrics.counter(NAMESPACE, "analysis_errors")

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        job_id, pieces = element
        pieces = [p for p in pieces if p is not None]
        yield from self.defer(analyze_staged_job, (job_id, pieces, self.context, *self.hour, self.params),
                              window, timestamp, cost=sum(rows.num_rows for _, rows in pieces))

    def outputs(self, analysis: JobAnalysis):
        if analysis.failed_stage is not None:
            self.errors.inc()
        yield analysis


# Unannotated: the runner types what they return as it did the lambdas they replace.
def keyed_by(analysis, key):
    """`analysis` keyed by `key` (the hour)."""
    return key, analysis


def assemble_staged_hour(_, analyses, context=None):
    """The hour's analysis (prism_core.analysis.assemble_hour) from its jobs' (None: the hour's own
    element, which reaches the step when the hour has no job)."""
    return assemble_hour([a for a in analyses if a is not None], context.get().recognition)


class AnalyzeHour(beam.PTransform):
    """An hour's recognition and flows partition -> one HourAnalysis element. `exporters`: the
    hour's ingest state `exporters` (what each exporter's records show; prism_core.resolution).
    Row groups are split and jobs analyzed on `workers` local worker processes
    (pipelines/local_workers.py).

    Only Create, ParDo, Flatten and GroupByKey, so that every runner executes it alike: the
    recognition, known before the pipeline starts, is staged with the rest of the HourContext when
    the pipeline is built, and the steps that need it carry its file's path rather than a side
    input (or the objects themselves, which the runner would pickle with every copy of a step), and the hour's analyses are gathered by a GroupByKey on the hour (which its
    own None element reaches when the hour has no job), not a combiner: Beam's Dask runner drops
    what a DoFn emits when its bundle finishes, as combiners do."""

    def __init__(self, recognition: Recognition, flows_path: str, previous: dict | None,
                 hour_start_ns: int, hour_end_ns: int, shuffle_dir: str, params: PrismParams = DEFAULT_PARAMS,
                 exporters: dict | None = None, workers: int = 1):
        super().__init__()
        self.exporters = profiles_by_address(
            [ExporterProfile.from_json(values) for values in (exporters or {}).get("exporters", [])])
        self.recognition, self.flows_path, self.shuffle_dir = recognition, flows_path, shuffle_dir
        self.params, self.workers = params, workers
        self.previous = previous or {}
        self.hour = (hour_start_ns, hour_end_ns)

    def expand(self, pipeline):
        # Every job to analyze gets a key even without flows (None), so silent jobs are seen.
        every_job = pipeline | "EveryJob" >> beam.Create(
            [(job_id, None) for job_id in jobs_to_analyze(self.recognition, self.previous)], reshuffle=False)
        context = stage_object(self.shuffle_dir, HourContext(
            self.recognition, open_membership(self.recognition, self.hour[0]), self.previous, self.exporters))
        # The local workers split the row groups whatever bundle they come in; any other runner
        # spreads them by the Create's reshuffle.
        job_flows = (
            pipeline
            | "FlowsRowGroups" >> beam.Create(row_groups(self.flows_path), reshuffle=self.workers == 1)
            | "SplitByJob" >> beam.ParDo(SplitByJob(context, self.shuffle_dir, self.workers))
        )
        analyses = (
            (every_job, job_flows)
            | "WithEveryJob" >> beam.Flatten()
            | "GroupByJob" >> beam.GroupByKey()
            | "AnalyzeJob" >> beam.ParDo(AnalyzeJob(context, *self.hour, self.params, self.workers))
            | "KeyByHour" >> beam.Map(keyed_by, self.hour[0]).with_output_types(tuple[int, Any])
        )
        the_hour = pipeline | "TheHour" >> beam.Create([(self.hour[0], None)])
        return (
            (the_hour, analyses)
            | "WithTheHour" >> beam.Flatten()
            | "AllJobs" >> beam.GroupByKey()
            | "AssembleHour" >> beam.MapTuple(assemble_staged_hour, context)
        )


def analysis_tables(analysis: HourAnalysis, hour: datetime) -> HourTables:
    """The hour's analysis tables, its row counts and, last, the state the next hour continues
    from."""
    counts = {name: rows.num_rows for name, rows in analysis.tables.items()}
    return HourTables(
        hour,
        tables={name: [rows] for name, rows in analysis.tables.items()},
        state={"analysis_counts": counts, "analysis": analysis.state},
    )


def previous_hour_state(root: str, hour: datetime) -> dict | None:
    return warehouse.read_stats(root, hour - timedelta(hours=1), "analysis")
