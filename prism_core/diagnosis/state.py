"""The diagnosis state one hour hands to the next hour of the same job: a part per detector.

`DiagnosisState.dump()` gives the JSON-serializable dict the warehouse stores (one flat dict, a key
per field of the parts) and `DiagnosisState.load()` reads it back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

# The layout `dump` writes and `load` reads. Layout 1, the first, carries no `version` key (the
# states written before layouts were numbered are layout 1); a later layout writes its number
# under `version`, and `load` refuses a layout it does not know.
STATE_VERSION = 1


@dataclass(frozen=True)
class Progress:
    """How far the job got (restarts)."""

    steps_seen: int = 0
    last_attempt: int = 0
    last_step_end_ns: int | None = None
    first_step_ns: int | None = None  # work since here is lost when no checkpoint is known
    n_gpus: int = 0  # the job's GPUs in its last step


@dataclass(frozen=True)
class CheckpointState:
    """The job's checkpoints so far."""

    last_checkpoint_ns: int | None = None
    checkpoint_rhythm: tuple[int, int] | None = None  # (period, phase) in step numbers
    checkpoint_save_s: tuple[float, ...] = ()  # the last checkpoints' time over a step
    checkpoint_bytes: int = 0  # what the last checkpoint seen wrote to storage ...
    checkpoint_writers: int = 0  # ... from this many GPUs


@dataclass(frozen=True)
class OpenDegradation:
    issue_id: str | None  # None until reported
    start_ns: int
    baseline_s: float  # the level before it


@dataclass(frozen=True)
class LevelState:
    """The job's normal step time (baseline and degradation)."""

    recent_s: tuple[float, ...] = ()  # the last clean step durations
    level_s: float | None = None  # the job's normal step time (before any open degradation)
    open_degradation: OpenDegradation | None = None
    step_bytes: float | None = None  # the bytes between members a whole step usually carries


@dataclass(frozen=True)
class OpenWindow:
    """A straggler or slow-link window still open at the hour's end."""

    name: str  # its subject
    start_ns: int
    baseline_s: float
    sync_baseline_s: float | None  # the usual DP synchronization, when that is what it slows


@dataclass(frozen=True)
class OpenHang:
    issue_id: str
    subject: str
    start_ns: int
    hosts: tuple[str, ...]
    n_gpus: int
    confidence: float


@dataclass(frozen=True)
class Resumed:
    """A restart reported from its checkpoint load, before its resumed steps were seen."""

    start_ns: int
    charged_until_ns: int  # its waste was charged up to here


@dataclass(frozen=True)
class Stop:
    """How the job's traffic last stopped (hangs.describe_stop)."""

    at_ns: int  # when the first GPUs went silent
    checkpoint_ns: int | None  # end of the last checkpoint completed before
    last_active_ns: int  # the job's last traffic or write to storage
    confirm_s: float  # silence that confirms a hang
    mid_step: bool  # stopped in the middle of a step (else: a normal end)
    staggered: bool  # some GPUs fell silent while the others went on
    stagger_s: float
    silent_first: tuple[str, ...]  # the addresses that went silent first
    hosts: tuple[str, ...]
    n_gpus: int
    decided: bool  # whether it was a hang is settled
    hang: bool = False  # reported as a hang
    resumed: Resumed | None = None

    @classmethod
    def load(cls, stop: dict) -> Stop:
        return _part(cls, {**stop, "resumed": _part(Resumed, stop.get("resumed"))})

    def dump(self) -> dict:
        """A stop not reported as a hang, or not seen resuming, has no `hang` or `resumed` key."""
        stop = _plain(self)
        if not self.hang:
            del stop["hang"]
        if self.resumed is None:
            del stop["resumed"]
        return stop


@dataclass(frozen=True)
class HangState:
    open_hang: OpenHang | None = None
    stop: Stop | None = None  # a restart in a later hour failed when this stop happened


@dataclass(frozen=True)
class DiagnosisState:
    progress: Progress = field(default_factory=Progress)
    checkpoints: CheckpointState = field(default_factory=CheckpointState)
    level: LevelState = field(default_factory=LevelState)
    open_windows: dict[str, OpenWindow] = field(default_factory=dict)  # kind -> its open window
    hangs: HangState = field(default_factory=HangState)

    @property
    def open_issue(self) -> bool:
        """Whether an issue continues without traffic: an open hang, or a stop not yet decided."""
        return bool(self.hangs.open_hang or (self.hangs.stop and not self.hangs.stop.decided))

    @classmethod
    def load(cls, previous: dict | None) -> DiagnosisState:
        if not previous:
            return cls()
        version = previous.get("version", 1)
        if version != STATE_VERSION:
            raise ValueError(f"diagnosis state of layout {version}; this code reads layout {STATE_VERSION}")

        degradation, hang, stop = previous["open_degradation"], previous["open_hang"], previous["stop"]
        return cls(
            progress=_part(Progress, previous),
            checkpoints=_part(CheckpointState, previous),
            level=_part(LevelState, {**previous, "open_degradation": _part(OpenDegradation, degradation)}),
            open_windows={kind: _part(OpenWindow, window) for kind, window in previous["open_windows"].items()},
            hangs=HangState(open_hang=_part(OpenHang, hang), stop=Stop.load(stop) if stop else None),
        )

    def dump(self) -> dict:
        """One flat dict of every part's fields (layout STATE_VERSION)."""
        return {
            **_plain(self.progress),
            **_plain(self.checkpoints),
            **_plain(self.level),
            "open_windows": {kind: _plain(window) for kind, window in self.open_windows.items()},
            "open_hang": _plain(self.hangs.open_hang),
            "stop": self.hangs.stop.dump() if self.hangs.stop else None,
        }


def _part(kind: type, values: dict | None):
    """The part `kind` from its fields in `values` (lists as tuples; an absent optional field takes
    its default); None for no values."""
    if values is None:
        return None
    return kind(**{f.name: _frozen(values[f.name]) for f in fields(kind) if f.name in values})


def _frozen(value):
    """A list as a tuple: parts are immutable."""
    return tuple(value) if isinstance(value, list) else value


def _plain(part) -> dict | None:
    """A part as a JSON-serializable dict (tuples as lists)."""
    if part is None:
        return None
    return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(part).items()}
