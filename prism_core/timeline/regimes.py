"""The boundary gap: the shortest quiet between sync bursts that still separates two steps.

The gap lengths fall into a few regimes (stages syncing one after another, the optimizer pause,
the compute between steps, checkpoints, a pipeline's micro-batch cadence); BOCD over the sorted
lengths finds where they change regime, and the cut whose longer gaps recur most regularly in time
separates the steps.
"""

from __future__ import annotations

import numpy as np

from prism_core.bocd import NormalGammaPrior, bocd
from prism_core.timeline.params import TimelineParams


def boundary_gap_threshold(
    gaps: np.ndarray, at: np.ndarray, flow_candidate: np.ndarray, bulk_writes: np.ndarray, previous: float | None,
    eligible: np.ndarray, steps_to_learn: int, params: TimelineParams, syncs: bool = False,
) -> float:
    """The shortest gap between two candidate bursts that still separates two steps.

    Each regime cut (`_regime_cuts`) keeps the gaps above it, and marks steps when those gaps recur
    regularly in time, no unit between two of them carries much more traffic than its neighbours
    (as a regime boundary in the middle of the hour would), they are not mostly checkpoint saves,
    and the time does not go mostly to a few long units (`time_irregularity`: the bursts of a
    long sync stretch at each step's end, the compute between). Of those, the most regular wins
    (a finer cut adds the micro-batch cadence, whose warm-up and cool-down break the rhythm once
    per step), small classes handicapped as their regularity may be luck (the micro-batches of a
    warm-up step alone). Only `eligible` gaps can separate steps. Of bursts that are gradient
    syncs (`syncs`), a finer cut wins where the best one's units are runs of its units, regular
    only as sums of independent units are (`_groups`: saves every k steps over a storage network
    the records do not show), and so does a finer cut too irregular only where the best one cuts,
    ranked on its regularity away from those cuts where its spacings there hold most of the time
    and the best cut's gaps vary in length more than its units do (`_irregularities_away`,
    `min_away_time_share`: saves of varying length every ten steps, whose long gaps alone put the
    steps' cadence over `max_irregularity`, sealed-13 job 000 read its 77 steps as 7; a sync's
    bursts one stage after another keep time too, but over a few tenths of a step, and a
    pipeline's micro-batch sends read as syncs keep time over most of it, but the steps' quiet
    between them keeps its length). Without such a cut, the previous hour's."""
    fallback = previous if previous is not None else (float(gaps[eligible].min()) if eligible.any() else np.inf)
    if np.sum(eligible & (gaps >= fallback)) < steps_to_learn:
        return fallback
    log_gaps = np.log10(np.maximum(gaps, 1))
    cuts = _regime_cuts(log_gaps[eligible], params)
    passing, seen = [], set()  # (score, irregularity, kept, threshold) of every cut that marks steps
    irregular = []  # the same of the cuts that fail only for their irregularity
    for cut in cuts:
        kept = np.flatnonzero(eligible & (log_gaps >= cut))
        if len(kept) in seen:
            continue
        seen.add(len(kept))
        irregularity_of_kept = irregularity(at[kept])
        # few gaps can look regular by chance: rank by an upper bound, ~1/sqrt(n) wide
        score = irregularity_of_kept + params.small_sample_penalty / np.sqrt(len(kept))
        regular = max(irregularity_of_kept, time_irregularity(at[kept], steps_to_learn)) <= params.max_irregularity
        if _unit_excess(kept, flow_candidate) > params.max_unit_excess:
            continue
        saving = np.searchsorted(bulk_writes, at[kept] + gaps[kept]) > np.searchsorted(bulk_writes, at[kept])
        if np.mean(saving) < params.max_saving_share:
            shortest_kept = float(gaps[kept].min())
            dropped = gaps[eligible & (gaps < shortest_kept)].astype(float)
            # halfway (in log) to the longest gap left inside steps
            threshold = float(np.sqrt(shortest_kept * dropped.max())) if len(dropped) else shortest_kept / params.cut_ratio
            (passing if regular else irregular).append((score, irregularity_of_kept, kept, threshold))
    if not passing:
        return fallback
    best = min(passing, key=lambda cut: cut[0])
    # a finer cut of syncs irregular only where the best one cuts (saves of varying length over a
    # network the records do not show, every k steps) keeps time between those cuts: ranked on
    # that, where the best cut's gaps vary in length more than the finer cut's units do (a save's
    # length is its own; a step's quiet between a pipeline's micro-batch sends read as syncs keeps
    # its length as the step keeps its pace)
    log_best_gaps = np.log(np.maximum(gaps[best[2]], 1.0))
    best_gap_spread = float(np.median(np.abs(log_best_gaps - np.median(log_best_gaps))))
    for _, _, kept, threshold in irregular:
        if syncs and len(kept) > len(best[2]):
            away = _irregularities_away(best[2], kept, at)
            if (max(away[:2]) <= params.max_irregularity and away[2] >= params.min_away_time_share
                    and best_gap_spread > away[0]):
                passing.append((away[0] + params.small_sample_penalty / np.sqrt(len(kept)), away[0], kept, threshold))
    best = min(passing, key=lambda cut: cut[0])
    # a cut whose units are runs of a finer cut's, regular only as sums of independent units are
    # (saves every k steps over a network the records do not show), is a cadence of steps
    grouping = [finer for finer in passing
                if syncs and len(finer[2]) > len(best[2]) and _groups(best[2], finer[2], at, params)]
    return min(grouping, key=lambda cut: cut[0])[3] if grouping else best[3]


