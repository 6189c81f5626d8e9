"""Which flows each job is analyzed with (prism_core.analysis)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.analysis import ADDRESS_COLUMNS, analyze_hour, open_membership, paused_restarts, split_flows_by_job
from prism_core.arrays import CODES_SUFFIX, with_codes
from prism_core.config import DEFAULT_PARAMS
from prism_core.diagnosis import DEFAULT_PARAMS as DIAGNOSIS
from prism_core.minutes import HOUR_NS, minute_aggregates
from prism_core.queue_pairs import coalesced_channels
from prism_core.recognition import MEMBERSHIP, Recognition
from prism_core.simulate import write_scenario
from prism_core.simulate.scenarios import SCENARIOS, FaultSpec, JobSpec
from test_recognition import scenario_flows

HOUR = 10 * HOUR_NS
SECOND = 1_000_000_000


def _recognition(job_rows: list[tuple[str, int, str, str]], spans: list[tuple[str, str, int, int]],
                 gpus_per_host: int = 1) -> Recognition:
    """Jobs (id, first seen, status, host) and their members' traffic spans (job, host, first, last);
    a host's GPUs are addressed "<host>" (GPU 0), "<host>.1", ..."""
    spans = [(j, h if g == 0 else f"{h}.{g}", f, l, h) for j, h, f, l in spans for g in range(gpus_per_host)]
    job_table = pa.table({
        "job_id": [j for j, _, _, _ in job_rows],
        "first_seen": pa.array([t for _, t, _, _ in job_rows], pa.timestamp("ns", "UTC")),
        "status": [s for _, _, s, _ in job_rows],
        "hosts": [[h] for _, _, _, h in job_rows],
    })
    membership = pa.table({
        "job_id": [j for j, _, _, _, _ in spans], "addr": [a for _, a, _, _, _ in spans],
        "host": [h for _, _, _, _, h in spans], "gpu": pa.array([0] * len(spans), pa.int32()),
        "gpus": pa.array([1] * len(spans), pa.int32()),
        "first_ns": pa.array([f for _, _, f, _, _ in spans], pa.int64()),
        "last_ns": pa.array([l for _, _, _, l, _ in spans], pa.int64()),
    }).cast(MEMBERSHIP)
    return Recognition(jobs=job_table, membership=membership, events=pa.table({}), state={})


def test_a_job_holds_its_hosts_from_the_hour_start_if_it_ran_then_and_to_the_end_if_it_still_runs():
    """Checkpoint writes before a running job's first sync of the hour and after its last are the
    job's; a host between two jobs belongs to neither, and a job that arrived mid-hour does not
    own what its host sent before it came."""
    recognition = _recognition(
        [("a", HOUR - HOUR_NS, "running", "h0"), ("b", HOUR + 100 * SECOND, "ended", "h1"),
         ("c", HOUR + 2000 * SECOND, "running", "h1")],
        [("a", "h0", HOUR + 10 * SECOND, HOUR + 3500 * SECOND), ("b", "h1", HOUR + 100 * SECOND, HOUR + 1000 * SECOND),
         ("c", "h1", HOUR + 2000 * SECOND, HOUR + 3500 * SECOND)],
        gpus_per_host=2,
    )
    sent = [("h0", 5), ("h0.1", 6), ("h0", 3550), ("h1", 50), ("h1", 500), ("h1", 1500), ("h1.1", 3590)]
    flows = pa.table({
        "time_flow_start_ns": pa.array([HOUR + t * SECOND for _, t in sent], pa.int64()),
        "time_flow_end_ns": pa.array([HOUR + t * SECOND + 1 for _, t in sent], pa.int64()),
        "src_addr": [h for h, _ in sent], "dst_addr": ["storage"] * len(sent),
        "bytes": pa.array([1 << 30] * len(sent), pa.int64()), "sampler_address": ["x"] * len(sent),
        "sampling_rate": pa.array([1] * len(sent), pa.int64()), "src_port": pa.array([None] * len(sent), pa.int32()),
    })
    split = {job: (part["time_flow_start_ns"].to_numpy() - HOUR) // SECOND
             for job, part in split_flows_by_job(flows, open_membership(recognition, HOUR))}
    assert {job: times.tolist() for job, times in split.items()} == {"a": [5, 6, 3550], "b": [500], "c": [3590]}
    # by the traffic spans alone, only what was sent amid the job's own traffic
    plain = {job: len(part) for job, part in split_flows_by_job(flows, recognition.membership)}
    assert plain == {"b": 1}


