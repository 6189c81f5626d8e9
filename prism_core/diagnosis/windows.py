"""Windows: what straggler and slow-link detection share.

Both name a culprit per step (stragglers.py, slow_links.py). A culprit that recurs in enough nearby
steps has a window: its steps from the first to the last, which is measured against the job's
usual pace, and which continues an open window of the previous hour with the same subject.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism_core import waste

from .baseline import Baseline
from .issues import Issue, confidence
from .job_hour import JobHour, StepMasks
from .params import DiagnosisParams
from .state import OpenWindow


@dataclass(frozen=True, eq=False)
class Window:
    code: int  # the culprit: a host (stragglers), an address or a link (slow links)
    run: np.ndarray  # the steps it was the culprit of
    scores: np.ndarray  # how late or slow it was in each
    contested: bool = False  # another culprit's window shares steps with it, or its culprit is not told

    @property
    def steps(self) -> np.ndarray:
        """Every step from its first to its last."""
        return np.arange(self.run[0], self.run[-1] + 1)


def find_windows(job: JobHour, culprit: np.ndarray, score: np.ndarray, carried: int,
                 params: DiagnosisParams) -> list[Window]:
    """A window for each run of steps sharing a culprit, with at most `window_max_gap` other steps
    between two of its steps. A run that continues the open window of the previous hour (whose
    culprit is `carried`, -1 for none) counts from the hour's first step."""
    # a step with part of its flows in another hour shows no culprit: it takes its
    # predecessor's (for the hour's first steps, the open window's of the previous hour)
    culprit = culprit.copy()
    for i in np.flatnonzero(job.split):
        culprit[i] = culprit[i - 1] if i else carried
    found = []
    for code in np.unique(culprit[culprit >= 0]):
        at = np.flatnonzero(culprit == code)
        runs = []
        for run in np.split(at, np.flatnonzero(np.diff(at) > params.window_max_gap + 1) + 1):
            continues = code == carried and run[0] <= params.window_max_gap
            if continues:
                run = np.r_[0, run] if run[0] else run
            if len(run) >= params.window_min_steps or continues:
                runs.append(run)
        for run in _rejoined(runs, culprit, params.window_rejoin_share):
            found.append(Window(int(code), run, score[run]))
    return found


def _rejoined(runs: list[np.ndarray], culprit: np.ndarray, share: float) -> list[np.ndarray]:
    """One culprit's windows (runs of steps, in order), each joined to the one before it when the
    steps between them name no other culprit and are at most `share` of the longer one's span:
    one episode that broke off. Hosts that take turns being the latest (a slow job, not a slow
    host) keep their windows apart."""
    joined = runs[:1]
    for run in runs[1:]:
        before = joined[-1]
        longer = max(before[-1] - before[0], run[-1] - run[0]) + 1
        between = culprit[before[-1] + 1:run[0]]
        if len(between) <= share * longer and np.all((between < 0) | (between == culprit[run[0]])):
            joined[-1] = np.r_[before, run]
        else:
            joined.append(run)
    return joined


def span_mask(windows: list[Window], n_steps: int) -> np.ndarray:
    """Per step: inside one of the windows."""
    inside = np.zeros(n_steps, bool)
    for window in windows:
        inside[window.run[0]:window.run[-1] + 1] = True
    return inside


@dataclass(frozen=True, eq=False)
class Span:
    """A window measured against the job's pace."""

    continued: bool  # continues the open window of the previous hour
    start_ns: int
    measured: np.ndarray  # the steps that show its pace
    baseline: np.ndarray | float  # the pace without it: the level of each measured step, or the carried one
    base: float  # their mean
    n_gpus: int


def measure(job: JobHour, window: Window, name: str, previous: OpenWindow | None, masks: StepMasks,
            slow: np.ndarray, fit: Baseline) -> Span:
    """The steps of `window` (subject `name`) that show its pace, and the pace without it. A
    window of many steps is measured against its segment's level, not against the few clean steps
    at its edges."""
    continued = previous is not None and name == previous.name and window.run[0] == 0
    steps = window.steps
    measured = steps[~(masks.checkpoint[steps] | masks.warmup[steps] | slow[steps])]
    # a stall, or two steps the timeline could not split, is not the window's pace
    pace = np.median(job.duration[measured]) if len(measured) else np.inf
    measured = measured[job.duration[measured] <= fit.limit * pace]
    baseline = previous.baseline_s if continued else fit.level[measured]
    return Span(
        continued=continued,
        start_ns=previous.start_ns if continued else job.ns(job.step_start[window.run[0]]),
        measured=measured,
        baseline=baseline,
        base=float(np.mean(baseline)) if np.size(baseline) else np.nan,
        n_gpus=job.gpus_active(job.step_start[window.run[0]], job.step_end[window.run[-1]]),
    )


def excess(window: Window, span: Span, paced: np.ndarray, measured: np.ndarray,
           usual: np.ndarray | float) -> tuple[float, float]:
    """GPU-seconds lost over the window, and the excess as a share of the window's baseline, from
    a per-step time (`paced`) over its `usual` value in the `measured` steps."""
    cost = waste.window_excess_gpu_s(paced[measured], usual, len(window.steps), span.n_gpus)
    share = float(np.mean(paced[measured] - usual)) / span.base if len(measured) else 0.0
    return cost, share


def window_issue(job: JobHour, kind: str, subject: str, window: Window, span: Span, *, share: float,
                 margin: float, cost: float, evidence: dict, params: DiagnosisParams) -> Issue:
    """The window's issue: its confidence grows with the `margin` over the detection threshold,
    weighed by the share of its steps that showed the culprit."""
    votes = len(window.run) / len(window.steps)
    return Issue.of(job.job_id, kind, subject, span.start_ns, job.ns(job.step_end[window.run[-1]]), share=share,
                    confidence=votes * confidence(margin), wasted_gpu_s=cost,
                    evidence={**evidence, "continued": span.continued}, params=params)


def still_open(job: JobHour, window: Window, params: DiagnosisParams) -> bool:
    """The window may go on next hour: its culprit showed within `window_max_gap` of the end."""
    return window.run[-1] >= job.n_steps - 1 - params.window_max_gap


def position(sorted_names: np.ndarray, name: str) -> int:
    """Index of `name` in `sorted_names` (-1 when absent)."""
    at = int(np.searchsorted(sorted_names, name))
    return at if at < len(sorted_names) and sorted_names[at] == name else -1
