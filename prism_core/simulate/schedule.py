"""A job's life, step by step: when each step runs, under which condition, and the faults' truth.

`plan_job` walks a job's allotted time once, step after step: each step gets a jitter, a
condition (warm-up, straggler, slow link, degradation), maybe a stall (slow step) or a checkpoint,
and hang / restart events cut it. The plan keeps the per-step arrays that `JobPlan.flows` turns
into records a minute at a time, and the truth rows (steps, faults) that the scorer reads.

Wasted GPU-seconds compare each step with the same step (same jitter) without the fault:
n_gpus x (actual - fault-free). A restart wastes the work since the last checkpoint, the downtime
and the slower warm-up steps after it. A relaunched job reads its checkpoint back from storage
(`checkpoint_load_template`: the save's writes reversed, as long as the save, at most half the
downtime) in the last seconds of the downtime, and resumes when the load is done. A hung job holds
its hosts silently until the collective watchdog kills it (`Scenario.hang_watchdog_s` after the
hang, or the allotment's end if sooner: the scheduler's time limit); the hang wastes everything
from the last checkpoint to the kill. A hang with `resume` is then restarted from that checkpoint
`gap_s` after the kill: that restart is a fault of its own, costing the downtime from the kill to
the resume and the warm-up steps (the work lost since the checkpoint is the hang's). Truth
intervals are clipped to the scenario window and only steps wholly inside it count. A job with
traits (`variation`) also records in each fault's params how much slower the steps it touched ran
(`step_slowdown`: mean of actual / fault-free step time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np

from prism_core.simulate.cluster import GPUS_PER_HOST, Cluster, Placement
from prism_core.simulate.model import WARMUP_AFTER_RESTART, WARMUP_AT_START, JobModel, job_model
from prism_core.simulate.scenarios import FaultSpec, JobSpec
from prism_core.simulate.traffic import (
    Condition,
    FlowBatch,
    Template,
    checkpoint_load_template,
    checkpoint_template,
    step_template,
)

RESTART_STOP_S = 0.3  # a failing job's NICs fall silent within this of the failure
HANG_SPREAD_S = (0.5, 4.0)  # peers of a hung GPU stop this long after they first wait on it
HANG_WATCHDOG_S = 600.0  # PyTorch's NCCL timeout: a hung collective is killed after 10 minutes
ATTEMPT_SALT = 1_000  # per attempt, in the job's port salt (jobs are salted by index: a few hundred at most)


@dataclass
class JobPlan:
    job_id: str
    spec: JobSpec
    model: JobModel
    placements: list[Placement]  # per attempt
    attempt_spans: list[tuple[float, float]]  # per attempt: first step to its failure or the end, in the window
    templates: list[Template]
    checkpoints: list[Template]  # per attempt
    checkpoint_loads: list[Template]  # per attempt
    loads: np.ndarray  # (n, 3): start of each checkpoint load, its pace (time scale), attempt
    steps: dict[str, np.ndarray]  # one entry per step (see `StepLog`)
    cutoffs: list[np.ndarray]  # per cut step: time each endpoint stops sending
    faults: list[dict]  # truth rows, times in scenario seconds
    start_s: float
    end_s: float
    restarts: int

    @property
    def hosts(self) -> list[np.ndarray]:
        """The job's hosts, per attempt."""
        return [placement.hosts for placement in self.placements]

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
            flows = ckpt.expand(steps["compute_end"][[step]], steps["save"][[step]] / self.model.ckpt_save_s, rng)
            parts.append(flows if steps["cut"][step] < 0 else _cut(flows, self.cutoffs[steps["cut"][step]]))
        # drawn last, so the loads leave every other flow's random draws as they were
        for at, scale, attempt in self.loads[(self.loads[:, 0] >= lo) & (self.loads[:, 0] < hi)]:
            parts.append(self.checkpoint_loads[int(attempt)].expand(np.array([at]), np.array([scale]), rng))
        return FlowBatch.concat(parts) if parts else FlowBatch.empty()


