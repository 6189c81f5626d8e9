"""Scores the `issues` table against the simulator's truth faults.

Issue rows are first merged by `issue_id` (an issue crossing hours has one row per hour, each with
that hour's waste). A Prism job is associated with every truth job whose address set it resembles
(Jaccard >= 0.5 over `job_gpus`); hosts are reused, so an issue then matches a truth fault of an
associated job when the kinds are equal, the times overlap (within `TIME_SLACK_NS`) and, for
`slow_link` and `hang`, the subject names one of the fault's addresses. A straggler is detected
whatever host it names, and a hang named after the whole job (its GPUs stopped together, so the
data cannot single one out) is detected without a subject: `straggler_top1` and `hang_localized`
say whether they named the right host or address. Each issue is given to the fault it overlaps
most, and a fault's estimated waste is the sum over its issues.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.evaluate.figures import Figure, ratio
from prism_core.truth import TRUTH_FAULT_KINDS

HOUR_NS = 3_600_000_000_000
MIN_JACCARD = 0.5
TIME_SLACK_NS = 30_000_000_000
ADDRESS_SUBJECT_KINDS = ("slow_link", "hang")
WASTE_TOLERANCE = 0.10
PERCEPTIBLE_SHARE = 0.01


def score(truth: dict[str, pa.Table], warehouse: dict[str, pa.Table], noise: dict) -> dict[str, Figure]:
    faults = truth["faults"]
    issues = merged_issues(warehouse["issues"])
    associated = associate_jobs(truth["job_gpus"], warehouse["job_gpus"])
    fault_of_issue = match(faults, issues, associated)

    fault_kind = np.asarray(faults["kind"].to_pylist(), dtype=object)
    detected = np.zeros(faults.num_rows, bool)
    detected[fault_of_issue[fault_of_issue >= 0]] = True
    figures: dict[str, Figure] = {}
    for kind in TRUTH_FAULT_KINDS:
        of_kind = fault_kind == kind
        figures[f"recall_{kind}"] = Figure.share(detected[of_kind].sum(), of_kind.sum(), 0.95, empty=None)
    figures["precision"] = Figure.share((fault_of_issue >= 0).sum(), issues.num_rows, 0.90)
    figures["false_issues_per_clean_job_hour"] = Figure(
        _false_per_clean_job_hour(truth, issues, associated, fault_of_issue), 1.0, at_most=True)

    subjects = np.asarray(issues["subject"].to_pylist(), dtype=object)
    truth_subjects = np.asarray(faults["subject"].to_pylist(), dtype=object)
    stragglers = np.flatnonzero(fault_kind == "straggler")
    right = [any(subjects[fault_of_issue == f] == truth_subjects[f]) for f in stragglers if detected[f]]
    figures["straggler_top1"] = Figure.share(sum(right), len(right), 0.97)
    hangs = np.flatnonzero(fault_kind == "hang")
    named = [any(truth_subjects[f] in _addresses(s) for s in subjects[fault_of_issue == f]) for f in hangs if detected[f]]
    figures["hang_localized"] = Figure.share(sum(named), len(named))

    estimated = np.bincount(fault_of_issue[fault_of_issue >= 0], minlength=faults.num_rows,
                            weights=issues["wasted_gpu_s"].to_numpy()[fault_of_issue >= 0])
    true_waste = faults["wasted_gpu_s"].to_numpy()
    errors = np.abs(estimated - true_waste)[detected] / np.maximum(true_waste[detected], 1e-9)
    figures["waste_within_10pct"] = Figure.share((errors <= WASTE_TOLERANCE).sum(), len(errors), 0.95)
    figures["median_waste_error"] = Figure(float(np.median(errors)) if len(errors) else 0.0, WASTE_TOLERANCE,
                                           at_most=True)
    # Step times jitter by 1-3%, so a fault that cost less than 1% of the GPU time its job held
    # meanwhile is below what they resolve; the share over the faults above that, for reference.
    perceptible = (true_waste >= PERCEPTIBLE_SHARE * _held_gpu_s(truth, faults))[detected]
    figures["waste_within_10pct_perceptible"] = Figure.share((errors[perceptible] <= WASTE_TOLERANCE).sum(),
                                                             perceptible.sum())
    figures["faults"] = Figure(faults.num_rows)
    figures["issues"] = Figure(issues.num_rows)
    return figures


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
    """(truth job, Prism job) pairs whose address sets have Jaccard similarity >= MIN_JACCARD."""
    truth_addrs = truth_gpus.group_by(["job_id", "addr"], use_threads=False).aggregate([])
    prism_addrs = prism_gpus.group_by(["job_id", "addr"], use_threads=False).aggregate([])
    shared = truth_addrs.join(prism_addrs, "addr", join_type="inner", left_suffix="_truth", right_suffix="_prism")
    shared = shared.group_by(["job_id_truth", "job_id_prism"], use_threads=False).aggregate([("addr", "count")])
    truth_size, prism_size = _sizes(truth_addrs), _sizes(prism_addrs)
    pairs = set()
    for truth_id, prism_id, common in zip(*(shared[c].to_pylist() for c in ("job_id_truth", "job_id_prism", "addr_count"))):
        if common / (truth_size[truth_id] + prism_size[prism_id] - common) >= MIN_JACCARD:
            pairs.add((truth_id, prism_id))
    return pairs


def _sizes(job_addrs: pa.Table) -> dict[str, int]:
    counted = job_addrs.group_by("job_id", use_threads=False).aggregate([("addr", "count")])
    return dict(zip(counted["job_id"].to_pylist(), counted["addr_count"].to_pylist()))


def match(faults: pa.Table, issues: pa.Table, associated: set[tuple[str, str]]) -> np.ndarray:
    """Index of the truth fault each issue matches (-1: none); the largest time overlap wins."""
    matched = np.full(issues.num_rows, -1)
    fault_rows = list(zip(faults["job_id"].to_pylist(), faults["kind"].to_pylist(), faults["subject"].to_pylist(),
                          faults["start"].cast(pa.int64()).to_pylist(), faults["end"].cast(pa.int64()).to_pylist()))
    issue_rows = zip(issues["job_id"].to_pylist(), issues["kind"].to_pylist(), issues["subject"].to_pylist(),
                     issues["start"].cast(pa.int64()).to_pylist(), issues["end"].cast(pa.int64()).to_pylist())
    for i, (job, kind, subject, start, end) in enumerate(issue_rows):
        best = 0
        for f, (f_job, f_kind, f_subject, f_start, f_end) in enumerate(fault_rows):
            if f_kind != kind or (f_job, job) not in associated:
                continue
            overlap = min(end, f_end) + TIME_SLACK_NS - max(start, f_start)
            if overlap <= 0 or (kind in ADDRESS_SUBJECT_KINDS and subject != job
                                and not _addresses(subject) & _addresses(f_subject)):
                continue
            if overlap > best:
                best, matched[i] = overlap, f
    return matched


def _held_gpu_s(truth: dict[str, pa.Table], faults: pa.Table) -> np.ndarray:
    """GPU-seconds each fault's job held during the fault."""
    gpus = dict(zip(truth["jobs"]["job_id"].to_pylist(), truth["jobs"]["n_gpus"].to_pylist()))
    seconds = pc.subtract(faults["end"].cast(pa.int64()), faults["start"].cast(pa.int64())).to_numpy() / 1e9
    return np.array([gpus[job] for job in faults["job_id"].to_pylist()]) * seconds


