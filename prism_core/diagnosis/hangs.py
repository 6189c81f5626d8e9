"""Stops and hangs.

A hang: the job stopped in the middle of a step and its hosts stayed silent, not taken by another
job: for `hang_confirm_s` (or three steps) when its GPUs fell silent one after another (the first
ones, busy at that point in earlier steps, are the subject), for `crash_wait_s` when they all
stopped at once (a crash looks the same until the job resumes: a restart), or until the data ends.
A hang lasts until the collective watchdog kills the job (`hang_watchdog_s`), traffic resumes, its
hosts are taken or the data ends. A job resumed after a stop first reads its checkpoint back from
storage: `checkpoint_load` finds that burst of bulk reads before any resumed step is seen.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from prism_core import waste
from prism_core.arrays import combined_key
from prism_core.constants import NS_PER_S as NS
from prism_core.parallelism import family_codes

from .checkpoints import Checkpoints
from .issues import Issue
from .job_hour import JobHour
from .params import DiagnosisParams
from .state import CheckpointState, OpenHang, Progress, Stop


def continue_hang(job: JobHour, hang: OpenHang | None, params: DiagnosisParams
                  ) -> tuple[list[Issue], OpenHang | None]:
    """This hour's part of a hang open since an earlier hour, and the hang if it is still open."""
    if not hang:
        return [], None
    resumed = float(job.start[0]) if len(job.start) else np.inf
    taken = job.hosts_taken_after(list(hang.hosts), 0.0)
    killed = job.seconds(hang.start_ns) + params.hang_watchdog_s
    end = min(resumed, taken, killed, job.data_end)
    cost = waste.idle_gpu_s(hang.n_gpus, job.origin_ns, job.ns(end))
    issue = Issue.of(job.job_id, "hang", hang.subject, hang.start_ns, job.ns(end), share=1.0,
                     confidence=hang.confidence, wasted_gpu_s=cost, params=params,
                     evidence={"continued": True, "ended_by": _ended_by(end, resumed, taken, killed, job.hour_end)})
    return [issue], hang if end >= job.hour_end else None


def watch_stop(job: JobHour, progress: Progress, stop: Stop | None, open_hang: OpenHang | None,
               checkpoints: Checkpoints, checkpoint_state: CheckpointState, level_s: float | None,
               params: DiagnosisParams) -> tuple[list[Issue], Stop | None, OpenHang | None, tuple[float, float] | None]:
    """Did the job stop before the data ends (this hour, or as `stop` from an earlier hour)? Decide
    hang now, or wait for the next hour. Returns the hang, the stop to remember, the open hang,
    and the checkpoint load of a resume after the stop (restarts.load_restart_issue reports it)."""
    if len(job.start) and progress.steps_seen + job.n_steps >= params.min_steps:
        stop = describe_stop(job, checkpoints, level_s, params)
    elif not stop:
        return [], None, open_hang, None
    load = checkpoint_load(job, stop, checkpoint_state, params)
    if open_hang or stop.decided:
        return [], stop, open_hang, load
    stop, hang, open_hang = _decide_hang(job, stop, load, checkpoints, params)
    return hang, stop, open_hang, load


def _decide_hang(job: JobHour, stop: Stop, load: tuple[float, float] | None, checkpoints: Checkpoints,
                 params: DiagnosisParams) -> tuple[Stop, list[Issue], OpenHang | None]:
    """Is the undecided `stop` a hang? Report it, or wait for the next hour. A checkpoint `load`
    after the stop is the job resuming."""
    stopped_at = job.seconds(stop.at_ns)
    taken = job.hosts_taken_after(list(stop.hosts), stopped_at)
    killed = stopped_at + params.hang_watchdog_s
    resumed = load[0] if load is not None else np.inf
    silent_until = min(taken, job.data_end, killed, resumed)
    silence = silent_until - job.seconds(stop.last_active_ns)
    # A crash looks the same until the job resumes (a restart): wait longer for it. When the
    # data ends first, the job is called hung if it was silent long enough to tell at all.
    wait = stop.confirm_s if stop.staggered else max(stop.confirm_s, params.crash_wait_s)
    if silence < wait:
        if silent_until >= job.hour_end:
            return stop, [], None  # still silent at the hour's end: decide next hour
        if not (silent_until == job.data_end and silence >= stop.confirm_s):
            return replace(stop, decided=True), [], None  # running on, or hosts taken by another job
    stop = replace(stop, decided=True)
    if not stop.mid_step:
        return stop, [], None  # a normal end: the last step completed
    ended_by = _ended_by(silent_until, resumed, taken, killed, job.hour_end)
    hang, stop = hang_issue(job, stop, silent_until, ended_by, checkpoints, params)
    if silent_until < job.hour_end:
        return stop, [hang], None
    return stop, [hang], OpenHang(issue_id=hang.issue_id, subject=hang.subject, start_ns=stop.at_ns,
                                  hosts=stop.hosts, n_gpus=stop.n_gpus, confidence=hang.confidence)


