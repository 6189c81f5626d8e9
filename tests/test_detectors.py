"""Each diagnosis detector alone, on a small hand-made JobHour (arrays built directly)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from prism_core.constants import DP, PP, UNCLASSIFIED
from prism_core.constants import NS_PER_S as NS
from prism_core.diagnosis import DEFAULT_PARAMS as PARAMS
from prism_core.diagnosis import (
    checkpoints,
    degradation,
    diagnose_job,
    hangs,
    restarts,
    slow_links,
    slow_steps,
    stragglers,
)
from prism_core.diagnosis.baseline import Baseline, fit_baseline
from prism_core.diagnosis.issues import Issue, issues_table
from prism_core.diagnosis.job_hour import JobHour, StepMasks
from prism_core.diagnosis.state import CheckpointState, DiagnosisState, HangState, LevelState, Progress
from prism_core.diagnosis.windows import find_windows, span_mask
from prism_core.recognition import EVENTS, MEMBERSHIP
from prism_core.schema import COMM_PAIRS, FLOWS, ISSUES, JOB_GPUS, STEPS, conform

ORIGIN_NS = 1_795_338_000 * NS  # the hour's start
FIRST_STEP_NS = ORIGIN_NS + NS  # the job's first step, 1 s into the hour (make_hour)
BULK = 64 << 20  # bytes: a transfer large enough to measure throughput, and a checkpoint write


def make_hour(durations=(), hosts: int = 4, flows: dict | None = None, writes: dict | None = None,
              step_start: np.ndarray | None = None, **fields) -> JobHour:
    """A job of `hosts` hosts with one GPU each (address 10.0.<host>.1, stage 0, dp rank = host),
    steps of `durations` seconds, back to back from 1 s into the hour unless `step_start` says
    when, numbered from 0, and the given flows between members ({start, end, src, dst, nbytes[,
    kind, port]}: arrays, kind DP by default, no port) and writes to storage ({start, end, src, nbytes});
    `fields` replace any other column."""
    durations = np.asarray(durations, float)
    if step_start is None:
        step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] if len(durations) else np.zeros(0)
    step_end = step_start + durations
    flows = {name: np.asarray(column) for name, column in (flows or {}).items()}
    start = flows.get("start", np.zeros(0))
    order = np.argsort(start, kind="stable")
    step = np.searchsorted(step_start, start[order], side="right") - 1
    step = np.where((step >= 0) & (start[order] < step_end[np.maximum(step, 0)] if len(step_end) else False), step, -1)
    writes = {name: np.asarray(column) for name, column in (writes or {}).items()}
    n_writes = len(writes.get("start", ()))
    columns = dict(
        job_id="job-x", origin_ns=ORIGIN_NS, hour_end=3600.0, data_end=3600.0,
        addrs=np.array([f"10.0.{h}.1" for h in range(hosts)]), host_of_addr=np.arange(hosts),
        hosts=np.array([f"gpu{h}" for h in range(hosts)]), gpus_of_host=np.ones(hosts, np.int64),
        stage_of_host=np.zeros(hosts, np.int64), stage_of_addr=np.zeros(hosts, np.int64),
        replica_of_addr=np.arange(hosts),
        start=start[order], end=flows.get("end", np.zeros(0))[order], src=flows.get("src", np.zeros(0, int))[order],
        dst=flows.get("dst", np.zeros(0, int))[order], nbytes=flows.get("nbytes", np.zeros(0, int))[order],
        port=flows.get("port", np.full(len(start), -1, np.int32))[order],
        shortest_timed=np.zeros(len(start)), sampled=flows.get("sampled", np.zeros(len(start), bool))[order],
        kind=flows.get("kind", np.full(len(start), DP, np.int8))[order], step=step,
        write_start=writes.get("start", np.zeros(0)), write_end=writes.get("end", np.zeros(0)),
        write_src=writes.get("src", np.zeros(0, int)), write_dst=np.full(n_writes, "10.200.0.1"),
        write_bytes=writes.get("nbytes", np.zeros(0, int)), write_to_storage=np.ones(n_writes, bool),
        read_start=np.zeros(0), read_end=np.zeros(0), read_dst=np.zeros(0, int), read_bytes=np.zeros(0, int),
        step_start=step_start, step_end=step_end, duration=durations, sync_s=np.full(len(durations), np.nan),
        number=np.arange(len(durations)), attempt=np.zeros(len(durations), np.int64),
        event_ns=np.zeros(0, np.int64), event_kind=np.zeros(0, str),
        other_addr=np.zeros(0, str), other_host=np.zeros(0, str), other_first=np.zeros(0), other_last=np.zeros(0),
    )
    return JobHour(**{**columns, **fields})


def ring_flows(step_start: np.ndarray, hosts: int, seconds: np.ndarray, phase_s: float = 0.1) -> dict:
    """One BULK transfer a step (starting at `step_start`) from each host to the next (a ring),
    `phase_s` into the step, lasting `seconds[step, sender]`."""
    step, src = np.divmod(np.arange(len(step_start) * hosts), hosts)
    start = step_start[step] + phase_s
    return {"start": start, "end": start + seconds[step, src], "src": src, "dst": (src + 1) % hosts,
            "nbytes": np.full(len(src), BULK)}


def cut_steps(ends_before: np.ndarray) -> dict:
    """A crash's trace: one transfer of the step it cut short, 0.2 s after each of `ends_before`
    (the end of the last complete step)."""
    start = np.asarray(ends_before, float) + 0.2
    return {"start": start, "end": start + 0.05, "src": np.zeros(len(start), int), "dst": np.ones(len(start), int),
            "nbytes": np.full(len(start), BULK)}


def joined(*flows: dict) -> dict:
    return {name: np.concatenate([f[name] for f in flows]) for name in flows[0]}


def no_masks(n: int) -> StepMasks:
    return StepMasks(warmup=np.zeros(n, bool), checkpoint=np.zeros(n, bool), windowed=np.zeros(n, bool),
                     merged=np.zeros(n, bool))


def find_checkpoints(job: JobHour) -> tuple[checkpoints.Checkpoints, CheckpointState]:
    """The checkpoints of a job first seen this hour, without warm-up."""
    return checkpoints.find_checkpoints(job, np.zeros(job.n_steps, bool), CheckpointState(), FIRST_STEP_NS, PARAMS)


def fit_without_writes(job: JobHour, masks: StepMasks) -> Baseline:
    """The baseline of a job first seen this hour, whose checkpoints (if any) wrote nothing."""
    nothing = np.full(job.n_steps, np.nan)
    return fit_baseline(job, masks, checkpoints.Checkpoints(masks.checkpoint, nothing, nothing, FIRST_STEP_NS), (), (),
                        PARAMS)


def jittered(n: int, seed: int = 1, step_s: float = 1.0) -> np.ndarray:
    return step_s * np.random.default_rng(seed).lognormal(0.0, 0.01, n)


# --- checkpoints and slow steps --------------------------------------------------------------------


def _saving_job() -> tuple[JobHour, np.ndarray]:
    """60 steps of ~1 s; steps 9, 19 and 29 save a checkpoint (+2 s, a 256 MiB write from two
    GPUs each); step 39 is as long on the same rhythm, its write not seen; step 45 stalls 1 s,
    step 53 is as long as a checkpoint but off the rhythm (a step one off it would count: the
    timeline may miscount a step near a save)."""
    durations = jittered(60)
    durations[[9, 19, 29, 39, 53]] += 2.0
    durations[45] += 1.0
    starts = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    saving = np.repeat(starts[[9, 19, 29]] + 1.2, 2)
    writes = {"start": saving, "end": saving + 0.6, "src": np.tile([0, 2], 3), "nbytes": np.full(6, 4 * BULK)}
    return make_hour(durations, writes=writes), durations


def test_checkpoints_are_the_written_steps_and_the_long_steps_on_their_rhythm():
    job, _ = _saving_job()
    found, state = find_checkpoints(job)
    assert np.flatnonzero(found.step).tolist() == [9, 19, 29, 39]  # not the stall (45) nor the long step 53
    assert state.checkpoint_rhythm == (10, 9)
    assert state.last_checkpoint_ns == job.ns(job.step_end[39])
    assert (state.checkpoint_bytes, state.checkpoint_writers) == (8 * BULK, 2)  # step 29's save
    assert found.save_end[29] == pytest.approx(job.step_start[29] + 1.8)
    # the work lost at a failure runs from the last checkpoint completed before it
    assert found.before(job, job.step_end[19] + 0.5) == job.ns(job.step_end[19])
    assert found.before(job, 0.5) == FIRST_STEP_NS  # none yet: the job's first step


def test_a_checkpoint_step_is_not_a_slow_step_but_a_stall_is():
    job, durations = _saving_job()
    found, _ = find_checkpoints(job)
    masks = StepMasks(warmup=np.zeros(job.n_steps, bool), checkpoint=found.step, windowed=np.zeros(job.n_steps, bool),
                      merged=np.zeros(job.n_steps, bool))
    fit = fit_baseline(job, masks, found, (), (), PARAMS)
    slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
    assert np.flatnonzero(slow).tolist() == [45, 53]
    (stall, long_step) = slow_steps.slow_step_issues(job, fit, masks, slow, PARAMS)
    assert json.loads(stall.evidence)["step"] == 45 and stall.kind == "slow_step"
    assert stall.wasted_gpu_s == pytest.approx(4 * (durations[45] - fit.expected[45]), rel=1e-9)
    assert stall.wasted_gpu_s == pytest.approx(4 * 1.0, rel=0.05)  # 1 s on 4 GPUs
    assert stall.severity == "critical"  # a whole step longer
    assert json.loads(long_step.evidence)["step"] == 53 and not json.loads(long_step.evidence)["checkpoint"]
    # the usual saving time (~2 s) is what the checkpoints took over their baseline
    assert checkpoints.saving_times((), fit.saving, slow[fit.save_first], PARAMS) == pytest.approx((2.0,) * 4, abs=0.05)


def test_a_long_step_carrying_two_steps_traffic_is_merged_not_slow():
    # 60 ring steps of ~1 s; step 20 stalls (2 s, one step's transfers), step 40 is two steps the
    # timeline could not divide (2 s, two steps' transfers); a flow cache's record runs over
    # steps 50-53 (its bytes shared by the four)
    durations = jittered(60)
    durations[[20, 40]] += 1.0
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    flows = ring_flows(step_start, 4, np.full((60, 4), 0.05))
    second = ring_flows(step_start[[40]] + 1.0, 4, np.full((1, 4), 0.05))
    flows = {name: np.r_[flows[name], second[name]] for name in flows}
    flows = {name: np.r_[flows[name], value] for name, value in
             {"start": [step_start[50]], "end": [step_start[54] - 0.01], "src": [0], "dst": [1],
              "nbytes": [4 * BULK]}.items()}
    job = make_hour(durations, flows=flows)
    merged, usual = slow_steps.merged_steps(job, PARAMS, None)
    assert np.flatnonzero(merged).tolist() == [39, 40, 41]  # and its neighbours: the boundary may be off
    masks = StepMasks(np.zeros(60, bool), np.zeros(60, bool), np.zeros(60, bool), merged)
    fit = fit_without_writes(job, masks)
    assert np.flatnonzero(slow_steps.find_slow_steps(job, fit, masks, PARAMS)).tolist() == [20]
    # the usual traffic of a step: a ring step's four transfers
    assert usual == pytest.approx(4 * BULK, rel=0.01)


def test_an_hour_of_few_steps_is_measured_against_the_usual_traffic_of_earlier_hours():
    # a job's last minutes in a new hour: three steps, the last of which the timeline could not
    # divide (ten steps' transfers). Too few steps to know the usual traffic of a step from the
    # hour alone; against the earlier hours' it is ten steps, not a slow one
    durations = np.array([1.0, 1.0, 10.0])
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    flows = ring_flows(np.r_[step_start[:2], step_start[2] + np.arange(10.0)], 4, np.full((12, 4), 0.05))
    job = make_hour(durations, flows=flows)
    assert slow_steps.merged_steps(job, PARAMS, None)[0].tolist() == [False] * 3
    merged, usual = slow_steps.merged_steps(job, PARAMS, 4 * BULK)
    assert merged.tolist() == [False, True, True] and usual == 4 * BULK


def test_a_silence_between_steps_with_transfers_in_it_is_no_restart():
    # the timeline found no step in a 40 s stretch before step 30 (records that blur the steps),
    # but transfers went on through it: no restart; a true 40 s silence before step 50 is one
    durations = jittered(60)
    gap = np.where(np.arange(60) >= 30, 40.0, 0.0) + np.where(np.arange(60) >= 50, 40.0, 0.0)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + gap
    flows = ring_flows(step_start, 4, np.full((60, 4), 0.05))
    during = step_start[29] + durations[29] + np.arange(1.0, 40.0, 2.0)
    flows = {name: np.r_[flows[name], value] for name, value in
             {"start": during, "end": during + 0.05, "src": np.zeros(len(during), int),
              "dst": np.ones(len(during), int), "nbytes": np.full(len(during), BULK)}.items()}
    flows = joined(flows, cut_steps(step_start[[49]] + durations[49]))
    job = make_hour(durations, step_start=step_start, flows=flows)
    found = restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS)
    assert found.steps.tolist() == [50]


def test_unwritten_saves_of_varying_length_on_a_rhythm_numbered_one_off_are_no_slow_steps():
    # a save every 40 steps that the flow logs do not see (a storage network), each 0.3-3 steps
    # long; the timeline numbered the steps after step 100 one off (a step split near a save)
    durations = jittered(400, seed=3)
    saves = np.arange(19, 400, 40)
    durations[saves] += np.random.default_rng(4).uniform(0.3, 3.0, len(saves))
    number = np.arange(400) + (np.arange(400) > 100)
    job = make_hour(durations, number=number)
    found, state = find_checkpoints(job)
    assert np.flatnonzero(found.step).tolist() == saves.tolist()
    assert state.checkpoint_rhythm[0] == 40
    masks = StepMasks(warmup=np.zeros(job.n_steps, bool), checkpoint=found.step, windowed=np.zeros(job.n_steps, bool),
                      merged=np.zeros(job.n_steps, bool))
    fit = fit_without_writes(job, masks)
    assert not slow_steps.find_slow_steps(job, fit, masks, PARAMS).any()


def test_the_rhythm_of_unwritten_saves_shows_through_the_stalls_between_them():
    # a save every 34 steps that the flow logs do not see (+2 s), and a stall (+0.6 s) between
    # most two saves: no two neighbouring long steps are a period apart, every save is
    # (regression: the rhythm was sought in the gaps between neighbouring long steps only, and a
    # short gap that divides many of them won, so no rhythm held and each save was a slow step)
    durations = jittered(200, seed=11)
    saves = np.arange(19, 200, 34)
    durations[saves] += 2.0
    durations[[30, 61, 110, 130, 170]] += 0.6
    job = make_hour(durations)
    found, state = find_checkpoints(job)
    assert np.flatnonzero(found.step).tolist() == saves.tolist()
    assert state.checkpoint_rhythm == (34, 19)
    masks = StepMasks(warmup=np.zeros(job.n_steps, bool), checkpoint=found.step, windowed=np.zeros(job.n_steps, bool),
                      merged=np.zeros(job.n_steps, bool))
    assert not (slow_steps.find_slow_steps(job, fit_without_writes(job, masks), masks, PARAMS) & found.step).any()


def test_a_save_is_judged_against_the_spread_of_the_jobs_own_saving_times():
    # saves of about 4 s, varying 20% (lognormal) from save to save; a fifth save takes 12 s
    durations = jittered(200, seed=5)
    saves = np.arange(9, 200, 20)
    saving = 4.0 * np.random.default_rng(6).lognormal(0.0, 0.2, len(saves))
    saving[5] = 12.0
    durations[saves] += saving
    job = make_hour(durations)
    found, _ = find_checkpoints(job)
    masks = StepMasks(warmup=np.zeros(job.n_steps, bool), checkpoint=found.step, windowed=np.zeros(job.n_steps, bool),
                      merged=np.zeros(job.n_steps, bool))
    fit = fit_without_writes(job, masks)
    assert np.flatnonzero(slow_steps.find_slow_steps(job, fit, masks, PARAMS)).tolist() == [saves[5]]
    # the allowance is the spread measured (20%, robustly from ten saves) times save_sigmas
    assert 0.1 < np.log1p(fit.save_allowance / np.median(saving)) / PARAMS.save_sigmas < 0.3


def test_a_save_whose_end_fell_into_the_next_step_is_one_save():
    # steps 9, 19, 29 save (+2 s, written); the timeline ended step 19 at its last write and put the
    # save's quiet end (0.8 s, as long as its quiet start) into step 20
    durations = jittered(60)
    durations[[9, 19, 29]] += 2.0
    durations[19] -= 0.8
    durations[20] += 0.8
    starts = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    first_write = starts[[9, 19, 29]] + 1.8  # a step's work, then 0.8 s quiet
    last_write = np.r_[first_write[0] + 0.4, starts[20], first_write[2] + 0.4]
    writes = {"start": first_write, "end": last_write, "src": np.zeros(3, int), "nbytes": np.full(3, 4 * BULK)}
    job = make_hour(durations, writes=writes)
    found, _ = find_checkpoints(job)
    assert np.flatnonzero(found.step).tolist() == [9, 19, 20, 29]
    masks = StepMasks(warmup=np.zeros(job.n_steps, bool), checkpoint=found.step, windowed=np.zeros(job.n_steps, bool),
                      merged=np.zeros(job.n_steps, bool))
    fit = fit_baseline(job, masks, found, (), (2.0, 2.0), PARAMS)
    assert fit.save_first.tolist() == [9, 19, 29]
    assert fit.saving == pytest.approx([2.0, 2.0, 2.0], abs=0.05)  # step 20's part counted in step 19's save
    assert not slow_steps.find_slow_steps(job, fit, masks, PARAMS).any()


def test_a_heavy_tailed_jobs_own_stalls_are_not_slow_steps_and_a_light_tailed_jobs_slowdown_is():
    # 40 job-hours of 100-800 steps with 1-6% lognormal jitter, each twice: with Pareto stalls of
    # 1-5% of the step (alpha 1.5-3) on top, and without stalls but with one step 1.5x long
    rng = np.random.default_rng(8)
    false_hours = by_jitter = found = 0
    for _ in range(40):
        n, jitter = int(rng.integers(100, 800)), rng.uniform(0.01, 0.06)
        stalls = 1 + rng.uniform(0.01, 0.05) * np.minimum(rng.pareto(rng.uniform(1.5, 3.0), n), 40)
        heavy = make_hour(rng.lognormal(0.0, jitter, n) * stalls)
        fit = fit_without_writes(heavy, no_masks(n))
        false_hours += slow_steps.find_slow_steps(heavy, fit, no_masks(n), PARAMS).any()
        jitter_limit = max(PARAMS.slow_step_delta, 1 + PARAMS.jitter_sigmas * fit.sigma)
        by_jitter += (heavy.duration / fit.baseline > jitter_limit).any()
        light = rng.lognormal(0.0, jitter, n)
        light[n // 2] *= 1.5
        job = make_hour(light)
        slow = slow_steps.find_slow_steps(job, fit_without_writes(job, no_masks(n)), no_masks(n), PARAMS)
        found += np.flatnonzero(slow).tolist() == [n // 2]
    # judged by their jitter, 32 of the heavy hours would have slow steps; by their own tail, 5 do
    assert by_jitter >= 30 and false_hours <= 6
    assert found >= 38  # the light hours keep about the jitter's limit (39 found)


# --- restarts --------------------------------------------------------------------------------------


def test_resumes_are_attempt_changes_and_long_silences_each_followed_by_warmup():
    # attempt 1 from step 20 on; a 60 s silence before step 40; each after a step cut short
    durations = jittered(60)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + np.where(np.arange(60) >= 40, 60.0, 0.0)
    job = make_hour(durations, step_start=step_start, attempt=(np.arange(60) >= 20).astype(np.int64),
                    flows=joined(ring_flows(step_start, 4, np.full((60, 4), 0.05), phase_s=0.0),
                                 cut_steps(step_start[[19, 39]] + durations[[19, 39]])))
    found = restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS)
    assert found.steps.tolist() == [20, 40]
    assert np.flatnonzero(found.warmup).tolist() == [20, 21, 22, 40, 41, 42]
    first_seen = restarts.find_resumes(job, Progress(), None, None, PARAMS)  # a job first seen warms up too
    assert np.flatnonzero(first_seen.warmup)[:3].tolist() == [0, 1, 2]
    assert first_seen.first_step_ns == job.ns(1.0)


def _unseen_saves_job(**fields) -> JobHour:
    """A save every 50 steps over a storage network: the job is quiet 30 s after steps 49, 99,
    149, 199 (recognition took the return after step 149 for a restart: attempt 1) but the save
    after step 99 was short (15 s, under the restart's floor); a crash leaves it quiet 40 s before
    step 230."""
    durations = jittered(260)
    quiet = np.zeros(260)
    quiet[[50, 150, 200]], quiet[100], quiet[230] = 30.0, 15.0, 40.0
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + np.cumsum(quiet)
    attempt = (np.arange(260) >= 150).astype(np.int64) + (np.arange(260) >= 230)
    return make_hour(durations, step_start=step_start, attempt=attempt,
                     flows=cut_steps(step_start[[229]] + durations[[229]]), **fields)


def test_quiet_gaps_on_the_rhythm_of_unseen_saves_are_saves_and_an_unrhythmic_one_a_restart():
    job = _unseen_saves_job()
    found = restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS)
    assert found.steps.tolist() == [230]
    # with fewer gaps in view, the rhythm of the saves of earlier hours tells
    assert restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, (50, 49), PARAMS).steps.tolist() == [230]


def test_a_return_on_a_replaced_host_is_a_restart_even_on_the_rhythm_of_unseen_saves():
    # recognition saw a host replace one of the job's during the quiet gap after step 149 (a save
    # replaces no host): that return is a restart
    step_150 = _unseen_saves_job().step_start[150]
    replaced_at = ORIGIN_NS + int(step_150 * NS)
    job = _unseen_saves_job(event_ns=np.array([replaced_at, replaced_at]),
                            event_kind=np.array(["restart", "host_replaced"]))
    found = restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, (50, 49), PARAMS)
    assert found.steps.tolist() == [150, 230]


def test_a_quiet_gap_after_a_complete_step_is_a_save_not_a_restart():
    # an unseen save: the job finishes step 29 and is quiet 40 s before step 30 (recognition takes
    # its return for a restart: attempt 1); a crash 0.2 s into the step after 49 is quiet as long
    durations = jittered(60)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + 40.0 * ((np.arange(60) >= 30).astype(int) + (np.arange(60) >= 50))
    attempt = (np.arange(60) >= 30).astype(np.int64) + (np.arange(60) >= 50)
    flows = joined(ring_flows(step_start, 4, np.full((60, 4), 0.05)), cut_steps(step_start[[49]] + durations[[49]]))
    job = make_hour(durations, step_start=step_start, attempt=attempt, flows=flows)
    assert restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS).steps.tolist() == [50]
    # records that do not resolve the steps (a flow cache's) show no step cut short: the
    # recognition's restarts stand
    unresolved = restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS, steps_resolved=False)
    assert unresolved.steps.tolist() == [30, 50]


def test_a_silence_is_read_in_the_whole_gap_though_the_step_after_it_begins_after_its_first_traffic():
    # a crash 0.2 s into the step after 39, back 60 s later; the timeline placed the start of
    # step 40 a second after its first transfers (a step's start is placed by its usual lead)
    durations = jittered(60)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + np.where(np.arange(60) >= 40, 60.0, 0.0)
    early = ring_flows(step_start[[40]] - 1.0, 4, np.full((1, 4), 0.05), phase_s=0.0)
    job = make_hour(durations, step_start=step_start,
                    flows=joined(ring_flows(step_start, 4, np.full((60, 4), 0.05), phase_s=0.0), early,
                                 cut_steps(step_start[[39]] + durations[[39]])))
    assert restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS).steps.tolist() == [40]


def test_the_work_of_a_job_whose_saves_show_no_writes_was_last_saved_where_it_last_paused():
    # the job finishes step 29 and is quiet 40 s (a save over a storage network the flow logs do
    # not see): no restart, a pause, which ends where the work since is at risk
    durations = jittered(60)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + np.where(np.arange(60) >= 30, 40.0, 0.0)
    flows = ring_flows(step_start, 4, np.full((60, 4), 0.05))
    job = make_hour(durations, step_start=step_start, flows=flows)
    resumes = restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS)
    assert resumes.steps.tolist() == [] and resumes.paused.tolist() == [30]
    found, state = checkpoints.find_checkpoints(job, resumes.warmup, CheckpointState(), FIRST_STEP_NS, PARAMS,
                                                paused=resumes.paused)
    assert found.before(job, job.step_end[59]) == job.ns(step_start[30]) == state.last_checkpoint_ns
    assert found.before(job, job.step_end[29]) == FIRST_STEP_NS
    # a job whose saves write to storage paused for something else
    writer = make_hour(durations, step_start=step_start, flows=flows,
                       writes={"start": [5.5], "end": [5.6], "src": [0], "nbytes": [BULK]})
    found, state = checkpoints.find_checkpoints(writer, resumes.warmup, CheckpointState(), FIRST_STEP_NS, PARAMS,
                                                paused=resumes.paused)
    assert found.before(writer, writer.step_end[59]) == FIRST_STEP_NS and state.last_checkpoint_ns is None


def test_a_resume_on_the_connections_of_before_is_a_pause_and_one_on_new_connections_a_restart():
    # two 40 s silences that look like crashes (a transfer of an unfinished step before each):
    # after the first the job's transfers run on the queue pairs (source ports) they ran on, after
    # the second on new ones; records without ports tell nothing
    durations = jittered(60)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + 40.0 * ((np.arange(60) >= 20).astype(int) + (np.arange(60) >= 40))
    attempt = (np.arange(60) >= 20).astype(np.int64) + (np.arange(60) >= 40)
    flows = joined(ring_flows(step_start, 4, np.full((60, 4), 0.05)), cut_steps(step_start[[19, 39]] + durations[[19, 39]]))
    port = 49152 + flows["src"] + np.where(flows["start"] > step_start[40] - 1.0, 100, 0)  # new queue pairs at step 40
    job = make_hour(durations, step_start=step_start, attempt=attempt, flows={**flows, "port": port})
    assert restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS).steps.tolist() == [40]
    unported = make_hour(durations, step_start=step_start, attempt=attempt, flows=flows)
    assert restarts.find_resumes(unported, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS).steps.tolist() == [20, 40]


def test_a_crash_between_two_steps_traffic_is_a_restart_when_the_job_comes_back_on_new_connections():
    # two 40 s quiet gaps after complete steps (nothing of an unfinished step before either): an
    # unseen save, after which the job runs on its queue pairs (source ports), and a crash in the
    # compute, after which it connects anew
    durations = jittered(60)
    attempt = (np.arange(60) >= 30).astype(np.int64) + (np.arange(60) >= 50)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + 40.0 * attempt
    flows = ring_flows(step_start, 4, np.full((60, 4), 0.05))
    port = 49152 + flows["src"] + np.where(flows["start"] > step_start[50] - 1.0, 100, 0)
    job = make_hour(durations, step_start=step_start, attempt=attempt, flows={**flows, "port": port})
    assert restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS).steps.tolist() == [50]


def test_a_restart_costs_the_downtime_and_the_warmup_and_names_the_replaced_host():
    # hosts 0-2 train until step 19 and fail 0.4 s into the next; 40 s later hosts 0, 1 and 3
    # resume as attempt 1
    durations = jittered(40)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]] + np.where(np.arange(40) >= 20, 40.0, 0.0)
    hosts = np.where(np.arange(40)[:, None] < 20, [0, 1, 2], [0, 1, 3])
    step, slot = np.divmod(np.arange(40 * 3), 3)
    failed = step_start[19] + durations[19] + 0.4
    flows = {"start": np.r_[step_start[step] + 0.1, failed - 0.2], "end": np.r_[step_start[step] + 0.3, failed],
             "src": np.r_[hosts[step, slot], 0], "dst": np.r_[hosts[step, (slot + 1) % 3], 1],
             "nbytes": np.full(len(step) + 1, BULK)}
    job = make_hour(durations, flows=flows, step_start=step_start, attempt=(np.arange(40) >= 20).astype(np.int64))
    resumes = restarts.find_resumes(job, Progress(first_step_ns=FIRST_STEP_NS), None, None, PARAMS)
    found, _ = checkpoints.find_checkpoints(job, resumes.warmup, CheckpointState(), FIRST_STEP_NS, PARAMS)
    baseline = np.ones(40)
    (restart,), stop = restarts.restart_issues(job, resumes, Progress(first_step_ns=FIRST_STEP_NS), None, found,
                                               baseline, None, PARAMS)
    evidence = json.loads(restart.evidence)
    assert restart.kind == "restart" and restart.severity == "critical" and stop is None
    assert restart.start == job.ns(failed) and restart.end == job.ns(step_start[20])
    assert evidence["hosts_replaced"] == ["gpu2"] and evidence["hosts_added"] == ["gpu3"]
    assert evidence["attempt"] == 1 and not evidence["after_hang"]
    assert evidence["lost_since_checkpoint_s"] == pytest.approx(failed - 1.0, rel=1e-5)  # no checkpoint yet
    # 3 GPUs idle from the job's first step to the resume, plus the warm-up's excess over the baseline
    warm = durations[20:23] - 1.0
    assert restart.wasted_gpu_s == pytest.approx(3 * (step_start[20] - 1.0 + max(warm.sum(), 0.0)), rel=1e-6)


# --- slow links and stragglers --------------------------------------------------------------------


def _ring_job(slow_address: int | None, slow_steps_range: range, hosts: int = 8, n: int = 40,
              late_host: int | tuple[int, ...] | None = None, late_slows_steps: bool = True) -> JobHour:
    """A ring of `hosts` one-GPU hosts, one 64 MiB transfer per host and step (0.1 s); the
    transfers to and from `slow_address` take 0.25 s in `slow_steps_range`; `late_host` (or hosts
    taking turns, step by step) sends 0.2 s late in those steps, and the steps then take 0.2 s
    longer (with `late_slows_steps`)."""
    durations = jittered(n)
    in_window = np.isin(np.arange(n), slow_steps_range)
    if late_host is not None and late_slows_steps:
        durations = np.where(in_window, durations + 0.2, durations)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    seconds = np.full((n, hosts), 0.1) * np.random.default_rng(2).lognormal(0.0, 0.01, (n, hosts))
    if slow_address is not None:
        touching = (np.arange(hosts) == slow_address) | ((np.arange(hosts) + 1) % hosts == slow_address)
        seconds[np.ix_(in_window, touching)] = 0.25
    flows = ring_flows(step_start, hosts, seconds)
    if late_host is not None:
        step, taking_turns = np.repeat(np.arange(n), hosts), np.atleast_1d(late_host)
        late = in_window[step] & (flows["src"] == taking_turns[step % len(taking_turns)])
        flows["start"] = np.where(late, flows["start"] + 0.2, flows["start"])
        flows["end"] = np.where(late, flows["end"] + 0.2, flows["end"])
    flows["start"] = flows["start"] + np.random.default_rng(3).uniform(0, 0.001, len(flows["start"]))
    return make_hour(durations, hosts=hosts, flows=flows)


def test_a_culprits_windows_that_break_off_and_resume_are_one_episode():
    # a link whose throughput hovers about the threshold names its culprit in runs with a few
    # more quiet steps between them than a window bridges; a run far after them is an episode
    # of its own
    job = make_hour(jittered(120))
    culprit = np.full(120, -1)
    culprit[[10, 11, 12, 17, 18, 19, 20, 21, 22, 23, 24, 25, 31, 32, 33, 90, 91, 92]] = 2
    windows = find_windows(job, culprit, np.ones(120), -1, PARAMS)
    assert [(w.run[0], w.run[-1], len(w.run)) for w in windows] == [(10, 33, 15), (90, 92, 3)]
    # hosts taking turns being the latest: another culprit between two windows keeps them apart
    culprit[[14, 15]] = 5
    windows = find_windows(job, culprit, np.ones(120), -1, PARAMS)
    assert [(w.code, w.run[0], w.run[-1]) for w in windows] == [(2, 10, 12), (2, 17, 33), (2, 90, 92)]


def test_a_slow_link_window_names_the_slow_address():
    job = _ring_job(slow_address=5, slow_steps_range=range(10, 30))
    found = slow_links.slow_link_steps(job, np.zeros(job.n_steps, bool), PARAMS)
    assert set(found.culprit[10:30].tolist()) == {5} and (found.culprit[30:] == -1).all()
    assert found.score[15] == pytest.approx(0.1 / 0.25, rel=0.05)  # its fastest transfer, over the usual
    (window,) = slow_links.link_windows(job, found, None, PARAMS)
    assert window.run.tolist() == list(range(10, 30))
    assert slow_links.link_hosts(job, [window]) == {5}
    masks = StepMasks(np.zeros(job.n_steps, bool), np.zeros(job.n_steps, bool), span_mask([window], job.n_steps),
                      np.zeros(job.n_steps, bool))
    fit = fit_without_writes(job, masks)
    slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
    (issue,), open_window = slow_links.link_issues(job, [window], None, masks, slow, fit, found, PARAMS)
    assert issue.subject == "10.0.5.1"  # both its transfers are slow: the NIC, not one link
    assert issue.start == job.ns(job.step_start[10]) and issue.end == job.ns(job.step_end[29])
    assert json.loads(issue.evidence)["slow_pairs"] == 2 and open_window is None  # closed well before the end


def test_a_collective_throttled_alike_on_every_link_names_no_link():
    # every transfer of the ring as slow as the others in steps 10-19 (one slow NIC's pace, its
    # links' lead finer than the exporter's clock shows): three or more addresses tie, and no
    # link or address is the culprit; the collective is, in a window no issue names, whose steps
    # are kept from the job's pace
    n, hosts = 40, 8
    durations = jittered(n)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    seconds = np.full((n, hosts), 0.1)
    seconds[10:20] = 0.25
    job = make_hour(durations, hosts=hosts, flows=ring_flows(step_start, hosts, seconds))
    found = slow_links.slow_link_steps(job, np.zeros(n, bool), PARAMS)
    collective = slow_links.collective_code(len(job.addrs))
    assert set(found.culprit[10:20].tolist()) == {collective} and (found.culprit[20:] == -1).all()
    assert found.score[15] == pytest.approx(0.4, rel=0.01)
    (window,) = slow_links.link_windows(job, found, None, PARAMS)
    assert window.contested and window.run.tolist() == list(range(10, 20))
    assert slow_links.link_hosts(job, [window]) == set()
    masks = StepMasks(np.zeros(n, bool), np.zeros(n, bool), span_mask([window], n), np.zeros(n, bool))
    fit = fit_without_writes(job, masks)
    slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
    assert slow_links.link_issues(job, [window], None, masks, slow, fit, found, PARAMS) == ([], None)
    # one address ahead of the others' pace by more than the tie: it is named again
    seconds[10:20, 5] = 0.3
    seconds[10:20, 4] = 0.3  # the ring's link into host 5
    job = make_hour(durations, hosts=hosts, flows=ring_flows(step_start, hosts, seconds))
    assert set(slow_links.slow_link_steps(job, np.zeros(n, bool), PARAMS).culprit[10:20].tolist()) == {5}


def test_a_hub_as_slow_with_each_of_its_peers_is_named_though_all_three_tie():
    # hosts 0 and 2 each talk only to host 1 (a tree's leaves and their parent); host 1's NIC is
    # slow in steps 10-19: every address ties, but each leaf was slow through the hub alone and
    # the hub as slow with the other leaf too, so the hub is the culprit, not the collective
    n = 40
    durations = jittered(n)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    seconds = np.where(np.isin(np.arange(n), range(10, 20)), 0.25, 0.1)
    start = np.repeat(step_start + 0.1, 2)
    flows = {"start": start, "end": start + np.repeat(seconds, 2), "src": np.tile([0, 1], n),
             "dst": np.tile([1, 2], n), "nbytes": np.full(2 * n, BULK)}
    job = make_hour(durations, hosts=3, flows=flows)
    found = slow_links.slow_link_steps(job, np.zeros(n, bool), PARAMS)
    assert set(found.culprit[10:20].tolist()) == {1} and (found.culprit[20:] == -1).all()


def test_warmup_steps_show_no_slow_link():
    job = _ring_job(slow_address=5, slow_steps_range=range(10, 30))
    warmup = np.isin(np.arange(job.n_steps), range(10, 30))
    assert (slow_links.slow_link_steps(job, warmup, PARAMS).culprit == -1).all()


def test_a_straggler_window_names_the_late_host_and_costs_the_steps_it_slowed():
    job = _ring_job(slow_address=None, slow_steps_range=range(20, 35), n=60, late_host=2)
    culprit, lateness = stragglers.straggler_steps(job, np.zeros(job.n_steps, bool), PARAMS)
    assert set(culprit[20:35].tolist()) == {2} and (culprit[:20] == -1).all()
    assert lateness[25] == pytest.approx(0.2, abs=0.01)
    (window,) = stragglers.straggler_windows(job, np.zeros(job.n_steps, bool), None, PARAMS)
    masks = StepMasks(np.zeros(job.n_steps, bool), np.zeros(job.n_steps, bool), span_mask([window], job.n_steps),
                      np.zeros(job.n_steps, bool))
    fit = fit_without_writes(job, masks)
    slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
    assert not slow.any()  # the window's steps are the straggler's, not slow steps
    (issue,), _ = stragglers.straggler_issues(job, [window], None, masks, slow, fit, PARAMS)
    assert issue.subject == "gpu2" and issue.kind == "straggler"
    assert issue.wasted_gpu_s == pytest.approx(0.2 * 15 * 8, rel=0.1)  # 0.2 s a step, 15 steps, 8 GPUs
    assert json.loads(issue.evidence)["late_steps"] == 15


def test_hosts_taking_turns_being_the_latest_over_the_same_steps_are_no_straggler():
    # hosts 2 and 5 alternate as the latest (as a slow link of their ring makes each late in
    # turn): each is the culprit of enough steps for a window, neither the one host the others wait for
    job = _ring_job(slow_address=None, slow_steps_range=range(20, 35), n=60, late_host=(2, 5))
    culprit, _ = stragglers.straggler_steps(job, np.zeros(job.n_steps, bool), PARAMS)
    assert set(culprit[20:35].tolist()) == {2, 5} and (culprit[:20] == -1).all()
    windows = stragglers.straggler_windows(job, np.zeros(job.n_steps, bool), None, PARAMS)
    assert sorted(w.code for w in windows) == [2, 5] and all(w.contested for w in windows)
    masks = StepMasks(np.zeros(job.n_steps, bool), np.zeros(job.n_steps, bool), span_mask(windows, job.n_steps),
                      np.zeros(job.n_steps, bool))
    fit = fit_without_writes(job, masks)
    slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
    assert stragglers.straggler_issues(job, windows, None, masks, slow, fit, PARAMS) == ([], None)
    assert not slow.any()  # someone was late in those steps: they are not judged slow either


def test_a_host_seen_through_a_samplers_instants_only_is_not_judged():
    # host 2 sends 0.2 s late in steps 20-34, but its leaf samples packets: its records are
    # instants, which time no send (prism_core.resolution)
    job = _ring_job(slow_address=None, slow_steps_range=range(20, 35), n=60, late_host=2)
    timed = make_hour(job.duration, hosts=8, flows={"start": job.start, "end": job.end, "src": job.src,
                                                     "dst": job.dst, "nbytes": job.nbytes})
    assert set(stragglers.straggler_steps(timed, np.zeros(60, bool), PARAMS)[0][20:35].tolist()) == {2}
    sampled = make_hour(job.duration, hosts=8, flows={"start": job.start, "end": job.end, "src": job.src,
                                                       "dst": job.dst, "nbytes": job.nbytes,
                                                       "sampled": job.src == 2})
    assert (stragglers.straggler_steps(sampled, np.zeros(60, bool), PARAMS)[0] == -1).all()


def test_a_late_host_holding_an_end_of_a_slow_link_is_the_links_not_a_straggler():
    # host 2 sends late in steps 20-34; where a slow link of the hour has an end on host 2, its NIC
    # makes its own sends late in the steps the link's windows leave out
    job = _ring_job(slow_address=None, slow_steps_range=range(20, 35), n=60, late_host=2)
    (alone,) = stragglers.straggler_windows(job, np.zeros(job.n_steps, bool), None, PARAMS)
    (linked,) = stragglers.straggler_windows(job, np.zeros(job.n_steps, bool), None, PARAMS, link_hosts={2})
    assert not alone.contested and linked.contested


def test_a_straggler_window_that_slowed_no_step_is_not_one_that_slows():
    windows = {}
    for slows in (True, False):
        job = _ring_job(slow_address=None, slow_steps_range=range(20, 35), n=60, late_host=2, late_slows_steps=slows)
        (window,) = stragglers.straggler_windows(job, np.zeros(job.n_steps, bool), None, PARAMS)
        masks = StepMasks(np.zeros(job.n_steps, bool), np.zeros(job.n_steps, bool), span_mask([window], job.n_steps),
                          np.zeros(job.n_steps, bool))
        fit = fit_without_writes(job, masks)
        slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
        windows[slows] = stragglers.slowing_windows(job, [window], None, masks, slow, fit, PARAMS)
        issues, _ = stragglers.straggler_issues(job, [window], None, masks, slow, fit, PARAMS)
        assert len(issues) == len(windows[slows])
    # late by 0.2 s in 15 steps, but nobody waited: no issue, and its steps are not left out
    assert len(windows[True]) == 1 and windows[False] == []


def _pipeline_job(slow_replica: int | None, n: int = 40, header_bytes: bool = False, slow_from: int = 0,
                  clock_offset_s: tuple[float, ...] = (0.0,) * 4, micro_batches: int = 4,
                  lost_share: float = 0.0) -> JobHour:
    """Two stages of two DP replicas on one-GPU hosts (stage 0: hosts 0, 1; stage 1: hosts 2, 3;
    replica r on hosts r and r + 2), four micro-batches a step (0.15 s apart): each forward send
    from stage 0 answered by a backward send from stage 1. From step `slow_from` on, the stage-0
    host of `slow_replica` computes slowly: its i-th forward leaves 0.1 * (i + 1) s after its
    peer's (0.4 s by the last), and its replica's backward sends follow as late. With
    `header_bytes`, every record counts up to 4 KiB of packet headers of its own on top of the 4
    MiB; each host's sends are recorded `clock_offset_s` late (its exporter's clock); a
    `lost_share` of the records, drawn at random, never arrives."""
    slowed = np.arange(n) >= slow_from if slow_replica is not None else np.zeros(n, bool)
    durations = jittered(n) + np.where(slowed, 0.4, 0.0)
    step_start = 1.0 + np.r_[0.0, np.cumsum(durations)[:-1]]
    step, replica, micro = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(2), np.arange(micro_batches),
                                                           indexing="ij"))
    delay = np.where((replica == slow_replica) & slowed[step], 0.4 * (micro + 1) / micro_batches, 0.0)
    forward = step_start[step] + 0.05 + 0.6 / micro_batches * micro + delay
    backward = forward + 0.08
    jitter = np.random.default_rng(4).uniform(0, 0.001, 2 * len(step))
    src = np.r_[replica, replica + 2]
    start = np.r_[forward, backward] + jitter + np.asarray(clock_offset_s)[src]
    flows = {"start": start, "end": start + 0.01, "src": src,
             "dst": np.r_[replica + 2, replica],
             "nbytes": np.full(len(start), 4 << 20) + (
                 np.random.default_rng(5).integers(0, 4 << 10, len(start)) if header_bytes else 0),
             "kind": np.full(len(start), PP, np.int8)}
    arrived = np.random.default_rng(6).random(len(start)) >= lost_share
    flows = {name: column[arrived] for name, column in flows.items()}
    stages = np.array([0, 0, 1, 1])
    return make_hour(durations, hosts=4, flows=flows, stage_of_host=stages, stage_of_addr=stages,
                     replica_of_addr=np.array([0, 1, 0, 1]))


def test_a_replica_slow_in_every_step_is_the_straggler_its_peers_wait_for():
    # no step is without it, so its own timing is no reference: its stage peer's is
    job = _pipeline_job(slow_replica=0)
    culprit, behind_s = stragglers.straggler_steps(job, np.zeros(job.n_steps, bool), PARAMS)
    assert (culprit == 0).all()  # host 0, not host 2 whose backward sends only follow it
    assert behind_s[10] == pytest.approx(0.4, abs=0.01)  # its last forward, 0.4 s behind its peer's
    (window,) = stragglers.straggler_windows(job, np.zeros(job.n_steps, bool), None, PARAMS)
    masks = StepMasks(np.zeros(job.n_steps, bool), np.zeros(job.n_steps, bool), span_mask([window], job.n_steps),
                      np.zeros(job.n_steps, bool))
    fit = fit_without_writes(job, masks)
    (issue,), _ = stragglers.straggler_issues(job, [window], None, masks, np.zeros(job.n_steps, bool), fit, PARAMS)
    assert issue.subject == "gpu0"
    assert issue.wasted_gpu_s == pytest.approx(0.4 * 40 * 4, rel=0.1)  # 0.4 s a step, 40 steps, 4 GPUs
    assert (stragglers.straggler_steps(_pipeline_job(slow_replica=None), np.zeros(40, bool), PARAMS)[0] == -1).all()


def test_a_send_trailing_its_stage_peer_by_its_exporters_clock_in_every_step_is_not_late():
    # host 2's exporter clock runs 6 ms behind: its backward sends trail host 3's in every step
    # by more than late_min_s; host 1 slows from step 25 on
    job = _pipeline_job(slow_replica=1, slow_from=25, clock_offset_s=(0.0, 0.0, 0.006, 0.0))
    culprit, _ = stragglers.straggler_steps(job, np.zeros(job.n_steps, bool), PARAMS)
    assert (culprit[:25] == -1).all() and (culprit[25:] == 1).all()


@pytest.mark.parametrize("slow_replica", [0, None])
def test_stage_peers_compare_their_sends_when_each_record_counts_its_own_header_bytes(slow_replica):
    # no two records agree to the byte: a send's peers are the sends of its size family
    job = _pipeline_job(slow_replica=slow_replica, header_bytes=True)
    culprit, _ = stragglers.straggler_steps(job, np.zeros(job.n_steps, bool), PARAMS)
    assert (culprit == (0 if slow_replica == 0 else -1)).all()


@pytest.mark.parametrize("slow_replica", [0, None])
def test_stage_peers_compare_their_sends_when_lost_records_leave_a_host_short(slow_replica):
    # 16 micro-batches a step and 3% of the records lost: a host's every send of a step arrives in
    # 6 steps of 10. One a few short is compared counting from its last send: what it sent reads
    # no later than it was, so it is late only by being late (its first sends, read early, may
    # leave a step to the replica's next stage, which is late too: not a window's worth).
    job = _pipeline_job(slow_replica=slow_replica, micro_batches=16, lost_share=0.03)
    culprit, _ = stragglers.straggler_steps(job, np.zeros(job.n_steps, bool), PARAMS)
    windows = stragglers.straggler_windows(job, np.zeros(job.n_steps, bool), None, PARAMS)
    if slow_replica is None:
        assert (culprit == -1).all() and windows == []
    else:
        assert np.mean(culprit == 0) >= 0.9 and [window.code for window in windows] == [0]



def test_usual_positions_read_from_a_table_by_step_are_those_of_the_group_medians():
    # the same flow of a host over 30 steps, some steps without it, some of its flows short
    rng = np.random.default_rng(7)
    step = np.repeat(np.arange(30), 50)
    structure = np.tile(np.arange(50), 30) * 3 + 5
    shown = rng.random(len(step)) > 0.2
    step, structure = step[shown], structure[shown]
    position = np.round(rng.normal(0.5, 0.1, len(step)), 3)  # ties, as clocks make them
    whole = rng.random(len(step)) > 0.1
    whole[structure == 5] = False  # a structure never whole
    table = stragglers._usual_positions(structure, step, 30, position, whole)
    sorted_ = stragglers._usual_positions_sorted(structure, position, whole)
    seen = sorted_[2] > 0
    assert np.array_equal(table[2], sorted_[2]) and (~seen).any()
    assert np.array_equal(table[0][seen], sorted_[0][seen]) and np.array_equal(table[1][seen], sorted_[1][seen])
    # structures that show in few of the steps take the group medians
    sparse = stragglers._usual_positions(structure * 1000 + step, step, 30, position, whole)
    assert all(np.array_equal(a, b) for a, b in zip(sparse, stragglers._usual_positions_sorted(
        structure * 1000 + step, position, whole)))

# --- degradation -----------------------------------------------------------------------------------


def test_a_level_rise_is_one_degradation_still_open_at_the_hours_end():
    durations = jittered(200, seed=4)
    durations[120:] *= 1.2
    job = make_hour(durations)
    masks = no_masks(job.n_steps)
    fit = fit_without_writes(job, masks)
    slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
    (issue,), level = degradation.degradation_issues(job, fit, masks, slow, LevelState(), PARAMS)
    assert issue.kind == "degradation" and issue.start == job.ns(job.step_start[120])
    evidence = json.loads(issue.evidence)
    assert evidence["level_s"] / evidence["baseline_s"] == pytest.approx(1.2, abs=0.01)
    assert issue.wasted_gpu_s == pytest.approx(0.2 * 80 * 4, rel=0.05)
    assert level.open_degradation.issue_id == issue.issue_id and level.level_s == pytest.approx(1.0, abs=0.01)


def test_a_level_rise_is_a_degradation_only_beyond_what_the_jobs_jitter_explains():
    """300 steps jittering 6% with heavy-tailed stalls (Pareto, alpha 1.8): at random, BOCD cuts a
    segment a few percent higher for tens of steps (sealed-14: a 3.6% rise over 47 steps, 3.9
    standard errors, reported as a degradation of a clean job). The same steps with an 8% rise
    from step 200 on are one degradation."""
    rng = np.random.default_rng(36)
    durations = rng.lognormal(0.0, 0.06, 300) * (1 + 0.04 * np.minimum(rng.pareto(1.8, 300), 40))
    for rise, expected in ((1.0, 0), (1.08, 1)):
        job = make_hour(np.r_[durations[:200], durations[200:] * rise])
        masks = no_masks(job.n_steps)
        fit = fit_without_writes(job, masks)
        slow = slow_steps.find_slow_steps(job, fit, masks, PARAMS)
        issues, _ = degradation.degradation_issues(job, fit, masks, slow, LevelState(), PARAMS)
        assert len(issues) == expected, (rise, [json.loads(issue.evidence) for issue in issues])


# --- hangs -----------------------------------------------------------------------------------------


def _hung_job(**fields) -> JobHour:
    """4 one-GPU hosts in a ring, 1 s steps, a transfer from each host at 0.1, 0.5 and 0.9 s into
    every step. After step 19 the GPU of host 3 never sends again (nothing to or from it); the
    others run on for 2 s."""
    step_start = 1.0 + np.arange(22.0)
    parts = [ring_flows(step_start, 4, np.full((22, 4), 0.05), phase) for phase in (0.1, 0.5, 0.9)]
    flows = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    keep = (flows["start"] < 21.0) | ((flows["src"] != 3) & (flows["dst"] != 3))
    return make_hour(np.ones(20), flows={name: column[keep] for name, column in flows.items()}, **fields)


def test_a_hang_names_the_gpu_that_went_silent_first_and_lasts_until_the_watchdog():
    job = _hung_job()
    found, state = find_checkpoints(job)
    stop = hangs.describe_stop(job, found, None, PARAMS)
    assert stop.silent_first == ("10.0.3.1",) and stop.staggered and stop.mid_step
    assert stop.at_ns == job.ns(20.95)  # its last transfer ended
    (hang,), stop, open_hang, load = hangs.watch_stop(job, Progress(), None, None, found, state, None, PARAMS)
    assert hang.subject == "10.0.3.1" and load is None and open_hang is None and stop.hang and stop.decided
    assert json.loads(hang.evidence)["ended_by"] == "killed_by_watchdog"
    assert hang.end == job.ns(20.95 + PARAMS.hang_watchdog_s)
    # the work since the job's first step (no checkpoint) and the silence, on 4 GPUs
    assert hang.wasted_gpu_s == pytest.approx(4 * (20.95 + 600 - 1.0), rel=1e-6)


def test_a_job_whose_last_step_no_next_step_divided_ended_normally():
    # 20 steps divided, then a whole step's transfers from every GPU, then silence for the rest of
    # the hour: the job's last step (no next step's start divided it from the silence), no stop
    # in the middle of a step; the same with one GPU silent in it is a hang, and with a transfer
    # cut short, a stop in the middle of a step
    step_start = 1.0 + np.arange(21.0)
    parts = [ring_flows(step_start, 4, np.full((21, 4), 0.05), phase) for phase in (0.1, 0.5, 0.9)]
    flows = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    ended = make_hour(np.ones(20), flows=flows)
    found, state = find_checkpoints(ended)
    assert not hangs.describe_stop(ended, found, None, PARAMS).mid_step
    assert hangs.watch_stop(ended, Progress(), None, None, found, state, None, PARAMS)[0] == []
    keep = (flows["start"] < 21.0) | ((flows["src"] != 3) & (flows["dst"] != 3))
    hung = make_hour(np.ones(20), flows={name: column[keep] for name, column in flows.items()})
    found, state = find_checkpoints(hung)
    assert [i.kind for i in hangs.watch_stop(hung, Progress(), None, None, found, state, None, PARAMS)[0]] == ["hang"]
    # every GPU took part, but the job stopped with a transfer in flight: it carried a third of its size
    cut = dict(flows, nbytes=np.where(flows["start"] == flows["start"].max(), flows["nbytes"] // 3, flows["nbytes"]))
    stopped = make_hour(np.ones(20), flows=cut)
    found, state = find_checkpoints(stopped)
    assert hangs.describe_stop(stopped, found, None, PARAMS).mid_step


def test_a_job_ending_with_a_rail_behind_a_flow_cache_ended_normally():
    # 8 hosts in a ring, and a NIC pair (hosts 8 and 9) whose exporter caches flows: each record
    # runs from the middle of a step into the next, the last one through the job's last step,
    # begun before it. Every GPU took part in that step: a normal end, not a stop in the middle of
    # a step (realistic-5: a hang reported until the data's end)
    step_start = 1.0 + np.arange(21.0)
    parts = [ring_flows(step_start, 8, np.full((21, 8), 0.05), phase) for phase in (0.1, 0.5, 0.9)]
    cached_start, cached_end = step_start[:20] + 0.5, np.r_[step_start[1:20] + 0.45, step_start[20] + 0.95]
    cached = {"start": np.tile(cached_start, 2), "end": np.tile(cached_end, 2), "src": np.repeat([8, 9], 20),
              "dst": np.repeat([9, 8], 20), "nbytes": np.full(40, 3 * BULK)}
    ended = make_hour(np.ones(20), hosts=10, flows=joined(*parts, cached))
    found, state = find_checkpoints(ended)
    assert not hangs.describe_stop(ended, found, None, PARAMS).mid_step
    assert hangs.watch_stop(ended, Progress(), None, None, found, state, None, PARAMS)[0] == []


@pytest.mark.parametrize("nic, hang", [("10.0.3.1", False), ("10.0.3.5", True)])
def test_a_stop_whose_gpus_another_job_takes_is_no_hang(nic, hang):
    # another job starts on host gpu3 20 s after the stop: on the stopped job's NIC, it took the
    # GPUs (no hang); on another NIC of the host, it took the host's other GPUs only
    job = _hung_job(other_addr=np.array([nic]), other_host=np.array(["gpu3"]), other_first=np.array([40.0]),
                    other_last=np.array([3000.0]))
    found, state = find_checkpoints(job)
    issues, stop, _, _ = hangs.watch_stop(job, Progress(), None, None, found, state, None, PARAMS)
    assert stop.decided and stop.hang == hang and [i.kind for i in issues] == ["hang"] * hang


# --- an empty hour, issues and state ----------------------------------------------------------------


def test_an_empty_hour_gives_no_issue_and_no_exception():
    job = make_hour()
    assert hangs.continue_hang(job, None, PARAMS) == ([], None)
    resumes = restarts.find_resumes(job, Progress(), None, None, PARAMS)
    found, state = checkpoints.find_checkpoints(job, resumes.warmup, CheckpointState(), None, PARAMS)
    assert len(found.step) == 0 and state == CheckpointState()
    assert len(slow_links.slow_link_steps(job, resumes.warmup, PARAMS).culprit) == 0
    assert len(stragglers.straggler_steps(job, resumes.warmup, PARAMS)[0]) == 0
    assert hangs.watch_stop(job, Progress(), None, None, found, state, None, PARAMS) == ([], None, None, None)
    # steps without any flow: no culprit in any step
    steps_only = make_hour(jittered(30))
    assert (slow_links.slow_link_steps(steps_only, np.zeros(30, bool), PARAMS).culprit == -1).all()
    assert (stragglers.straggler_steps(steps_only, np.zeros(30, bool), PARAMS)[0] == -1).all()
    # the whole stage on empty tables
    empty = diagnose_job("job-x", FLOWS.empty_table(), JOB_GPUS.empty_table(), COMM_PAIRS.empty_table(),
                         STEPS.empty_table(), EVENTS.empty_table(), None, ORIGIN_NS, ORIGIN_NS + 3600 * NS,
                         MEMBERSHIP.empty_table())
    assert empty.issues.num_rows == 0 and empty.issues.schema == ISSUES
    assert empty.state == DiagnosisState().dump()


def test_issue_rows_carry_severity_confidence_and_rounded_evidence():
    slow = Issue.of("job-x", "slow_step", "job-x", 10, 5, share=0.3, confidence=1.7, wasted_gpu_s=2,
                    evidence={"ratio": 1 / 3, "gone": np.nan, "steps": np.int64(4)}, params=PARAMS)
    assert (slow.severity, slow.confidence, slow.end) == ("high", 1.0, 10)  # clipped; never ends before it starts
    assert json.loads(slow.evidence) == {"ratio": 0.333333, "gone": None, "steps": 4}
    hang = Issue.of("job-x", "hang", "10.0.0.1", 10, 20, share=0.01, confidence=0.9, wasted_gpu_s=1.0, evidence={},
                    params=PARAMS)
    assert hang.severity == "critical"  # the whole job stands still
    table = issues_table([slow, hang])
    assert table.schema == ISSUES and table["subject"].to_pylist() == ["job-x", "10.0.0.1"]
    assert table["start"].cast(pa.int64()).to_pylist() == [10, 10]


def test_state_round_trips_and_refuses_an_unknown_layout():
    job = _hung_job()
    found, state = find_checkpoints(job)
    _, stop, _, _ = hangs.watch_stop(job, Progress(), None, None, found, state, None, PARAMS)
    dumped = DiagnosisState(progress=Progress(steps_seen=20, first_step_ns=FIRST_STEP_NS), checkpoints=state,
                            hangs=HangState(stop=stop)).dump()
    stored = json.loads(json.dumps(dumped))  # as the warehouse keeps it
    assert DiagnosisState.load(stored).dump() == stored
    assert DiagnosisState.load(stored).hangs.stop == stop
    assert stored["stop"]["hang"] is True and "resumed" not in stored["stop"]
    assert not DiagnosisState.load(stored).open_issue  # the hang was decided and closed
    with pytest.raises(ValueError, match="layout 2"):
        DiagnosisState.load({**stored, "version": 2})


def test_job_hour_build_assigns_flows_to_steps_and_tells_storage_from_other_jobs():
    gpus = conform(pa.table({"job_id": ["job-x"] * 2, "addr": ["10.0.1.1", "10.0.0.1"], "host": ["gpu1", "gpu0"],
                             "gpu": [0, 0], "pp_stage": [0, 0], "dp_rank": [1, 0]}), JOB_GPUS)
    pairs = conform(pa.table({"job_id": ["job-x"], "src_addr": ["10.0.0.1"], "dst_addr": ["10.0.1.1"],
                              "kind": ["dp"]}), COMM_PAIRS)
    at = [ORIGIN_NS + int(s * NS) for s in (0.99, 1.5, 2.5, 2.6)]
    flows = pa.table({"time_flow_start_ns": at, "time_flow_end_ns": [t + NS // 10 for t in at],
                      "src_addr": ["10.0.0.1", "10.0.1.1", "10.0.0.1", "10.0.1.1"],
                      "dst_addr": ["10.0.1.1", "10.0.0.1", "10.9.0.1", "10.200.0.1"],
                      "bytes": [BULK, BULK, BULK, BULK]})
    steps = conform(pa.table({"job_id": ["job-x"], "step": [7], "start": pa.array([ORIGIN_NS + NS]).cast(
        STEPS.field("start").type), "end": pa.array([ORIGIN_NS + 3 * NS]).cast(STEPS.field("end").type)}), STEPS)
    membership = conform(pa.table({"job_id": ["job-x", "job-y"], "addr": ["10.0.0.1", "10.9.0.1"],
                                   "host": ["gpu0", "gpu9"], "gpu": [0, 0],
                                   "first_ns": [ORIGIN_NS, ORIGIN_NS + 5 * NS],
                                   "last_ns": [ORIGIN_NS + 3 * NS, ORIGIN_NS + 1800 * NS]}), MEMBERSHIP)
    job = JobHour.build("job-x", flows, gpus, pairs, steps, None, membership, ORIGIN_NS, ORIGIN_NS + 3600 * NS,
                        PARAMS)
    assert job.addrs.tolist() == ["10.0.0.1", "10.0.1.1"] and job.hosts.tolist() == ["gpu0", "gpu1"]
    assert job.step.tolist() == [0, 0]  # 10 ms early still belongs to the step (exporter clock skew)
    assert job.kind.tolist() == [DP, UNCLASSIFIED]  # the reverse pair was given no kind
    assert job.write_dst.tolist() == ["10.9.0.1", "10.200.0.1"]
    assert job.write_to_storage.tolist() == [False, True]  # the first goes to another job's GPU
    assert job.data_end == pytest.approx(1800.0)  # the data ends half way through the hour
    # job-y used gpu9 from 5 s, but none of job-x's GPUs: nothing of job-x's was taken
    assert job.hosts_taken_after(["gpu9"], 10.0) == np.inf and job.hosts_taken_after(["gpu0"], 0.0) == np.inf


@pytest.mark.parametrize("seed", range(3))
def test_pairs_of_long_steps_apart_are_counted_as_every_pair_would(seed):
    from prism_core.rhythm import pairs_apart

    rng = np.random.default_rng(seed)
    numbers = np.sort(rng.choice(3_000, 800, replace=False)) + 10**6
    expected = np.bincount((numbers[None, :] - numbers[:, None])[np.triu_indices(len(numbers))],
                           minlength=numbers[-1] - numbers[0] + 1)
    assert np.array_equal(pairs_apart(numbers), expected)


def test_a_flow_the_clock_carried_over_the_step_boundary_shows_nothing_of_the_next_step():
    # 8 one-GPU hosts in a ring, a transfer from each 0.3, 0.6 and 0.9 s into every step: host 3's
    # GPU never starts step 20, and host 6 stops too, after its last transfer of step 19, which
    # began 0.1 s before step 20 and ended 0.04 s into it (a millisecond clock or the step
    # division's slack put it across); the others run on for 2 s. Host 6 did not begin step 20
    # either, nor went silent before the stuck GPU (named alone until this round)
    step_start = 1.0 + np.arange(22.0)
    parts = [ring_flows(step_start, 8, np.full((22, 8), 0.05), phase) for phase in (0.3, 0.6, 0.9)]
    flows = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    stopped = np.isin(flows["src"], (3, 6)) | np.isin(flows["dst"], (3, 6))
    flows = {name: column[(flows["start"] < 21.0) | ~stopped] for name, column in flows.items()}
    flows["end"] = np.where((flows["src"] == 6) & (flows["start"] == 20.9), 21.04, flows["end"])
    job = make_hour(np.ones(20), hosts=8, flows=flows)
    found, _ = find_checkpoints(job)
    assert "10.0.3.1" in hangs.describe_stop(job, found, None, PARAMS).silent_first