def _addresses(subject: str) -> set[str]:
    """Addresses a subject names: "a", "a->b" or "a,b,c"."""
    return set(subject.replace("->", ",").split(","))


def _false_per_clean_job_hour(truth, issues: pa.Table, associated, fault_of_issue: np.ndarray) -> float:
    """Issues on Prism jobs associated only with fault-free truth jobs, per hour such a job ran."""
    faulty = set(truth["faults"]["job_id"].to_pylist())
    clean_truth = set(truth["jobs"]["job_id"].to_pylist()) - faulty
    by_prism: dict[str, set[str]] = {}
    for truth_id, prism_id in associated:
        by_prism.setdefault(prism_id, set()).add(truth_id)
    clean_prism = {p for p, ts in by_prism.items() if ts <= clean_truth}
    on_clean = pc.is_in(issues["job_id"], value_set=pa.array(sorted(clean_prism), pa.string())).to_numpy(zero_copy_only=False)
    steps = truth["steps"].filter(pc.is_in(truth["steps"]["job_id"], value_set=pa.array(sorted(clean_truth), pa.string())))
    hours = pc.divide(steps["start"].cast(pa.int64()), HOUR_NS)
    job_hours = pa.table({"job_id": steps["job_id"], "hour": hours}).group_by(["job_id", "hour"]).aggregate([]).num_rows
    return ratio(int((on_clean & (fault_of_issue < 0)).sum()), job_hours, empty=0.0)
