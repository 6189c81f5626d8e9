"""One scored figure: its value and, where an issue sets one, the target it must reach."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    value: float | int | None  # None: nothing to score (no such fault in the scenario)
    target: float | None = None
    at_most: bool = False  # the target is an upper bound (errors) rather than a lower one
    count: int | None = None  # a share's numerator and denominator: scenarios pool by adding them
    of: int | None = None

    @classmethod
    def share(cls, count: int, of: int, target: float | None = None, empty: float | None = 1.0,
              at_most: bool = False) -> Figure:
        """count / of; `empty` when there is nothing to score (1.0: no misses possible)."""
        return cls(ratio(count, of, empty), target, at_most, count=int(count), of=int(of))

    @property
    def ok(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return bool(self.value <= self.target if self.at_most else self.value >= self.target)

    def as_dict(self) -> dict:
        shares = {"count": self.count, "of": self.of} if self.count is not None else {}
        return {"value": self.value, "target": self.target, "ok": self.ok, **shares, **_bound(self.at_most)}


def ratio(numerator: float, denominator: float, empty: float | None) -> float | None:
    """numerator / denominator; `empty` when there is nothing to score (denominator 0)."""
    return float(numerator / denominator) if denominator else empty


def pool(scored: list[dict[str, dict[str, dict]]]) -> dict[str, dict[str, dict]]:
    """Figures of several scenarios ({stage: {metric: as_dict}} each) as one: shares add their
    counts; other figures give their range (and counts their total) and are ok when every
    scenario's is."""
    pooled: dict[str, dict[str, dict]] = {}
    for stage in scored[0]:
        for metric, first in scored[0][stage].items():
            each = [s[stage][metric] for s in scored]
            oks = [f["ok"] for f in each if f["ok"] is not None]
            at_most = first.get("at_most", False)
            if all("count" in f for f in each):
                count, of = sum(f["count"] for f in each), sum(f["of"] for f in each)
                figure = Figure.share(count, of, first["target"], empty=None, at_most=at_most).as_dict()
            else:
                values = [f["value"] for f in each if f["value"] is not None]
                figure = {"min": min(values, default=None), "max": max(values, default=None),
                          "target": first["target"], "ok": all(oks) if oks else None, **_bound(at_most)}
                if first["target"] is None and all(isinstance(v, int) for v in values):
                    figure["total"] = sum(values)  # a count: steps, faults, jobs
            pooled.setdefault(stage, {})[metric] = figure
    return pooled


def _bound(at_most: bool) -> dict:
    """The mark of an upper-bound target, which pooling needs to judge a pooled share again."""
    return {"at_most": True} if at_most else {}
