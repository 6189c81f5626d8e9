"""What step division hands from one hour to the next for one job: a typed, versioned state."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# the layout of the dumped state: a field added with a default reads a state written before it as
# the default (an empty memory); any other change takes the next number
STATE_VERSION = 1


@dataclass
class TimelineState:
    """One job's timeline state: `load` reads what `dump` wrote the hour before (JSON-serializable)."""

    next_step: int = 0
    attempt: int = 0
    pending_restarts_ns: list[int] = field(default_factory=list)  # not yet behind an emitted step
    pending_paused_ns: list[int] = field(default_factory=list)  # those of them that were pauses
    last_end_ns: int | None = None  # end of the last emitted step; None until a boundary is seen
    last_close_ns: int | None = None  # end of the sync phase that closed it
    checkpoint_steps: list[int] = field(default_factory=list)  # the last three saving, this attempt
    quiet_gaps: list[int] = field(default_factory=list)  # steps a long quiet gap followed, lately (walk.py)
    baseline: dict = field(default_factory=dict)  # the job's usual timings (Typical.as_baseline)
    carry: dict | None = None  # flows after the last emitted boundary (Traffic.carry)
    paused_restarts: int = 0  # restarts recognition reported that were pauses (not attempts), so far

    @classmethod
    def load(cls, previous: dict | None) -> TimelineState:
        """The state `dump` wrote (None: a job new to Prism); a state of another layout is refused.
        A state without a version is version 1 as written before states carried their version (the
        same fields), so a warehouse written then continues."""
        if not previous:
            return cls()
        if previous.get("version", STATE_VERSION) != STATE_VERSION:
            raise ValueError(f"timeline state version {previous.get('version')!r}, expected {STATE_VERSION}")
        return cls(**{name: value for name, value in previous.items() if name != "version"})

    def dump(self) -> dict:
        return {"version": STATE_VERSION, **asdict(self)}
