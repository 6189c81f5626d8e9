"""The TCPD benchmark protocol (van den Burg & Williams 2020, "An Evaluation of Change Point
Detection Algorithms"; TCPDBench), replicated so that Prism's detectors are scored the same way.

Protocol: every dimension of a series is z-scored with its sample standard deviation (missing
values ignored, as R's ``scale`` does); predicted change points are deduplicated and kept in
``1 .. n_obs - 2``; index 0 joins every annotator's set and the prediction. F1 uses a margin of
5 points, precision against the union of all annotations and recall averaged over annotators;
cover is the segmentation covering metric averaged over annotators. ``f_measure`` and
``covering`` give the same numbers as TCPDBench's ``metrics.py`` (its doctest values are in
``tests/test_tcpd.py``).

Layout of the data directory: ``datasets/<name>/<name>.json`` (``series[].raw`` with ``null`` for
missing values, ``n_obs``, ``n_dim``) and ``annotations.json`` (name -> annotator -> indices).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MARGIN = 5


@dataclass(frozen=True)
class TcpdSeries:
    name: str
    values: np.ndarray
    """(n_obs, n_dim) float64, NaN where the dataset has no value."""
    annotations: dict[str, list[int]]
    """Annotator id -> 0-based change point indices."""

    @property
    def n_obs(self) -> int:
        return self.values.shape[0]

    @property
    def n_dim(self) -> int:
        return self.values.shape[1]


@dataclass(frozen=True)
class SeriesScore:
    name: str
    n_obs: int
    n_dim: int
    f1: float
    precision: float
    recall: float
    cover: float
    changepoints: list[int]


def load_series(root: str | Path, name: str) -> TcpdSeries:
    """One series of the TCPD directory ``root`` with its annotations."""
    root = Path(root)
    dataset = json.loads((root / "datasets" / name / f"{name}.json").read_text())
    annotations = json.loads((root / "annotations.json").read_text())[name]
    columns = [[np.nan if v is None else v for v in series["raw"]] for series in dataset["series"]]
    values = np.array(columns, dtype=np.float64).T.reshape(dataset["n_obs"], dataset["n_dim"])
    return TcpdSeries(name, values, {k: list(v) for k, v in annotations.items()})


def load_all(root: str | Path) -> list[TcpdSeries]:
    """Every series under ``root/datasets``, sorted by name."""
    names = sorted(p.name for p in (Path(root) / "datasets").iterdir() if p.is_dir())
    return [load_series(root, name) for name in names]


def zscore(values: np.ndarray) -> np.ndarray:
    """Per-column z-score with the sample standard deviation, ignoring NaN."""
    return (values - np.nanmean(values, axis=0)) / np.nanstd(values, axis=0, ddof=1)


def clean_predictions(locations: Iterable[int], n_obs: int) -> np.ndarray:
    """Sorted unique predicted change points in ``1 .. n_obs - 2`` (the ends are meaningless)."""
    unique = np.unique(np.asarray(list(locations), dtype=np.int64))
    return unique[(unique >= 1) & (unique <= n_obs - 2)]


def f_measure(
    annotations: Mapping[str, Iterable[int]], predictions: Iterable[int], margin: int = MARGIN
) -> tuple[float, float, float]:
    """(F1, precision, recall) of ``predictions`` against the annotators' change points."""
    annotator_sets = []
    for locations in annotations.values():
        points = set(int(v) for v in locations)
        points.add(0)
        annotator_sets.append(points)
    predicted = set(int(v) for v in predictions)
    predicted.add(0)
    union = set()
    for points in annotator_sets:
        for tau in points:  # one by one, as TCPDBench builds it: the set's order matters below
            union.add(tau)

    precision = len(_true_positives(union, predicted, margin)) / len(predicted)
    recall = float(
        np.mean([len(_true_positives(points, predicted, margin)) / len(points) for points in annotator_sets])
    )
    return 2 * precision * recall / (precision + recall), precision, recall


def _true_positives(truth: set[int], predicted: set[int], margin: int) -> set[int]:
    """True change points matched to a distinct prediction within ``margin`` (closest, then smallest).

    Greedy in the iteration order of ``truth``, a Python set as in TCPDBench: the order can change
    the count, so it is kept rather than sorted.
    """
    unmatched = set(predicted)
    matched = set()
    for tau in truth:
        candidates = [(abs(tau - x), x) for x in unmatched if abs(tau - x) <= margin]
        if candidates:
            unmatched.remove(min(candidates)[1])
            matched.add(tau)
    return matched


def covering(annotations: Mapping[str, Iterable[int]], predictions: Iterable[int], n_obs: int) -> float:
    """Segmentation covering of each annotator's segmentation by the predicted one, averaged.

    Segment starts outside ``1 .. n_obs - 1`` are ignored; 0 always starts a segment.
    """
    predicted = _segment_bounds(predictions, n_obs)
    covers = [_cover(predicted, _segment_bounds(loc, n_obs), n_obs) for loc in annotations.values()]
    return float(np.mean(covers))


def _segment_bounds(locations: Iterable[int], n_obs: int) -> np.ndarray:
    """Boundaries 0 = b_0 < ... < b_k = n_obs of the segments that start at ``locations``."""
    starts = np.asarray(list(locations), dtype=np.int64)
    inside = starts[(starts > 0) & (starts < n_obs)]
    return np.unique(np.concatenate(([0, n_obs], inside)))


def _cover(predicted_bounds: np.ndarray, true_bounds: np.ndarray, n_obs: int) -> float:
    """sum over true segments |R| * max_R' Jaccard(R, R') / n_obs (Arbelaez et al. 2010, eq. 8)."""
    true_lo, true_hi = true_bounds[:-1, None], true_bounds[1:, None]
    pred_lo, pred_hi = predicted_bounds[None, :-1], predicted_bounds[None, 1:]
    intersection = np.clip(np.minimum(true_hi, pred_hi) - np.maximum(true_lo, pred_lo), 0, None)
    union = (true_hi - true_lo) + (pred_hi - pred_lo) - intersection
    jaccard = intersection / union
    return float(((true_hi - true_lo)[:, 0] * jaccard.max(axis=1)).sum() / n_obs)


def evaluate(
    series: Iterable[TcpdSeries], detect: Callable[[np.ndarray], Iterable[int]]
) -> list[SeriesScore]:
    """Score ``detect`` (z-scored (n_obs, n_dim) values -> change point indices) on each series."""
    scores = []
    for s in series:
        changepoints = clean_predictions(detect(zscore(s.values)), s.n_obs)
        f1, precision, recall = f_measure(s.annotations, changepoints)
        cover = covering(s.annotations, changepoints, s.n_obs)
        scores.append(
            SeriesScore(s.name, s.n_obs, s.n_dim, f1, precision, recall, cover, changepoints.tolist())
        )
    return scores


def summarize(scores: Iterable[SeriesScore]) -> dict:
    """JSON-ready scores: mean F1 and cover of the univariate and multivariate series, and each series."""
    scores = list(scores)
    groups = {
        "univariate": [s for s in scores if s.n_dim == 1],
        "multivariate": [s for s in scores if s.n_dim > 1],
    }
    summary: dict = {
        kind: {
            "count": len(group),
            "mean_f1": float(np.mean([s.f1 for s in group])) if group else None,
            "mean_cover": float(np.mean([s.cover for s in group])) if group else None,
        }
        for kind, group in groups.items()
    }
    summary["series"] = {s.name: {k: v for k, v in vars(s).items() if k != "name"} for s in scores}
    return summary
