"""One scored figure: its value and, where an issue sets one, the target it must reach."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    value: float | int | None  # None: nothing to score (no such fault in the scenario)
    target: float | None = None
    at_most: bool = False  # the target is an upper bound (errors) rather than a lower one

    @property
    def ok(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return bool(self.value <= self.target if self.at_most else self.value >= self.target)

    def as_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "ok": self.ok}


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, 1.0 when there is nothing to score (no misses possible)."""
    return float(numerator / denominator) if denominator else 1.0
