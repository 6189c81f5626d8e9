"""Scores the `issues` table against the simulator's truth faults.

Issue rows are first merged by `issue_id` (an issue crossing hours has one row per hour, each with
that hour's waste). A Prism job is associated with every truth job that held at least half of its
addresses while both held them (`associate_jobs`: hosts are reused, so an address that served
another job earlier in the hour associates nothing; a Prism job seen on part of a job's GPUs is
that job, one merging two jobs is both). An issue can match a truth fault of an
associated job when the kinds are equal, the times overlap (within `TIME_SLACK_NS`) and the subject
is the fault's: a straggler names its host (or one host of a slow stage), a slow link its address (alone or as one end of a
link), and a hang its address or the whole job (its GPUs stopped together, so the data cannot
single one out: `hang_localized` says how often the address was named). Issues and faults are then
paired one to one, the most pairs and then the most overlap: an issue on a fault that another
issue matched is false, as is one on a clean or spurious job. `straggler_top1` is the share of the
stragglers some straggler issue overlapped that were named right. Recall is also given by fault
size against the diagnosis thresholds (`sensitivity`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.optimize import linear_sum_assignment

from prism_core.arrays import encoded, group_indices, rolling_median
from prism_core.diagnosis import DEFAULT_PARAMS as DIAGNOSIS_DEFAULTS
from prism_core.evaluate import jobs as jobs_scorer
from prism_core.evaluate import sensitivity
from prism_core.evaluate.figures import Figure
from prism_core.truth import TRUTH_FAULT_KINDS

HOUR_NS = 3_600_000_000_000
MIN_SHARED = 0.5  # of a Prism job's addresses, held by the truth job at the same time
TIME_SLACK_NS = 30_000_000_000
SUBJECT_KINDS = ("straggler", "slow_link", "hang")  # the truth names a host or an address
WASTE_TOLERANCE = 0.10
PERCEPTIBLE_SHARE = 0.01
SLOW_STEP_NEIGHBOURS = 10  # truth steps each side whose median is a step's usual length


def score(truth: dict[str, pa.Table], warehouse: dict[str, pa.Table], noise: dict) -> dict[str, Figure]:
    faults = truth["faults"]
    issues = merged_issues(warehouse["issues"])
    associated = associate_jobs(truth["job_gpus"], warehouse["job_gpus"])
    overlap, subject_right = candidates(faults, issues, associated)
    fault_of_issue = one_to_one(np.where(subject_right, overlap, 0))

    fault_kind = np.asarray(faults["kind"].to_pylist(), dtype=object)
    detected = np.zeros(faults.num_rows, bool)
    detected[fault_of_issue[fault_of_issue >= 0]] = True
    figures: dict[str, Figure] = {}
    for kind in TRUTH_FAULT_KINDS:
        of_kind = fault_kind == kind
        figures[f"recall_{kind}"] = Figure.share(detected[of_kind].sum(), of_kind.sum(), 0.95, empty=None)
    figures["recall"] = Figure.share(detected.sum(), faults.num_rows, 0.90, empty=None)  # every kind
    matched = fault_of_issue >= 0
    figures["precision"] = Figure.share(matched.sum(), issues.num_rows, 0.90)
    # false issues that would match a fault another issue matched: one fault reported twice
    claimed = (overlap > 0) & subject_right & detected
    figures["duplicate_issues"] = Figure(int((~matched & claimed.any(axis=1)).sum()))
    false_on_clean, clean_job_hours = _false_on_clean_jobs(truth, issues, associated)
    figures["false_issues_per_clean_job_hour"] = Figure.share(false_on_clean, clean_job_hours, 1.0, empty=0.0,
                                                              at_most=True)

    overlapped_stragglers = (fault_kind == "straggler") & (overlap > 0).any(axis=0)
    figures["straggler_top1"] = Figure.share(detected[overlapped_stragglers].sum(), overlapped_stragglers.sum(), 0.97)
    hang_issues = matched & (fault_kind[np.maximum(fault_of_issue, 0)] == "hang")
    named = pc.not_equal(issues["subject"], issues["job_id"]).to_numpy(zero_copy_only=False)
    figures["hang_localized"] = Figure.share((hang_issues & named).sum(), hang_issues.sum())

    estimated = np.zeros(faults.num_rows)
    estimated[fault_of_issue[matched]] = issues["wasted_gpu_s"].to_numpy()[matched]
    true_waste = faults["wasted_gpu_s"].to_numpy()
    errors = np.abs(estimated - true_waste)[detected] / np.maximum(true_waste[detected], 1e-9)
    figures["waste_within_10pct"] = Figure.share((errors <= WASTE_TOLERANCE).sum(), len(errors), 0.95)
    figures["median_waste_error"] = Figure(float(np.median(errors)) if len(errors) else 0.0, WASTE_TOLERANCE,
                                           at_most=True)
    # Step times jitter by 1-3%, so a fault that cost less than 1% of the GPU time its job held
    # meanwhile is below what they resolve; the share over the faults above that, for reference.
    held = _held_gpu_s(truth, faults)
    perceptible = (true_waste >= PERCEPTIBLE_SHARE * held)[detected]
    figures["waste_within_10pct_perceptible"] = Figure.share((errors[perceptible] <= WASTE_TOLERANCE).sum(),
                                                             perceptible.sum())
    figures |= _recall_by_size(faults, fault_kind, detected, held)
    if "steps" in truth:
        figures |= _false_slow_steps(truth["steps"], issues, matched, associated)
        beyond = _beyond_natural_stalls(truth["steps"], faults, fault_kind)
        figures["recall_slow_step_beyond_natural"] = Figure.share(detected[beyond].sum(), beyond.sum(), empty=None)
    figures["faults"] = Figure(faults.num_rows)
    figures["issues"] = Figure(issues.num_rows)
    return figures


def _false_slow_steps(steps: pa.Table, issues: pa.Table, matched: np.ndarray,
                      associated: set[tuple[str, str]]) -> dict[str, Figure]:
    """The false slow-step issues by the truth's step they overlap most (of the truth jobs their
    Prism job stands for): a checkpoint step, a step that took `slow_step_delta` times the median
    of the job's ordinary steps around it (SLOW_STEP_NEIGHBOURS each side) though the simulator
    injected no fault there (a stall of a heavy-tailed job: slow by any measure of the step, not a
    fault by the truth's), or neither. Says how much of the slow steps' imprecision is the truth's
    line between a stall that is the job's nature and an injected one."""
    false = np.flatnonzero(~matched & (np.asarray(issues["kind"].to_pylist(), dtype=object) == "slow_step"))
    start, end = (steps[c].cast(pa.int64()).to_numpy() for c in ("start", "end"))
    checkpoint = steps["checkpoint"].to_numpy(zero_copy_only=False)
    steps_of = _rows_by_job(steps)
    # per Prism job: the steps of the truth jobs it stands for, by start
    parts: dict[str, list[np.ndarray]] = {}
    for truth_id, prism_id in sorted(associated):
        parts.setdefault(prism_id, []).append(steps_of.get(truth_id, np.zeros(0, np.int64)))
    rows_of = {prism_id: np.concatenate(rows) for prism_id, rows in parts.items()}
    rows_of = {prism_id: rows[np.argsort(start[rows], kind="stable")] for prism_id, rows in rows_of.items()}
    issue_start, issue_end = (issues[c].cast(pa.int64()).to_numpy() for c in ("start", "end"))
    job_of_issue = issues["job_id"].to_pylist()
    on_checkpoints = on_long_steps = 0
    for i in false.tolist():
        rows = rows_of.get(job_of_issue[i], np.zeros(0, np.int64))
        together = np.minimum(end[rows], issue_end[i]) - np.maximum(start[rows], issue_start[i])
        if not len(rows) or together.max() <= 0:
            continue
        k = int(np.argmax(together))
        if checkpoint[rows[k]]:
            on_checkpoints += 1
            continue
        around = rows[max(k - SLOW_STEP_NEIGHBOURS, 0):k + SLOW_STEP_NEIGHBOURS + 1]
        around = around[~checkpoint[around]]
        usual = np.median(end[around] - start[around])
        on_long_steps += end[rows[k]] - start[rows[k]] >= DIAGNOSIS_DEFAULTS.slow_step_delta * usual
    return {"false_slow_steps": Figure(len(false)), "false_slow_steps_on_long_steps": Figure(int(on_long_steps)),
            "false_slow_steps_on_checkpoints": Figure(on_checkpoints)}


def merged_issues(rows: pa.Table) -> pa.Table:
    """One row per issue_id: first start, last end, summed waste, and the first row's labels."""
    if not rows.num_rows:
        return rows.select(["issue_id", "job_id", "kind", "subject", "start", "end", "wasted_gpu_s"])
    ordered = rows.sort_by([("issue_id", "ascending"), ("start", "ascending")])
    return ordered.group_by("issue_id", use_threads=False).aggregate(
        [("job_id", "first"), ("kind", "first"), ("subject", "first"), ("start", "min"), ("end", "max"),
         ("wasted_gpu_s", "sum")]
    ).rename_columns(["issue_id", "job_id", "kind", "subject", "start", "end", "wasted_gpu_s"])


def associate_jobs(truth_gpus: pa.Table, prism_gpus: pa.Table) -> set[tuple[str, str]]:
    """(truth job, Prism job) pairs where the truth job held at least MIN_SHARED of the Prism job's
    addresses while both held them: their spans (`start`..`end` in the truth, `first_seen`..
    `last_seen` in Prism's, where the tables have them) overlap as `jobs.held_together` says."""
    truth_spans, prism_spans = _address_spans(truth_gpus, "start", "end"), _address_spans(prism_gpus, "first_seen", "last_seen")
    joined = truth_spans.join(prism_spans, "addr", join_type="inner", left_suffix="_truth", right_suffix="_prism")
    start_truth, end_truth, start_prism, end_prism = (
        joined[c].to_numpy() for c in ("start_truth", "end_truth", "start_prism", "end_prism"))
    shared = joined.filter(pa.array(jobs_scorer.held_together(start_truth, end_truth, start_prism, end_prism)))
    shared = shared.group_by(["job_id_truth", "job_id_prism"], use_threads=False).aggregate([("addr", "count")])
    prism_size = _sizes(prism_spans)
    return {(truth_id, prism_id)
            for truth_id, prism_id, common in zip(*(shared[c].to_pylist() for c in ("job_id_truth", "job_id_prism", "addr_count")))
            if common >= MIN_SHARED * prism_size[prism_id]}


def _address_spans(gpus: pa.Table, start: str, end: str) -> pa.Table:
    """job_id, addr, start, end (int64 ns) per address of each job; a table without spans holds
    every address for all time."""
    def column(name: str, fill: int) -> np.ndarray:
        if name not in gpus.column_names:
            return np.full(gpus.num_rows, fill, np.int64)
        return pc.fill_null(gpus[name].cast(pa.int64()), fill).to_numpy()

    spans = pa.table({"job_id": gpus["job_id"], "addr": gpus["addr"],
                      "start": column(start, 0), "end": column(end, 1 << 62)})
    spans = spans.group_by(["job_id", "addr"], use_threads=False).aggregate([("start", "min"), ("end", "max")])
    return pa.table({"job_id": spans["job_id"], "addr": spans["addr"], "start": spans["start_min"], "end": spans["end_max"]})


def _sizes(job_addrs: pa.Table) -> dict[str, int]:
    counted = job_addrs.group_by("job_id", use_threads=False).aggregate([("addr", "count")])
    return dict(zip(counted["job_id"].to_pylist(), counted["addr_count"].to_pylist()))


def match(faults: pa.Table, issues: pa.Table, associated: set[tuple[str, str]]) -> np.ndarray:
    """Index of the truth fault each issue matches (-1: none), one to one."""
    overlap, subject_right = candidates(faults, issues, associated)
    return one_to_one(np.where(subject_right, overlap, 0))


def candidates(faults: pa.Table, issues: pa.Table, associated: set[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """(issues x faults) how long each issue overlaps each fault of its kind on an associated job
    (ns, plus the slack; 0 where they cannot match), and whether the issue names the fault's subject."""
    if not issues.num_rows or not faults.num_rows:
        return np.zeros((issues.num_rows, faults.num_rows)), np.zeros((issues.num_rows, faults.num_rows), bool)
    issue_kind = np.asarray(issues["kind"].to_pylist(), dtype=object)
    fault_kind = np.asarray(faults["kind"].to_pylist(), dtype=object)
    issue_start, issue_end, fault_start, fault_end = (
        table[c].cast(pa.int64()).to_numpy() for table in (issues, faults) for c in ("start", "end"))
    overlap = np.minimum(issue_end[:, None], fault_end) + TIME_SLACK_NS - np.maximum(issue_start[:, None], fault_start)
    possible = (issue_kind[:, None] == fault_kind) & _associated(issues["job_id"], faults["job_id"], associated)
    overlap = np.where(possible & (overlap > 0), overlap, 0)

    whole_job = pc.equal(issues["subject"], issues["job_id"]).to_numpy(zero_copy_only=False)
    subject_right = (~np.isin(fault_kind, SUBJECT_KINDS)
                     | _names(issues["subject"], faults["subject"])
                     | (whole_job[:, None] & (fault_kind == "hang")))
    return overlap, subject_right


def one_to_one(overlap: np.ndarray) -> np.ndarray:
    """Index of the fault each issue is paired with (-1: none) by `overlap` (issues x faults, 0:
    no pair): the most pairs, then the most overlap in all."""
    paired = np.full(overlap.shape[0], -1)
    rows, cols = np.flatnonzero(overlap.any(axis=1)), np.flatnonzero(overlap.any(axis=0))
    if not len(rows):
        return paired
    within = overlap[np.ix_(rows, cols)]
    # Each pair outweighs all the overlap of any matching, so no pair is given up for overlap.
    pair_weight = min(within.shape) + 1
    weight = np.where(within > 0, pair_weight + within / within.max(), 0)
    issue, fault = linear_sum_assignment(weight, maximize=True)
    kept = weight[issue, fault] > 0
    paired[rows[issue[kept]]] = cols[fault[kept]]
    return paired


def _associated(issue_jobs: pa.ChunkedArray, fault_jobs: pa.ChunkedArray, associated: set[tuple[str, str]]) -> np.ndarray:
    """(issues x faults) whether the issue's Prism job is associated with the fault's truth job."""
    truth_ids, prism_ids = sorted({t for t, _ in associated}), sorted({p for _, p in associated})
    # one row and column more, all False, for the jobs associated with none (code -1)
    linked = np.zeros((len(prism_ids) + 1, len(truth_ids) + 1), bool)
    rows, cols = {p: i for i, p in enumerate(prism_ids)}, {t: i for i, t in enumerate(truth_ids)}
    for truth_id, prism_id in associated:
        linked[rows[prism_id], cols[truth_id]] = True
    issue_code, fault_code = (pc.fill_null(pc.index_in(jobs, value_set=pa.array(ids, pa.string())), -1).to_numpy()
                              for jobs, ids in ((issue_jobs, prism_ids), (fault_jobs, truth_ids)))
    return linked[issue_code[:, None], fault_code]


def _names(issue_subjects: pa.ChunkedArray, fault_subjects: pa.ChunkedArray) -> np.ndarray:
    """(issues x faults) whether the issue's subject names one of the fault's: a subject is "a",
    "a->b" or "a,b,c" on either side (a slow stage's fault lists its hosts; naming one is right)."""
    issues, faults = _subject_names(issue_subjects, "issue"), _subject_names(fault_subjects, "fault")
    both = issues.join(faults, "name", join_type="inner")
    out = np.zeros((len(issue_subjects), len(fault_subjects)), bool)
    out[both["issue"].to_numpy(), both["fault"].to_numpy()] = True
    return out


def _subject_names(subjects: pa.ChunkedArray, index: str) -> pa.Table:
    """One row per name in each subject, with the subject's position as `index`."""
    named = pc.split_pattern(pc.replace_substring(subjects, "->", ","), ",")
    return pa.table({index: pc.list_parent_indices(named), "name": pc.list_flatten(named)})


def _held_gpu_s(truth: dict[str, pa.Table], faults: pa.Table) -> np.ndarray:
    """GPU-seconds each fault's job held during the fault."""
    gpus = dict(zip(truth["jobs"]["job_id"].to_pylist(), truth["jobs"]["n_gpus"].to_pylist()))
    seconds = pc.subtract(faults["end"].cast(pa.int64()), faults["start"].cast(pa.int64())).to_numpy() / 1e9
    return np.array([gpus[job] for job in faults["job_id"].to_pylist()]) * seconds


def _rows_by_job(steps: pa.Table) -> dict[str, np.ndarray]:
    """{truth job_id: its rows of `steps`}."""
    job_code, job_names = encoded(steps, "job_id")
    return dict(zip(job_names.to_pylist(), (rows for _, rows in group_indices(job_code))))


def _beyond_natural_stalls(steps: pa.Table, faults: pa.Table, fault_kind: np.ndarray) -> np.ndarray:
    """Per fault: a slow step whose truth step (the one it overlaps most) took longer, against the
    median of its job's ordinary steps around it (SLOW_STEP_NEIGHBOURS each side), than every
    step of its job that the truth calls natural (no checkpoint, no warm-up after a (re)start,
    no fault over it). A heavy-tailed job stalls by nature as long as a slow-step fault slows a
    step; only a fault beyond its job's own stalls can be told from them by the step times."""
    beyond = np.zeros(faults.num_rows, bool)
    slow_faults = np.flatnonzero(fault_kind == "slow_step")
    if not len(slow_faults) or not steps.num_rows:
        return beyond
    start, end = (steps[c].cast(pa.int64()).to_numpy() for c in ("start", "end"))
    checkpoint = steps["checkpoint"].to_numpy(zero_copy_only=False)
    attempt = steps["attempt"].to_numpy() if "attempt" in steps.column_names else np.zeros(steps.num_rows, np.int64)
    fault_job = np.asarray(faults["job_id"].to_pylist(), dtype=object)
    fault_start, fault_end = (faults[c].cast(pa.int64()).to_numpy() for c in ("start", "end"))
    rows_of = _rows_by_job(steps)
    for job in sorted(set(fault_job[slow_faults])):
        rows = rows_of.get(job, np.zeros(0, np.int64))
        rows = rows[np.argsort(start[rows], kind="stable")]
        if not len(rows):
            continue
        ordinary = ~checkpoint[rows]
        duration = (end[rows] - start[rows]).astype(np.float64)
        ratio = duration / rolling_median(duration, ordinary, np.zeros(len(rows), int), SLOW_STEP_NEIGHBOURS)
        of_job = np.flatnonzero(fault_job == job)
        faulty = np.zeros(len(rows), bool)
        for f in of_job:
            faulty |= (start[rows] < fault_end[f]) & (end[rows] > fault_start[f])
        first_of_attempt = np.r_[True, attempt[rows][1:] != attempt[rows][:-1]]
        since_start = np.arange(len(rows)) - np.maximum.accumulate(np.where(first_of_attempt, np.arange(len(rows)), 0))
        natural = ordinary & ~faulty & (since_start >= DIAGNOSIS_DEFAULTS.warmup_steps)
        longest_natural = ratio[natural].max(initial=0.0)
        for f in of_job[fault_kind[of_job] == "slow_step"]:
            together = np.minimum(end[rows], fault_end[f]) - np.maximum(start[rows], fault_start[f])
            beyond[f] = together.max() > 0 and ratio[int(np.argmax(together))] > longest_natural
    return beyond


def _recall_by_size(faults: pa.Table, fault_kind: np.ndarray, detected: np.ndarray, held: np.ndarray) -> dict[str, Figure]:
    """recall_<kind>_<bucket> for each sized kind, and how many sized faults the truth gives no size."""
    bucket = sensitivity.bucket_of(sensitivity.relative_sizes(faults, held))
    figures = {}
    for kind in sensitivity.SIZED_KINDS:
        for name in sensitivity.BUCKETS:
            in_bucket = (fault_kind == kind) & (bucket == name)
            figures[f"recall_{kind}_{name}"] = Figure.share(detected[in_bucket].sum(), in_bucket.sum(), empty=None)
    figures["faults_without_size"] = Figure(int((np.isin(fault_kind, sensitivity.SIZED_KINDS) & (bucket == "")).sum()))
    return figures


def _false_on_clean_jobs(truth, issues: pa.Table, associated) -> tuple[int, int]:
    """Issues on Prism jobs associated with no faulty truth job (a clean job's, or a spurious
    one's: none of them can match a fault), and the hours fault-free truth jobs ran."""
    faulty = set(truth["faults"]["job_id"].to_pylist())
    clean_truth = set(truth["jobs"]["job_id"].to_pylist()) - faulty
    on_faulty = sorted({prism_id for truth_id, prism_id in associated if truth_id in faulty})
    on_clean = pc.invert(pc.is_in(issues["job_id"], value_set=pa.array(on_faulty, pa.string())))
    steps = truth["steps"].filter(pc.is_in(truth["steps"]["job_id"], value_set=pa.array(sorted(clean_truth), pa.string())))
    hours = pc.divide(steps["start"].cast(pa.int64()), HOUR_NS)
    job_hours = pa.table({"job_id": steps["job_id"], "hour": hours}).group_by(["job_id", "hour"]).aggregate([]).num_rows
    return int(pc.sum(on_clean).as_py() or 0), job_hours
