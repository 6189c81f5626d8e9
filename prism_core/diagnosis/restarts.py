"""Restarts: the attempt number goes up, or the job falls silent between two steps for longer than
any step takes, and resumes on new connections (restarted processes connect anew; a job that
resumes on its queue pairs only paused: prism_core.queue_pairs). The first `warmup_steps` steps
of an attempt (and of a job first seen) are warm-up: slow by nature, charged to the restart. A
job that resumes after a silence as long as the collective watchdog's timeout was hung, killed
and restarted: the restart then costs its downtime from the kill, the hang the work lost since
the checkpoint. A restart seen only from its checkpoint load (hangs.checkpoint_load) is reported
to the end of the data and continued by the resumed steps next hour, under the same issue id.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from prism_core import waste
from prism_core.constants import NS_PER_S as NS
from prism_core.queue_pairs import kept_connections_share
from prism_core.rhythm import on_rhythm

from . import hangs
from .checkpoints import Checkpoints, save_rhythm
from .issues import Issue
from .job_hour import JobHour
from .params import DiagnosisParams
from .state import Progress, Resumed, Stop


@dataclass(frozen=True, eq=False)
class Resumes:
    steps: np.ndarray  # indices of the steps that resume the job after a restart
    warmup: np.ndarray  # per step: warm-up after a restart or the job's first step
    first_step_ns: int | None  # the job's first step (its first traffic): its work starts here
    # indices of the steps that end a quiet gap that was no restart: the job only paused (a save
    # over a network the flow logs do not see, its step finished and its connections kept)
    paused: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def find_resumes(job: JobHour, progress: Progress, stop: Stop | None, saves_rhythm: tuple[int, int] | None,
                 params: DiagnosisParams, steps_resolved: bool = True) -> Resumes:
    """The steps that resume the job (the attempt goes up, or it was silent for longer than any
    step takes, after a step cut short, but not on the job's own connections nor on the rhythm
    of its saves: `saves_rhythm`, (period, phase) in step numbers, from earlier hours), and its
    warm-up steps. `stop`: how the job's traffic stopped in an earlier hour. `steps_resolved`: the
    records resolve the steps; where they do not, no step shows itself cut short, and a restart
    the recognition found (the attempt goes up) stands."""
    if not job.n_steps:
        return Resumes(np.zeros(0, np.int64), np.zeros(0, bool), progress.first_step_ns)
    previous_attempt = np.r_[progress.last_attempt, job.attempt[:-1]]
    last_end = job.seconds(progress.last_step_end_ns) if progress.last_step_end_ns is not None else np.nan
    silence = job.step_start - np.r_[last_end, job.step_end[:-1]]
    quiet = silence > params.restart_gap_steps * float(np.median(job.duration))  # longer than any step takes
    # the job's records must fall silent too: where they do not resolve its steps (a flow cache's
    # merged records, a sampler's instants) the timeline may find none while transfers go on. The
    # longest silence anywhere in the gap: the step after a long silence may begin after its first
    # traffic (the timeline places a step's start by its usual lead, not by the silence)
    quiet[quiet] &= _longest_silence(job, (job.step_start - silence)[quiet], job.step_start[quiet]) > params.restart_gap_s
    resumed = (job.attempt > previous_attempt) | (quiet & (silence > params.restart_gap_s))
    # a job that resumed on the connections it had only paused (a save the flow logs do not see);
    # one on new connections, or on a host recognition saw replace one of its own, restarted its
    # processes, whatever the records show of how it stopped
    silent_from = np.r_[last_end, job.step_end[:-1]][resumed]
    kept = kept_connections_share(job.src, job.dst, job.port, job.start, silent_from, job.step_start[resumed],
                                  params.connection_window_s)
    replaced = np.zeros(job.n_steps, bool)
    replaced[resumed] = _host_replaced(job, silent_from, job.step_start[resumed], params)
    reconnected = np.zeros(job.n_steps, bool)
    reconnected[resumed] = (kept < params.same_connection_share) | replaced[resumed]
    resumed[resumed] &= ~(kept >= params.same_connection_share)
    # A crash stops the job in the middle of a step: traffic of the unfinished step comes before
    # the silence. A job that finished its step and went quiet (a save over a network the flow logs
    # do not see; recognition may still take its return for a restart) was not interrupted, unless
    # it came back on new connections (a crash between two steps' traffic: in the compute).
    # Without the step before (a job new to Prism) nothing shows it; a stop in an earlier hour
    # says itself how it happened.
    interrupted = _interrupted(job, last_end, params) | np.isnan(np.r_[last_end, job.step_end[:-1]])
    interrupted[0] |= stop is None or stop.mid_step
    if not steps_resolved:
        interrupted |= job.attempt > previous_attempt
    resumed &= ~quiet | interrupted | reconnected
    # A save over a network the flow logs do not see leaves the job quiet between two steps (and
    # recognition may take the job's return for a restart): resumes after steps on the rhythm of
    # such quiet gaps (or of the saves of earlier hours), in step numbers, are the job's saves,
    # not restarts (crashes recur on no rhythm), unless a host was replaced (a save replaces none)
    saved = job.number - 1  # the step before each quiet gap
    rhythm = save_rhythm(saved[quiet | resumed], params.rhythm_repeats_unwritten, params) or saves_rhythm
    if rhythm:
        resumed &= ~on_rhythm(saved, resumed, *rhythm, params.rhythm_slack_steps) | replaced
    resumes = np.flatnonzero(resumed)
    paused = np.flatnonzero(quiet & ~resumed)
    warmup = np.zeros(job.n_steps, bool)
    first_step_ns = progress.first_step_ns
    for first in resumes.tolist() + ([0] if first_step_ns is None else []):
        warmup[first:first + params.warmup_steps] = True
    if first_step_ns is None:  # the work starts with the job's first traffic
        first_traffic = job.start.min() if len(job.start) else job.step_start[0]
        first_step_ns = job.ns(max(job.step_start[0], first_traffic))
    return Resumes(resumes, warmup, first_step_ns, paused)


def _interrupted(job: JobHour, last_end: float, params: DiagnosisParams) -> np.ndarray:
    """Per step: some of the job's flows started after the step before it ended and before this
    one began (an unfinished step's, cut short)."""
    previous_end = np.r_[last_end, job.step_end[:-1]]
    after_previous = np.searchsorted(job.start, np.nan_to_num(previous_end, nan=np.inf), side="left")
    before_this = np.searchsorted(job.start, job.step_start - params.boundary_slack_s, side="left")
    return before_this > after_previous


def _longest_silence(job: JobHour, since: np.ndarray, until: np.ndarray) -> np.ndarray:
    """Per window [since, until] (disjoint, in order): the longest stretch of it in which none of
    the job's records was in flight."""
    if not len(job.end):
        return until - since
    reach = job.latest_end  # records come in start order: the last end so far
    first = np.searchsorted(job.start, since, side="left")
    last = np.searchsorted(job.start, until, side="left")
    longest = np.empty(len(since))
    for i, (a, b) in enumerate(zip(first.tolist(), last.tolist())):
        # each record's start after the reach of the records before it (the first: of the window)
        starts = np.r_[job.start[a:b], until[i]]
        reached = np.maximum(np.r_[reach[a - 1] if a else -np.inf, reach[a:b]], since[i])
        longest[i] = np.max(starts - reached)
    return longest


def restart_issues(job: JobHour, resumes: Resumes, progress: Progress, stop: Stop | None, checkpoints: Checkpoints,
                   baseline: np.ndarray, level_s: float | None, params: DiagnosisParams
                   ) -> tuple[list[Issue], Stop | None]:
    """A restart per resume (and a hang before it, when the job was killed by the watchdog and no
    earlier hour reported the hang). `progress` and `stop` are the previous hour's: a resume at
    the hour's first step failed when that stop happened. Returns the stop, marked as a hang when
    one was reported from it."""
    issues = []
    for i in resumes.steps.tolist():
        previous_end = job.step_end[i - 1] if i else (
            job.seconds(progress.last_step_end_ns) if progress.last_step_end_ns is not None else job.step_start[i])
        partial = (job.start >= previous_end) & (job.start < job.step_start[i] - params.boundary_slack_s)
        failed = float(job.end[partial].max()) if partial.any() else previous_end
        hosts_before = job.host_names_active(failed - params.active_window_s, failed)
        checkpoint_ns = checkpoints.before(job, failed)
        seen_loading = None  # the restart as its checkpoint load showed it in an earlier hour
        stop_before = stop if i == 0 else None
        if stop_before:
            failed = job.seconds(stop_before.at_ns)
            hosts_before = list(stop_before.hosts)
            checkpoint_ns = stop_before.checkpoint_ns
            seen_loading = stop_before.resumed
        resume = job.step_start[i]
        killed, hang, hung = _killed_after_hang(job, stop_before, i, failed, resume, checkpoints, level_s, params)
        issues += hang
        if stop_before:
            stop = hung
        # after a hang, the work lost since the checkpoint is the hang's: the restart costs the
        # downtime from the kill on
        restart_from_ns = job.ns(killed) if killed is not None else checkpoint_ns
        start_ns = restart_from_ns if killed is not None else job.ns(failed)
        charged_from_ns = restart_from_ns
        if seen_loading:  # the same issue: charge what the earlier hour did not
            start_ns = seen_loading.start_ns
            charged_from_ns = max(restart_from_ns, seen_loading.charged_until_ns)
        warm = np.arange(i, min(i + params.warmup_steps, job.n_steps))
        warm = warm[job.attempt[warm] == job.attempt[i]]
        n_gpus = job.gpus_active(resume, job.step_end[warm[-1]])
        cost = waste.restart_gpu_s(n_gpus, charged_from_ns, job.ns(resume), job.duration[warm], baseline[warm])
        evidence = _evidence(job, failed, resume, killed is not None, checkpoint_ns, int(job.attempt[i]),
                             float(np.sum(job.duration[warm] - baseline[warm])), hosts_before,
                             job.host_names_active(resume, job.step_end[warm[-1]]), job.ns(resume), params)
        issues.append(Issue.of(job.job_id, "restart", job.job_id, start_ns, job.ns(resume), share=1.0,
                               confidence=params.restart_confidence, wasted_gpu_s=cost, evidence=evidence,
                               params=params))
    return issues, stop


def _killed_after_hang(job: JobHour, stop: Stop | None, i: int, failed: float, resume: float,
                       checkpoints: Checkpoints, level_s: float | None, params: DiagnosisParams
                       ) -> tuple[float | None, list[Issue], Stop | None]:
    """When the job that resumes at step `i` was killed, if it had hung (None: it crashed); the hang
    issue when it is reported here, and `stop` (the previous hour's, for the hour's first step)
    marked as a reported hang. A hang reported in an earlier hour says so; otherwise a silence as
    long as the collective watchdog's timeout does (a crashed job is relaunched sooner). The
    watchdog killed the job `hang_watchdog_s` after it hung, unless it resumed sooner."""
    reported = bool(stop and stop.hang)
    if not reported and (resume - failed < params.hang_watchdog_s or (i == 0 and not stop)):
        return None, [], stop
    hung = stop or hangs.describe_stop(job, checkpoints, level_s, params, before=resume - params.boundary_slack_s)
    killed = min(job.seconds(hung.at_ns) + params.hang_watchdog_s, resume)
    if reported:
        return killed, [], stop
    hang, hung = hangs.hang_issue(job, hung, killed, "killed_by_watchdog" if killed < resume else "resumed",
                                  checkpoints, params)
    return killed, [hang], hung if stop else None


def load_restart_issue(job: JobHour, stop: Stop, load: tuple[float, float], checkpoints: Checkpoints,
                       last_attempt: int, params: DiagnosisParams) -> tuple[Issue, Stop]:
    """A restart seen from its checkpoint `load` alone (no resumed step in view): from the kill
    (after a hang) or the failure to the end of the data seen, costing the job's GPUs over the
    downtime seen (and, after a failure, the work lost since the checkpoint). The stop remembers
    it, so that the resumed steps next hour continue the same issue and charge only their part."""
    load_start, load_end = load
    failed = job.seconds(stop.at_ns)
    checkpoint_ns = stop.checkpoint_ns or checkpoints.before(job, failed)
    if stop.hang:
        start_ns = restart_from_ns = job.ns(min(failed + params.hang_watchdog_s, load_start))
    else:
        start_ns, restart_from_ns = job.ns(failed), checkpoint_ns
    until_ns = job.ns(max(job.data_end, load_end))
    evidence = {
        **_evidence(job, failed, load_start, stop.hang, checkpoint_ns, last_attempt + 1, 0.0, [], [], until_ns, params),
        "recognized_from": "checkpoint_load",
        "checkpoint_load_s": load_end - load_start,
        "warmup_steps_seen": 0,
    }
    cost = waste.idle_gpu_s(stop.n_gpus, restart_from_ns, until_ns)
    issue = Issue.of(job.job_id, "restart", job.job_id, start_ns, until_ns, share=1.0,
                     confidence=params.load_restart_confidence, wasted_gpu_s=cost, evidence=evidence, params=params)
    return issue, replace(stop, resumed=Resumed(start_ns=start_ns, charged_until_ns=until_ns))


def _evidence(job: JobHour, failed: float, resumed: float, after_hang: bool, checkpoint_ns: int, attempt: int,
              warmup_excess_s: float, hosts_before: list[str], hosts_after: list[str], until_ns: int,
              params: DiagnosisParams) -> dict:
    """A restart's evidence: when the job failed and resumed (seconds), and what changed."""
    return {
        "failed_at_ns": job.ns(failed),
        "gap_s": resumed - failed,
        "after_hang": after_hang,
        "lost_since_checkpoint_s": (job.ns(failed) - checkpoint_ns) / NS,
        "warmup_excess_s": warmup_excess_s,
        "attempt": attempt,
        "hosts_replaced": sorted(set(hosts_before) - set(hosts_after)),
        "hosts_added": sorted(set(hosts_after) - set(hosts_before)),
        "recognized_events": job.event_kinds(job.ns(failed), until_ns, params.event_window_s),
    }


def _host_replaced(job: JobHour, silent_from: np.ndarray, resumed_at: np.ndarray,
                   params: DiagnosisParams) -> np.ndarray:
    """Per resume: recognition saw a host replace one of the job's after its silence began and
    by `event_window_s` after its resumed step began (the event is the job's first traffic back)."""
    replaced = job.event_ns[job.event_kind == "host_replaced"]
    if not len(replaced) or not len(resumed_at):
        return np.zeros(len(resumed_at), bool)
    lo = job.origin_ns + np.nan_to_num(silent_from, nan=-np.inf) * NS
    hi = job.origin_ns + resumed_at * NS + params.event_window_s * NS
    return ((replaced[None, :] >= lo[:, None]) & (replaced[None, :] <= hi[:, None])).any(axis=1)


def next_progress(job: JobHour, progress: Progress, first_step_ns: int | None) -> Progress:
    """How far the job got by the hour's end."""
    if not job.n_steps:
        return progress
    return Progress(
        steps_seen=progress.steps_seen + job.n_steps,
        last_attempt=int(job.attempt[-1]),
        last_step_end_ns=job.ns(job.step_end[-1]),
        first_step_ns=first_step_ns,
        n_gpus=job.gpus_active(job.step_start[-1], job.step_end[-1]),
    )
