"""An hour's analysis completes whatever its flows look like.

Hypothesis perturbs the tiny scenario's flows the way real exporters and collectors do (records
lost, per-packet header bytes, millisecond clocks, a second switch exporting the same flows a
little later, files or minutes that never arrived, a job seen only in part), the flows go through
the ingest's core functions (dedupe, per-minute aggregates), and `analyze_hour` must return every
table: a job whose analysis raises is an `analysis_error` issue, never a failed hour.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.run import load_topology
from prism_core.analysis import ANALYSIS_TABLES, HourAnalysis, analyze_hour
from prism_core.ingest import deduplicated_order, parse_flow_file
from prism_core.minutes import HOUR_NS, MINUTE_NS, minute_aggregates, minute_of
from prism_core.schema import ISSUE_KINDS, TABLES
from prism_core.topology import Topology

SECOND_SAMPLER = "192.0.2.250"  # a second switch on the path exports the same flows again


@dataclass(frozen=True)
class Perturbation:
    seed: int  # of every random choice below
    hour: int  # which of the scenario's hours is analyzed (the second continues from the first)
    loss: float  # share of records lost
    byte_noise: int  # each record gains up to this many bytes
    millisecond_clock: bool  # start and end truncated to the millisecond (NetFlow v9)
    copies: float  # share of records exported again by SECOND_SAMPLER ...
    copy_delay_ns: int  # ... this much later
    files_lost: frozenset[int]  # indices of flow files that never arrived
    minutes_lost: frozenset[int]  # minutes of the scenario with no flows at all
    half_seen_job: int | None  # index of a truth job whose members' flows are only half present


PERTURBATIONS = st.builds(
    Perturbation,
    seed=st.integers(0, 2**32 - 1),
    hour=st.integers(0, 1),
    loss=st.floats(0, 0.05),
    byte_noise=st.integers(0, 64),
    millisecond_clock=st.booleans(),
    copies=st.floats(0, 0.2),
    copy_delay_ns=st.integers(0, 50_000_000),
    files_lost=st.frozensets(st.integers(0, 15), max_size=4),
    minutes_lost=st.frozensets(st.integers(0, 11), max_size=4),
    half_seen_job=st.none() | st.integers(0, 3),
)


@dataclass
class Scenario:
    files: list[pa.Table]  # the clean rows of each flow file, as parsed
    flows: pa.Table  # of every file, deduplicated
    topology: Topology
    job_addrs: list[pa.Array]  # each truth job's addresses
    start_ns: int  # the scenario's first minute
    first_hour_ns: int
    first_hour_state: dict  # the unperturbed first hour's analysis state


@pytest.fixture(scope="module")
def tiny(scenario_dir) -> Scenario:
    directory = scenario_dir("tiny")
    files = [parse_flow_file(path.read_bytes(), str(path)).clean for path in sorted((directory / "flows").iterdir())]
    topology = load_topology(str(directory / "topology.csv"))
    truth = pq.read_table(directory / "truth" / "job_gpus.parquet")
    job_addrs = [truth.filter(pc.equal(truth["job_id"], job))["addr"].combine_chunks()
                 for job in pc.unique(truth["job_id"]).to_pylist()]
    flows = deduplicated(pa.concat_tables(files))
    start_ns = int(pc.min(flows["time_flow_start_ns"]).as_py()) // MINUTE_NS * MINUTE_NS
    first_hour_ns = start_ns // HOUR_NS * HOUR_NS
    first = analyze(flows, topology, None, first_hour_ns)
    return Scenario(files, flows, topology, job_addrs, start_ns, first_hour_ns, first.state)


def deduplicated(flows: pa.Table) -> pa.Table:
    return flows.take(deduplicated_order(flows))


def analyze(flows: pa.Table, topology: Topology, previous: dict | None, hour_ns: int) -> HourAnalysis:
    """The hour's analysis from the deduplicated flows of any hours, as the pipeline runs it."""
    start = flows["time_flow_start_ns"].to_numpy()
    hour_flows = flows.filter(pa.array((start >= hour_ns) & (start < hour_ns + HOUR_NS)))
    return analyze_hour(hour_flows, minute_aggregates(hour_flows), topology, previous, hour_ns)


def perturbed(scenario: Scenario, change: Perturbation) -> pa.Table:
    """The scenario's flows as a collector would have received them under `change`."""
    rng = np.random.default_rng(change.seed)
    flows = pa.concat_tables([f for i, f in enumerate(scenario.files) if i not in change.files_lost])
    start, end = flows["time_flow_start_ns"].to_numpy(), flows["time_flow_end_ns"].to_numpy()
    minute = (start - scenario.start_ns) // MINUTE_NS
    kept = (rng.random(flows.num_rows) >= change.loss) & ~np.isin(minute, list(change.minutes_lost))
    if change.half_seen_job is not None:
        members = pc.is_in(flows["src_addr"], value_set=scenario.job_addrs[change.half_seen_job]).to_numpy()
        kept &= ~members | (rng.random(flows.num_rows) < 0.5)
    if change.millisecond_clock:
        start, end = start // 1_000_000 * 1_000_000, end // 1_000_000 * 1_000_000
    flows = with_columns(flows, time_flow_start_ns=start, time_flow_end_ns=end,
                         bytes=flows["bytes"].to_numpy() + rng.integers(0, change.byte_noise + 1, flows.num_rows))
    flows = flows.filter(pa.array(kept))
    copied = flows.filter(pa.array(rng.random(flows.num_rows) < change.copies))
    delayed = {c: pc.add(copied[c], change.copy_delay_ns) for c in ("time_flow_start_ns", "time_flow_end_ns")}
    copied = with_columns(copied, sampler_address=pa.array([SECOND_SAMPLER] * copied.num_rows), **delayed)
    flows = pa.concat_tables([flows, copied])
    return deduplicated(with_columns(flows, minute=minute_of(flows["time_flow_start_ns"])))


def with_columns(table: pa.Table, **columns) -> pa.Table:
    """`table` with the named columns replaced by `columns` (numpy or Arrow), keeping its types."""
    for name, values in columns.items():
        index = table.schema.get_field_index(name)
        values = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
        table = table.set_column(index, table.schema.field(index), values.cast(table.schema.field(index).type))
    return table


@settings(max_examples=20, deadline=None, database=None)
@given(change=PERTURBATIONS)
def test_an_hour_is_analyzed_whatever_its_flows(tiny, change):
    hour_ns = tiny.first_hour_ns + change.hour * HOUR_NS
    previous = tiny.first_hour_state if change.hour else None
    analysis = analyze(perturbed(tiny, change), tiny.topology, previous, hour_ns)

    assert set(analysis.tables) == set(ANALYSIS_TABLES)
    for name, rows in analysis.tables.items():
        assert rows.schema == TABLES[name], name
    issues = analysis.tables["issues"]
    assert set(issues["kind"].to_pylist()) <= set(ISSUE_KINDS)
    # A job whose analysis raised has its analysis_error issue and no other row.
    failed = issues.filter(pc.equal(issues["kind"], "analysis_error"))
    for row in failed.to_pylist():
        assert row["subject"] == row["job_id"]
        assert json.loads(row["evidence"])["stage"] in ("input", "parallelism", "timeline", "diagnosis")
    failed_jobs = pa.array(failed["job_id"].to_pylist(), pa.string())
    for name in ANALYSIS_TABLES[1:-1]:
        assert not pc.any(pc.is_in(analysis.tables[name]["job_id"], value_set=failed_jobs)).as_py(), name
