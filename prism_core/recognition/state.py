"""What job recognition hands from one hour to the next: typed, versioned, JSON in and out."""

from __future__ import annotations

from dataclasses import asdict, dataclass

STATE_VERSION = 2  # 2: a job's members are NICs, no longer hosts


@dataclass(frozen=True)
class CarriedTrack:
    """A job the next hour may continue: running, or stopped recently on NICs no other job took."""

    job_id: str
    nics: tuple[str, ...]  # sorted addresses of its GPU NICs
    first_seen_ns: int
    last_end_ns: int  # its last traffic (or the end of its last checkpoint save)
    restarts: int
    status: str  # running | ended
    reported_end: bool  # an `end` event was already emitted for the current stop
    signature: tuple[tuple[int, int, int], ...]  # (flow size, flows, minutes seen), most flows first


@dataclass(frozen=True)
class RecognitionState:
    """The carried tracks, in creation order (a newer job's NICs win when they are loaded)."""

    tracks: tuple[CarriedTrack, ...] = ()

    @classmethod
    def load(cls, state: dict | None) -> RecognitionState:
        """The state `dump` wrote (after a JSON round trip); None or {} for a first hour. A state
        of another version is refused: its hour must be recomputed without it."""
        if not state:
            return cls()
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"job recognition state has version {version!r}, this Prism reads version {STATE_VERSION}: "
                "recompute from an hour whose previous state is empty"
            )
        return cls(tuple(
            CarriedTrack(**{**job, "nics": tuple(job["nics"]), "signature": tuple(map(tuple, job["signature"]))})
            for job in state["jobs"]
        ))

    def dump(self) -> dict:
        """JSON-serializable form, read back by `load`."""
        return {
            "version": STATE_VERSION,
            "jobs": [
                {**asdict(track), "nics": list(track.nics), "signature": [list(row) for row in track.signature]}
                for track in self.tracks
            ],
        }
