"""A job's life, step by step: when each step runs, under which condition, and the faults' truth.

`plan_job` walks a job's allotted time once, step after step: each step gets a jitter, a
condition (warm-up, straggler, slow link, degradation), maybe a stall (slow step) or a checkpoint,
and hang / restart events cut it. The plan keeps the per-step arrays that `JobPlan.flows` turns
into records a minute at a time, and the truth rows (steps, faults) that the scorer reads.

Wasted GPU-seconds compare each step with the same step (same jitter) without the fault:
n_gpus x (actual - fault-free). A hang wastes everything from the last checkpoint to the end of
the allotment (or the scenario); a restart wastes the work since the last checkpoint, the downtime
and the slower warm-up steps after it. Truth intervals are clipped to the scenario window and only
steps wholly inside it count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from prism_core.simulate.cluster import GPUS_PER_HOST, Cluster
from prism_core.simulate.model import WARMUP_AFTER_RESTART, WARMUP_AT_START, JobModel, job_model
from prism_core.simulate.scenarios import JobSpec
from prism_core.simulate.traffic import (
    Condition,
    FlowBatch,
    Template,
    checkpoint_template,
    step_template,
)

RESTART_STOP_S = 0.3  # a failing job's NICs fall silent within this of the failure
HANG_SPREAD_S = (0.5, 4.0)  # peers of a hung GPU stop this long after it


@dataclass
class JobPlan:
    job_id: str
    spec: JobSpec
    model: JobModel
    hosts: list[np.ndarray]  # per attempt
    templates: list[Template]
    checkpoints: list[Template]  # per attempt
    steps: dict[str, np.ndarray]  # one entry per step (see `_StepLog`)
    cutoffs: list[np.ndarray]  # per cut step: time each endpoint stops sending
    faults: list[dict]  # truth rows, times in scenario seconds
    start_s: float
    end_s: float
    restarts: int
    salt: int = field(repr=False)

    @property
    def has_network(self) -> bool:
        return any(len(t.src) for t in self.templates)

    def flows(self, lo: float, hi: float, rng: np.random.Generator) -> FlowBatch:
        """Records of the steps that start in [lo, hi)."""
        steps = self.steps
        chosen = np.flatnonzero((steps["start"] >= lo) & (steps["start"] < hi))
        parts = []
        for tid in np.unique(steps["template"][chosen]):
            group = chosen[steps["template"][chosen] == tid]
            uncut = group[steps["cut"][group] < 0]
            parts.append(self.templates[tid].expand(steps["base"][uncut], steps["jitter"][uncut], rng))
            for step in group[steps["cut"][group] >= 0]:
                flows = self.templates[tid].expand(steps["base"][[step]], steps["jitter"][[step]], rng)
                parts.append(_cut(flows, self.cutoffs[steps["cut"][step]]))
        for step in chosen[steps["checkpoint"][chosen]]:
            ckpt = self.checkpoints[steps["attempt"][step]]
            parts.append(ckpt.expand(steps["compute_end"][[step]], np.ones(1), rng))
        return FlowBatch.concat(parts) if parts else FlowBatch.empty()


def _cut(flows: FlowBatch, cutoff: np.ndarray) -> FlowBatch:
    """Drop what starts after either endpoint stopped; truncate what was in flight."""
    stop = np.minimum(cutoff[flows.src], cutoff[flows.dst])
    kept = flows.take(flows.start < stop)
    kept.end = np.minimum(kept.end, stop[flows.start < stop])
    return kept


class _StepLog:
    COLUMNS = ("start", "base", "compute_end", "end", "jitter", "template", "checkpoint", "attempt",
               "number", "complete", "cut")

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def add(self, **row) -> None:
        self.rows.append(tuple(row[c] for c in self.COLUMNS))

    def arrays(self) -> dict[str, np.ndarray]:
        dtypes = (float, float, float, float, float, np.int32, bool, np.int32, np.int64, bool, np.int32)
        columns = zip(*self.rows) if self.rows else [()] * len(self.COLUMNS)
        return {c: np.array(v, dtype=t) for c, v, t in zip(self.COLUMNS, columns, dtypes)}


def plan_job(index: int, spec: JobSpec, cluster: Cluster, window_s: float, seed: int) -> JobPlan:
    rng = np.random.default_rng([seed, index, 0x10B])
    job_id = f"sim-job-{index:03d}"
    model = job_model(spec, rng)
    salt = index + 1
    hosts = [np.asarray(spec.hosts, np.int64)]
    templates: list[Template] = []
    template_ids: dict[Condition, int] = {}

    def template(cond: Condition) -> tuple[int, float]:
        if cond not in template_ids:
            template_ids[cond] = len(templates)
            templates.append(step_template(model, hosts[cond.attempt], cond, salt))
        tid = template_ids[cond]
        return tid, templates[tid].duration

    def checkpoint(attempt: int) -> Template:
        return checkpoint_template(model, hosts[attempt], cluster.storage_base, cluster.n_storage, salt)

    faults = list(spec.faults)
    first = templates[template(Condition(0))[0]]
    subject_nic = {i: _busy_nic(first, spec.hosts[f.host], f.rail) for i, f in enumerate(faults)
                   if f.kind in ("slow_link", "hang")}
    events = sorted((f.at_s, i) for i, f in enumerate(faults) if f.kind in ("hang", "restart"))
    stalls = sorted((f.at_s + (k + 0.5) * f.span_s / f.count, i)
                    for i, f in enumerate(faults) if f.kind == "slow_step" for k in range(f.count))
    wasted = np.zeros(len(faults))
    touched = [[np.inf, -np.inf] for _ in faults]  # first start, last end of affected steps
    cutoffs: list[np.ndarray] = []
    lost: dict[int, dict] = {}  # hang / restart: work and time lost
    slow_steps: list[dict] = []

    def blame(i: int, start: float, end: float, extra: float) -> None:
        if start >= 0 and end <= window_s:
            wasted[i] += extra * spec.n_gpus
            touched[i][0] = min(touched[i][0], start)
            touched[i][1] = max(touched[i][1], end)

    log = _StepLog()
    t = spec.start_s
    number = int(rng.integers(1_000, 50_000)) if t < 0 else 0  # jobs seen mid-life
    attempt, warmup = 0, (WARMUP_AT_START if t >= 0 else ())
    warm_step = 0
    last_checkpoint = t
    end_of_traffic = None
    stop = min(spec.end_s, window_s)
    while t < stop:
        level = warmup[warm_step] if warm_step < len(warmup) else 1.0
        scale, straggler, slow, active = level, (-1, 1.0), (-1, 1.0), None
        for i, f in enumerate(faults):
            if f.kind == "degradation" and t >= f.at_s:
                scale, active = scale * f.factor, i
            elif f.kind in ("straggler", "slow_link") and f.at_s <= t < f.at_s + f.span_s:
                active = i
                if f.kind == "straggler":
                    straggler = (f.host, f.factor)
                else:
                    slow = (subject_nic[i], f.factor)
        tid, duration = template(Condition(attempt, scale, *straggler, *slow))
        after_restart = attempt > 0 and level != 1.0
        _, fault_free = template(Condition(attempt, 1.0 if after_restart else level))
        jitter = float(rng.lognormal(0.0, model.jitter_sigma))
        is_checkpoint = (number + 1) % model.ckpt_every == 0 and level == 1.0
        stall, slow_step = 0.0, None
        if stalls and stalls[0][0] <= t and not is_checkpoint:
            slow_step = stalls.pop(0)[1]
            stall = (faults[slow_step].factor - 1.0) * jitter * fault_free
        compute_end = t + stall + jitter * duration
        end = compute_end + (model.ckpt_save_s if is_checkpoint else 0.0)
        if end > spec.end_s:
            break  # the allotment cannot hold another step
        row = dict(start=t, base=t + stall, compute_end=compute_end, end=end, jitter=jitter,
                   template=tid, checkpoint=is_checkpoint, attempt=attempt, number=number)
        if events and events[0][0] < end:
            failed_at, i = events.pop(0)
            failed_at = max(failed_at, t)
            f = faults[i]
            job_nics = _nics(hosts[attempt])
            cutoff = np.full(cluster.n_endpoints, np.inf)
            if f.kind == "hang":
                cutoff[job_nics] = failed_at + rng.uniform(*HANG_SPREAD_S, len(job_nics))
                cutoff[subject_nic[i]] = failed_at
            else:
                cutoff[job_nics] = failed_at + rng.uniform(0, RESTART_STOP_S, len(job_nics))
            log.add(**row, complete=False, cut=len(cutoffs))
            cutoffs.append(cutoff)
            end_of_traffic = failed_at
            lost[i] = {"lost_since_checkpoint_s": round(failed_at - max(last_checkpoint, 0.0), 3)}
            if f.kind == "hang":
                silent_until = min(spec.end_s, window_s)
                wasted[i] = spec.n_gpus * (silent_until - max(last_checkpoint, 0.0))
                touched[i] = [failed_at, silent_until]
                break
            resume = failed_at + f.gap_s
            wasted[i] = spec.n_gpus * (min(resume, window_s) - max(last_checkpoint, 0.0))
            touched[i] = [failed_at, min(resume, window_s)]
            lost[i]["gap_s"] = f.gap_s
            attempt += 1
            new_hosts = hosts[-1].copy()
            if f.replace_host is not None:
                new_hosts[f.host] = f.replace_host
            hosts.append(new_hosts)
            warmup, warm_step, t = WARMUP_AFTER_RESTART, 0, resume
            continue
        log.add(**row, complete=True, cut=-1)
        extra = jitter * (duration - fault_free)
        if active is not None:
            blame(active, t, end, extra)
        elif after_restart:
            blame(max(i for i, f in enumerate(faults) if f.kind == "restart"), t, end, extra)
        if slow_step is not None:
            blame(slow_step, t, end, stall)
            slow_steps.append({"fault": slow_step, "start": t, "end": end, "extra": stall})
        if is_checkpoint:
            last_checkpoint = end
        t, number, warm_step = end, number + 1, warm_step + 1
        end_of_traffic = end

    plan = JobPlan(
        job_id=job_id,
        spec=spec,
        model=model,
        hosts=hosts,
        templates=templates,
        checkpoints=[checkpoint(a) for a in range(len(hosts))],
        steps=log.arrays(),
        cutoffs=cutoffs,
        faults=[],
        start_s=max(spec.start_s, 0.0),
        end_s=min(end_of_traffic if end_of_traffic is not None else spec.start_s, window_s),
        restarts=len(hosts) - 1,
        salt=salt,
    )
    plan.faults = _fault_rows(plan, cluster, subject_nic, wasted, touched, lost, slow_steps,
                              window_s)
    return plan


def _fault_rows(plan, cluster, subject_nic, wasted, touched, lost, slow_steps, window_s) -> list[dict]:
    rows = []
    spec = plan.spec
    for i, f in enumerate(spec.faults):
        start, end = touched[i]
        if f.kind == "slow_step":
            for k, s in enumerate(r for r in slow_steps if r["fault"] == i):
                if s["start"] >= 0 and s["end"] <= window_s:
                    rows.append(dict(kind=f.kind, subject=plan.job_id, start=s["start"], end=s["end"],
                                     wasted=s["extra"] * spec.n_gpus,
                                     params={"factor": f.factor, "nth": k}))
            continue
        if not start < end:
            continue  # the fault never touched a step the scenario sees
        subject, params = plan.job_id, {"factor": f.factor}
        if f.kind == "straggler":
            subject = cluster.host_name(spec.hosts[f.host])
        elif f.kind in ("slow_link", "hang"):
            subject = cluster.addrs[subject_nic[i]].as_py()
        if f.kind in ("hang", "restart"):
            params = lost[i]
        if f.kind == "restart" and f.replace_host is not None:
            params["replaced_host"] = {"old": cluster.host_name(spec.hosts[f.host]),
                                       "new": cluster.host_name(f.replace_host)}
        rows.append(dict(kind=f.kind, subject=subject, start=start, end=end, wasted=float(wasted[i]),
                         params=params))
    for n, row in enumerate(rows):
        row["fault_id"] = f"{plan.job_id}-f{n}"
        row["params"] = json.dumps(row["params"], sort_keys=True)
    return rows


def _nics(hosts: np.ndarray) -> np.ndarray:
    return (hosts[:, None] * GPUS_PER_HOST + np.arange(GPUS_PER_HOST)).ravel()


def _busy_nic(template: Template, host: int, rail: int) -> int:
    """The NIC of `host` nearest to `rail` that carries the job's traffic (a fault on an unused
    NIC would leave no trace)."""
    used = np.unique(np.concatenate([template.src, template.dst]))
    on_host = used[used // GPUS_PER_HOST == host]
    if not len(on_host):
        return host * GPUS_PER_HOST + rail
    return int(on_host[np.argmin(np.abs(on_host % GPUS_PER_HOST - rail))])
