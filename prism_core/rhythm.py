"""Rhythms: long steps that recur every k step numbers, as a training loop's checkpoint saves do.

Shared by the step division (a save the flow logs do not see leaves a long quiet gap on the
rhythm) and the diagnosis (a long step on the rhythm is a save, not a slow step).
"""

from __future__ import annotations

import numpy as np


def on_rhythm(numbers: np.ndarray, long: np.ndarray, period: int, phase: int, slack: int) -> np.ndarray:
    """Per step: long and on the rhythm, or within `slack` steps of it when the step on it is not
    long (the timeline numbered the steps after a save one off; a step after a save is no save)."""
    offset = (numbers - phase + slack) % period - slack
    exact = long & (offset == 0)
    near = long & (np.abs(offset) <= slack) & (offset != 0)
    return exact | (near & ~np.isin(numbers - offset, numbers[exact]))


def pairs_apart(numbers: np.ndarray) -> np.ndarray:
    """For sorted distinct integers: per difference d from 0 to their span, how many pairs of them
    lie d apart. The autocorrelation of their indicator, by FFT (O(span log span), where every
    pair is quadratic in them: thousands of long steps in a heavy tail); rounded, exact while its
    error (~1e-16 x span x count) stays far below 1/2."""
    indicator = np.zeros(int(numbers[-1] - numbers[0]) + 1)
    indicator[numbers - numbers[0]] = 1.0
    size = 1 << (2 * len(indicator) - 1).bit_length()  # no wrap-around
    spectrum = np.fft.rfft(indicator, size)
    return np.rint(np.fft.irfft(spectrum * np.conj(spectrum), size)[: len(indicator)]).astype(np.int64)


def rhythm_of(numbers: np.ndarray, min_repeats: int, coverage: float, slack: int,
              candidates: int) -> tuple[int, int] | None:
    """(period, phase) when long steps recur every `period` step numbers at least `min_repeats`
    times, and at least `coverage` of the steps on that rhythm are long: a few stalls that happen
    to be equal gaps apart are not a rhythm. A step within `slack` of a slot counts: a step near a
    save may be split or merged, and the next ones numbered one off. The periods tried are the
    `candidates` most common differences between any two long steps, not only neighbours: a job
    whose steps stall by nature (a heavy tail) has long steps between its saves. Of the periods
    whose rhythm holds, the one most long steps are on wins (a multiple of the period has fewer
    slots; a fraction of it, empty ones)."""
    numbers = np.unique(numbers[numbers >= 0])
    numbers = numbers[np.diff(numbers, prepend=-2) > 1]  # a save's next step may hold its end
    if len(numbers) <= min_repeats:
        return None
    apart = pairs_apart(numbers)
    apart[: 2 * slack + 2] = 0
    periods = np.flatnonzero(apart)
    if not len(periods):
        return None
    periods = periods[np.argsort(-apart[periods], kind="stable")[:candidates]]
    best, best_hits = None, 0
    for period in periods.tolist():  # most common first: ties keep it
        phase = int(np.argmax(np.bincount(numbers % period)))  # a long step off the rhythm does not set it
        slots = np.arange(numbers[0] + (phase - numbers[0]) % period, numbers[-1] + 1, period)
        at = np.searchsorted(numbers, slots)
        hits = np.abs(numbers[np.clip(at, 0, len(numbers) - 1)] - slots) <= slack
        hits |= np.abs(numbers[np.clip(at - 1, 0, len(numbers) - 1)] - slots) <= slack
        if hits.sum() - 1 >= min_repeats and hits.mean() >= coverage and hits.sum() > best_hits:
            best, best_hits = (int(period), phase), int(hits.sum())
    return best