def _groups(coarse: np.ndarray, fine: np.ndarray, at: np.ndarray, params: TimelineParams) -> bool:
    """Whether the units between the `coarse` boundary gaps are runs of the units between the
    `fine` ones (gap indexes; the coarse are among the fine) whose regularity is what summing
    independent units gives: a step's jitter is its own, so k steps in a row deviate from their
    usual length about 1/sqrt(k) as much as one step does, while the parts of one step (the
    micro-batches of a pipeline, a sync's buckets) share its jitter and their sum deviates as much
    as each (of a pipeline's micro-batches, which need not, the cadence is read from its turns). The
    fine units' own deviation is measured away from the coarse boundaries (whose
    units hold the longer gaps); the coarse units must hold at least two fine ones each (the
    median) and be no more regular than `averaged_irregularity` times that sum's."""
    per_unit = np.diff(np.searchsorted(fine, coarse))
    if len(per_unit) < 3 or np.median(per_unit) < 2:
        return False
    deviation = _deviations(at[fine])
    starts_coarse = np.isin(fine[:-1], coarse) | np.isin(fine[1:], coarse)
    if np.sum(~starts_coarse) < 3:
        return False
    averaged = float(np.mean(deviation[~starts_coarse])) / np.sqrt(float(np.median(per_unit)))
    return irregularity(at[coarse]) <= params.averaged_irregularity * averaged


def _irregularities_away(coarse: np.ndarray, fine: np.ndarray, at: np.ndarray) -> tuple[float, float, float]:
    """`irregularity` and `time_irregularity` (nothing set aside) of the `fine` boundary gaps'
    spacing (gap indexes), over the spacings that neither end nor begin at a `coarse` one (inf
    with fewer than 3 such spacings), and the share of the time those spacings hold."""
    if len(fine) < 4:
        return np.inf, np.inf, 0.0
    away = ~(np.isin(fine[:-1], coarse) | np.isin(fine[1:], coarse))
    if away.sum() < 3:
        return np.inf, np.inf, 0.0
    spacing = np.diff(at[fine]).astype(float)
    departure = np.abs(spacing - _neighbour_median(spacing))
    return (float(np.mean(_deviations(at[fine])[away])), float(departure[away].sum() / spacing[away].sum()),
            float(spacing[away].sum() / spacing.sum()))


def _regime_cuts(log_gaps: np.ndarray, params: TimelineParams) -> np.ndarray:
    """The lengths (log10) where the gap lengths change regime, and the shortest (a cut that
    keeps every gap): BOCD's MAP segmentation of the sorted lengths (of `regime_points` quantiles
    of them, for speed), each change moved to the widest spacing of all the sorted lengths
    around it."""
    ordered = np.sort(log_gaps)
    points = min(len(ordered), params.regime_points)
    picks = np.unique(np.linspace(0, len(ordered) - 1, points).round().astype(np.int64))
    sample = ordered[picks]
    prior = NormalGammaPrior(mu=float(np.median(sample)), kappa=0.01, alpha=1.0, beta=params.regime_spread**2)
    changes = bocd(sample, prior=prior).changepoints
    spacing = np.diff(ordered)
    around = zip(picks[np.maximum(changes - 1, 0)], picks[np.minimum(changes + 1, len(picks) - 1)])
    return np.r_[ordered[0], [ordered[lo + 1 + np.argmax(spacing[lo:hi])] for lo, hi in around]]


def _unit_excess(boundary_gaps: np.ndarray, flow_candidate: np.ndarray) -> float:
    """The most flows any unit between boundary gaps carries against the median of its 8
    neighbours (units cut by the window carry fewer, never more)."""
    unit = np.searchsorted(boundary_gaps, flow_candidate)  # gap i separates candidates i and i + 1
    flows = np.bincount(unit, minlength=len(boundary_gaps) + 1).astype(float)
    if len(flows) < 3:
        return np.inf
    return float(np.max(flows / np.maximum(_neighbour_median(flows), 1.0)))


def irregularity(times: np.ndarray) -> float:
    """Mean deviation of the spacing of `times` from the median of its 8 neighbours, each capped
    at 1: near 0 for one event per step, high when two kinds of gaps interleave (an even number
    of neighbours keeps an alternating pattern from matching itself)."""
    if len(times) < 4:
        return np.inf
    return float(np.mean(_deviations(times)))


def _deviations(times: np.ndarray) -> np.ndarray:
    """Per spacing of `times` (4 or more), its relative deviation from the median of its 8
    neighbours, capped at 1."""
    spacing = np.diff(times).astype(float)
    return np.minimum(np.abs(spacing / _neighbour_median(spacing) - 1.0), 1.0)


def time_irregularity(times: np.ndarray, set_aside: int) -> float:
    """The time the spacing of `times` spends away from the median of its 8 neighbours, as a
    share of all of it, the `set_aside` largest departures left out (saves, a restart). Near 0 for
    one event per step; near 1 for the bursts of a long sync stretch at the end of each step,
    whose cadence `irregularity` may find regular: a long step's compute is one spacing in many,
    but most of the time."""
    spacing = np.diff(times).astype(float)
    if len(spacing) < 3:
        return np.inf
    departure = np.sort(np.abs(spacing - _neighbour_median(spacing)))
    return float(departure[:max(len(departure) - set_aside, 0)].sum() / spacing.sum())


def _neighbour_median(values: np.ndarray) -> np.ndarray:
    """Per element, the median of the 4 values on either side (reflected at the ends)."""
    window = np.lib.stride_tricks.sliding_window_view(np.pad(values, 4, mode="reflect"), 9)
    return np.median(np.delete(window, 4, axis=1), axis=1)
