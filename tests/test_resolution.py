"""What the flow records can resolve (prism_core.resolution), and the gate before the timeline."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from prism_core.analysis import analyze_hour, silent_resolution
from prism_core.minutes import HOUR_NS
from prism_core.resolution import (
    DEFAULT_PARAMS,
    EXPORTER_KINDS,
    ExporterProfile,
    exporter_profiles,
    issue_kinds_shown,
    job_resolution,
    rhythm_period_s,
    steps_keep_time,
    tally_exporters,
    _agreed_period,
)
from prism_core.schema import FLOWS
from prism_core.simulate import write_scenario
from prism_core.simulate.scenarios import SCENARIOS, ExportOptions, JobSpec
from test_recognition import scenario_flows

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z, an hour start
MS = 1_000_000
SECOND = 1_000_000_000


def records(start_ns, end_ns, exporter: str, src_port=None, rate: int = 1, src="10.0.0.1", dst="10.0.0.2",
            nbytes=None) -> pa.Table:
    """FLOWS rows of one queue pair (or one per `src_port`) reported by `exporter`, of 40,960
    bytes each unless `nbytes` says."""
    start_ns, end_ns = np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64)
    n = len(start_ns)
    columns = {
        "time_flow_start_ns": start_ns, "time_flow_end_ns": end_ns,
        "src_addr": [src] * n, "dst_addr": [dst] * n,
        "bytes": np.full(n, 40_960, np.int64) if nbytes is None else np.asarray(nbytes, np.int64),
        "packets": np.full(n, 10, np.int64),
        "src_port": np.full(n, 49152, np.int32) if src_port is None else np.asarray(src_port, np.int32),
        "dst_port": np.full(n, 4791, np.int32), "proto": np.full(n, 17, np.int16),
        "sampler_address": [exporter] * n, "time_received_ns": end_ns + 5 * MS,
        "sampling_rate": np.full(n, rate, np.int64),
        "minute": pa.array(start_ns // (60 * SECOND) * (60 * SECOND), pa.timestamp("ns", "UTC")),
    }
    return pa.table(columns, schema=FLOWS)


def transfers(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Collective chunks on one queue pair: bursts of 8 back-to-back 300-700 us transfers every
    2 s, with jitter."""
    bursts = T0 + np.arange(n // 8) * 2 * SECOND + rng.integers(0, 50 * MS, n // 8)
    length = rng.integers(300_000, 700_000, (n // 8, 8))
    starts = bursts[:, None] + np.cumsum(np.c_[np.zeros(n // 8, np.int64), length[:, :-1] + 2_000], axis=1)
    return starts.ravel(), (starts + length).ravel()


def profile_of(table: pa.Table) -> ExporterProfile:
    [profile] = exporter_profiles(tally_exporters(table))
    assert profile.kind in EXPORTER_KINDS
    return profile


def test_a_nanosecond_exporter_that_reports_each_transfer():
    start, end = transfers(400, np.random.default_rng(0))
    profile = profile_of(records(start + 17, end + 3, "10.255.0.1"))
    assert (profile.kind, profile.clock_ns, profile.sampling_rate) == ("per_transfer", 1, 1)
    assert profile.merge_gap_s < 0.005


@pytest.mark.parametrize("clock_ns", [1_000, MS])
def test_the_clock_is_the_lattice_its_timestamps_sit_on(clock_ns):
    start, end = transfers(400, np.random.default_rng(1))
    profile = profile_of(records(start // clock_ns * clock_ns, end // clock_ns * clock_ns, "10.255.0.1"))
    assert profile.clock_ns == clock_ns
    assert profile.kind == "per_transfer"  # at ms, transfers in one millisecond touch or overlap


def test_sampled_records_are_instants_or_carry_their_rate():
    start, _ = transfers(400, np.random.default_rng(2))
    instants = profile_of(records(start // MS * MS, start // MS * MS, "10.255.0.1", rate=1))
    assert (instants.kind, instants.instant_share) == ("sampled", 1.0)
    rated = profile_of(records(start, start + 1000, "10.255.0.1", rate=2048))
    assert (rated.kind, rated.sampling_rate) == ("sampled", 2048)
    # 1 in 4 still sees every transfer of a collective: its records are per transfer, also where
    # a millisecond clock shows most of them (shorter than a tick) as instants
    assert profile_of(records(*transfers(400, np.random.default_rng(2)), "10.255.0.1", rate=4)).kind == "per_transfer"
    assert profile_of(records(start // MS * MS, start // MS * MS, "10.255.0.1", rate=4)).kind == "per_transfer"


def cached(start, end, nbytes, idle_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A flow cache's records of one queue pair's transfers (in time order): a run of transfers
    with no pause above `idle_ns` is one record holding their bytes."""
    opens = np.r_[True, start[1:] - end[:-1] > idle_ns]
    run = np.cumsum(opens) - 1
    last = np.r_[np.flatnonzero(opens)[1:], len(start)] - 1
    return start[opens], end[last], np.bincount(run, weights=nbytes).astype(np.int64)


def test_a_flow_cache_is_told_by_its_gaps_and_merged_records():
    """A cache with a 0.4 s idle timeout merges each burst of transfers (idle tens of ms apart)
    into one record holding idle time, while a lone transfer keeps its own record: records of a
    queue pair are never closer than 0.4 s (which estimates the timeout) and the merged ones are
    slow, of sizes (sums) no lone transfer has."""
    rng = np.random.default_rng(3)
    starts, ends, sizes = [], [], []
    at = T0
    for _ in range(400):
        burst = int(rng.choice([1, 3, 4, 5]))
        size = rng.choice([4_000_000, 6_500_000], burst) + rng.integers(0, 2_000, burst)
        length = (size / 10e9 * SECOND).astype(np.int64)  # 10 GB/s
        idle = np.r_[0, rng.integers(10 * MS, 80 * MS, burst - 1)]
        start = at + np.cumsum(idle + np.r_[0, length[:-1]])
        starts.append(start), ends.append(start + length), sizes.append(size)
        at = start[-1] + length[-1] + int(rng.uniform(0.41, 2.0) * SECOND)
    start, end, nbytes = cached(*map(np.concatenate, (starts, ends, sizes)), idle_ns=int(0.4 * SECOND))
    profile = profile_of(records(start, end, "10.255.0.1", nbytes=nbytes))
    assert profile.kind == "flow_cache"
    assert 0.35 <= profile.merge_gap_s <= 0.45
    assert profile.long_record_s < 0.5  # no record is long enough to tell alone
    assert profile.merged_share > 0.3
    # records as long as its active timeout, back to back: longer than any transfer
    start = T0 + np.arange(200) * 5 * SECOND
    cut = profile_of(records(start, start + 5 * SECOND, "10.255.0.1"))
    assert cut.kind == "flow_cache"
    assert 4.0 <= cut.long_record_s <= 5.0


def test_sparse_transfers_leave_wide_gaps_without_a_cache():
    """A per-transfer exporter whose queue pairs each send two large transfers a step, far
    apart, and a small message that waits on its peer (as a real Megatron job's do): no two
    records of a pair are close, yet none is a merge. The slow ones (a transfer slowed by
    contention, a message that waited) have siblings of their size that ran at speed."""
    rng = np.random.default_rng(5)
    parts = []
    for pair in range(4):
        step = T0 + np.arange(200) * 3 * SECOND + rng.integers(0, 20 * MS, 200)
        big = np.r_[step, step + rng.integers(600 * MS, 1_000 * MS, 200)]
        big_bytes = 64_000_000 + rng.integers(0, 30_000, 400)  # header bytes
        big_end = big + (big_bytes / 10e9 * SECOND).astype(np.int64) * np.where(
            rng.random(400) < 0.05, rng.integers(3, 20, 400), 1)  # contention
        small = step + 2_000 * MS
        small_end = small + np.where(rng.random(200) < 0.03, rng.integers(200 * MS, 400 * MS, 200), 20_000)
        start, end = np.r_[big, small], np.r_[big_end, small_end]
        parts.append(records(start, end, "10.255.0.1", src_port=np.full(600, 49152 + pair),
                             nbytes=np.r_[big_bytes, np.full(200, 1_024)]))
    profile = profile_of(pa.concat_tables(parts))
    assert profile.merge_gap_s > 0.3  # the gaps alone would say a cache with a 0.3 s timeout
    assert profile.merged_share == 0.0
    assert profile.kind == "per_transfer"


def test_tallies_add_up_over_minutes():
    start, end = transfers(800, np.random.default_rng(4))
    table = records(start, end, "10.255.0.1")
    minute = (start - T0) // (60 * SECOND)
    halves = [tally_exporters(table.filter(pa.array(minute == m))) for m in np.unique(minute)]
    merged = halves[0]
    for tally in halves[1:]:
        merged = merged.merge(tally)
    whole = tally_exporters(table)
    assert merged.records.tolist() == whole.records.tolist() == [800]
    assert merged.durations.tolist() == whole.durations.tolist()
    assert exporter_profiles(merged)[0].kind == "per_transfer"


def job_records(rng: np.random.Generator, step_s: float = 3.0, steps: int = 200) -> pa.Table:
    """A job's records: 4 DP pairs synchronizing at each step's end (one 1 GiB record each) and 4
    PP pairs sending 8 micro-batches (32 MiB) during the step, with 2% step jitter."""
    durations = step_s * (1 + 0.02 * rng.standard_normal(steps))
    ends = T0 + (np.cumsum(durations) * SECOND).astype(np.int64)
    parts = []
    for k in range(4):
        sync = ends - int(0.3 * SECOND) + rng.integers(0, 2 * MS, steps)
        parts.append(records(sync, sync + 200 * MS, "10.255.0.1", src=f"10.0.0.{k}", dst=f"10.0.0.{k + 4}",
                             nbytes=np.full(steps, 1 << 30)))
        micro = (ends[:, None] - ((step_s - 0.4) * SECOND) + np.arange(8) * int(0.3 * SECOND)).ravel().astype(np.int64)
        parts.append(records(micro, micro + 20 * MS, "10.255.0.2", src=f"10.0.1.{k}", dst=f"10.0.1.{k + 4}",
                             nbytes=np.full(len(micro), 32 << 20)))
    return pa.concat_tables(parts)


def test_the_step_period_shows_in_the_rhythm_of_the_records_not_in_the_micro_batches():
    period = rhythm_period_s(job_records(np.random.default_rng(5)))
    assert period == pytest.approx(3.0, rel=0.02)


def test_a_cadence_within_the_step_sums_to_the_step_period():
    """A ZeRO job of 3.7 s steps behind a short idle timeout: each pair's records are its
    per-layer gathers, four a step 0.88 s apart, the fourth interval (the step's end) longer. The
    pattern repeats every four records: the period is the step's, not the cadence."""
    rng = np.random.default_rng(9)
    step_starts = T0 + np.cumsum(rng.normal(3.7, 0.05, 300) * SECOND).astype(np.int64)
    parts = []
    for k in range(4):
        gathers = (step_starts[:, None] + (np.arange(4) * 0.88 * SECOND).astype(np.int64)).ravel()
        gathers += rng.integers(0, 20 * MS, len(gathers))
        parts.append(records(gathers, gathers + 300 * MS, "10.255.0.1", src=f"10.0.0.{k}", dst=f"10.0.1.{k}"))
    assert rhythm_period_s(pa.concat_tables(parts)) == pytest.approx(3.7, rel=0.01)


def test_pairs_locked_onto_several_steps_agree_at_one_step():
    """An rs_ag job behind a flow cache (dev seed 4 of `flow_cache_1s`): each pair shows its
    reduce-scatter and its all-gather, and where a pause between them now and then falls under the
    idle timeout, the pair's cadence repeats only after 23 steps (its median interval 114.5 s).
    Those pairs keep the step's time; pairs whose medians are no whole number of steps do not."""
    locked = np.array([4.97, 4.98, 4.98, 4.99, 4.99, 5.01, 114.52, 114.52, 114.53])
    assert _agreed_period(locked, float(np.median(locked)), DEFAULT_PARAMS) == pytest.approx(4.98, rel=0.01)
    scattered = np.array([3.1, 4.4, 5.0, 6.7, 9.3, 12.2])
    assert _agreed_period(scattered, 5.0, DEFAULT_PARAMS) is None


def test_records_without_a_rhythm_show_no_period():
    rng = np.random.default_rng(6)
    start = T0 + np.sort(rng.integers(0, 600 * SECOND, 4000))
    table = records(start, start + MS, "10.255.0.1", src_port=49152 + rng.integers(0, 8, 4000))
    assert rhythm_period_s(table) is None


def test_steps_are_resolved_from_the_exporters_that_report_transfers():
    table = job_records(np.random.default_rng(7))
    cache = ExporterProfile("10.255.0.1", 800, "flow_cache", MS, 0.0, 1, 0.4, 5.0)
    each = ExporterProfile("10.255.0.2", 6400, "per_transfer", MS, 0.0, 1, 1e-6, 0.02)
    mixed = job_resolution(table, {p.sampler_address: p for p in (cache, each)})
    assert (mixed.resolution, mixed.resolving_exporters) == ("steps", frozenset({"10.255.0.2"}))
    cached = job_resolution(table, {p.sampler_address: replace(p, kind="flow_cache") for p in (cache, each)})
    assert cached.resolution == "period"
    assert cached.period_s == pytest.approx(3.0, rel=0.02)


def test_records_cut_only_by_a_caches_active_timeout_show_no_period():
    # a pipeline whose quiet gaps are all shorter than the cache's 1 s idle timeout: each queue
    # pair's records run to the 60 s active timeout, the next starting after a 0.1-0.5 s gap;
    # monitoring agents poll each member every 15 s (issue #18: the timeout's rhythm or the
    # agent's was reported as the step period)
    rng = np.random.default_rng(8)
    members = [f"10.0.0.{k}" for k in range(8)]
    parts = []
    for k in range(4):
        starts = T0 + np.arange(10) * 60 * SECOND + rng.integers(100 * MS, 500 * MS, 10)
        for src, dst in ((members[k], members[k + 4]), (members[k + 4], members[k])):
            parts.append(records(starts, starts + 60 * SECOND - 300 * MS, "10.255.0.1", src=src, dst=dst,
                                 nbytes=rng.integers(10**9, 2 * 10**9, 10)))
    for member in members:
        for agent in ("10.250.0.1", "10.250.0.2", "10.250.0.3"):
            polls = T0 + np.arange(40) * 15 * SECOND + rng.integers(0, 20 * MS, 40)
            parts.append(records(polls, polls + 5 * MS, "10.255.0.1", src=member, dst=agent))
    table = pa.concat_tables(parts)
    cache = ExporterProfile("10.255.0.1", table.num_rows, "flow_cache", 1, 0.0, 1, 1.0, 60.0)
    resolved = job_resolution(table, {cache.sampler_address: cache}, members=pa.array(members))
    assert (resolved.resolution, resolved.period_s) == ("jobs_only", None)


def test_a_silent_hour_closes_a_step_only_as_resolved_as_the_records_carried_for_it():
    # the hour before ran its timeline on a cache's records (no steps reported); the job is silent
    # now, and the step those records leave open is no more resolved than they were
    cache = ExporterProfile("10.255.0.1", 800, "flow_cache", 1, 0.0, 1, 1.0, 60.0)
    each = ExporterProfile("10.255.0.2", 6400, "per_transfer", 1, 0.0, 1, 1e-6, 0.02)
    profiles = {p.sampler_address: p for p in (cache, each)}

    def carrying(*exporters: str) -> dict:
        return {"carry": {"exporters": list(exporters)}}

    assert silent_resolution(carrying("10.255.0.1"), profiles).resolution == "jobs_only"
    assert silent_resolution(carrying("10.255.0.2", "10.255.0.1"), profiles).resolution == "jobs_only"
    assert silent_resolution(carrying("10.255.0.2"), profiles).resolution == "steps"
    assert silent_resolution({"carry": None}, profiles).resolution == "steps"
    assert silent_resolution(None, None).resolution == "steps"


def test_stragglers_and_slow_links_need_the_nics_transfers_timed():
    # 8 NICs syncing gradients in 200 ms records, 8 others sending activations in 20 ms ones
    table = job_records(np.random.default_rng(7))

    def shown(clock_ns: int, cache_kind: str = "per_transfer", records: pa.Table = table) -> tuple[str, ...]:
        profiles = [ExporterProfile("10.255.0.1", 800, cache_kind, clock_ns, 0.0, 1, 1e-6, 0.02),
                    ExporterProfile("10.255.0.2", 6400, "per_transfer", clock_ns, 0.0, 1, 1e-6, 0.02),
                    ExporterProfile("10.255.0.3", 1600, "sampled", clock_ns, 1.0, 1024, None, None)]
        return issue_kinds_shown(job_resolution(records, {p.sampler_address: p for p in profiles}))

    assert set(shown(1)) >= {"slow_step", "straggler", "slow_link", "hang", "restart"}
    # a millisecond clock times both sizes (10 ticks and more)
    assert {"straggler", "slow_link"} <= set(shown(MS))
    # a 5 ms clock times the syncs only: half the NICs show no throughput
    assert "straggler" not in shown(5 * MS) and "slow_link" not in shown(5 * MS) and "slow_step" in shown(5 * MS)
    # ... unless the same NICs send the activations too: their syncs time them
    same_nics = table.set_column(table.schema.get_field_index("src_addr"), "src_addr",
                                 pc.replace_substring(table["src_addr"], "10.0.1.", "10.0.0."))
    same_nics = same_nics.set_column(table.schema.get_field_index("dst_addr"), "dst_addr",
                                     pc.replace_substring(table["dst_addr"], "10.0.1.", "10.0.0."))
    assert {"straggler", "slow_link"} <= set(shown(5 * MS, records=same_nics))
    # a clock coarser than a tenth of every transfer times none
    assert "slow_link" not in shown(25 * MS, records=same_nics)
    # a flow cache's records (a tenth of the job's here, half its NICs) time no transfer either
    assert "straggler" not in shown(1, "flow_cache") and "slow_step" in shown(1, "flow_cache")
    assert set(shown(1, "sampled")) - {"straggler", "slow_link"} == set(shown(1, "sampled"))
    # a sampling switch behind two NICs (a fifth of the records) leaves the others judged
    sampled = pc.is_in(table["src_addr"], pa.array(["10.0.1.0"]))
    behind_sampler = table.set_column(table.schema.get_field_index("sampler_address"), "sampler_address",
                                      pc.if_else(sampled, "10.255.0.3", table["sampler_address"]))
    assert {"straggler", "slow_link"} <= set(shown(1, records=behind_sampler))


def test_a_flow_cache_hour_reports_no_steps_but_the_step_period(tmp_path):
    """One job with 3 s steps behind flow caches whose idle timeout (0.2-0.4 s) merges each
    burst of transfers but not the quiet between steps: no step rows, the period estimated.
    The same job behind per-transfer exporters has its steps."""
    job = JobSpec(2, tp=8, pp=1, start_s=-60, end_s=1e9, step_s=3.0, hosts=(0, 1))
    base = replace(SCENARIOS["tiny"], name="tiny", minutes=8, jobs=(job,), duplicate_rate=0.0, malformed_rate=0.0)
    found = {}
    cache = ExportOptions(flow_cache=1.0, idle_timeout_s=(0.2, 0.4), active_timeout_s=(30.0, 60.0))
    for name, export in (("cache", cache), ("per_transfer", ExportOptions())):
        write_scenario(replace(base, export=export), tmp_path / name, seed=1)
        flows, flow_minutes, topology, _ = scenario_flows(tmp_path / name)
        hour = int(pc.min(flow_minutes["minute"]).cast(pa.int64()).as_py()) // HOUR_NS * HOUR_NS
        found[name] = analyze_hour(flows, flow_minutes, topology, None, hour).tables
    [cached] = found["cache"]["jobs"].select(["resolution", "step_period_s", "issue_kinds_judged"]).to_pylist()
    assert cached["resolution"] == "period"
    assert cached["step_period_s"] == pytest.approx(3.0, rel=0.03)
    assert cached["issue_kinds_judged"] == ["hang", "restart"]  # the analyst sees what was not judged
    assert found["cache"]["steps"].num_rows == 0
    [each] = found["per_transfer"]["jobs"].select(["resolution", "step_period_s", "issue_kinds_judged"]).to_pylist()
    assert each["resolution"] == "steps"
    assert {"slow_step", "straggler", "slow_link", "degradation"} <= set(each["issue_kinds_judged"])
    assert found["per_transfer"]["steps"].num_rows > 100
    assert each["step_period_s"] == pytest.approx(3.0, rel=0.03)


def test_divided_steps_that_do_not_keep_time_are_not_reported():
    rng = np.random.default_rng(8)
    steady = 3.0 * (1 + 0.02 * rng.standard_normal(40))
    steady[[7, 21]] = 9.5  # two checkpoints
    steady[30:] *= 1.3  # a degradation keeps time around it
    assert steps_keep_time(steady)
    # boundaries found on a few rails: steps split and merged at random
    scrambled = rng.choice([1.5, 3.0, 4.5, 6.0], 40) * (1 + 0.02 * rng.standard_normal(40))
    assert not steps_keep_time(scrambled)
    assert steps_keep_time(scrambled[:6])  # too few to judge
    # a jittery job (8%) that stalls a third of its steps by 30% keeps time: its steps are
    # nearer one step than half or two
    jittery = 3.0 * np.exp(0.08 * rng.standard_normal(40))
    jittery[::3] *= 1.3
    assert steps_keep_time(jittery)
    # a heavy-tailed job stalls a third of its steps by 60%: each still holds its DP sync
    stalled = 3.0 * (1 + 0.02 * rng.standard_normal(40))
    stalled[::3] *= 1.6
    assert not steps_keep_time(stalled)
    assert steps_keep_time(stalled, np.ones(40, bool))
    assert not steps_keep_time(scrambled, np.ones(40, bool))  # split steps are short, sync or not
