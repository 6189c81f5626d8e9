"""Exporters' clocks brought onto one time per job (prism_core.clocks)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import group_median
from prism_core.clocks import DEFAULT_PARAMS, learn

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
MS = 1_000_000
SECOND = 1_000_000_000
RAILS = 4
KEPT = DEFAULT_PARAMS.kept_skew_ns  # clocks are brought this close to the common time, no closer


def job_gpus(hosts: int = 2, stage_of_rail=lambda rail: 0) -> pa.Table:
    return pa.table({"addr": [f"10.0.{rail}.{host}" for host in range(hosts) for rail in range(RAILS)],
                     "host": [f"host-{host}" for host in range(hosts) for _ in range(RAILS)],
                     "pp_stage": pa.array([stage_of_rail(rail) for _ in range(hosts) for rail in range(RAILS)], pa.int32())})


def aligned(flows: pa.Table, gpus: pa.Table) -> pa.Table:
    return learn(flows, gpus).apply(flows)


def rail_traffic(ahead_ns, minutes: int = 10, seed: int = 0) -> pa.Table:
    """A two-host job on RAILS rails, each rail's records exported by its own leaf: every 0.9-1.1 s
    the job's collective runs on every rail at once (launch jitter 0.2 ms) as a burst of four
    20 ms sends each way. `ahead_ns(rail, t)`: how far leaf `rail`'s clock runs ahead at true t
    (ns since the start). In start order, with each record's true start (`true_start`)."""
    rng = np.random.default_rng(seed)
    collectives = T0 + np.cumsum(rng.uniform(0.9, 1.1, minutes * 60) * SECOND).astype(np.int64)
    collectives = collectives[collectives < T0 + minutes * 60 * SECOND]
    parts = []
    for rail in range(RAILS):
        for send in range(4):
            for src, dst in ((0, 1), (1, 0)):
                true = collectives + send * 25 * MS + rng.normal(0, 0.2 * MS, len(collectives)).astype(np.int64)
                stamped = true + np.asarray(ahead_ns(rail, true - T0), np.int64)
                parts.append(pa.table({
                    "time_flow_start_ns": stamped, "time_flow_end_ns": stamped + 20 * MS,
                    "src_addr": [f"10.0.{rail}.{src}"] * len(true), "dst_addr": [f"10.0.{rail}.{dst}"] * len(true),
                    "sampler_address": [f"172.31.0.{rail + 1}"] * len(true), "true_start": true,
                }))
    table = pa.concat_tables(parts)
    return table.take(pa.array(np.argsort(table["time_flow_start_ns"].to_numpy(), kind="stable")))


def clock_error(flows: pa.Table, rail: int | None = None) -> np.ndarray:
    """Per record (of one rail's leaf, or all), its stamped start less its true start."""
    if rail is not None:
        flows = flows.filter(pc.equal(flows["sampler_address"], f"172.31.0.{rail + 1}"))
    return flows["time_flow_start_ns"].to_numpy() - flows["true_start"].to_numpy()


def test_drifting_leaves_are_brought_onto_one_clock():
    # offsets of up to 40 ms and drifts of -30..+25 ppm: leaves 60+ ms apart within ten minutes
    offset = [0, 30 * MS, -40 * MS, 5 * MS]
    drift_ppm = [0.0, 25.0, -30.0, 10.0]
    flows = rail_traffic(lambda rail, t: offset[rail] + drift_ppm[rail] * 1e-6 * t)
    assert np.ptp(clock_error(flows)) > 60 * MS
    moved = aligned(flows, job_gpus())
    start = moved["time_flow_start_ns"].to_numpy()
    assert np.all(start[1:] >= start[:-1])
    # at any moment every leaf's records read one time within the kept skew (and launch jitter and
    # the drift's interpolation between minutes): the leaves' median clock, drifting by their median drift
    error = clock_error(moved)
    moment = moved["true_start"].to_numpy() // SECOND
    assert np.abs(error - group_median(moment, error)).max() < 2 * KEPT + 1.5 * MS
    median_ahead = np.median([offset, np.add(offset, np.multiply(drift_ppm, 1e-6 * 600 * SECOND))], axis=1)
    assert median_ahead[0] - KEPT - 1 * MS <= np.median(error[moment == moment.min()])
    assert np.median(error[moment == moment.max()]) <= median_ahead[1] + KEPT + 1 * MS


def test_clocks_within_the_kept_skew_are_left_alone():
    flows = rail_traffic(lambda rail, t: [0, KEPT // 2, -KEPT // 2, KEPT // 4][rail])
    assert aligned(flows, job_gpus()) is flows


def test_exporters_on_other_links_and_lone_exporters_keep_their_clock():
    flows = rail_traffic(lambda rail, t: [0, 30 * MS, -40 * MS, 5 * MS][rail])
    # rail 3's leaf carries another host's links: not a peer of the others, its clock is kept
    on_rail_3 = pc.equal(flows["sampler_address"], "172.31.0.4")
    src = pc.if_else(pc.and_(on_rail_3, pc.equal(flows["src_addr"], "10.0.3.0")), "10.0.3.2", flows["src_addr"])
    flows = flows.set_column(flows.schema.get_field_index("src_addr"), "src_addr", src)
    moved = aligned(flows, job_gpus(hosts=3))
    assert np.array_equal(clock_error(moved, 3), clock_error(flows, 3))
    assert np.ptp([np.median(clock_error(moved, rail)) for rail in range(3)]) <= 2 * KEPT + 1 * MS
    alone = flows.filter(on_rail_3)
    assert aligned(alone, job_gpus(hosts=3)) is alone


def test_a_clock_whose_resumes_do_not_pair_is_kept():
    # a collective's spacing ahead: its resumes sit among the others' at random (no offset is told)
    flows = rail_traffic(lambda rail, t: SECOND if rail == 1 else 0)
    moved = aligned(flows, job_gpus())
    assert np.array_equal(clock_error(moved, 1), clock_error(flows, 1))
    assert all(np.abs(clock_error(moved, rail) - clock_error(flows, rail)).max() < 0.5 * MS for rail in (0, 2, 3))


def test_rails_that_carry_different_stages_keep_their_clocks():
    # a job on part of each host: rail 0 carries stage 0, rail 1 stage 1 between the same two
    # hosts; stage 1's collectives come 30 ms after stage 0's, which no clock explains
    flows = rail_traffic(lambda rail, t: 30 * MS if rail % 2 else 0)
    gpus = job_gpus(stage_of_rail=lambda rail: rail % 2)
    moved = aligned(flows, gpus)
    assert all(np.abs(clock_error(moved, rail) - clock_error(flows, rail)).max() < 0.5 * MS for rail in range(RAILS))
