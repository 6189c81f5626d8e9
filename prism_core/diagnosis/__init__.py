"""What went wrong in one job over one hour, and what it cost: the `issues` table.

Input is what the earlier stages know about the job (its flows, GPUs, classified pairs, steps and
recognition events) plus the state the previous hour left. Detectors, one module per rule family,
are functions of the job's hour (`JobHour`) and of what the detectors before them found;
`diagnose_job` runs them in order. docs/architecture.md ("Diagnosis detectors") explains the rules;
waste is computed by prism_core.waste.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa

from . import checkpoints, degradation, hangs, restarts, slow_links, slow_steps, stragglers
from .baseline import fit_baseline
from .issues import issue_id, issues_table, severity
from .job_hour import JobHour, StepMasks
from .params import DEFAULT_PARAMS, DiagnosisParams
from .state import DiagnosisState, HangState, LevelState
from .windows import span_mask

__all__ = ["DEFAULT_PARAMS", "Diagnosis", "DiagnosisParams", "diagnose_job", "has_open_issue", "is_hung", "issue_id", "severity"]


@dataclass
class Diagnosis:
    issues: pa.Table  # ISSUES schema
    state: dict  # JSON-serializable, handed to the next hour's diagnosis of this job


def diagnose_job(
    job_id: str,
    job_flows: pa.Table,
    job_gpus: pa.Table,
    comm_pairs: pa.Table,
    steps: pa.Table,
    events: pa.Table,
    previous: dict | None,
    hour_start_ns: int,
    hour_end_ns: int,
    hour_membership: pa.Table | None = None,
    params: DiagnosisParams = DEFAULT_PARAMS,
    steps_resolved: bool = True,
    shortest_timed_s: dict[str, float] | None = None,
    samplers: frozenset[str] = frozenset(),
) -> Diagnosis:
    """Issues of one job over [hour_start_ns, hour_end_ns).

    `hour_membership` (prism_core.recognition.MEMBERSHIP, every job of the hour) tells whether the job's
    hosts were taken by another job after it fell silent, and how far the hour's data reaches;
    without it the hour is assumed complete and no host taken. `events` (prism_core.recognition.EVENTS)
    add host replacements to the restart evidence. `steps_resolved`: the job's records resolve its
    steps (prism_core.resolution); where they do not, `steps` show no step cut short.
    `shortest_timed_s`: by exporter address, the shortest record whose length its clock resolves
    (prism_core.resolution.shortest_timed_s): a slow link is read from the throughput of those
    records only (none given: of every record). `samplers`: the exporters that sample packets,
    whose records time no send (stragglers are read without them). Call this also for a job without flows whose
    previous state has an open issue (`has_open_issue`), so an ongoing hang keeps counting.
    """
    state = DiagnosisState.load(previous)
    job = JobHour.build(job_id, job_flows, job_gpus, comm_pairs, steps, events, hour_membership, hour_start_ns,
                        hour_end_ns, params, shortest_timed_s, samplers)
    issues, open_hang = hangs.continue_hang(job, state.hangs.open_hang, params)
    resumes = restarts.find_resumes(job, state.progress, state.hangs.stop, state.checkpoints.checkpoint_rhythm,
                                   params, steps_resolved)
    checkpoints_found, checkpoint_state = checkpoints.find_checkpoints(
        job, resumes.warmup, state.checkpoints, resumes.first_step_ns, params, paused=resumes.paused)
    stop, open_windows = state.hangs.stop, {}
    # a degradation is open while steps show it
    level = LevelState(state.level.recent_s, state.level.level_s, step_bytes=state.level.step_bytes)
    if job.n_steps:
        previous_link, previous_straggler = state.open_windows.get("slow_link"), state.open_windows.get("straggler")
        link_steps = slow_links.slow_link_steps(job, resumes.warmup, params)
        link_windows = slow_links.link_windows(job, link_steps, previous_link, params)
        link_windowed = span_mask(link_windows, job.n_steps)
        # slow links make their receivers late too; a collective slow on links it does not tell
        # apart may be waiting for a straggler
        named_links = span_mask([window for window in link_windows if not window.contested], job.n_steps)
        straggler_windows = stragglers.straggler_windows(job, resumes.warmup | named_links, previous_straggler,
                                                         params, slow_links.link_hosts(job, link_windows))
        merged, step_bytes = slow_steps.merged_steps(job, params, state.level.step_bytes)
        masks = StepMasks(warmup=resumes.warmup, checkpoint=checkpoints_found.step,
                          windowed=link_windowed | span_mask(straggler_windows, job.n_steps), merged=merged)
        fit = fit_baseline(job, masks, checkpoints_found, state.level.recent_s, checkpoint_state.checkpoint_save_s,
                           params)
        slow = slow_steps.find_slow_steps(job, fit, masks, params)
        # a straggler window that slowed no step is no issue, and its steps are the job's pace:
        # judged again with them, they show slow steps and degradations the window hid
        slowing = stragglers.slowing_windows(job, straggler_windows, previous_straggler, masks, slow, fit, params)
        if len(slowing) < len(straggler_windows):
            straggler_windows = slowing
            masks = replace(masks, windowed=link_windowed | span_mask(straggler_windows, job.n_steps))
            fit = fit_baseline(job, masks, checkpoints_found, state.level.recent_s,
                               checkpoint_state.checkpoint_save_s, params)
            slow = slow_steps.find_slow_steps(job, fit, masks, params)
        checkpoint_state = replace(checkpoint_state, checkpoint_save_s=checkpoints.saving_times(
            checkpoint_state.checkpoint_save_s, fit.saving, slow[fit.save_first], params))
        restart_issues, stop = restarts.restart_issues(job, resumes, state.progress, stop, checkpoints_found,
                                                       fit.baseline, level.level_s, params)
        link_issues, open_link = slow_links.link_issues(job, link_windows, previous_link, masks, slow, fit,
                                                        link_steps, params)
        straggler_issues, open_straggler = stragglers.straggler_issues(job, straggler_windows, previous_straggler,
                                                                       masks, slow, fit, params)
        degradation_issues, level = degradation.degradation_issues(job, fit, masks, slow, state.level, params)
        level = replace(level, step_bytes=step_bytes)
        issues += restart_issues + link_issues + straggler_issues + degradation_issues
        issues += slow_steps.slow_step_issues(job, fit, masks, slow, params)
        open_windows = {kind: window for kind, window in (("slow_link", open_link), ("straggler", open_straggler))
                        if window}
    stop_issues, stop, open_hang, load = hangs.watch_stop(job, state.progress, stop, open_hang, checkpoints_found,
                                                          checkpoint_state, level.level_s, params)
    issues += stop_issues
    if load is not None:
        resumed, stop = restarts.load_restart_issue(job, stop, load, checkpoints_found, state.progress.last_attempt,
                                                    params)
        issues.append(resumed)
    next_state = DiagnosisState(
        progress=restarts.next_progress(job, state.progress, resumes.first_step_ns),
        checkpoints=checkpoint_state,
        level=level,
        open_windows=open_windows,
        hangs=HangState(open_hang=open_hang, stop=stop),
    )
    return Diagnosis(issues_table(issues), next_state.dump())


def has_open_issue(previous: dict | None) -> bool:
    """True when a job's diagnosis state carries an issue that continues without traffic."""
    return DiagnosisState.load(previous).open_issue


def is_hung(state: dict | None) -> bool:
    """True when a job's diagnosis state holds a hang still open: silent GPUs it has not released."""
    return DiagnosisState.load(state).hangs.open_hang is not None