def _cut(flows: FlowBatch, cutoff: np.ndarray) -> FlowBatch:
    """Drop what starts after either endpoint stopped; truncate what was in flight, which then
    carried only the bytes it moved until the stop."""
    stop = np.minimum(cutoff[flows.src], cutoff[flows.dst])
    started = flows.start < stop
    kept = flows.take(started)
    end = np.minimum(kept.end, stop[started])
    moved = np.where(kept.end > kept.start, (end - kept.start) / np.maximum(kept.end - kept.start, 1e-12), 1.0)
    kept.nbytes = np.maximum(np.round(kept.nbytes * moved), 1).astype(np.int64)
    kept.end = end
    return kept


class StepLog:
    COLUMNS = ("start", "base", "compute_end", "end", "jitter", "template", "checkpoint", "save", "attempt",
               "number", "complete", "cut")
    DTYPES = (float, float, float, float, float, np.int32, bool, float, np.int32, np.int64, bool, np.int32)

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def add(self, **row) -> None:
        self.rows.append(tuple(row[c] for c in self.COLUMNS))

    def arrays(self) -> dict[str, np.ndarray]:
        columns = zip(*self.rows) if self.rows else [()] * len(self.COLUMNS)
        return {c: np.array(v, dtype=t) for c, v, t in zip(self.COLUMNS, columns, self.DTYPES)}


@dataclass
class _Tally:
    """What one fault did to the steps the scenario sees."""

    wasted_gpu_s: float = 0.0
    start: float = np.inf
    end: float = -np.inf
    params: dict = field(default_factory=dict)
    slow_steps: list[tuple[float, float, float]] = field(default_factory=list)  # start, end, extra
    slowdowns: list[float] = field(default_factory=list)  # actual / fault-free time of each step touched


def plan_job(index: int, spec: JobSpec, cluster: Cluster, window_s: float, seed: int,
             watchdog_s: float = HANG_WATCHDOG_S) -> JobPlan:
    return _Planner(index, spec, cluster, window_s, seed, watchdog_s).run()


