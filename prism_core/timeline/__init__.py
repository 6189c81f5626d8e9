"""Training steps of one job, reconstructed from its network flows hour by hour.

A step runs from the start of its forward compute to the end of its optimizer update; the gradient
sync over the data-parallel pairs (or, without them, the pipeline sends) closes each. The sync
phases are found with BOCD over the gaps between heavy bursts, each boundary is placed from the
closing sync and the next step's start, and the state carries what the next hour needs.
docs/architecture.md ("Step division") explains the rules and how the modules split them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from prism_core.timeline.params import DEFAULT_PARAMS, TimelineParams
from prism_core.timeline.phases import sync_phases
from prism_core.timeline.state import TimelineState
from prism_core.timeline.traffic import Traffic
from prism_core.timeline.typical import last_step_timings, steps_to_learn, typical
from prism_core.timeline.walk import emit_steps, steps_table

__all__ = ["DEFAULT_PARAMS", "Timeline", "TimelineParams", "divide_steps"]


@dataclass
class Timeline:
    steps: pa.Table  # prism_core.schema.STEPS
    state: dict  # JSON-serializable; the `previous` of the next hour


def divide_steps(
    job_id: str,
    job_flows: pa.Table,
    comm_pairs: pa.Table,
    previous: dict | None,
    hour_start_ns: int,
    hour_end_ns: int,
    restarts_ns: Sequence[int] = (),
    job_gpus: pa.Table | None = None,
    params: TimelineParams = DEFAULT_PARAMS,
    paused_ns: Sequence[int] = (),
) -> Timeline:
    """Steps of `job_id` decided by this hour's flows: the job's flows of the hour (sent by its
    members), its directed pairs labelled dp / pp / other, the state the previous hour returned
    (None for a job new to Prism), the job tracker's restart instants (the job's first traffic
    after each downtime; the attempt increments at each) and, where known, the host of each of
    its addresses (`job_gpus`: addr, host). `paused_ns`: those of the restart instants that were
    pauses (the job resumed on its connections, `prism_core.queue_pairs`): the step division reads
    them as it reads restarts, but the attempt stays. Flows carried from the previous hour start before
    `hour_start_ns`; only flows older than `params.max_carry_ns` before `hour_end_ns` are dropped
    from the carry."""
    state = TimelineState.load(previous)
    state.paused_restarts += len(paused_ns)
    traffic = Traffic.build(job_flows, comm_pairs, state.carry, job_gpus)
    seen_until = state.last_close_ns if state.last_close_ns is not None else -(1 << 62)
    restarts = np.unique(np.array([*state.pending_restarts_ns, *(r for r in restarts_ns if r > seen_until)], np.int64))
    paused = np.unique(np.array([*state.pending_paused_ns, *(r for r in paused_ns if r > seen_until)], np.int64))
    learn_from = steps_to_learn(traffic, hour_end_ns, params)
    phases = sync_phases(traffic, hour_end_ns, state.baseline.get("gap_threshold_ns"), learn_from, params)
    usual = typical(phases, traffic, state.baseline, learn_from, params)
    if learn_from == params.steps_to_learn_whole and not usual.known:
        # a job seen whole with too few steps to learn its timings will show no more: its last step stands in
        usual = typical(phases, traffic, {**state.baseline, **last_step_timings(phases, traffic, params)}, learn_from,
                        params)
    rows = emit_steps(phases, usual, traffic, state, restarts, paused, hour_start_ns, hour_end_ns, params)

    first_step = state.next_step
    state.next_step += len(rows)
    state.attempt = rows[-1]["attempt"] if rows else state.attempt
    # restarts no emitted step is behind yet count for the next hour (within the carry's reach)
    behind = state.last_close_ns if state.last_close_ns is not None else -(1 << 62)
    pending_from = max(behind, hour_end_ns - params.max_carry_ns)
    state.pending_restarts_ns = [int(r) for r in restarts if r > pending_from]
    state.pending_paused_ns = [int(r) for r in paused if r > pending_from]
    state.baseline = usual.as_baseline(phases.gap_threshold_ns)
    carry_from = max(state.last_end_ns if state.last_end_ns is not None else -(1 << 62),
                     hour_end_ns - params.max_carry_ns)
    state.carry = traffic.carry(carry_from)
    return Timeline(steps_table(job_id, rows, first_step), state.dump())
