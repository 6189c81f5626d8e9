"""What step division hands from one hour to the next for one job."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TimelineState:
    """One job's timeline state: `load` reads what `dump` wrote the hour before (JSON-serializable)."""

    next_step: int = 0
    attempt: int = 0
    pending_restarts_ns: list[int] = field(default_factory=list)  # not yet behind an emitted step
    last_end_ns: int | None = None  # end of the last emitted step; None until a boundary is seen
    last_close_ns: int | None = None  # end of the sync phase that closed it
    checkpoint_steps: list[int] = field(default_factory=list)  # the last three saving, this attempt
    baseline: dict = field(default_factory=dict)  # the job's usual timings (Typical.as_baseline)
    carry: dict | None = None  # flows after the last emitted boundary (Traffic.carry)

    @classmethod
    def load(cls, previous: dict | None) -> TimelineState:
        state = cls(**(previous or {}))
        state.baseline = dict(state.baseline or {})
        return state

    def dump(self) -> dict:
        return {"next_step": self.next_step, "attempt": self.attempt, "pending_restarts_ns": self.pending_restarts_ns,
                "last_end_ns": self.last_end_ns, "last_close_ns": self.last_close_ns,
                "checkpoint_steps": self.checkpoint_steps, "baseline": self.baseline, "carry": self.carry}