def _host_spans(job_gpus: pa.Table, start: str, end: str, hour: int) -> dict[str, tuple[float, float]]:
    """host -> (first, last) in seconds since `hour` over all its addresses."""
    spans = job_gpus.group_by("host", use_threads=False).aggregate([(start, "min"), (end, "max")])
    first, last = ((spans[column].cast(pa.int64()).to_numpy() - hour) / SECOND
                   for column in (f"{start}_min", f"{end}_max"))
    return {host: (f, l) for host, f, l in zip(spans["host"].to_pylist(), first, last)}


def test_job_gpus_tell_when_a_replacement_host_joined_and_the_replaced_one_left(tmp_path):
    """A job restarts at 150 s with host 1 replaced by host 5: each address carries its host's
    first and last traffic for the job, close to the truth's spans."""
    scenario = replace(SCENARIOS["tiny"], name="tiny", minutes=6, jobs=(
        JobSpec(2, tp=8, pp=1, start_s=10, end_s=1e9, step_s=3.0, checkpoint_s=60, hosts=(0, 1),
                faults=(FaultSpec("restart", at_s=150, gap_s=60, host=1, replace_host=5),)),))
    write_scenario(scenario, tmp_path, seed=0)
    flows, flow_minutes, topology, truth = scenario_flows(tmp_path)
    hour = int(pc.min(flow_minutes["minute"]).cast(pa.int64()).as_py()) // HOUR_NS * HOUR_NS
    job_gpus = analyze_hour(flows, flow_minutes, topology, None, hour).tables["job_gpus"]
    assert job_gpus["first_seen"].null_count == job_gpus["last_seen"].null_count == 0
    found = _host_spans(job_gpus, "first_seen", "last_seen", hour)
    expected = _host_spans(truth["job_gpus"], "start", "end", hour)
    assert sorted(found) == sorted(expected) == ["gpu0000", "gpu0001", "gpu0005"]
    for host, (first, last) in found.items():
        assert abs(first - expected[host][0]) < 10 and abs(last - expected[host][1]) < 10, host
    assert found["gpu0001"][1] < found["gpu0005"][0]  # left before its replacement joined