def hang_issue(job: JobHour, stop: Stop, until: float, ended_by: str, checkpoints: Checkpoints,
               params: DiagnosisParams) -> tuple[Issue, Stop]:
    """A hang from `stop` to `until`: the work since the last checkpoint completed before it (a save
    still running did not complete) and the silence are lost. Returns the stop marked as a
    reported hang, so that a restart from it charges only its own downtime."""
    checkpoint_ns = stop.checkpoint_ns or checkpoints.before(job, job.seconds(stop.at_ns))
    checkpoint_ns = min(checkpoint_ns, stop.at_ns)
    cost = waste.idle_gpu_s(stop.n_gpus, checkpoint_ns, job.ns(until))
    evidence = {"silent_first": stop.silent_first, "stagger_s": stop.stagger_s, "staggered": stop.staggered,
                "lost_since_checkpoint_s": (stop.at_ns - checkpoint_ns) / NS,
                "silent_s": until - job.seconds(stop.at_ns), "hosts": stop.hosts, "ended_by": ended_by}
    confidence = params.staggered_hang_confidence if stop.staggered else params.sudden_hang_confidence
    subject = ",".join(stop.silent_first) or job.job_id
    issue = Issue.of(job.job_id, "hang", subject, stop.at_ns, job.ns(until), share=1.0, confidence=confidence,
                     wasted_gpu_s=cost, evidence=evidence, params=params)
    return issue, replace(stop, hang=True)


