"""Job recognition per minute and job tracking across minutes, hours and restarts.

Per minute, the GPU NICs that exchange repeated traffic form components, merged into jobs by the
hosts they share when their traffic keeps in step (`observe`, `merge`): a job's members are NICs,
and jobs on different GPUs of the same hosts stay apart. Tracking links each minute's jobs to the
jobs already known and keeps their ids across stops, restarts and NICs changing hands (`track`,
`decisions`). Every
threshold is in `params`; the state handed to the next hour is `state`. The reasoning is in
docs/architecture.md, "Job recognition".
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from prism_core.minutes import HOUR_NS
from prism_core.recognition.observe import (
    minute_of_rows,
    observe,
    rows_by_minute,
    saves,
)
from prism_core.recognition.params import DEFAULT_PARAMS, RecognitionParams
from prism_core.recognition.state import STATE_VERSION, RecognitionState
from prism_core.recognition.tables import (
    EVENTS,
    MEMBERSHIP,
    Recognition,
    events_table,
    jobs_table,
    membership_table,
)
from prism_core.recognition.track import Track, Tracker
from prism_core.recognition.vocabulary import NicVocabulary
from prism_core.topology import Topology

__all__ = [
    "DEFAULT_PARAMS",
    "EVENTS",
    "MEMBERSHIP",
    "STATE_VERSION",
    "Recognition",
    "RecognitionParams",
    "RecognitionState",
    "recognize_hour",
    "recognize_minute",
]


def recognize_minute(
    minute_pairs: pa.Table, topology: Topology, *, params: RecognitionParams = DEFAULT_PARAMS
) -> list[np.ndarray]:
    """The jobs communicating in one minute's `flow_minutes` rows: for each, the sorted addresses
    of its NICs."""
    vocabulary = NicVocabulary(topology)
    observations = observe(minute_pairs, vocabulary, minute_of_rows(minute_pairs), params)
    return [np.array(vocabulary.addr_list(observations.nics(k))) for k in range(len(observations.minute_ns))]


def recognize_hour(
    flow_minutes: pa.Table,
    topology: Topology,
    previous_state: dict | None,
    hour_start_ns: int,
    *,
    params: RecognitionParams = DEFAULT_PARAMS,
) -> Recognition:
    """Jobs of one hour from its `flow_minutes`, continuing the jobs of `previous_state` (the
    previous hour's `Recognition.state`)."""
    vocabulary = NicVocabulary(topology)
    tracks = [Track.from_state(carried, vocabulary) for carried in RecognitionState.load(previous_state).tracks]
    observations = observe(flow_minutes, vocabulary, minute_of_rows(flow_minutes), params)
    tracker = Tracker(tracks, vocabulary, saves(flow_minutes, vocabulary), params)
    for minute_rows in rows_by_minute(observations.minute_ns):
        tracker.observe_minute(observations, minute_rows)
    hour_end_ns = hour_start_ns + HOUR_NS
    reported = tracker.end_hour(observations, hour_end_ns)
    return Recognition(
        jobs=jobs_table(reported, vocabulary),
        membership=membership_table(tracker.presence, [track.job_id for track in tracker.tracks], vocabulary),
        events=events_table(tracker.events),
        state=tracker.carried(hour_end_ns).dump(),
    )