def test_bulk_reads_from_storage_go_to_the_job_that_last_took_the_gpu_even_after_its_traffic_stopped():
    """A stopped job that resumes reads its checkpoint back before it sends anything: a bulk read
    into a GPU from an address of no job belongs to the job whose span on that GPU began last
    (job b, stopped at 1000 s, until job c arrives at 2000 s). Small reads, reads into addresses
    of no job and reads before any job took the GPU are dropped."""
    recognition = _recognition(
        [("b", HOUR + 100 * SECOND, "ended", "h1"), ("c", HOUR + 2000 * SECOND, "running", "h1")],
        [("b", "h1", HOUR + 100 * SECOND, HOUR + 1000 * SECOND),
         ("c", "h1", HOUR + 2000 * SECOND, HOUR + 3500 * SECOND)],
    )
    reads = [("storage", "h1", 50, 1 << 30), ("storage", "h1", 1500, 1 << 30), ("storage", "h1", 1600, 16 << 20),
             ("storage", "h9", 1700, 1 << 30), ("storage", "h1", 2500, 1 << 30)]
    flows = pa.table({
        "time_flow_start_ns": pa.array([HOUR + t * SECOND for _, _, t, _ in reads], pa.int64()),
        "time_flow_end_ns": pa.array([HOUR + t * SECOND + 1 for _, _, t, _ in reads], pa.int64()),
        "src_addr": [s for s, _, _, _ in reads], "dst_addr": [d for _, d, _, _ in reads],
        "bytes": pa.array([b for _, _, _, b in reads], pa.int64()), "sampler_address": ["x"] * len(reads),
        "sampling_rate": pa.array([1] * len(reads), pa.int64()), "src_port": pa.array([None] * len(reads), pa.int32()),
    })
    split = {job: ((part["time_flow_start_ns"].to_numpy() - HOUR) // SECOND).tolist()
             for job, part in split_flows_by_job(flows, recognition.membership)}
    assert split == {"b": [1500], "c": [2500]}


def test_addresses_read_dictionary_encoded_split_and_encode_as_their_text_does():
    """The pipeline reads the addresses dictionary-encoded (pipelines/analyze.split_row_group):
    each job gets the same rows and text as from the text columns, and the codes it carries are
    those `with_codes` gives the text (one dictionary, values in order of first appearance), here
    from two pieces with dictionaries of their own that list values no row of the job shows."""
    recognition = _recognition(
        [("a", HOUR - HOUR_NS, "running", "h0"), ("b", HOUR + 100 * SECOND, "ended", "h1")],
        [("a", "h0", HOUR + 10 * SECOND, HOUR + 3500 * SECOND), ("b", "h1", HOUR + 100 * SECOND, HOUR + 1000 * SECOND)],
        gpus_per_host=2,
    )
    sent = [("h0.1", "h0", 20, "x"), ("h1", "h1.1", 200, None), ("h0", "storage", 30, "y"), ("idle", "h0", 40, "x"),
            ("h1.1", "h1", 300, "z"), ("storage", "h1", 1500, "x"), ("h0", "h0.1", 3000, "y")]
    flows = pa.table({
        "time_flow_start_ns": pa.array([HOUR + t * SECOND for _, _, t, _ in sent], pa.int64()),
        "time_flow_end_ns": pa.array([HOUR + t * SECOND + 1 for _, _, t, _ in sent], pa.int64()),
        "src_addr": [s for s, _, _, _ in sent], "dst_addr": [d for _, d, _, _ in sent],
        "bytes": pa.array([1 << 30] * len(sent), pa.int64()), "sampler_address": [x for _, _, _, x in sent],
        "sampling_rate": pa.array([1] * len(sent), pa.int64()), "src_port": pa.array([None] * len(sent), pa.int32()),
    })
    membership = open_membership(recognition, HOUR)
    encoded = flows
    for name in ADDRESS_COLUMNS:
        encoded = encoded.set_column(encoded.schema.get_field_index(name), name, flows[name].dictionary_encode())
    plain = dict(split_flows_by_job(flows, membership))
    # pieces of a job from two row groups, each with its own dictionary
    pieces = [dict(split_flows_by_job(part, membership)) for part in (encoded.slice(0, 4), encoded.slice(4))]
    assert sorted(plain) == ["a", "b"]
    for job, rows in plain.items():
        parts = [piece[job] for piece in pieces if job in piece]
        assert len(parts) == 2 and all("src_addr" + CODES_SUFFIX in part.column_names for part in parts)
        carried = with_codes(pa.concat_tables(parts), ADDRESS_COLUMNS)
        expected = with_codes(rows, ADDRESS_COLUMNS)
        assert carried.schema == expected.schema
        assert carried.combine_chunks().equals(expected.combine_chunks())
        for name in ADDRESS_COLUMNS:
            assert carried[name + CODES_SUFFIX].num_chunks == 1


def test_a_recognized_restart_on_the_connections_of_before_is_a_pause():
    # two hosts send every second, fall silent 100-190 s, and send again; recognition, a minute at
    # a time, puts the resume 10 s late (at 200 s). On the same source ports: a pause; on new
    # ones: a restart; a silence begun before the hour's records (none before 150 s) tells nothing
    def flows(times, new_ports_from):
        times = np.repeat(np.asarray(times, float), 2)
        src = np.tile(["10.0.0.1", "10.0.1.1"], len(times) // 2)
        port = 49152 + np.tile([0, 1], len(times) // 2) + np.where(times >= new_ports_from, 7, 0)
        return pa.table({"time_flow_start_ns": pa.array((HOUR + times * SECOND).astype(np.int64)),
                         "src_addr": src, "dst_addr": np.where(src == "10.0.0.1", "10.0.1.1", "10.0.0.1"),
                         "src_port": pa.array(port, pa.int32())})

    members = pa.chunked_array([["10.0.0.1", "10.0.1.1"]])
    times, at = np.r_[np.arange(0, 100), np.arange(190, 300)], HOUR + 200 * SECOND
    assert paused_restarts(flows(times, np.inf), members, [at], DIAGNOSIS) == [at]
    assert paused_restarts(flows(times, 190), members, [at], DIAGNOSIS) == []
    assert paused_restarts(flows(np.arange(190, 300), np.inf), members, [at], DIAGNOSIS) == []


def test_a_job_whose_transfers_each_show_as_several_queue_pairs_records_reads_as_with_one_record_each(tmp_path):
    """An exporter that reports every queue pair of a NIC pair: each transfer of a dp2 x pp2 x tp4
    job, one record in the simulator's flows, comes as three (a third of its bytes each, on their
    own source ports, started up to 0.3 ms apart). The job's pairs, degrees, steps and issues are
    those read from one record per transfer (prism_core.queue_pairs.coalesced_channels)."""
    scenario = replace(SCENARIOS["tiny"], name="tiny", minutes=6, jobs=(
        JobSpec(2, tp=4, pp=2, start_s=10, end_s=1e9, step_s=3.0, channels=1, checkpoint_s=120, hosts=(0, 1)),))
    write_scenario(scenario, tmp_path, seed=0)
    flows, flow_minutes, topology, _ = scenario_flows(tmp_path)
    queue_pairs = 3
    rows = np.repeat(np.arange(flows.num_rows), queue_pairs)
    place = np.tile(np.arange(queue_pairs), flows.num_rows)
    skew = np.random.default_rng(0).integers(0, 300_000, len(rows))
    split = flows.take(rows)
    for name, values in (
        ("time_flow_start_ns", split["time_flow_start_ns"].to_numpy() + skew),
        ("time_flow_end_ns", split["time_flow_end_ns"].to_numpy() + skew),
        ("bytes", split["bytes"].to_numpy() // queue_pairs),
        ("src_port", split["src_port"].to_numpy() + 7 * place),
    ):
        field = split.schema.field(name)
        split = split.set_column(split.schema.get_field_index(name), field, pa.array(values, field.type))
    hour = int(pc.min(flow_minutes["minute"]).cast(pa.int64()).as_py()) // HOUR_NS * HOUR_NS
    one, several = (analyze_hour(f, minute_aggregates(f), topology, None, hour) for f in (flows, split))
    # read back as one record per transfer between the job's NICs (its saves to storage stay split)
    nics = one.tables["job_gpus"]["addr"].combine_chunks()
    resolution = DEFAULT_PARAMS.resolution
    read_back = coalesced_channels(split, nics, resolution.channel_start_s, resolution.channel_size_spread,
                                   resolution.channel_even_share)
    between = pc.and_(pc.is_in(flows["src_addr"], value_set=nics), pc.is_in(flows["dst_addr"], value_set=nics))
    assert read_back.num_rows == flows.num_rows + 2 * pc.sum(pc.invert(between)).as_py() < split.num_rows
    assert pc.sum(read_back["bytes"]).as_py() == pc.sum(split["bytes"]).as_py()
    assert one.tables["jobs"].select(["dp", "pp", "tp"]).to_pylist() == [{"dp": 2, "pp": 2, "tp": 4}]
    assert several.tables["jobs"].select(["dp", "pp", "tp"]).to_pylist() == [{"dp": 2, "pp": 2, "tp": 4}]
    pairs = [table.tables["comm_pairs"].select(["src_addr", "dst_addr", "kind"]).sort_by("src_addr").to_pylist()
             for table in (one, several)]
    assert pairs[0] == pairs[1]
    steps = [table.tables["steps"]["duration_s"].to_numpy() for table in (one, several)]
    assert len(steps[0]) == len(steps[1]) > 100
    assert np.abs(steps[0] - steps[1]).max() < 0.001
    assert sorted(one.tables["issues"]["kind"].to_pylist()) == sorted(several.tables["issues"]["kind"].to_pylist())
