"""Every threshold and prior of the diagnosis stage, in one frozen dataclass.

A *threshold* is policy: where the stage draws a line (how slow is slow, how long a silence is a
hang). A *prior* is a property of the job, assumed until the job's own traffic shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from prism_core.constants import CHECKPOINT_FLOW_BYTES


@dataclass(frozen=True)
class DiagnosisParams:
    # --- thresholds: steps ---
    # s; no training step of a multi-host job is shorter: shorter "steps" are artifacts of step division
    min_step_s: float = 0.1
    # s; exporter clocks differ by a few ms: a flow this early still belongs to its step
    boundary_slack_s: float = 0.02
    # steps a job must have shown before its steps are judged or its stop called a hang
    min_steps: int = 10
    # steps; a step with at least this share of the usual flow count of a step is complete
    complete_step_share: float = 0.9

    # --- thresholds: slow steps and the baseline ---
    # Holmes' delta: a step is slow when longer than delta x its local baseline. Jitter below ~1.04
    # is indistinguishable from noise; 1.1 is 3-10 sigma of the 1-3% step jitter of real jobs.
    slow_step_delta: float = 1.1
    jitter_sigmas: float = 5.0  # ... and at least this many robust sigmas of the job's own jitter
    # step-to-step differences of log durations needed to measure the job's jitter
    jitter_min_diffs: int = 5
    jitter_sigma_floor: float = 1e-3  # log-duration units: jitter is never taken as smaller
    baseline_steps: int = 10  # rolling median over this many steps on each side
    # Heavy tails (baseline.tail_limit): a job's clean steps pass its slow-step limit
    # natural_slow_steps_per_hour times an hour by its own Pareto tail, fitted to the excesses
    # beyond tail_sigmas of its jitter (where jitter alone seldom reaches: a normal distribution's
    # 2.5 sigmas is its 0.6% quantile) or its longest tail_share of steps if more (at least
    # tail_min_steps), after the tail_trim_steps longest are set aside (a slow-step fault slows
    # a few steps). The rate is the issues' budget of false alarms: one per 50 clean job-hours.
    natural_slow_steps_per_hour: float = 0.02
    tail_share: float = 0.1
    tail_sigmas: float = 2.5
    tail_min_steps: int = 10
    tail_trim_steps: int = 3
    # share of a step: how much longer than usual a checkpoint step must be to be slow (saving
    # times vary more than compute: storage is shared)
    checkpoint_margin: float = 0.25
    # a checkpoint is slow beyond this many robust sigmas of the job's own saving times (log
    # units), the spread taken as at least save_spread_floor
    save_sigmas: float = 4.0
    save_spread_floor: float = 0.05
    # share of the usual traffic of a step (bytes between members, the median of the steps around
    # it); a step carrying this much holds two steps whose boundary the records missed (a sync lost
    # with its export datagram), not a slow one: a step's traffic varies by a few percent (10%
    # with loss), two steps' is twice it
    merged_step_traffic: float = 1.3
    degradation_min_shift: float = 0.03  # level rise, as a share of the baseline
    degradation_min_steps: int = 10  # steps the new level must hold
    # standard errors of the difference of the two levels (the job's jitter over the steps of
    # each) a rise must pass: a job jittering 6% a step moves a ten-step level by 3% at random
    degradation_min_z: float = 5.0

    # --- thresholds: checkpoints ---
    checkpoint_write_bytes: int = CHECKPOINT_FLOW_BYTES  # bytes; a flow out of the job this large is a save
    # times long steps must recur on one period to be a checkpoint rhythm: with a write seen, and
    # without (stalls spread evenly over time put three long steps two equal gaps apart)
    rhythm_repeats: int = 2
    rhythm_repeats_unwritten: int = 3
    # share of the steps on a rhythm that must be long: stalls at random seldom fill a rhythm
    rhythm_coverage: float = 0.75
    # steps; a save's step numbered this far off its rhythm is still on it (the timeline may split
    # or merge a step near a save)
    rhythm_slack_steps: int = 1
    rhythm_candidates: int = 8  # the most common differences between long steps tried as the rhythm's period
    usual_save_checkpoints: int = 3  # checkpoints whose saving time must be seen before it is usual
    save_history: int = 8  # checkpoints' saving times kept between hours

    # --- thresholds: restarts ---
    warmup_steps: int = 3  # steps after a (re)start that are slow by nature, charged to the restart
    restart_gap_s: float = 20.0  # s; a silence between steps this long (and > restart_gap_steps) is a restart
    restart_gap_steps: float = 3.0  # median steps
    # a job that resumes on the connections it had (queue pairs, read from the records' source
    # ports: prism_core.queue_pairs) paused, its processes alive: no restart. The connections of
    # the transfers within connection_window_s after the silence and before it are compared; at
    # least same_connection_share of the later ones must be earlier ones (a restart's are all new)
    connection_window_s: float = 30.0
    same_connection_share: float = 0.5
    # s; the hosts a job had at a moment are those active this long before it
    active_window_s: float = 60.0
    event_window_s: float = 60.0  # s; recognition events this close to a restart are its evidence

    # --- thresholds: slow links and stragglers ---
    throughput_min_bytes: int = 1 << 20  # bytes; smaller transfers are dominated by latency
    slow_link_ratio: float = 0.7  # throughput below this share of same-size transfers
    link_tie: float = 0.03  # share; two addresses this close in throughput are equally slow
    # share; sizes a clock does not time one by one are measured together (per step, link and
    # size; to tell which address throttles a slow collective) where they move at least at this
    # share of the job's fastest timed size's usual throughput: slower ones mostly wait, and their
    # lengths say nothing of a link's speed
    pace_share: float = 0.5
    # s; exporter clocks differ by up to this (NTP-synced switches): a pipeline send trailing its
    # stage peers' by no more in most steps trails them by its exporter's clock, not by being slow
    clock_trail_max_s: float = 0.02
    late_min_s: float = 0.005  # s; a flow later than its usual trail behind its stage peers by more than clock noise ...
    late_min_share: float = 0.01  # ... or, alone in its stage, by this share of the step
    late_sigmas: float = 4.0  # ... and by this many robust sigmas of its own timing noise
    late_min_samples: int = 5  # steps a flow must be seen in before its timing noise is known
    # quantile of a host's counts of a transfer class over the steps: the count it sends when no
    # record is lost (the usual count, the mode, is short of it where exporters lose 0.1-5% of
    # their records over UDP; a flow across the step boundary now and then makes one more)
    complete_count_quantile: float = 0.9
    # share of that count a host may lack in a step and still be compared, one flow at least
    short_flows_share: float = 0.1
    # share of steps: a transfer class is regular when its count per step is the usual one (or a
    # few short) this often
    regular_share: float = 0.8
    # sigmas of the mean step: a straggler whose window is not slower than this cost nobody time
    straggler_min_sigmas: float = 2.0
    window_min_steps: int = 3  # straggler / slow link: steps it must show in
    window_max_gap: int = 3  # steps without the culprit that do not break a window
    # share of a window's span: two windows of one culprit are one episode when the steps between
    # them are no more than this share of the longer one's span. A fault near the detection
    # threshold names its culprit in some steps and not in others (a link whose throughput hovers
    # about `slow_link_ratio`): its windows break off and resume over the fault's whole span
    window_rejoin_share: float = 1.0
    # s; the flows of one transfer (one per NCCL channel) start within launch skew (well under a
    # millisecond); a pipeline stage sends its next micro-batch at least a forward pass later
    transfer_gap_s: float = 0.002

    # --- thresholds: stops and hangs ---
    hang_confirm_s: float = 30.0  # s; silence (hosts not taken) before a stop can be called a hang
    hang_confirm_steps: float = 3.0  # ... or this many typical steps, when longer
    hang_stagger_s: float = 0.4  # s; GPUs stopping this far apart: a hang, not a crash
    crash_wait_s: float = 300.0  # s; a stop without stagger is a hang after this silence (restarts resume)
    # A hung collective holds the job's GPUs until the NCCL watchdog kills the job (PyTorch's
    # default timeout: 10 minutes; a platform setting): a hang lasts at most this long, and a job
    # that resumes after a silence this long was hung, then killed and restarted.
    hang_watchdog_s: float = 600.0
    stop_reference_steps: int = 10  # complete steps that show where in a step each GPU is normally active
    # when in a step a GPU is normally active is known to within this (s), or this share of a
    # step when larger: step-to-step jitter
    phase_tolerance_s: float = 0.1
    phase_tolerance_share: float = 0.05
    data_end_margin_s: float = 60.0  # s; an hour whose last flow comes earlier than this before its end ends the data
    # a checkpoint load: bulk reads less than this apart (s), bringing back at least this share of
    # what the last save wrote, into at least this share of as many GPUs (a host replaced on the
    # restart is not a member yet)
    load_gap_s: float = 15.0
    load_share: float = 0.5

    # --- thresholds: issue rows ---
    # the band of an issue whose impact (a share of the step time) is below each limit
    severity_bands: tuple[tuple[float, str], ...] = ((0.10, "low"), (0.25, "medium"), (0.50, "high"))
    # confidence of evidence that has no margin to grow with: a restart seen from its steps, or
    # from its checkpoint load alone; a hang whose GPUs fell silent one after another, or at once
    restart_confidence: float = 0.95
    load_restart_confidence: float = 0.8
    staggered_hang_confidence: float = 0.9
    sudden_hang_confidence: float = 0.6

    # --- priors: properties of the job, used until its own traffic shows them ---
    # log-duration units; step-to-step jitter of a job before jitter_min_diffs steps show its own
    jitter_sigma: float = 0.02
    # bytes; before any save of the job was seen, its checkpoint load reads a shard this large at
    # least into each GPU that saves (dp rank 0): a multi-host model's shard is gigabytes,
    # data-loader reads are megabytes
    load_min_shard_bytes: int = 1 << 30
    # BOCD on the steps' log durations: expected steps between level changes, and the weight (in
    # steps) of the prior mean of a new level
    change_hazard_steps: float = 1000.0
    level_prior_steps: float = 0.1
    # a pipeline stage's backward pass per micro-batch, x its forward, when its transfers cannot
    # tell the two apart (a single micro-batch)
    backward_per_forward: float = 2.0


DEFAULT_PARAMS = DiagnosisParams()