def describe_stop(job: JobHour, checkpoints: Checkpoints, level_s: float | None, params: DiagnosisParams,
                  before: float = np.inf) -> Stop:
    """How the job's traffic ended this hour (or, with `before`, before that time): when, whether
    in the middle of a step, and which GPUs went silent first. GPUs fell silent one after another
    (a hang) when some stopped while the others went on, although in the last complete steps they
    were active at that point of the step. `level_s` is the job's usual step time, for an hour
    without steps."""
    # the flows seen before `before` are the first ones (they come by start): read as views
    seen = int(np.searchsorted(job.start, before, side="left"))
    stopped = float(job.end[:seen].max())
    n_steps = int(np.searchsorted(job.step_start, before))
    per_step = np.bincount(job.step[:seen] + 1, minlength=n_steps + 1)[1:n_steps + 1]  # -1: in no step
    complete = (np.flatnonzero(per_step >= params.complete_step_share * np.median(per_step)) if n_steps
                else np.zeros(0, int))
    unfinished_start = job.step_end[complete[-1]] if len(complete) else -np.inf
    # A checkpoint saved after the last complete step (the step that saved it had not been
    # divided from the next yet) completed that step's work: the unfinished step began when
    # the save's last write to storage ended.
    saved = (job.write_start >= unfinished_start) & (job.write_end < min(before, stopped)) & bool(len(complete))
    saved &= job.write_to_storage
    save_end = float(job.write_end[saved].max()) if saved.any() else None
    unfinished_start = save_end if save_end is not None else unfinished_start
    mid_step = bool(seen) and bool(job.start[seen - 1] > unfinished_start)
    typical_step = float(np.median(job.duration[:n_steps])) if n_steps else (level_s or 0.0)

    # the GPUs active since the last complete step began (a checkpoint step is long: a GPU
    # that hung while saving last spoke before it)
    since = min(unfinished_start - typical_step, job.step_start[complete[-1]] if len(complete) else -np.inf)
    recent = np.flatnonzero(job.end[:seen] >= since)
    addr = np.concatenate([job.src[recent], job.dst[recent]])
    last_seen, last_begun = np.full(len(job.addrs), -np.inf), np.full(len(job.addrs), -np.inf)
    np.maximum.at(last_seen, addr, np.concatenate([job.end[recent], job.end[recent]]))
    np.maximum.at(last_begun, addr, np.concatenate([job.start[recent], job.start[recent]]))
    active = np.unique(addr)
    # silent for a while before the others stopped, though normally busy then (the phase
    # tolerance covers step-to-step jitter)
    tolerance = max(params.phase_tolerance_s, params.phase_tolerance_share * typical_step)
    quiet = active[last_seen[active] <= stopped - params.hang_stagger_s - 2 * tolerance]
    reference = complete[-params.stop_reference_steps:]
    expected = _active_at_phase(
        job, reference, quiet, last_seen[quiet] - unfinished_start + tolerance,
        stopped - unfinished_start - params.hang_stagger_s - tolerance) if len(complete) else np.zeros(0, bool)
    # silent for longer than a whole step while the others went on: a GPU busy in every step
    # should have spoken, whatever the phase (the peers of a stuck GPU can run on for more than
    # a step, when they first wait for it at the next step's gradient synchronization)
    whole_step = stopped - params.hang_stagger_s - last_seen[quiet] - 2 * tolerance >= typical_step
    if len(complete) and whole_step.any():
        expected |= whole_step & _active_at_phase(job, reference, quiet, np.full(len(quiet), -np.inf), np.inf)
    silenced = quiet[expected]
    # no GPU fell silent before the others, and a whole step's transfers came after the last
    # complete step, from every GPU of the steps before and each of a size they moved: the job's
    # last step, which no next step's start divided from the silence after it (a normal end).
    # Transfers in flight when a job stopped carry only what they moved by then.
    if mid_step and len(complete) and not len(silenced) and _whole_step(
            job, _before(job.start > unfinished_start, seen), _before(job.end > unfinished_start, seen),
            complete[-params.stop_reference_steps:], per_step, params):
        mid_step = False
    # When each went silent: at its last flow, or, for a GPU that began no flow in the
    # unfinished step, when it failed to send its first usual transfer of that step (its last
    # flow of the step before only shows that it finished that step, as every GPU did: the
    # stage that finishes its step earliest is no more silent than the others, and a GPU
    # downstream of the stuck one waits for it before it first sends). A flow that ends past the
    # step's start but began before it is the step before's: a sync the clock's tick or the
    # step division's slack carried over the boundary.
    silent_since = last_seen.copy()
    unseen = silenced[last_begun[silenced] < unfinished_start]
    missed = unfinished_start + _usual_first_send(job, reference, unseen)
    silent_since[unseen] = np.where(np.isnan(missed), last_seen[unseen], missed)
    # the GPUs that went silent first; the whole job when none stopped before the others
    first_silent = silent_since[silenced].min(initial=np.inf)
    silent_first = silenced[silent_since[silenced] <= first_silent + params.hang_stagger_s / 2]
    first = last_seen[silent_first if len(silent_first) else active].min()
    # a checkpoint write keeps the job busy without traffic between its GPUs
    last_active = max(stopped, float(job.write_end[job.write_end < before].max(initial=-np.inf)))
    return Stop(
        at_ns=job.ns(float(first)),
        checkpoint_ns=job.ns(save_end) if save_end is not None and save_end <= first
        else checkpoints.before(job, float(first)),
        last_active_ns=job.ns(last_active),
        confirm_s=max(params.hang_confirm_s, params.hang_confirm_steps * typical_step),
        mid_step=mid_step,
        staggered=bool(len(silenced)),
        stagger_s=stopped - float(first),
        silent_first=tuple(sorted(job.addrs[silent_first].tolist())),
        hosts=tuple(job.host_names_active(stopped - params.active_window_s, stopped)),
        n_gpus=job.gpus_active(stopped - params.active_window_s, stopped),
        decided=False,
    )


def _before(flows: np.ndarray, seen: int) -> np.ndarray:
    """The `flows` (a mask) among the first `seen`."""
    flows[seen:] = False
    return flows


def _whole_step(job: JobHour, flows: np.ndarray, running: np.ndarray, reference: np.ndarray, per_step: np.ndarray,
                params: DiagnosisParams) -> bool:
    """Whether the `flows` (a mask) are one step's transfers: about as many as the `reference`
    steps had each, of the sizes (families) they moved, with every GPU of theirs in the records
    `running` in the step (a flow cache's record of a GPU's transfers may begin before it)."""
    usual = float(np.median(per_step[reference]))
    if usual <= 0 or not params.complete_step_share <= flows.sum() / usual <= 2 - params.complete_step_share:
        return False
    in_reference = np.isin(job.step, reference)
    gpus = np.union1d(job.src[in_reference], job.dst[in_reference])
    if not np.isin(gpus, np.r_[job.src[running], job.dst[running]]).all():
        return False
    family = family_codes(np.r_[job.nbytes[in_reference], job.nbytes[flows]])
    n_reference = int(in_reference.sum())
    return bool(np.isin(family[n_reference:], family[:n_reference]).all())


