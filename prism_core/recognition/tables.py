"""What recognition returns for an hour: its jobs, membership and events tables, and the state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from prism_core.arrays import group_spans, unique_rows
from prism_core.recognition.vocabulary import NicVocabulary
from prism_core.schema import JOBS, TS, conform

if TYPE_CHECKING:  # the tracker, in track.py, closes an hour with these functions
    from prism_core.recognition.track import Track

MEMBERSHIP = pa.schema(
    [
        ("job_id", pa.string()),
        ("addr", pa.string()),
        ("host", pa.string()),
        ("gpu", pa.int32()),  # the first GPU the NIC serves
        ("gpus", pa.int32()),  # how many GPUs it serves
        ("first_ns", pa.int64()),
        ("last_ns", pa.int64()),
    ]
)

EVENTS = pa.schema(
    [
        ("job_id", pa.string()),
        ("kind", pa.string()),  # start | end | restart | host_replaced
        ("at_ns", pa.int64()),
        ("detail", pa.string()),  # JSON: hosts (start), gap_s (restart), removed/added hosts
    ]
)

# (job id, kind, at_ns, detail) of one EVENTS row
Event = tuple[str, str, int, str]
# (track index, first_ns, last_ns, NIC codes): a track's NICs and span in one minute
Presence = tuple[int, int, int, np.ndarray]


@dataclass
class Recognition:
    jobs: pa.Table  # JOBS columns (dp/pp/tp null: parallelism fills them)
    membership: pa.Table  # MEMBERSHIP: which addresses belonged to which job when, this hour
    events: pa.Table  # EVENTS: start | end | restart | host_replaced
    state: dict  # JSON-serializable (`RecognitionState.dump`), handed to the next hour


def jobs_table(tracks: list[Track], vocabulary: NicVocabulary) -> pa.Table:
    """One JOBS row per track, by job id: its GPUs are those its NICs serve."""
    if not tracks:
        return JOBS.empty_table()
    table = pa.Table.from_pylist([
        {
            "job_id": track.job_id,
            "first_seen": track.first_seen_ns,
            "last_seen": track.last_end_ns,
            "n_gpus": vocabulary.gpus(track.nics),
            "n_hosts": len(np.unique(vocabulary.hosts(track.nics))),
            "status": track.status,
            "restarts": track.restarts,
            "hosts": vocabulary.host_list(track.nics),
        }
        for track in tracks
    ])
    for name in ("first_seen", "last_seen"):
        table = table.set_column(table.column_names.index(name), name, table[name].cast(pa.int64()).cast(TS))
    return conform(table, JOBS).sort_by("job_id")


def membership_table(presence: list[Presence], job_ids: list[str], vocabulary: NicVocabulary) -> pa.Table:
    """MEMBERSHIP rows: every NIC a track was present on, with the first and last moment over its
    minutes there. `job_ids`: of every track index."""
    if not presence:
        return MEMBERSHIP.empty_table()
    track_of = np.concatenate([np.full(len(n), t) for t, _, _, n in presence])
    nics = np.concatenate([n for _, _, _, n in presence])
    first = np.concatenate([np.full(len(n), f) for _, f, _, n in presence])
    last = np.concatenate([np.full(len(n), l) for _, _, l, n in presence])
    keys, position = unique_rows(track_of, nics, return_inverse=True)
    first_ns, last_ns = group_spans(position, len(keys), first, last)
    per_nic = pa.table(
        {
            "job_id": pa.array([job_ids[t] for t in keys[:, 0].tolist()], pa.string()),
            "addr": pa.array(np.array(vocabulary.addrs, dtype=object)[keys[:, 1]], pa.string()),
            "first_ns": first_ns,
            "last_ns": last_ns,
        }
    )
    nics_table = vocabulary.nics(np.unique(keys[:, 1]))
    joined = per_nic.join(nics_table, "addr", join_type="inner")
    return conform(joined, MEMBERSHIP).sort_by([("job_id", "ascending"), ("host", "ascending"), ("gpu", "ascending")])


def events_table(events: list[Event]) -> pa.Table:
    if not events:
        return EVENTS.empty_table()
    job_id, kind, at_ns, detail = zip(*events)
    return pa.table({"job_id": job_id, "kind": kind, "at_ns": at_ns, "detail": detail}, schema=EVENTS)
