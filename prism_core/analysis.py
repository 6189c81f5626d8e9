"""The per-hour analysis: recognize jobs, then analyze each job's flows on their own.

The pipeline runs these pieces as separate steps (recognition over the hour's small
`flow_minutes`, then the flows keyed by job); `analyze_hour` runs them in one process for tests
and for small inputs, and both paths share every function here. One job's trouble never costs the
hour: a job whose analysis raises is reported as an `analysis_error` issue and the other jobs go
on (`analyze_job`); only a failed recognition fails the hour (`RecognitionError`).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core import diagnosis, parallelism, resolution, timeline
from prism_core.arrays import CODES_SUFFIX, filter_rows, lookup, stable_order, uncoded_columns, with_codes
from prism_core.config import DEFAULT_PARAMS, PrismParams
from prism_core.constants import CHECKPOINT_FLOW_BYTES, NS_PER_S
from prism_core.minutes import MINUTE_NS
from prism_core.queue_pairs import coalesced_channels, resumed_on_same_connections, source_ports
from prism_core.recognition import Recognition, recognize_hour
from prism_core.schema import COMM_PAIRS, FLOWS, ISSUES, JOB_GPUS, JOBS, STEPS, TABLES
from prism_core.topology import Topology

logger = logging.getLogger(__name__)

ANALYSIS_TABLES = ("jobs", "job_gpus", "comm_pairs", "steps", "issues")
# The per-job states an hour hands to the next, by stage.
JOB_STAGE_STATES = ("parallelism", "timeline", "diagnosis")
# Reads from storage at least this large into a job's GPUs are kept for the job's diagnosis
# (checkpoint shards are read back in chunks as large as the writes).
BULK_READ_BYTES = CHECKPOINT_FLOW_BYTES
# The flow columns the per-job stages read (parallelism, timeline, diagnosis): the pipeline reads
# only these from the hour's Parquet and stages only these, half the bytes of a flow row. A stage
# that needs another column adds it here.
JOB_FLOW_COLUMNS = ("time_flow_start_ns", "time_flow_end_ns", "src_addr", "dst_addr", "bytes", "sampler_address",
                    "sampling_rate", "src_port")
# The flow columns a job's stages look up and number: encoded once per job (`arrays.with_codes`)
ADDRESS_COLUMNS = ("src_addr", "dst_addr", "sampler_address")


@dataclass
class JobAnalysis:
    job_id: str
    tables: dict[str, pa.Table]  # job_gpus, comm_pairs, steps, issues of this job
    degrees: dict[str, int]  # dp, pp, tp
    state: dict
    failed_stage: str | None = None  # the stage that raised, when the analysis failed
    resolution: str | None = None  # what the records resolved (schema.RESOLUTIONS); None: failed
    step_period_s: float | None = None  # the steps' median duration, or the records' rhythm
    issue_kinds_judged: list[str] | None = None  # sorted; None: failed


class RecognitionError(RuntimeError):
    """Job recognition failed: without it no job of the hour can be analyzed."""


@dataclass
class HourAnalysis:
    tables: dict[str, pa.Table]  # ANALYSIS_TABLES
    state: dict


def recognize(flow_minutes: pa.Table, topology: Topology, previous: dict, hour_start_ns: int,
              params: PrismParams = DEFAULT_PARAMS) -> Recognition:
    """The hour's jobs (prism_core.recognition.recognize_hour); any failure is a RecognitionError that
    says what went wrong, for the operator."""
    try:
        return recognize_hour(flow_minutes, topology, previous.get("jobs"), hour_start_ns, params=params.recognition)
    except Exception as error:
        raise RecognitionError(f"job recognition failed: {type(error).__name__}: {error}") from error


def split_flows_by_job(flows: pa.Table, membership: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """(job_id, flows of JOB_FLOW_COLUMNS) for each job: a flow belongs to the job whose member
    sent it while a member (membership spans are the exact first and last traffic, so the tail of
    a job that just left a host never goes to the next job on it). A bulk read into a member
    address from an address that is no job's (storage) belongs to the job that last took that
    address, even after its traffic stopped: a stopped job that resumes reads its checkpoint back
    before it sends anything (prism_core.diagnosis). Other flows of no job (idle hosts, background
    endpoints) are dropped here: they have no job to be analyzed with.
    Address columns read dictionary-encoded (the pipeline reads the hour's Parquet so: its
    dictionaries come without decoding every row's text) are looked up through their few distinct
    values; each job's flows then carry them as text, as ever, and their codes beside them
    (`arrays.with_codes`, which then need not hash every row's text again)."""
    if flows.num_rows == 0 or membership.num_rows == 0:
        return
    src = flows["src_addr"]
    src_values = src.combine_chunks().dictionary if pa.types.is_dictionary(src.type) else src.combine_chunks()
    addrs = pc.unique(pa.concat_arrays([membership["addr"].combine_chunks(), src_values]))
    member_code = pc.index_in(membership["addr"], value_set=addrs).to_numpy().astype(np.int64)
    first_ns, last_ns = membership["first_ns"].to_numpy(), membership["last_ns"].to_numpy()
    flow_start = flows["time_flow_start_ns"].to_numpy()

    # Each address's spans by first traffic, as tables over address codes (+1: none), the k-th
    # span of every address in row k: an address holds a few spans an hour, so a flow's span is
    # found by a few lookups in small tables rather than a binary search over every span.
    by_address = np.lexsort((first_ns, member_code))
    spans = np.bincount(member_code, minlength=len(addrs) + 1)
    rank = np.arange(len(by_address)) - (np.cumsum(spans) - spans)[member_code[by_address]]
    span_first = np.full((spans.max(), len(spans)), np.iinfo(np.int64).max)
    span_first[rank, member_code[by_address]] = first_ns[by_address]
    span_row = np.zeros(span_first.shape, np.int64)
    span_row[rank, member_code[by_address]] = by_address

    def latest_span(code: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per flow: the membership row of the last span on address `code` begun by the flow's
        `start`, and whether there is one."""
        row = span_row[0][code]
        begun = span_first[0][code] <= start
        later = np.flatnonzero(begun & (spans[code] > 1))
        for next_first, next_row in zip(span_first[1:], span_row[1:]):
            later = later[next_first[code[later]] <= start[later]]
            row[later] = next_row[code[later]]
        return row, begun

    src_code = _index_in(src, addrs).to_numpy().astype(np.int64)
    row, sent = latest_span(src_code, flow_start)
    sent &= flow_start <= last_ns[row]
    # bulk reads from an address that is no job's: the few candidates are looked up alone
    is_member = np.zeros(len(addrs), bool)
    is_member[member_code] = True
    bulk = np.flatnonzero(~is_member[src_code] & (flows["bytes"].to_numpy() >= BULK_READ_BYTES))
    dst_code = pc.fill_null(_index_in(flows["dst_addr"].take(bulk), addrs), len(addrs))
    reader_row, read = latest_span(dst_code.to_numpy().astype(np.int64), flow_start[bulk])
    row[bulk[read]] = reader_row[read]
    belongs = sent.copy()
    belongs[bulk[read]] = True

    kept = np.flatnonzero(belongs)
    # Grouped by integer codes in job_id order: sorting the ids themselves (Python strings) per
    # flow would cost seconds per million flows.
    job_ids = pc.unique(membership["job_id"]).sort()
    member_job = pc.index_in(membership["job_id"], value_set=job_ids).to_numpy()
    job_of_kept = member_job[row[kept]]
    # One take and one decoding of all kept flows, job after job, then a slice of it per job: a
    # take and a decoding per job and column cost ~8% more of the split
    grouped = decoded_with_codes(flows.select(JOB_FLOW_COLUMNS).take(kept[stable_order(job_of_kept)]))
    flows_of_job = np.bincount(job_of_kept, minlength=len(job_ids))
    first_of_job = np.cumsum(flows_of_job) - flows_of_job
    for code in np.flatnonzero(flows_of_job).tolist():
        yield job_ids[code].as_py(), grouped.slice(first_of_job[code], flows_of_job[code])


def _index_in(column: pa.ChunkedArray | pa.Array, value_set: pa.Array) -> pa.Array:
    """`pc.index_in(column, value_set)` (one array); of a dictionary-encoded column, through its
    distinct values."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(column.type):
        return pc.index_in(column, value_set=value_set)
    return pc.index_in(column.dictionary, value_set=value_set).take(column.indices)


def decoded_with_codes(flows: pa.Table) -> pa.Table:
    """`flows` with each dictionary-encoded column decoded to its values' type, and the encoded
    column appended as its codes (name + CODES_SUFFIX, as `arrays.with_codes` adds them)."""
    for index, field in enumerate(flows.schema):
        if pa.types.is_dictionary(field.type):
            codes = flows[field.name]
            values = pa.chunked_array([chunk.dictionary.take(chunk.indices) for chunk in codes.chunks],
                                      field.type.value_type)
            flows = flows.set_column(index, field.name, values).append_column(field.name + CODES_SUFFIX, codes)
    return flows


def open_membership(recognition: Recognition, hour_start_ns: int) -> pa.Table:
    """The membership with the spans a job holds its hosts for, not just the span of its traffic:
    a job running when the hour began (known from earlier hours, or heard in the hour's first
    minute) holds its hosts from the hour's start, and a job still running at the hour's end holds
    them to the end. So what a host sends outside the job's traffic in those spans is the job's:
    the checkpoint save after its last sync of the hour, or the save before its first. A span
    begun by a job's arrival on a host another job had this hour, or closed by the job's end,
    stays as it was, so one job's traffic never joins another's."""
    membership = recognition.membership
    info = recognition.jobs
    running_at_end = pc.equal(info["status"], "running")
    running_at_start = pc.less(info["first_seen"].cast(pa.int64()), hour_start_ns + MINUTE_NS)
    hosts = pc.list_flatten(info["hosts"])
    job = pc.list_parent_indices(info["hosts"])
    held = pa.table({
        "job_id": info["job_id"].take(job),
        "host": hosts,
        "held_at_end": running_at_end.take(job),
        "held_at_start": running_at_start.take(job),
    })
    membership = membership.join(held, ["job_id", "host"], join_type="left outer")
    first_ns = membership["first_ns"].to_numpy()
    # the NIC's first job of the hour: no other job's span on it begins earlier (jobs on other
    # GPUs of the host hold other NICs)
    addr, job_id = (membership[c].to_numpy(zero_copy_only=False) for c in ("addr", "job_id"))
    order = np.lexsort((first_ns, addr))
    leads = np.r_[True, addr[order][1:] != addr[order][:-1]] if len(order) else np.zeros(0, bool)
    first_of_nic = np.empty(len(order), bool)
    first_of_nic[order] = job_id[order] == job_id[order][leads][np.cumsum(leads) - 1]
    at_start = pc.fill_null(membership["held_at_start"], False).to_numpy(zero_copy_only=False) & first_of_nic
    at_end = pc.fill_null(membership["held_at_end"], False).to_numpy(zero_copy_only=False)
    membership = membership.set_column(membership.schema.get_field_index("first_ns"), "first_ns",
                                       pa.array(np.where(at_start, np.minimum(first_ns, hour_start_ns), first_ns)))
    membership = membership.set_column(membership.schema.get_field_index("last_ns"), "last_ns",
                                       pa.array(np.where(at_end, np.iinfo(np.int64).max, membership["last_ns"].to_numpy())))
    return membership.drop_columns(["held_at_end", "held_at_start"])


def jobs_to_analyze(recognition: Recognition, previous: dict) -> list[str]:
    """Every job recognized this hour, and every silent job the previous hour left something
    open for: a last step to close (timeline state) or an ongoing issue."""
    recognized = set(recognition.jobs["job_id"].to_pylist())
    return sorted(recognized | set(previous.get("timeline", {})) | _open_issue_jobs(previous))


def _open_issue_jobs(state: dict) -> set[str]:
    return {j for j, s in state.get("diagnosis", {}).items() if diagnosis.has_open_issue(s)}


def analyze_job(
    job_id: str,
    batches: list[pa.Table],
    recognition: Recognition,
    previous: dict,
    hour_start_ns: int,
    hour_end_ns: int,
    params: PrismParams = DEFAULT_PARAMS,
    exporters: dict[str, resolution.ExporterProfile] | None = None,
    evict_flows: Callable[[], None] = lambda: None,
) -> JobAnalysis:
    """Parallelism, steps and issues of one job over one hour (its flows may be empty: a job
    that fell silent still has an ongoing hang to account for). `exporters`: the hour's exporter
    profiles by address (the ingest state's `exporters`; none: every exporter reads as reporting
    transfers one by one). Steps are reported only where the records resolve them
    (prism_core.resolution, decided before the timeline): elsewhere the job-hour has no step rows,
    its `step_period_s` is the records' rhythm, and of its issues only those that need no step
    (`ResolutionParams.unresolved_issue_kinds`) are reported; a straggler or a slow link only where
    the records also time single transfers (`resolution.issue_kinds_shown`). If a stage raises,
    the job's analysis is `failed_job`'s instead, and the hour goes on for every other job.
    `evict_flows`: drops the pages of `batches` from memory where they can be read back (memory-
    mapped files); called once what members sent is copied, and again before the timeline, which
    reads only its own selection of that: the diagnosis, which reads every flow again, comes
    after the stages whose peaks are highest."""
    # A stage may update the state it is handed in place, so it gets a copy: the previous hour's
    # states stay as they were for a failed job to carry on and for a retried bundle to start from.
    before = previous
    previous = {name: {job_id: copy.deepcopy(before[name][job_id])}
                for name in JOB_STAGE_STATES if job_id in before.get(name, {})}
    stage = "input"
    try:
        flows = pa.concat_tables(batches) if batches else FLOWS.empty_table().select(JOB_FLOW_COLUMNS)
        members = recognition.membership.filter(pc.equal(recognition.membership["job_id"], job_id))
        # one transfer split over several queue pairs is one record for every stage after this
        # (not where a NIC serves two GPUs, whose transfers at once are two)
        nics = members["addr"] if pc.max(members["gpus"]).as_py() == 1 else pa.array([], pa.string())
        flows = coalesced_channels(with_codes(flows, ADDRESS_COLUMNS), nics, params.resolution.channel_start_s,
                                   params.resolution.channel_size_spread, params.resolution.channel_even_share)
        events = recognition.events.filter(pc.equal(recognition.events["job_id"], job_id))
        restarts_ns = events.filter(pc.equal(events["kind"], "restart"))["at_ns"].to_pylist()
        paused_ns = paused_restarts(flows, members["addr"], restarts_ns, params.diagnosis)
        if paused_ns:  # no restart for the diagnosis; the timeline divides them alike, in one attempt
            events = events.filter(pc.invert(pc.and_(pc.equal(events["kind"], "restart"),
                                                     pc.is_in(events["at_ns"], value_set=pa.array(paused_ns, pa.int64())))))

        # the stages before diagnosis read what members sent, not the reads into them
        sent = filter_rows(flows, lookup(flows, "src_addr", members["addr"]) >= 0) if members.num_rows else flows
        evict_flows()
        samplers = sampling_exporters(exporters)
        stage = "parallelism"
        layout = previous.get("parallelism", {}).get(job_id)
        found = (
            parallelism.identify_parallelism(job_id, sent, members, params=params.parallelism,
                                             cached_exporters=cached_exporters(exporters),
                                             samplers=samplers, previous=layout)
            if members.num_rows
            else parallelism.Parallelism(JOB_GPUS.empty_table(), COMM_PAIRS.empty_table(), None, None, None,
                                         state=layout)
        )
        stage = "resolution"
        # a silent hour only closes the step the previous hour carried: nothing in it blurs that
        # but the carried records themselves
        silent = sent.num_rows == 0
        resolved = (silent_resolution(previous.get("timeline", {}).get(job_id), exporters) if silent
                    else resolution.job_resolution(sent, exporters or {}, params.resolution,
                                                   members=pc.unique(members["addr"].combine_chunks())))
        stage = "timeline"
        timeline_flows = resolving_flows(found.labelled(sent), resolved)
        # what members sent (a copy of most of the flows) is not held through the timeline, which
        # reads its own selection of it, nor through the diagnosis, which reads every flow
        del sent
        evict_flows()
        steps = timeline.divide_steps(
            job_id, timeline_flows, found.comm_pairs, previous.get("timeline", {}).get(job_id),
            hour_start_ns, hour_end_ns, restarts_ns, found.job_gpus, params=params.timeline, paused_ns=paused_ns,
        )
        del timeline_flows
        stage = "diagnosis"
        diagnosed = diagnosis.diagnose_job(
            job_id, flows, found.job_gpus, found.comm_pairs, steps.steps, events,
            previous.get("diagnosis", {}).get(job_id), hour_start_ns, hour_end_ns, recognition.membership,
            params=params.diagnosis, steps_resolved=resolved.resolution == "steps",
            shortest_timed_s={name: resolution.shortest_timed_s(profile, params.resolution)
                              for name, profile in (exporters or {}).items()},
            samplers=samplers or frozenset(),
        )
    except Exception as error:
        logger.warning("analysis of job %s failed in %s", job_id, stage, exc_info=True)
        return failed_job(job_id, stage, error, before, hour_start_ns, hour_end_ns)
    step_rows, issues = steps.steps, diagnosed.issues
    durations = step_rows["duration_s"].to_numpy()
    synchronized = step_rows["sync_s"].is_valid().to_numpy(zero_copy_only=False)
    if resolved.resolution == "steps" and not resolution.steps_keep_time(durations, synchronized, params.resolution):
        resolved = resolution.demoted(resolved)
    if resolved.resolution != "steps":
        # The timeline's steps still carry the job's step numbers and the diagnosis' restarts and
        # hangs, but are no steps to report, nor to judge a step, a host or a link by.
        step_rows, durations = STEPS.empty_table(), np.zeros(0)
    # a silent hour has no record to judge a step, a host or a link by (the step it closes was
    # divided from the previous hour's records, resolved or not): only the job's silences
    shown = (params.resolution.unresolved_issue_kinds if silent
             else resolution.issue_kinds_shown(resolved, params.resolution))
    issues = issues.filter(pc.is_in(issues["kind"], value_set=pa.array(shown, pa.string())))
    return JobAnalysis(
        job_id,
        tables={"job_gpus": found.job_gpus, "comm_pairs": found.comm_pairs,
                "steps": step_rows, "issues": issues},
        degrees={"dp": found.dp, "pp": found.pp, "tp": found.tp},
        state={"parallelism": found.state, "timeline": steps.state, "diagnosis": diagnosed.state},
        resolution=resolved.resolution,
        step_period_s=float(np.median(durations)) if len(durations) else resolved.period_s,
        issue_kinds_judged=sorted(shown),
    )


def paused_restarts(flows: pa.Table, members: pa.ChunkedArray, restarts_ns: list[int],
                    params: diagnosis.DiagnosisParams) -> list[int]:
    """The recognition's restarts after which the job's transfers between members ran on the
    connections they ran on before (prism_core.queue_pairs): pauses, its processes alive. The
    recognition reads minutes: its restart instant may come after the resumed job's first
    transfers, so the silence is the longest quiet between two transfers that ends within a
    minute of it; one shorter than a restart's (`restart_gap_s`: the silence began before the
    hour's records) tells nothing."""
    if not restarts_ns or "src_port" not in flows.column_names:
        return []
    src, dst = lookup(flows, "src_addr", members), lookup(flows, "dst_addr", members)
    between = np.flatnonzero((src >= 0) & (dst >= 0))
    start = flows["time_flow_start_ns"].to_numpy()[between]
    order = np.argsort(start, kind="stable")
    rows = between[order]
    start = start[order]
    if len(start) < 2:
        return []
    port = source_ports(flows, rows)
    gap = np.diff(start)
    silences = []
    for at in restarts_ns:
        # gap k ends at start[k + 1]: the gaps ending within a minute of the instant (one at least)
        lo, hi = np.searchsorted(start[1:], [at - MINUTE_NS, at + MINUTE_NS], side="left")
        lo = min(lo, len(gap) - 1)
        quiet = lo + int(np.argmax(gap[lo:max(hi, lo + 1)]))
        if gap[quiet] >= params.restart_gap_s * NS_PER_S:
            silences.append((at, start[quiet] + 1, start[quiet + 1]))
    if not silences:
        return []
    at, silent_from, resumed_at = (np.array(column) for column in zip(*silences))
    same = resumed_on_same_connections(src[rows], dst[rows], port, start, silent_from, resumed_at,
                                       params.connection_window_s * NS_PER_S, params.same_connection_share)
    return at[same].tolist()


def silent_resolution(timeline_state: dict | None,
                      exporters: dict[str, resolution.ExporterProfile] | None) -> resolution.JobResolution:
    """What a silent hour resolves: the step the previous hour carried, where the records carried
    for it come from exporters that report transfers one by one (a resolved hour's timeline read
    only those; an unresolved hour's carries a cache's or a sampler's records, and the step they
    close is no more resolved than the hour's were)."""
    carry = (timeline_state or {}).get("carry") or {}
    carried = carry.get("exporters", [])
    if any(not resolution.reports_one_by_one((exporters or {}).get(name)) for name in carried):
        return resolution.JobResolution("jobs_only", None, frozenset(), False)
    return resolution.JobResolution("steps", None, frozenset(), True)


def cached_exporters(exporters: dict[str, resolution.ExporterProfile] | None) -> frozenset[str]:
    """The exporters whose profile says they keep a flow cache (records may merge transfers)."""
    return frozenset(name for name, profile in (exporters or {}).items() if resolution.keeps_flow_cache(profile))


def sampling_exporters(exporters: dict[str, resolution.ExporterProfile] | None) -> frozenset[str] | None:
    """The exporters whose profile says they sample packets (their records are instants); None
    without profiles."""
    if not exporters:
        return None
    return frozenset(name for name, profile in exporters.items() if resolution.samples_packets(profile))


def profiles_by_address(profiles: list[resolution.ExporterProfile]) -> dict[str, resolution.ExporterProfile]:
    return {profile.sampler_address: profile for profile in profiles}


def resolving_flows(flows: pa.Table, resolved: resolution.JobResolution) -> pa.Table:
    """Where the job's steps are resolved, its records from the exporters that report transfers
    one by one: the timeline reads only these, a flow cache's merged records or an sFlow agent's
    instants would blur its boundaries. Elsewhere every record (no step of it is reported).
    The timeline reads addresses through their codes (`with_codes`): a copy leaves out the text
    of those whose codes the table carries (most of the bytes a filter of many rows copies)."""
    if resolved.resolution != "steps":
        return flows
    resolving = pa.array(sorted(resolved.resolving_exporters), pa.string())
    kept = lookup(flows, "sampler_address", resolving, fill=resolution.NO_EXPORTER) >= 0
    return filter_rows(flows.select(uncoded_columns(flows.column_names)), kept)


def failed_job(job_id: str, stage: str, error: Exception, previous: dict, hour_start_ns: int,
               hour_end_ns: int) -> JobAnalysis:
    """The analysis of a job whose `stage` raised `error`: one `analysis_error` issue over the
    hour that names the stage and the exception (no severity, no waste), no rows in the job's
    other tables, and the stage states the job had before the hour, so the next hour continues
    its step numbers and open issues."""
    evidence = {"stage": stage, "exception": type(error).__name__, "message": str(error)}
    issue = pa.table({
        "issue_id": [diagnosis.issue_id(job_id, "analysis_error", job_id, hour_start_ns)],
        "job_id": [job_id],
        "kind": ["analysis_error"],
        "subject": [job_id],
        "start": pa.array([hour_start_ns], pa.int64()).cast(ISSUES.field("start").type),
        "end": pa.array([hour_end_ns], pa.int64()).cast(ISSUES.field("end").type),
        "severity": pa.nulls(1, pa.string()),
        "confidence": pa.nulls(1, pa.float64()),
        "wasted_gpu_s": [0.0],
        "evidence": [json.dumps(evidence, sort_keys=True)],
    }, schema=ISSUES)
    empty = {name: TABLES[name].empty_table() for name in ANALYSIS_TABLES[1:-1]}
    return JobAnalysis(
        job_id,
        tables={**empty, "issues": issue},
        degrees={"dp": None, "pp": None, "tp": None},
        state={name: previous.get(name, {}).get(job_id) for name in JOB_STAGE_STATES},
        failed_stage=stage,
    )


def job_status(recognized: str, hung: bool) -> str:
    """The job's status at the hour's end (schema.JOB_STATUSES): recognition tells running from
    ended by its traffic; a job the diagnosis holds in an open hang is hung, whatever its silence
    made recognition conclude."""
    return "hung" if hung else recognized


def assemble_hour(analyses: list[JobAnalysis], recognition: Recognition) -> HourAnalysis:
    """The hour's tables from every job's analysis, and the state the next hour starts from."""
    analyses = sorted(analyses, key=lambda a: a.job_id)
    degrees = {a.job_id: a.degrees for a in analyses}
    hung = {a.job_id for a in analyses if diagnosis.is_hung(a.state["diagnosis"])}
    job_table = recognition.jobs
    statuses = [job_status(status, job_id in hung)
                for job_id, status in zip(job_table["job_id"].to_pylist(), job_table["status"].to_pylist())]
    job_table = job_table.set_column(job_table.schema.get_field_index("status"), "status", pa.array(statuses, pa.string()))
    # the tracker counts every resume after a silence; those the job's connections showed were pauses are none
    paused = {a.job_id: (a.state["timeline"] or {}).get("paused_restarts", 0) for a in analyses}
    restarts = [count - paused.get(job_id, 0) if count is not None else None
                for job_id, count in zip(job_table["job_id"].to_pylist(), job_table["restarts"].to_pylist())]
    job_table = job_table.set_column(job_table.schema.get_field_index("restarts"), "restarts",
                                     pa.array(restarts, job_table.schema.field("restarts").type))
    for name in ("dp", "pp", "tp"):
        values = pa.array([degrees.get(j, {}).get(name) for j in job_table["job_id"].to_pylist()], pa.int32())
        job_table = job_table.set_column(job_table.schema.get_field_index(name), name, values)
    resolved = {a.job_id: (a.resolution, a.step_period_s, a.issue_kinds_judged) for a in analyses}
    for position, name in enumerate(("resolution", "step_period_s", "issue_kinds_judged")):
        values = pa.array([resolved.get(j, (None, None, None))[position] for j in job_table["job_id"].to_pylist()],
                          JOBS.field(name).type)
        job_table = job_table.set_column(job_table.schema.get_field_index(name), name, values)
    tables = {"jobs": job_table}
    for name in ANALYSIS_TABLES[1:]:
        parts = [a.tables[name] for a in analyses]
        tables[name] = pa.concat_tables(parts).cast(TABLES[name]) if parts else TABLES[name].empty_table()

    # Stage states go on for the jobs the tracker still follows (running, or stopped recently
    # enough to restart) and those with an issue still open; the rest were closed this hour.
    state = {"jobs": recognition.state}
    for stage in JOB_STAGE_STATES:
        state[stage] = {a.job_id: a.state[stage] for a in analyses if a.state[stage] is not None}
    followed = {job["job_id"] for job in recognition.state.get("jobs", [])} | _open_issue_jobs(state)
    for stage in JOB_STAGE_STATES:
        state[stage] = {job_id: s for job_id, s in sorted(state[stage].items()) if job_id in followed}
    return HourAnalysis(tables=tables, state=state)


def analyze_hour(
    flows: pa.Table, flow_minutes: pa.Table, topology: Topology, previous: dict | None, hour_start_ns: int,
    params: PrismParams = DEFAULT_PARAMS,
) -> HourAnalysis:
    """The whole analysis of one hour in one process (what the Beam pipeline distributes); the
    exporters are profiled from `flows` itself (FLOWS columns)."""
    previous = previous or {}
    exporters = profiles_by_address(resolution.exporter_profiles(
        resolution.tally_exporters(flows, params.resolution), params.resolution))
    recognition = recognize(flow_minutes, topology, previous, hour_start_ns, params)
    hour_end_ns = hour_start_ns + 60 * MINUTE_NS
    flows_of = dict(split_flows_by_job(flows, open_membership(recognition, hour_start_ns)))
    analyses = [
        analyze_job(job_id, [flows_of[job_id]] if job_id in flows_of else [], recognition, previous,
                    hour_start_ns, hour_end_ns, params, exporters)
        for job_id in jobs_to_analyze(recognition, previous)
    ]
    return assemble_hour(analyses, recognition)