def _active_at_phase(job: JobHour, steps: np.ndarray, addrs: np.ndarray, since: np.ndarray, until: float) -> np.ndarray:
    """For each address: did it carry traffic between `since` (its own) and `until` seconds into
    at least half of `steps`?"""
    if not len(addrs):
        return np.zeros(0, bool)
    in_steps = np.isin(job.step, steps)
    step = np.tile(job.step[in_steps], 2)
    addr = np.concatenate([job.src[in_steps], job.dst[in_steps]])
    phase = np.tile(job.start[in_steps] - job.step_start[job.step[in_steps]], 2)
    slot = np.full(len(job.addrs), -1)
    slot[addrs] = np.arange(len(addrs))
    mine = slot[addr] >= 0
    hit = mine & (phase > since[np.maximum(slot[addr], 0)]) & (phase <= until)
    busy_steps = np.zeros(len(addrs))
    pairs = np.unique(combined_key(slot[addr[hit]], step[hit]), return_index=True)[1]
    np.add.at(busy_steps, slot[addr[hit]][pairs], 1)
    return busy_steps >= max(len(steps), 1) / 2


def _usual_first_send(job: JobHour, steps: np.ndarray, addrs: np.ndarray) -> np.ndarray:
    """For each address: when it usually sends its first flow of a step, seconds after the step's
    start (the median over the `steps` it sent in); when it sent in none of them, when its first
    flow, sent or received, usually comes. A send is what a GPU does; it receives what its peers
    send, whether it is stuck or not."""
    if not len(addrs) or not len(steps):
        return np.full(len(addrs), np.nan)
    in_steps = np.flatnonzero(np.isin(job.step, steps))
    column = np.searchsorted(steps, job.step[in_steps])
    at = job.start[in_steps] - job.step_start[job.step[in_steps]]
    slot = np.full(len(job.addrs), -1)
    slot[addrs] = np.arange(len(addrs))

    def median_first(addr: np.ndarray, column: np.ndarray, at: np.ndarray) -> np.ndarray:
        first = np.full((len(addrs), len(steps)), np.inf)
        mine = slot[addr] >= 0
        np.minimum.at(first, (slot[addr[mine]], column[mine]), at[mine])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an address in none of the steps
            return np.nanmedian(np.where(np.isfinite(first), first, np.nan), axis=1)

    sends = median_first(job.src[in_steps], column, at)
    any_flow = median_first(np.r_[job.src[in_steps], job.dst[in_steps]], np.r_[column, column], np.r_[at, at])
    return np.where(np.isnan(sends), any_flow, sends)


def checkpoint_load(job: JobHour, stop: Stop, checkpoints: CheckpointState, params: DiagnosisParams
                    ) -> tuple[float, float] | None:
    """Start and end of the checkpoint load of a resume after `stop` whose steps are not in view:
    the first burst of bulk reads into the job's GPUs after the stop that brings back about what
    its last checkpoint wrote (before any save: large shards into the GPUs that save), while no
    other job took its hosts (a new job on them reads its data too). None when there is none, or
    when it was reported already."""
    writers = checkpoints.checkpoint_writers or int(np.sum(job.replica_of_addr == 0))
    if stop.resumed or not writers:
        return None
    stopped_at = job.seconds(stop.at_ns)
    after = job.read_start > stopped_at
    start, end, dst, nbytes = (a[after] for a in (job.read_start, job.read_end, job.read_dst, job.read_bytes))
    if not len(start):
        return None
    burst = np.r_[0, np.cumsum(np.diff(start) > params.load_gap_s)]
    loaded = np.bincount(burst, weights=nbytes)
    readers = np.bincount(burst[np.unique(combined_key(burst, dst), return_index=True)[1]], minlength=len(loaded))
    saved = checkpoints.checkpoint_bytes or writers * params.load_min_shard_bytes
    loads = np.flatnonzero((loaded >= params.load_share * saved) & (readers >= params.load_share * writers))
    if not len(loads):
        return None
    load = float(start[burst == loads[0]].min()), float(end[burst == loads[0]].max())
    if (job.step_start > load[0]).any():
        return None  # the resumed steps are in view: restarts.restart_issues reports the restart
    if job.hosts_taken_after(list(stop.hosts), stopped_at) < np.inf:
        return None
    return load


def _ended_by(end: float, resumed: float, taken: float, killed: float, hour_end: float) -> str:
    if end >= hour_end - 1e-9:
        return "ongoing"
    return ("resumed" if end == resumed else "hosts_taken" if end == taken else "killed_by_watchdog"
            if end == killed else "data_end")
