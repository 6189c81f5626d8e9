"""Scores the `steps` table against the simulator's truth steps.

Truth jobs the network cannot see (one-host jobs) are left out. Prism jobs are matched to truth
jobs by their address sets (best Jaccard among the Prism jobs whose steps overlap in time), so the
score measures step division on whatever job Prism recognized. A step is counted in the hour where
it ends, for both sides; Prism steps outside the simulated window are dropped, as the truth holds
only steps wholly inside it. Each truth step is paired with the Prism step whose end is nearest
(within half a step); boundary errors are shares of the truth job's median step time, so jobs with
2 s and 30 s steps weigh the same, and a truth step without a pair counts as outside 1%.

Where the records cannot resolve steps Prism reports none (`jobs.resolution`), so the figures
above count those truth steps as missed; `prism_steps_within_1pct` says how many of the steps
Prism did report are right (a step of an unmatched Prism job is not), and the job-hours that
report only a period (`resolution` = period) are scored on it: `periods_within_5pct` and
`periods_within_1pct`, the shares whose `step_period_s` is within 5% and 1% of the truth job's
median step in that hour (issue #18 asks 1% of a flow cache's hours where the steps outlast its
idle timeout); `job_hours_without_period` counts the job-hours of a job that took steps in them
where Prism reported neither steps nor a period.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import group_indices
from prism_core.evaluate.figures import Figure
from prism_core.minutes import HOUR_NS, MINUTE_NS
from prism_core.schema import STEPS

MIN_JACCARD = 0.5  # below this a Prism job is not the truth job, only overlaps it
TOLERANCE_SHARE = 0.01  # "within 1% of the median step time"
PERIOD_TOLERANCE_SHARES = (0.05, 0.01)  # an estimated step period within 5%, 1% of the median step time


def match_jobs(
    truth_gpus: pa.Table, prism_gpus: pa.Table, truth_spans: dict[str, tuple[int, int]],
    prism_spans: dict[str, tuple[int, int]],
) -> dict[str, str]:
    """{truth job_id: prism job_id} by the best Jaccard similarity of address sets (>= 0.5) among
    the Prism jobs whose steps overlap the truth job's in time (jobs reuse hosts one after the
    other); ties go to the longer overlap."""
    truth_sets = _addr_sets(truth_gpus)
    prism_sets = _addr_sets(prism_gpus)
    matches = {}
    for truth_id, truth_addrs in truth_sets.items():
        lo, hi = truth_spans.get(truth_id, (0, 0))
        best_id, best = None, (MIN_JACCARD, 0)
        for prism_id, prism_addrs in prism_sets.items():
            shared = len(truth_addrs & prism_addrs)
            p_lo, p_hi = prism_spans.get(prism_id, (0, 0))
            overlap = min(hi, p_hi) - max(lo, p_lo)
            if shared and overlap > 0:
                key = (shared / len(truth_addrs | prism_addrs), overlap)
                if key >= best:
                    best_id, best = prism_id, key
        if best_id is not None:
            matches[truth_id] = best_id
    return matches


def score(truth: dict[str, pa.Table], warehouse: dict[str, pa.Table], noise: dict) -> dict[str, Figure]:
    steps = truth["steps"]
    if "jobs" in truth:
        visible = truth["jobs"].filter(pc.field("has_network"))["job_id"]
        steps = steps.filter(pc.is_in(steps["job_id"], value_set=visible))
    truth_steps = _steps_by_job(steps)
    prism_steps = _steps_by_job(_inside_window(warehouse["steps"], noise))
    matches = match_jobs(truth["job_gpus"], warehouse["job_gpus"], _spans(truth_steps), _spans(prism_steps))

    exact_hours = job_hours = 0
    errors: list[np.ndarray] = []  # per matched truth step: mean |boundary error| / median step
    within = truth_total = prism_total = 0
    for truth_id, (t_start, t_end) in truth_steps.items():
        p_start, p_end = prism_steps.get(matches.get(truth_id), (np.empty(0, np.int64),) * 2)
        truth_total += len(t_end)
        prism_total += len(p_end)
        hours, truth_counts = np.unique(t_end // HOUR_NS, return_counts=True)
        p_hours, prism_counts = np.unique(p_end // HOUR_NS, return_counts=True)
        all_hours = np.union1d(hours, p_hours)
        job_hours += len(all_hours)
        exact_hours += int(
            np.sum(_counts_at(all_hours, hours, truth_counts) == _counts_at(all_hours, p_hours, prism_counts))
        )
        median_step = float(np.median(t_end - t_start))
        start_error, end_error = _boundary_errors(t_start, t_end, p_start, p_end, median_step)
        matched = np.isfinite(end_error)
        errors.append((start_error[matched] + end_error[matched]) / 2)
        within += int(np.sum(matched & (start_error <= TOLERANCE_SHARE) & (end_error <= TOLERANCE_SHARE)))

    all_errors = np.concatenate(errors) if errors else np.empty(0)
    reported_right = 0
    for prism_id, truth_id in {p: t for t, p in sorted(matches.items(), reverse=True)}.items():
        (t_start, t_end), (p_start, p_end) = truth_steps[truth_id], prism_steps[prism_id]
        start_error, end_error = _boundary_errors(p_start, p_end, t_start, t_end, float(np.median(t_end - t_start)))
        reported_right += int(np.sum((start_error <= TOLERANCE_SHARE) & (end_error <= TOLERANCE_SHARE)))
    (within_5pct, within_1pct), periods, without_period = _periods_scored(truth, warehouse, truth_steps)
    return {
        "jobs_matched": Figure(len(matches)),
        "truth_steps": Figure(truth_total),
        "prism_steps": Figure(prism_total),
        "job_hours_exact_count": Figure.share(exact_hours, job_hours, 0.99),
        "boundary_error_share": Figure(float(all_errors.mean()) if len(all_errors) else 0.0, 0.003, at_most=True),
        "steps_within_1pct": Figure.share(within, truth_total, 0.99),
        "prism_steps_within_1pct": Figure.share(reported_right, sum(len(e) for _, e in prism_steps.values())),
        "periods_within_5pct": Figure.share(within_5pct, periods),
        "periods_within_1pct": Figure.share(within_1pct, periods),
        "job_hours_without_period": Figure(without_period),
    }


def _periods_scored(truth: dict[str, pa.Table], warehouse: dict[str, pa.Table],
                    truth_steps: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[tuple[int, ...], int, int]:
    """(right within each of PERIOD_TOLERANCE_SHARES, all) of the job-hours that report a step
    period instead of steps, and how many job-hours of a truth job that took steps in that hour
    report neither (`jobs_only`: its records showed no rhythm). The period is the rhythm of the
    job the Prism job's GPUs run, so a row is matched to the truth job holding most of its
    addresses (at least MIN_JACCARD of them) while both run: a fragment of a job (recognition's
    error, scored there) still has that job's period. An unmatched row is not right."""
    right = np.zeros(len(PERIOD_TOLERANCE_SHARES), np.int64)
    jobs = warehouse.get("jobs")
    if jobs is None or "resolution" not in jobs.column_names or jobs.num_rows == 0:
        return tuple(right.tolist()), 0, 0
    resolution = jobs["resolution"].to_numpy(zero_copy_only=False)
    is_period = (resolution == "period") & pc.is_valid(jobs["step_period_s"]).to_numpy(zero_copy_only=False)
    unresolved = resolution == "jobs_only"
    truth_sets, prism_sets = _addr_sets(truth["job_gpus"]), _addr_sets(warehouse["job_gpus"])
    truth_spans = _spans(truth_steps)
    first, last = (pc.cast(jobs[c], pa.int64()).to_numpy() for c in ("first_seen", "last_seen"))
    # rows loaded from a warehouse carry their partition's hour; an analysis' own rows are the
    # hour their last record ended in
    hours = (pc.cast(jobs["hour_start"], pa.int64()).to_numpy() if "hour_start" in jobs.column_names
             else (last - 1) // HOUR_NS * HOUR_NS).tolist()
    first, last = first.tolist(), last.tolist()
    job_ids, periods = jobs["job_id"].to_pylist(), jobs["step_period_s"].to_pylist()
    without_period = 0
    for row in np.flatnonzero(is_period | unresolved).tolist():
        addrs = prism_sets.get(job_ids[row], set())
        held = {t: len(addrs & a) for t, a in truth_sets.items()
                if t in truth_spans and truth_spans[t][0] < last[row] and truth_spans[t][1] > first[row]}
        best = max(held, key=held.get, default=None)
        if best is None or held[best] < MIN_JACCARD * max(len(addrs), 1):
            continue
        t_start, t_end = truth_steps[best]
        if not is_period[row]:
            without_period += bool(np.any((t_end >= hours[row]) & (t_end < hours[row] + HOUR_NS)))
            continue
        median = _median_step_in_hour(t_start, t_end, hours[row]) * 1e-9
        right += abs(periods[row] - median) <= np.array(PERIOD_TOLERANCE_SHARES) * median
    return tuple(right.tolist()), int(is_period.sum()), without_period


def _median_step_in_hour(start: np.ndarray, end: np.ndarray, hour_start_ns: int) -> float:
    """The median length (ns) of a truth job's steps that end in the hour of a jobs row: a job's
    pace changes from hour to hour (warm-up, a degradation, a straggler), and the row reports its
    hour's. The job's median over every hour where none ends in that one."""
    in_hour = (end >= hour_start_ns) & (end < hour_start_ns + HOUR_NS)
    lengths = (end - start)[in_hour] if in_hour.any() else end - start
    return float(np.median(lengths))


def _inside_window(steps: pa.Table, noise: dict) -> pa.Table:
    """The steps the truth can hold: the simulator records only steps wholly inside its window,
    so a step Prism closes after the flows stop (or opened before they began) is not scored."""
    scenario = noise.get("scenario", {})
    if "start" not in scenario or "minutes" not in scenario:
        return steps
    began = datetime.fromisoformat(str(scenario["start"])).astimezone(timezone.utc)
    start = pa.scalar(began, STEPS.field("start").type)
    end = pa.scalar(start.value + int(scenario["minutes"]) * MINUTE_NS, STEPS.field("end").type)
    return steps.filter(pc.and_(pc.greater_equal(steps["start"], start), pc.less_equal(steps["end"], end)))


def _boundary_errors(
    t_start: np.ndarray, t_end: np.ndarray, p_start: np.ndarray, p_end: np.ndarray, median_step: float
) -> tuple[np.ndarray, np.ndarray]:
    """|start error| and |end error| of each truth step against the Prism step whose end is
    nearest, as shares of `median_step`; inf where no Prism step ends within half a median step."""
    if len(p_end) == 0:
        return np.full(len(t_end), np.inf), np.full(len(t_end), np.inf)
    right = np.minimum(np.searchsorted(p_end, t_end), len(p_end) - 1)
    left = np.maximum(right - 1, 0)
    nearest = np.where(np.abs(p_end[left] - t_end) <= np.abs(p_end[right] - t_end), left, right)
    end_error = np.abs(p_end[nearest] - t_end) / median_step
    start_error = np.abs(p_start[nearest] - t_start) / median_step
    unmatched = end_error > 0.5
    return np.where(unmatched, np.inf, start_error), np.where(unmatched, np.inf, end_error)


def _counts_at(hours: np.ndarray, keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(hours), np.int64)
    out[np.searchsorted(hours, keys)] = counts
    return out


def _steps_by_job(steps: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{job_id: (start_ns, end_ns)} sorted by end."""
    if steps.num_rows == 0:
        return {}
    job_ids = steps["job_id"].to_numpy(zero_copy_only=False)
    start = pc.cast(steps["start"], pa.int64()).to_numpy()
    end = pc.cast(steps["end"], pa.int64()).to_numpy()
    out = {}
    for job_id, rows in group_indices(job_ids):
        order = rows[np.argsort(end[rows], kind="stable")]
        out[str(job_id)] = (start[order], end[order])
    return out


def _spans(steps: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, tuple[int, int]]:
    return {job_id: (int(start.min()), int(end.max())) for job_id, (start, end) in steps.items()}


def _addr_sets(job_gpus: pa.Table) -> dict[str, set[str]]:
    job_ids = job_gpus["job_id"].to_numpy(zero_copy_only=False)
    addrs = job_gpus["addr"].to_numpy(zero_copy_only=False)
    return {str(job_id): set(addrs[rows].tolist()) for job_id, rows in group_indices(job_ids)}