class _Planner:
    """Walks one job's allotment step by step (see module doc)."""

    def __init__(self, index: int, spec: JobSpec, cluster: Cluster, window_s: float, seed: int,
                 watchdog_s: float):
        self.watchdog_s = watchdog_s
        self.rng = np.random.default_rng([seed, index, 0x10B])
        self.job_id = f"sim-job-{index:03d}"
        self.spec, self.cluster, self.window_s = spec, cluster, window_s
        self.model = job_model(spec, self.rng)
        self.salt = index + 1
        self.placements = [Placement.of(spec.hosts, spec.first_gpu, spec.gpus_per_host)]
        self.templates: list[Template] = []
        self.template_ids: dict[Condition, int] = {}
        self.faults = list(spec.faults)  # a restart after a hang is appended when it happens
        self.tally = [_Tally() for _ in self.faults]
        nominal = self.templates[self.template(Condition(0))[0]]
        self.subject_nic = {i: _busy_nic(nominal, cluster, spec.hosts[f.host], f.rail)
                            for i, f in enumerate(self.faults) if f.kind in ("slow_link", "hang")}
        self.log = StepLog()
        self.cutoffs: list[np.ndarray] = []
        self.loads: list[tuple[float, float, int]] = []  # see JobPlan.loads

    def template(self, cond: Condition) -> tuple[int, float]:
        """Id and duration of the step template for `cond`, built on first use."""
        if cond not in self.template_ids:
            self.template_ids[cond] = len(self.templates)
            # a restarted job's processes connect anew: new queue pairs, so new RoCE source ports
            self.templates.append(step_template(self.model, self.placements[cond.attempt], self.cluster.gpu_nic,
                                                cond, self.salt + ATTEMPT_SALT * cond.attempt))
        tid = self.template_ids[cond]
        return tid, self.templates[tid].duration

    def condition(self, t: float, attempt: int, level: float) -> tuple[Condition, int | None]:
        """The condition of a step starting at `t`, and the fault shaping it (at most one)."""
        scale, straggler, slow, active = level, (-1, 1.0), (-1, 1.0), None
        for i, f in enumerate(self.faults):
            if f.kind == "degradation" and t >= f.at_s:
                scale, active = scale * f.factor, i
            elif f.kind == "straggler" and f.at_s <= t < f.at_s + f.span_s:
                straggler, active = (f.host, f.factor), i
            elif f.kind == "slow_link" and f.at_s <= t < f.at_s + f.span_s:
                slow, active = (self.subject_nic[i], f.factor), i
        return Condition(attempt, scale, *straggler, *slow), active

    def blame(self, i: int, start: float, end: float, extra: float) -> None:
        if start >= 0 and end <= self.window_s:
            tally = self.tally[i]
            tally.wasted_gpu_s += extra * self.spec.n_gpus
            tally.start, tally.end = min(tally.start, start), max(tally.end, end)

    def run(self) -> JobPlan:
        spec, model, rng = self.spec, self.model, self.rng
        events = sorted((f.at_s, i) for i, f in enumerate(self.faults) if f.kind in ("hang", "restart"))
        stalls = sorted((f.at_s + (k + 0.5) * f.span_s / f.count, i) for i, f in enumerate(self.faults)
                        if f.kind == "slow_step" for k in range(f.count))
        restart = None  # the restart the current warm-up is charged to
        t = spec.start_s
        number = int(rng.integers(1_000, 50_000)) if t < 0 else 0  # a job seen mid-life
        attempt, warmup, warm_step = 0, (WARMUP_AT_START if t >= 0 else ()), 0
        last_checkpoint, end_of_traffic = t, None
        attempt_bounds = [[t, None]]  # per attempt: its start, then where its traffic stopped
        while t < min(spec.end_s, self.window_s):
            level = warmup[warm_step] if warm_step < len(warmup) else 1.0
            after_restart = attempt > 0 and level != 1.0  # warm-up after a restart is its cost
            cond, active = self.condition(t, attempt, level)
            tid, duration = self.template(cond)
            _, fault_free = self.template(Condition(attempt, 1.0 if after_restart else level))
            jitter = model.jitter(rng)
            is_checkpoint = (number + 1) % model.ckpt_every == 0 and level == 1.0
            stall, slow_step = 0.0, None
            if stalls and stalls[0][0] <= t and not is_checkpoint:
                slow_step = stalls.pop(0)[1]
                stall = (self.faults[slow_step].factor - 1.0) * jitter * fault_free
            compute_end = t + stall + jitter * duration
            save = model.save_time(rng) if is_checkpoint else 0.0
            end = compute_end + save
            if end > spec.end_s:
                break  # the allotment cannot hold another step
            row = dict(start=t, base=t + stall, compute_end=compute_end, end=end, jitter=jitter,
                       template=tid, checkpoint=is_checkpoint, save=save, attempt=attempt, number=number)
            if events and events[0][0] < end:
                failed_at, i = events.pop(0)
                failed_at = max(failed_at, t)
                cut_steps = [row]
                if self.faults[i].kind == "hang" and _first_need(self.templates[tid], row, self.subject_nic[i],
                                                                 failed_at) is None:
                    # the hung GPU was done with this step (saving a checkpoint, say): its peers
                    # finish it, begin the next one and block there
                    next_jitter = model.jitter(rng)
                    next_end = end + next_jitter * duration
                    cut_steps.append(dict(row, start=end, base=end, compute_end=next_end, end=next_end,
                                          jitter=next_jitter, checkpoint=False, save=0.0, number=number + 1))
                for cut_step in cut_steps:
                    self.log.add(**cut_step, complete=False, cut=len(self.cutoffs))
                self.cutoffs.append(self.silence(i, failed_at, attempt, self.templates[tid], cut_steps))
                end_of_traffic = failed_at
                attempt_bounds[-1][1] = failed_at
                if self.faults[i].kind == "hang":
                    killed_at = self.hang(i, failed_at, last_checkpoint)
                    resume = killed_at + self.faults[i].gap_s
                    if not self.faults[i].resume or resume >= min(spec.end_s, self.window_s):
                        break  # the job ends (or comes back after the scenario)
                    restart = self.restart_after_hang(i, killed_at, resume)
                    self.load_checkpoint(killed_at, resume)
                    t = resume
                else:
                    restart = i
                    t = self.restart(i, failed_at, last_checkpoint)
                    self.load_checkpoint(failed_at, t)
                attempt, warmup, warm_step = attempt + 1, WARMUP_AFTER_RESTART, 0
                attempt_bounds.append([t, None])
                continue
            self.log.add(**row, complete=True, cut=-1)
            if active is not None or after_restart:
                self.blame(restart if active is None else active, t, end, jitter * (duration - fault_free))
                if active is not None:
                    self.tally[active].slowdowns.append(duration / fault_free)
            if slow_step is not None:
                self.blame(slow_step, t, end, stall)
                self.tally[slow_step].slow_steps.append((t, end, stall))
            if is_checkpoint:
                last_checkpoint = end
            t, number, warm_step, end_of_traffic = end, number + 1, warm_step + 1, end

        traffic_end = spec.start_s if end_of_traffic is None else end_of_traffic
        if attempt_bounds[-1][1] is None:
            attempt_bounds[-1][1] = traffic_end
        storage = (self.cluster.gpu_nic, self.cluster.storage_base, self.cluster.n_storage, self.salt)
        checkpoints = [checkpoint_template(model, placement, *storage) for placement in self.placements]
        return JobPlan(
            job_id=self.job_id,
            spec=spec,
            model=model,
            placements=self.placements,
            attempt_spans=[self.clip(start, max(start, end)) for start, end in attempt_bounds],
            templates=self.templates,
            checkpoints=checkpoints,
            checkpoint_loads=[checkpoint_load_template(writes, self.salt) for writes in checkpoints],
            loads=np.array(self.loads, float).reshape(-1, 3),
            steps=self.log.arrays(),
            cutoffs=self.cutoffs,
            faults=self.fault_rows(),
            start_s=max(spec.start_s, 0.0),
            end_s=min(traffic_end, self.window_s),
            restarts=len(self.placements) - 1,
        )

    def clip(self, start: float, end: float) -> tuple[float, float]:
        return min(max(start, 0.0), self.window_s), min(max(end, 0.0), self.window_s)

    def silence(self, i: int, failed_at: float, attempt: int, template: Template, steps: list[dict]) -> np.ndarray:
        """When each endpoint stops sending. A hung GPU's NIC stops at once; its peers run on until
        they first wait on it (its next transfer in the cut `steps`, e.g. the gradient collective
        of a data-parallel job hung in compute), send what does not depend on it, and block within
        seconds. A failing job stops all at once."""
        job_nics = _nics(self.placements[attempt], self.cluster)
        cutoff = np.full(self.cluster.n_endpoints, np.inf)
        if self.faults[i].kind == "hang":
            nic = self.subject_nic[i]
            needs = [_first_need(template, step, nic, failed_at) for step in steps]
            waits_from = next((need for need in needs if need is not None), failed_at)
            cutoff[job_nics] = waits_from + self.rng.uniform(*HANG_SPREAD_S, len(job_nics))
            cutoff[nic] = failed_at
        else:
            cutoff[job_nics] = failed_at + self.rng.uniform(0, RESTART_STOP_S, len(job_nics))
        return cutoff

    def hang(self, i: int, at: float, last_checkpoint: float) -> float:
        """The job holds its hosts, silent, until the watchdog (or the allotment's time limit) kills
        it: all since the last checkpoint is lost. Returns when it is killed."""
        killed_at = min(at + self.watchdog_s, self.spec.end_s)
        silent_until = min(killed_at, self.window_s)
        self.tally[i] = _Tally(
            wasted_gpu_s=self.spec.n_gpus * (silent_until - max(last_checkpoint, 0.0)),
            start=at, end=silent_until,
            params={"lost_since_checkpoint_s": round(at - max(last_checkpoint, 0.0), 3),
                    "killed_at_s": round(killed_at, 3), "resumes": bool(self.faults[i].resume)})
        return killed_at

    def restart_after_hang(self, i: int, killed_at: float, resume: float) -> int:
        """The killed job is restarted from its last checkpoint on the same hosts: a restart fault
        of its own, costing the downtime (the lost work is the hang's); returns its index."""
        self.faults.append(FaultSpec("restart", at_s=killed_at, gap_s=self.faults[i].gap_s))
        self.tally.append(_Tally(
            wasted_gpu_s=self.spec.n_gpus * (min(resume, self.window_s) - min(killed_at, self.window_s)),
            start=killed_at, end=min(resume, self.window_s),
            params={"after_hang": True, "gap_s": self.faults[i].gap_s}))
        self.placements.append(self.placements[-1])
        return len(self.faults) - 1

    def restart(self, i: int, at: float, last_checkpoint: float) -> float:
        """The job resumes from its last checkpoint after the gap, maybe on a replacement host;
        returns when."""
        f = self.faults[i]
        resume = at + f.gap_s
        self.tally[i] = _Tally(
            wasted_gpu_s=self.spec.n_gpus * (min(resume, self.window_s) - max(last_checkpoint, 0.0)),
            start=at, end=min(resume, self.window_s),
            params={"lost_since_checkpoint_s": round(at - max(last_checkpoint, 0.0), 3), "gap_s": f.gap_s})
        placement = self.placements[-1]
        if f.replace_host is not None:
            hosts = placement.hosts.copy()
            hosts[f.host] = f.replace_host
            self.tally[i].params["replaced_host"] = {"old": self.cluster.host_name(placement.hosts[f.host]),
                                                     "new": self.cluster.host_name(f.replace_host)}
            placement = replace(placement, hosts=hosts)
        self.placements.append(placement)
        return resume

    def load_checkpoint(self, stopped_at: float, resume: float) -> None:
        """The relaunched attempt (on the latest hosts) reads its checkpoint back just before its
        first step at `resume`, taking as long as the save or half the downtime, whichever is
        shorter."""
        load_s = min(self.model.ckpt_save_s, (resume - stopped_at) / 2)
        self.loads.append((resume - load_s, load_s / self.model.ckpt_save_s, len(self.placements) - 1))

    def fault_rows(self) -> list[dict]:
        """Truth rows (times in scenario seconds); faults that touched no step seen are left out."""
        rows = []
        for i, (f, tally) in enumerate(zip(self.faults, self.tally)):
            if f.kind == "slow_step":
                rows += [dict(kind=f.kind, subject=self.job_id, start=start, end=end,
                              wasted=extra * self.spec.n_gpus, params={"factor": f.factor, "nth": k})
                         for k, (start, end, extra) in enumerate(tally.slow_steps)
                         if start >= 0 and end <= self.window_s]
                continue
            if not tally.start < tally.end:
                continue
            subject = self.job_id
            if f.kind == "straggler":
                subject = self.cluster.host_name(self.spec.hosts[f.host])
            elif f.kind in ("slow_link", "hang"):
                subject = self.cluster.addrs[self.subject_nic[i]].as_py()
            params = tally.params or {"factor": f.factor}
            if self.spec.traits is not None and tally.slowdowns:
                params["step_slowdown"] = round(float(np.mean(tally.slowdowns)), 4)
            rows.append(dict(kind=f.kind, subject=subject, start=tally.start, end=tally.end,
                             wasted=tally.wasted_gpu_s, params=params))
        for n, row in enumerate(rows):
            row["fault_id"] = f"{self.job_id}-f{n}"
            row["params"] = json.dumps(row["params"], sort_keys=True)
        return rows


def _first_need(template: Template, step: dict, nic: int, after: float) -> float | None:
    """When the step first moves data to or from `nic` at or after `after` (None: never)."""
    planned = step["base"] + step["jitter"] * template.rel_start
    needs = planned[((template.src == nic) | (template.dst == nic)) & (planned >= after)]
    return float(needs.min()) if len(needs) else None


def _nics(placement: Placement, cluster: Cluster) -> np.ndarray:
    """The NICs of the job's GPUs, in rank order, each once."""
    nics = cluster.gpu_nic[placement.gpus]
    return nics[np.sort(np.unique(nics, return_index=True)[1])]


def _busy_nic(template: Template, cluster: Cluster, host: int, rail: int) -> int:
    """The NIC of `host` nearest to `rail` that carries the job's traffic (a fault on an unused
    NIC would leave no trace)."""
    used = np.unique(np.concatenate([template.src, template.dst]))
    on_host = used[used // GPUS_PER_HOST == host]
    if not len(on_host):
        return int(cluster.gpu_nic[host * GPUS_PER_HOST + rail])
    return int(on_host[np.argmin(np.abs(on_host % GPUS_PER_HOST - rail))])
