"""Every threshold and prior of step division, in one frozen dataclass.

A *threshold* is policy: where Prism draws a line. A *prior* is a property of the job, assumed only
until the job's own traffic shows it (each names the learned timing that replaces it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimelineParams:
    # --- thresholds: grouping flows into activities and collectives -------------------------------
    # ns; flows closer than this are one activity (launch jitter, exporter clock skew)
    merge_ns: int = 1_000_000
    # ns; one collective's flows start within this of each other across exporters
    cluster_ns: int = 15_000_000
    # ns; a pair's flows starting within this of each other are one transfer (its channels)
    transfer_ns: int = 2_000_000

    # --- thresholds: finding the sync phases ------------------------------------------------------
    # ratio; gradient syncs weigh this many times other DP bursts (bytes x flows / pairs^2)
    heavy_separation: float = 2.5
    # share of the DP bytes; gradient syncs carry at least this much (a ZeRO-3 job gathers each
    # micro-batch's parameters, at most 8 per step, against one sync of every gradient)
    heavy_bytes_share: float = 0.05
    # heavy bursts (the median's bytes); lighter DP bursts moving the heavy ones' transfer sizes on
    # their pairs in this much between two heavy bursts sync without them: the heavy ones are
    # buckets merged by a straggler, and every burst is a sync (phases._runs_without_heavy)
    heavy_absent_syncs: float = 2.0
    # share; boundary gaps deviate at most this much (mean, relative) from their local median spacing
    max_irregularity: float = 0.15
    # pipeline sends (bursts); a pipeline job's exchange outside its hops marks its steps when at
    # least this many come between two of its bursts (the median): a step's forward and backward
    # of a micro-batch at least (phases._exchange_marks_steps)
    marker_sends: int = 2
    # share; a pipeline's turns are misread where they mark fewer than this share of the longer gaps
    # that part its steps without them (phases._turns_misread)
    min_turn_share: float = 0.5
    # share; the irregularity a class of one gap would have to beat (few gaps look regular by luck)
    small_sample_penalty: float = 0.2
    # ratio; no step carries more than this many times the sync flows of its neighbours
    max_unit_excess: float = 2.0
    # ratio; a cut whose units each hold several of a finer cut's is a cadence of those (saves
    # every k steps) when it is at most this many times as regular as summing k independent units
    # makes them (regimes._groups; the sum of k jittered steps deviates ~1/sqrt(k) as much)
    averaged_irregularity: float = 2.0
    # share of the time; a finer cut too irregular only where a coarser one cuts is judged on its
    # spacings away from those cuts when they hold at least this share of the time (steps between
    # saves: most of it; a sync's bursts one stage after another: its few tenths of a step)
    min_away_time_share: float = 0.5
    # share; a cut may keep gaps that are mostly checkpoint saves only below this share of them
    max_saving_share: float = 0.5
    # ratio; a cut keeping every gap sits this far below the shortest
    cut_ratio: float = 1.05
    # log10 spread of the lengths of one regime of gaps (BOCD's prior, ~12%)
    regime_spread: float = 0.05
    # count; BOCD segments at most this many quantiles of the gap lengths (its cost grows with them)
    regime_points: int = 1000
    # share; a last burst with this much of its bytes on pairs the phase used repeats them
    repeat_share: float = 0.5
    # share; a collective after another on its pairs, in other transfer sizes, moves at least this
    # much of its bytes on them to be a collective of its own (a parameter gather moves the
    # parameters once, half the fp32 gradients' bytes in bf16), not the last records of a transfer
    trailing_collective_share: float = 0.25
    # share of the pairs of the collective before it that such a collective runs on, and of them
    # done when it starts (a slow rank's ring, a channel's stretched flow run on)
    trailing_pairs_share: float = 0.5
    # share; an all-gather of the updated shards repeats the reduce-scatter's bytes and flows this closely
    same_shape: float = 0.1
    # share of a collective's records that lost export datagrams may take (24 records each, a few
    # on a collective of some 60 flows): flows of the same mean size fewer by at most this much
    # are the same collective again
    lost_share: float = 0.4
    # divisor; the next step's first sends are looked for in this part of the gap to the next phase's end
    first_sends_part: int = 4

    # --- thresholds: steps and their boundaries ---------------------------------------------------
    # share of a step; an inter-step gap this much above usual is a checkpoint or a stall
    long_gap_share: float = 0.1
    # share; a sync phase with fewer bytes or flows than this share of usual was cut short
    complete_share: float = 0.9
    # share; the same for a phase after which the job falls silent (a hang or failure cut it)
    last_complete_share: float = 0.97
    # share of the usual phase's span; a phase lasting this long, short of records but not of more
    # than `lost_share`, was not cut short (phases._whole_over_its_span)
    usual_span_share: float = 0.8
    # ratio; a job whose next step is this much slower than usual started in view (warm-up)
    warmup_ratio: float = 1.15
    # steps; a first step is judged against the median of this many steps after it (the local rhythm)
    rhythm_steps: int = 5
    # steps; fewer than this after the first step: the usual period stands in for the rhythm
    min_rhythm_steps: int = 3
    # steps; a warm-up shows as this many steps in a row each faster than the one before
    speedup_steps: int = 3
    # share of the usual gap; a quiet this long before a step's first traffic can open it
    quiet_gap_share: float = 0.8
    # steps without traffic after a sync: the job stopped after it
    silence_steps: float = 4.0
    # steps without traffic before a new job's traffic: what came before was another job's tail
    tail_silence_steps: float = 2.0

    # --- thresholds: saves the flow logs do not see (a storage network; boundaries.unwritten_saves) -
    # A quiet gap after a sync is a save when such gaps recur every k phases: at least this many
    # times after the first, on a rhythm that this share of its slots fill (stalls at random fill
    # none), a gap within this many phases of a slot counting (a step near a save may be split),
    # the periods tried being this many of the most common distances between gaps. The same
    # policy as the diagnosis's rhythm of unwritten saves (DiagnosisParams.rhythm_*).
    save_rhythm_repeats: int = 3
    save_rhythm_coverage: float = 0.75
    save_rhythm_slack: int = 1
    save_rhythm_candidates: int = 8
    # steps; quiet gaps are remembered this long between hours (three intervals of a save every
    # 20 minutes at 1.5 s a step)
    save_rhythm_memory_steps: int = 2400

    # --- thresholds: what is learned, and what is carried between hours ---------------------------
    # count; the job's usual timings are learned from this many steps in view, else the previous hours'
    steps_to_learn: int = 8
    # count; the same for a job seen whole (silent for longer than it ran in view: no more will come)
    steps_to_learn_whole: int = 4
    # count; the usual save is a median over this many checkpoints (one may be a stall with bulk traffic)
    saves_to_learn: int = 3
    # share of the usual save's writes' span; saves whose spans differ this much tell how a save's
    # tail grows with its span (typical._save_tail)
    save_span_spread: float = 0.2
    # count; the tail's line is fitted over at most this many of the hour's saves (the last)
    save_tail_saves: int = 64
    # ns; flows carried to the next hour reach back at most this far before the hour's end
    max_carry_ns: int = 600_000_000_000

    # --- thresholds: the optimizer's tail learned from the steps' pace (typical._tail_per_sync) ---
    # count; the pace fit needs at least this many pairs of consecutive normal steps
    pace_fit_steps: int = 30
    # MADs; a period this far from the fit is a stall or a save, left out of it
    pace_fit_outlier: float = 4.0
    # count; besides the whole hour, the fit is also begun from each of this many stretches of it
    pace_fit_stretches: int = 6
    # ratio; a stretch's fit replaces the hour's when its residuals spread this many times less
    # (the MAD of a few hundred residuals varies by ~10% between fits of one pace)
    pace_fit_tighter: float = 2.0
    # share of the period; the fit must explain the mean period this closely
    pace_fit_misfit: float = 0.03
    # share of the period; and pin the optimizer's share this closely (standard error)
    pace_fit_error: float = 0.01
    # standard errors; the learned share replaces the prior `optimizer_share` only this far from it
    pace_fit_confidence: float = 3.0

    # ratio; a gather after the optimizer belongs to the step whose pace it keeps this much better
    # (spread of its length's ratio to the syncs around it; typical._gather_opens)
    gather_pace_ratio: float = 0.5

    # --- priors: properties of the job, used until its traffic shows them -------------------------
    # Learned from the job's own steps instead (typical.py): the optimizer's tail after the sync
    # (Typical.close_to_end_ns, wherever a parameter gather or pipeline sends mark the next step's
    # start), the forward passes before a step's first visible send (Typical.fill, from the
    # pipeline's warm-up sends; no backward/forward ratio is assumed), saves and their tails.
    # share of a step the optimizer takes after the sync, for a job whose only traffic is its sync
    # (nothing on the network marks its steps' starts) until its steps' pace shows its own
    # (Typical.tail_per_sync), and one with too few steps to learn from
    optimizer_share: float = 0.04
    # share of a step after the sync within which a checkpoint save starts writing, until the job's
    # own saves show how long theirs took (Typical.write_delay_ns)
    save_start_share: float = 0.25


DEFAULT_PARAMS = TimelineParams()
