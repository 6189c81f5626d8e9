"""Job recognition and tracking (prism_core.recognition); the job-stage scorer is tested in test_evaluate_jobs."""

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from prism_core.analysis import split_flows_by_job
from prism_core.evaluate import jobs as job_scores
from prism_core.ingest import dedupe, parse_flow_file
from prism_core.minutes import HOUR_NS, MINUTE_NS, minute_aggregates, minute_of
from prism_core.recognition import (
    DEFAULT_PARAMS, STATE_VERSION, Recognition, RecognitionState, recognize_hour, recognize_minute,
)
from prism_core.schema import FLOW_MINUTES, FLOWS, TS, conform
from prism_core.topology import Topology

HOUR0 = 1_795_334_400 * 10**9  # 2026-11-22 00:00 UTC
SECOND = 10**9


def scenario_flows(scenario: Path) -> tuple[pa.Table, pa.Table, Topology, dict[str, pa.Table]]:
    """(clean deduplicated flows, flow_minutes, topology, truth tables) of a simulated scenario."""
    files = sorted((scenario / "flows").iterdir())
    flows, _ = dedupe(pa.concat_tables([parse_flow_file(f.read_bytes(), f.name).clean for f in files]))
    topology = Topology.from_csv_bytes((scenario / "topology.csv").read_bytes())
    truth = {name: pq.read_table(scenario / "truth" / f"{name}.parquet") for name in ("jobs", "job_gpus", "pairs")}
    return flows, minute_aggregates(flows), topology, truth


def recognize_hours(flow_minutes: pa.Table, topology: Topology) -> list[tuple[int, Recognition]]:
    """(hour start, recognition) for every hour of `flow_minutes` in order, each continuing the
    JSON state of the one before."""
    minute = flow_minutes["minute"].cast(pa.int64()).to_numpy()
    state, found = None, []
    for hour in np.unique(minute // HOUR_NS * HOUR_NS).tolist():
        part = flow_minutes.filter(pa.array((minute >= hour) & (minute < hour + HOUR_NS)))
        recognition = recognize_hour(part, topology, state, hour)
        state = json.loads(json.dumps(recognition.state))
        found.append((hour, recognition))
    return found


# --- hand-built inventory and traffic ------------------------------------------------------------


def inventory(n_hosts: int) -> Topology:
    lines = ["addr,host,gpu,leaf,pod"] + [
        f"10.0.{h}.{g},host{h:02d},{g},leaf{g},pod0" for h in range(n_hosts) for g in range(8)
    ]
    return Topology.from_csv_bytes("\n".join(lines).encode())


def ring(hosts, minutes, size, rails=range(8), flows=12, first_s=1, last_s=59):
    """flow_minutes rows of a ring over `hosts` on each rail, one row per pair per minute."""
    rows = []
    for minute in minutes:
        at = HOUR0 + minute * MINUTE_NS
        for rail in rails:
            for a, b in zip(hosts, hosts[1:] + hosts[:1]):
                rows.append(pair_row(at, f"10.0.{a}.{rail}", f"10.0.{b}.{rail}", size, flows,
                                    at + round(first_s * SECOND), at + round(last_s * SECOND)))
    return rows


def pair_row(minute_ns, src, dst, size, flows, first_ns, last_ns):
    return {"minute": minute_ns, "src_addr": src, "dst_addr": dst, "flows": flows, "bytes": size * flows,
            "distinct_sizes": 1, "top_size": size, "top_size_flows": flows,
            "first_start_ns": first_ns, "last_end_ns": last_ns}


def table(rows) -> pa.Table:
    raw = pa.Table.from_pylist(rows)
    return conform(raw.set_column(0, "minute", raw["minute"].cast(TS)), FLOW_MINUTES)


def hosts_of(addr_sets) -> list[list[str]]:
    return sorted(sorted({".".join(a.split(".")[:3]) for a in addrs}) for addrs in addr_sets)


def job_rows(recognition) -> dict[str, dict]:
    return {r["job_id"]: r for r in recognition.jobs.drop_columns(["first_seen", "last_seen"]).to_pylist()}


# --- one minute -----------------------------------------------------------------------------------


def test_rail_components_merge_into_whole_hosts():
    topology = inventory(4)
    rows = ring([0, 1], [0], 4 << 20, rails=range(4)) + ring([2, 3], [0], 8 << 20, rails=[0])
    found = recognize_minute(table(rows), topology)
    assert hosts_of(found) == [["10.0.0", "10.0.1"], ["10.0.2", "10.0.3"]]
    assert sorted(len(addrs) for addrs in found) == [2, 8]  # the NICs that talked
    # over the hour, all NICs of the hosts each holds whole: the silent rails too (PXN hides them)
    assert sorted(recognize_hour(table(rows), topology, None, HOUR0).jobs["n_gpus"].to_pylist()) == [16, 16]


def gpus_by_job(recognition) -> list[list[int]]:
    gpus_of: dict[str, set] = {}
    for row in recognition.membership.to_pylist():
        gpus_of.setdefault(row["job_id"], set()).add(row["gpu"])
    return sorted(map(sorted, gpus_of.values()))


def test_jobs_on_other_gpus_of_the_same_hosts_are_two_jobs():
    # GPUs 0-3 and 4-7 of the same four hosts all hour, each job at its own rhythm (the first's
    # minutes run from 1 s to 59 s, the second's from 3.4 s to 57.2 s) with its own flow sizes
    topology = inventory(4)
    hosts = [0, 1, 2, 3]
    rows = ring(hosts, range(10), 4 << 20, rails=range(4)) + ring(hosts, range(10), 6 << 20, rails=range(4, 8),
                                                                   first_s=3.4, last_s=57.2)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert sorted(found.jobs["n_gpus"].to_pylist()) == [16, 16]
    assert found.jobs["n_hosts"].to_pylist() == [4, 4]
    assert gpus_by_job(found) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a tolerance wider than their phases differ by takes them for the rails of one job
    wide = replace(DEFAULT_PARAMS, in_step_ns=3 * SECOND)
    assert recognize_hour(table(rows), topology, None, HOUR0, params=wide).jobs["n_gpus"].to_pylist() == [32]


def test_a_job_arriving_on_other_gpus_of_busy_hosts_is_a_job_of_its_own():
    # the same flow sizes (the same model), out of step, and the second job starts four minutes
    # after the first: not a part of it with another role
    topology = inventory(4)
    hosts = [0, 1, 2, 3]
    rows = ring(hosts, range(10), 4 << 20, rails=range(4))
    rows += ring(hosts, range(4, 10), 4 << 20, rails=range(4, 8), first_s=2.5, last_s=58)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert gpus_by_job(found) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    first_seen = sorted(found.jobs["first_seen"].cast(pa.int64()).to_pylist())
    assert first_seen == [HOUR0 + SECOND, HOUR0 + 4 * MINUTE_NS + 5 * SECOND // 2]
    # started together, they would be one job in two roles
    rows = ring(hosts, range(10), 4 << 20, rails=range(4)) + ring(hosts, range(10), 4 << 20, rails=range(4, 8),
                                                                   first_s=2.5, last_s=58)
    assert recognize_hour(table(rows), topology, None, HOUR0).jobs["n_gpus"].to_pylist() == [32]


def test_jobs_side_by_side_are_judged_on_their_own_lives_not_on_later_jobs_on_their_nics():
    # GPUs 0-3 and 4-7 of four hosts, one model's sizes, out of step, both running when the hour
    # begins: the first stops after two minutes, the second after eight. Later jobs take each one's
    # NICs to the hour's end, so the NICs' traffic spans the same hour: the two jobs' lives do not.
    topology = inventory(4)
    hosts = [0, 1, 2, 3]
    rows = ring(hosts, range(2), 4 << 20, rails=range(4)) + ring(hosts, range(8), 4 << 20, rails=range(4, 8),
                                                               first_s=2.5, last_s=58)
    rows += ring(hosts, range(12, 60), 6 << 20, rails=range(4)) + ring(hosts, range(20, 60), 10 << 20,
                                                                        rails=range(4, 8), first_s=3.3)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert sorted(found.jobs["n_gpus"].to_pylist()) == [16, 16, 16, 16]
    assert gpus_by_job(found) == [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2


def test_two_jobs_arriving_side_by_side_on_the_nics_a_job_left_seconds_before_are_two_jobs():
    # a job of whole hosts stops 42 s into minute 10; 19 s and 47 s later two jobs begin on GPUs
    # 0-3 and 4-7 of its hosts, out of step with each other (sealed-5 jobs 039 and 040 after 032).
    # Their NICs talked without a pause before: judged on those in-step minutes too, they were
    # the rails of one job; nor does their talking at once make them parts of the old job.
    topology = inventory(4)
    hosts = [0, 1, 2, 3]
    rows = ring(hosts, range(10), 8 << 20) + ring(hosts, [10], 8 << 20, last_s=42)
    rows += ring(hosts, [11], 4 << 20, rails=range(4), first_s=1.0) + ring(hosts, range(12, 22), 4 << 20, rails=range(4))
    rows += ring(hosts, [11], 6 << 20, rails=range(4, 8), first_s=29.0, last_s=57.2)
    rows += ring(hosts, range(12, 22), 6 << 20, rails=range(4, 8), first_s=3.4, last_s=57.2)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert sorted(found.jobs["n_gpus"].to_pylist()) == [16, 16, 32]
    assert gpus_by_job(found) == [[0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7], [4, 5, 6, 7]]


def test_a_rail_optimized_job_is_one_job():
    # eight rails in step over four hosts (the exporters' clocks a few ms apart): one job of 32 GPUs
    topology = inventory(4)
    rows = [r for rail in range(8) for r in ring([0, 1, 2, 3], range(10), 4 << 20, rails=[rail], first_s=1 + rail / 1000)]
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert found.jobs["n_gpus"].to_pylist() == [32]
    assert found.membership.num_rows == 32
    # rails with other roles, out of step, are its parts still: they carry its activation size
    rows = ring([0, 1, 2, 3], range(10), 96 << 20, rails=range(4)) + ring([0, 1, 2, 3], range(10), 4 << 20, rails=range(4))
    rows += ring([0, 1, 2, 3], range(10), 4 << 20, rails=range(4, 8), first_s=2.5, last_s=58.5)
    assert recognize_hour(table(rows), topology, None, HOUR0).jobs["n_gpus"].to_pylist() == [32]


def test_a_job_on_part_of_its_hosts_leaves_their_silent_nics_out():
    # GPUs 4-7 of two hosts whose GPUs 0-3 never talk (idle, or jobs inside one host): 8 GPUs
    topology = inventory(2)
    found = recognize_hour(table(ring([0, 1], range(5), 4 << 20, rails=range(4, 8))), topology, None, HOUR0)
    assert found.jobs["n_gpus"].to_pylist() == [8]
    assert sorted(set(found.membership["gpu"].to_pylist())) == [4, 5, 6, 7]


def pipeline_hop(sender, receiver, minutes, size, forward_rail, backward_rail):
    """flow_minutes rows of a pipeline hop between two hosts through PXN: the forward activations
    arrive on `forward_rail` of the receiver, the gradients back on `backward_rail` of the sender."""
    return [pair_row(HOUR0 + m * MINUTE_NS, f"10.0.{a}.{rail}", f"10.0.{b}.{rail}", size, 12,
                     HOUR0 + m * MINUTE_NS + SECOND, HOUR0 + m * MINUTE_NS + 59 * SECOND)
            for m in minutes for a, b, rail in ((sender, receiver, forward_rail), (receiver, sender, backward_rail))]


def test_pipeline_hops_tell_a_job_on_the_first_gpus_of_idle_hosts_from_a_job_of_whole_hosts():
    # two replicas of a 4-stage pipeline, two stages per host, alone on GPUs 0-1 of four hosts:
    # the DP ring shows rails 0 and 1 as a job of whole hosts whose other GPUs stay on NVLink would,
    # but the hop from stage 1 to 2 comes back on rail 1, so the host's GPUs end at GPU 1: 8 GPUs
    topology = inventory(4)
    minutes = range(5)
    rows = ring([0, 2], minutes, 64 << 20, rails=[0, 1]) + ring([1, 3], minutes, 64 << 20, rails=[0, 1])
    hops = pipeline_hop(0, 1, minutes, 4 << 20, 0, 1) + pipeline_hop(2, 3, minutes, 4 << 20, 0, 1)
    found = recognize_hour(table(rows + hops), topology, None, HOUR0)
    assert found.jobs["n_gpus"].to_pylist() == [8]
    assert sorted(set(found.membership["gpu"].to_pylist())) == [0, 1]
    # the same hop coming back on the host's last rail is the last stage of a host held whole
    hops = pipeline_hop(0, 1, minutes, 4 << 20, 0, 7) + pipeline_hop(2, 3, minutes, 4 << 20, 0, 7)
    assert recognize_hour(table(rows + hops), topology, None, HOUR0).jobs["n_gpus"].to_pylist() == [32]


def test_sampled_rows_show_no_pipeline_hop_ending_a_host():
    # the same rows behind packet samplers: their sizes are estimates (sampled packets x rate), a
    # size shared one way and the other tells no transfer, so the job holds its hosts whole
    topology = inventory(4)
    minutes = range(5)
    rows = ring([0, 2], minutes, 64 << 20, rails=[0, 1]) + ring([1, 3], minutes, 64 << 20, rails=[0, 1])
    hops = pipeline_hop(0, 1, minutes, 4 << 20, 0, 1) + pipeline_hop(2, 3, minutes, 4 << 20, 0, 1)
    sampled = [dict(row, sampling_rate=4096) for row in rows + hops]
    assert recognize_hour(table(sampled), topology, None, HOUR0).jobs["n_gpus"].to_pylist() == [32]


def test_a_job_on_hosts_another_left_this_hour_holds_them_whole():
    # a job of whole hosts ends at minute 10; from minute 20 another on the same hosts shows only
    # rails 0-3 (its other GPUs' NICs talked this hour, for the first job): both hold 16 GPUs
    topology = inventory(2)
    rows = ring([0, 1], range(10), 4 << 20) + ring([0, 1], range(20, 30), 6 << 20, rails=range(4))
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert found.jobs["n_gpus"].to_pylist() == [16, 16]
    assert gpus_by_job(found) == [list(range(8)), list(range(8))]


def test_a_nic_serving_two_gpus_counts_both():
    lines = ["addr,host,gpu,leaf,pod,gpus_per_nic"] + [
        f"10.0.{h}.{n},host{h:02d},{2 * n},leaf{n},pod0,2" for h in range(2) for n in range(4)]
    topology = Topology.from_csv_bytes("\n".join(lines).encode())
    found = recognize_hour(table(ring([0, 1], range(5), 4 << 20, rails=range(4))), topology, None, HOUR0)
    assert found.jobs["n_gpus"].to_pylist() == [16]
    assert found.membership["gpus"].to_pylist() == [2] * 8


def mixed_inventory(n_hosts: int, four_nic_hosts: tuple[int, ...]) -> Topology:
    """8-NIC hosts, and 4-NIC hosts whose NIC 10.0.h.g serves GPUs g and g + 1."""
    lines = ["addr,host,gpu,leaf,pod,gpus_per_nic"] + [
        f"10.0.{h}.{g},host{h:02d},{g},leaf{g},pod0,{2 if h in four_nic_hosts else 1}"
        for h in range(n_hosts) for g in (range(0, 8, 2) if h in four_nic_hosts else range(8))]
    return Topology.from_csv_bytes("\n".join(lines).encode())


def gpus_by_host(recognition, job_id) -> dict[str, list[int]]:
    found: dict[str, set] = {}
    for row in recognition.membership.filter(pc.equal(recognition.membership["job_id"], job_id)).to_pylist():
        found.setdefault(row["host"], set()).update(range(row["gpu"], row["gpu"] + row["gpus"]))
    return {host: sorted(gpus) for host, gpus in sorted(found.items())}


def test_a_job_on_part_of_its_hosts_holds_as_many_gpus_on_each():
    # a DP ring over GPUs 4-5 of four hosts shows only rail 4 (PXN: the block's first GPU carries
    # the ring between hosts, GPU 5 talks over NVLink); host03 has 4 NICs, its NIC 4 serves GPUs 4
    # and 5: the job holds GPUs 4-5 on every host. Beside it, on GPUs 0-1 of hosts 0-2, a job
    # showing rails 0 and 1 (a ring per tensor-parallel rank) holds them and no more; it never shows
    # more than two GPUs a host, so the silent GPUs 2-7 of those hosts are not its.
    topology = mixed_inventory(4, four_nic_hosts=(3,))
    minutes = range(10)
    rows = ring([0, 1, 2, 3], minutes, 6 << 20, rails=[4], first_s=3.4, last_s=57.2)
    rows += ring([0, 1, 2], minutes, 4 << 20, rails=[0, 1])
    found = recognize_hour(table(rows), topology, None, HOUR0)
    jobs = {row["n_hosts"]: row for row in found.jobs.to_pylist()}
    assert {hosts: row["n_gpus"] for hosts, row in jobs.items()} == {4: 8, 3: 6}
    assert gpus_by_host(found, jobs[4]["job_id"]) == {f"host{h:02d}": [4, 5] for h in range(4)}
    assert gpus_by_host(found, jobs[3]["job_id"]) == {f"host{h:02d}": [0, 1] for h in range(3)}
    # without the prior each keeps the NICs it showed: rail 4 (two GPUs on host03 only)
    apart = recognize_hour(table(rows), topology, None, HOUR0, params=replace(DEFAULT_PARAMS, same_gpus_per_host=False))
    assert sorted(apart.jobs["n_gpus"].to_pylist()) == [5, 6]


def test_a_gpu_block_stops_at_another_jobs_nics():
    # the same ring over GPUs 4-5, while a third job talks on GPU 5 of host00 (with host04): the
    # block's other NIC there is that job's, so on host00 the ring's job keeps GPU 4 alone
    topology = mixed_inventory(5, four_nic_hosts=(3,))
    minutes = range(10)
    rows = ring([0, 1, 2, 3], minutes, 6 << 20, rails=[4], first_s=3.4, last_s=57.2)
    rows += ring([0, 4], minutes, 9 << 20, rails=[5], first_s=7.1, last_s=50.3)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    jobs = {row["n_hosts"]: row for row in found.jobs.to_pylist()}
    assert gpus_by_host(found, jobs[4]["job_id"]) == {"host00": [4], **{f"host{h:02d}": [4, 5] for h in (1, 2, 3)}}
    # the third job shows one GPU a host on 8-NIC hosts: it holds GPU 5 of each
    assert gpus_by_host(found, jobs[2]["job_id"]) == {"host00": [5], "host04": [5]}


def test_on_a_platform_that_hands_out_gpus_a_job_showing_some_nics_holds_their_gpus():
    # a job on GPUs 0-1 of hosts 5-7, alone there, shows rails 0 and 1 (a ring per NIC). Where
    # hosts are handed out whole, those are the first rails of a job of whole hosts; where the
    # scheduler hands out GPUs (hosts 1-3 each hold two jobs at once for ten minutes, one job also
    # on host 0, the other on host 4), they are the job's GPUs and the hosts' other GPUs are idle
    topology = inventory(8)
    minutes = range(10)
    alone = ring([5, 6, 7], minutes, 4 << 20, rails=[0, 1])
    assert recognize_hour(table(alone), topology, None, HOUR0).jobs["n_gpus"].to_pylist() == [24]

    def side_by_side(hosts, others):
        return (ring(hosts, minutes, 6 << 20, rails=range(4), first_s=3.4, last_s=57.2)
                + ring(others, minutes, 9 << 20, rails=range(4, 8), first_s=7.1, last_s=50.3))

    found = recognize_hour(table(alone + side_by_side([0, 1, 2, 3], [1, 2, 3, 4])), topology, None, HOUR0)
    assert sorted(found.jobs["n_gpus"].to_pylist()) == [6, 16, 16]
    (job,) = [row["job_id"] for row in found.jobs.to_pylist() if row["n_gpus"] == 6]
    assert gpus_by_host(found, job) == {f"host{h:02d}": [0, 1] for h in (5, 6, 7)}
    # two jobs side by side on the same hosts may be the pieces of one job that recognition split;
    # on two hosts each, they may be the two ends of a link between such pieces: no evidence of
    # how the platform hands out GPUs
    for hosts, others in (([0, 1, 2], [0, 1, 2]), ([0, 1, 2], [1, 2, 3])):
        found = recognize_hour(table(alone + side_by_side(hosts, others)), topology, None, HOUR0)
        assert 24 in found.jobs["n_gpus"].to_pylist()


def test_weak_edges_and_storage_do_not_glue_jobs():
    topology = inventory(4)
    rows = ring([0, 1], [0], 4 << 20) + ring([2, 3], [0], 8 << 20)
    at = HOUR0
    rows.append(pair_row(at, "10.0.1.3", "10.0.2.3", 1_234_567, 1, at + 5 * SECOND, at + 6 * SECOND))  # one-off copy
    for a in ("10.0.1.0", "10.0.2.0"):  # checkpoint writes to a storage server, repeated sizes
        rows.append(pair_row(at, a, "10.200.0.1", 64 << 20, 4, at + SECOND, at + 9 * SECOND))
    found = recognize_minute(table(rows), topology)
    assert hosts_of(found) == [["10.0.0", "10.0.1"], ["10.0.2", "10.0.3"]]
    assert not any("10.200.0.1" in addrs for addrs in found)


def test_a_copy_between_two_running_jobs_takes_neither_ones_nics():
    # two jobs side by side for 20 minutes: hosts 0-1 whole and rails 4-5 of hosts 2-3. In
    # minute 6 a checkpoint copy (two 1.2 GB flows, a repeated size) goes from the first to the
    # second, gluing their components for that minute. A NIC serves one job at a time: each job
    # keeps its own NICs and its life, and the copy starts no third job
    topology = inventory(4)
    rows = ring([0, 1], range(20), 4 << 20) + ring([2, 3], range(20), 8 << 20, rails=[4, 5])
    at = HOUR0 + 6 * MINUTE_NS
    rows.append(pair_row(at, "10.0.1.1", "10.0.2.4", 1_200_000_000, 2, at + 8 * SECOND, at + 9 * SECOND))
    (_, found), = recognize_hours(table(rows), topology)
    spans = found.membership.group_by("job_id").aggregate(
        [("addr", "count_distinct"), ("first_ns", "min"), ("last_ns", "max")]).sort_by("addr_count_distinct")
    assert spans["addr_count_distinct"].to_pylist() == [4, 16]
    assert [(f - HOUR0) // MINUTE_NS for f in spans["first_ns_min"].to_pylist()] == [0, 0]
    assert [(last - HOUR0) // MINUTE_NS for last in spans["last_ns_max"].to_pylist()] == [19, 19]


def test_jaccard_threshold_decides_the_rail_merge():
    # rail 0 over hosts 0-2 and rail 1 over hosts 2-4: one shared host of five, Jaccard 0.2
    topology = inventory(5)
    rows = ring([0, 1, 2], [0], 4 << 20, rails=[0]) + ring([2, 3, 4], [0], 4 << 20, rails=[1])
    assert len(recognize_minute(table(rows), topology)) == 2
    assert len(recognize_minute(table(rows), topology, params=replace(DEFAULT_PARAMS, jaccard=0.2))) == 1


def test_a_jaccard_threshold_above_the_rails_similarity_keeps_them_apart():
    # rail 0 over hosts 0-3 and rail 1 over hosts 1-4: three shared hosts of five, Jaccard 0.6
    topology = inventory(5)
    rows = ring([0, 1, 2, 3], [0], 4 << 20, rails=[0]) + ring([1, 2, 3, 4], [0], 4 << 20, rails=[1])
    assert hosts_of(recognize_minute(table(rows), topology)) == [[f"10.0.{h}" for h in range(5)]]
    apart = recognize_minute(table(rows), topology, params=replace(DEFAULT_PARAMS, jaccard=0.7))
    assert hosts_of(apart) == [[f"10.0.{h}" for h in range(4)], [f"10.0.{h}" for h in range(1, 5)]]


def pipeline_job(minutes, parts_size=4 << 20, **span):
    """An 8-host job, stages of 4 hosts: a collective over all hosts on rail 0 (one component),
    and on rails 4-7 only the pipeline hops host i -> host i + 4 (four two-host components, whose
    Jaccard with the whole is 0.25)."""
    rows = ring(list(range(8)), minutes, 96 << 20, rails=[0], flows=4, **span)
    for host in range(4):
        rows += ring([host, host + 4], minutes, parts_size, rails=range(4, 8), **span)
    return rows


def test_parts_of_a_job_busy_on_its_hosts_at_the_same_time_are_the_job():
    topology = inventory(8)
    found = recognize_minute(table(pipeline_job([0])), topology)
    assert hosts_of(found) == [[f"10.0.{h}" for h in range(8)]]
    # parts busy only after the whole stopped on their hosts may be another job's
    rows = ring(list(range(8)), [0], 96 << 20, rails=[0], flows=4, last_s=20)
    rows += ring([0, 4], [0], 6 << 20, rails=range(4, 8), first_s=30)
    assert len(recognize_minute(table(rows), topology)) == 2
    # partly shared hosts are not enough: see test_jaccard_threshold_decides_the_rail_merge


def test_a_job_whose_last_minute_shows_new_sizes_on_its_parts_stays_one_job():
    # the last second of the job: the pipeline hops carry the tied-embedding all-reduce only (a
    # size never the top one before) while the collective runs on the whole
    topology = inventory(8)
    rows = pipeline_job(range(10)) + pipeline_job([10], parts_size=64 << 20, last_s=2)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["n_hosts"] == 8 and job["status"] == "ended"
    assert found.jobs["last_seen"].cast(pa.int64()).to_pylist() == [HOUR0 + 10 * MINUTE_NS + 2 * SECOND]
    assert sorted(found.events["kind"].to_pylist()) == ["end", "start"]


def test_a_jobs_last_sync_without_repeated_sizes_still_belongs_to_it():
    # The last minute holds one step: its activation sends repeat (until 10 s), the gradient sync
    # after them sends one flow per pair (9-11 s). The job ends with its sync, not its last send.
    topology = inventory(4)
    at = HOUR0 + 5 * MINUTE_NS
    rows = ring([0, 1], range(5), 4 << 20) + ring([0, 1], [5], 4 << 20, last_s=10)
    rows += ring([0, 1], [5], 512 << 20, flows=1, first_s=9, last_s=11)
    # not the job's: one-off copies seconds after its traffic on those NICs, one to another job
    rows += [pair_row(at, "10.0.0.0", "10.0.1.0", 3 << 20, 1, at + 14 * SECOND, at + 15 * SECOND)]
    rows += ring([2, 3], range(6), 8 << 20)
    rows += [pair_row(at, "10.0.1.3", "10.0.2.3", 5 << 20, 1, at + 13 * SECOND, at + 14 * SECOND)]
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert sorted(found.jobs["hosts"].to_pylist()) == [["host00", "host01"], ["host02", "host03"]]
    by_host = {r["host"]: r["last_ns"] for r in found.membership.to_pylist()}
    assert by_host["host00"] == by_host["host01"] == at + 11 * SECOND
    assert by_host["host02"] == HOUR0 + 5 * MINUTE_NS + 59 * SECOND


def test_without_inventory_every_address_is_its_own_host():
    rows = ring([0, 1, 2], [0], 4 << 20, rails=[0, 1])
    found = recognize_minute(table(rows), Topology.empty())
    assert sorted(sorted(a) for a in found) == [["10.0.0.0", "10.0.1.0", "10.0.2.0"], ["10.0.0.1", "10.0.1.1", "10.0.2.1"]]


# --- tracking -------------------------------------------------------------------------------------


def test_job_keeps_its_id_across_hours_and_reruns():
    topology = inventory(2)
    rows = ring([0, 1], range(120), 4 << 20) + ring([0, 1], range(120), 96 << 20, flows=4)
    (_, first), (_, second) = recognize_hours(table(rows), topology)
    assert list(job_rows(first)) == list(job_rows(second))
    (job_id,) = job_rows(second)
    assert job_rows(second)[job_id]["status"] == "running"
    assert job_rows(second)[job_id]["restarts"] == 0
    again = recognize_hour(table([r for r in rows if r["minute"] >= HOUR0 + HOUR_NS]), topology,
                                json.loads(json.dumps(first.state)), HOUR0 + HOUR_NS)
    for name in ("jobs", "membership", "events"):
        assert getattr(again, name).equals(getattr(second, name))
    assert again.state == second.state


def test_restart_on_the_same_hosts_keeps_the_id():
    topology = inventory(2)
    minutes = [m for m in range(60) if not 20 <= m < 25]  # five silent minutes
    rows = ring([0, 1], minutes, 4 << 20) + ring([0, 1], minutes, 96 << 20, flows=4)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["restarts"] == 1 and job["status"] == "running"
    restart = found.events.filter(pc.equal(found.events["kind"], "restart")).to_pylist()
    assert len(restart) == 1
    assert restart[0]["at_ns"] == HOUR0 + 25 * MINUTE_NS + SECOND
    assert json.loads(restart[0]["detail"])["gap_s"] == pytest.approx(5 * 60 + 2)


def test_a_restart_whose_sizes_are_told_a_few_header_bytes_apart_keeps_the_id():
    # an exporter counting per-packet headers tells each pair's sizes a few bytes apart, minute
    # after minute: after five silent minutes, the job is known by sizes within
    # `signature_size_share` of its own, not byte for byte
    topology = inventory(2)
    minutes = [m for m in range(60) if not 20 <= m < 25]
    rows = [dict(row, top_size=row["top_size"] + 37 * minute + 11 * pair)
            for minute in minutes
            for pair, row in enumerate(ring([0, 1], [minute], 4 << 20) + ring([0, 1], [minute], 96 << 20, flows=4))]
    (job,) = job_rows(recognize_hour(table(rows), topology, None, HOUR0)).values()
    assert job["restarts"] == 1


def test_a_resume_first_seen_in_pieces_without_its_sizes_is_the_job():
    """A job on hosts 0-2 stops after minute 19 and resumes with host 2 replaced by host 3 ten
    seconds before the end of minute 24. Behind a flow cache those seconds show a few records
    on rails 0-3, each of a size of its own (transfers merged): no size to know the job by, so
    a job of their own, holding more of the resumed job's NICs than the stopped job still does.
    From minute 25 the job talks on every rail in its sizes: it resumed, and the pieces were its
    first seconds (realistic seeds 3-5: a split or spurious jobs, one with a false hang)."""
    topology = inventory(4)
    at = HOUR0 + 24 * MINUTE_NS
    # 20 records a pair, of 19 sizes: one merge repeats a size by chance
    pieces = [dict(pair_row(at, f"10.0.{a}.{rail}", f"10.0.{b}.{rail}", 700_000_000 + 7919 * (8 * rail + a), 2,
                            at + 50 * SECOND, at + 59 * SECOND), flows=20, distinct_sizes=19, bytes=12 << 30)
              for rail in range(4) for a, b in ((0, 1), (1, 3), (3, 0))]
    rows = ring([0, 1, 2], range(20), 4 << 20) + pieces + ring([0, 1, 3], range(25, 60), 4 << 20)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["restarts"] == 1 and job["hosts"] == ["host00", "host01", "host03"]
    restart = found.events.filter(pc.equal(found.events["kind"], "restart")).to_pylist()
    assert [r["at_ns"] for r in restart] == [at + 50 * SECOND]


def test_a_resume_onto_a_host_another_stopped_job_left_is_judged_by_its_sizes():
    """Job B ran on rails 0-5 of hosts 2 and 3 and stopped after minute 1; job A, on rails 4-5
    of hosts 0 and 1, stops after minute 11 and resumes at minute 15 with host 1 replaced by host
    2. Its NICs there are B's: the two stopped jobs own two NICs each of the resumed traffic, and
    the tie went to B, whose sizes it does not have, so it was a new job (sealed-14 job 004: 780
    steps unscored). The resume is A's: its sizes."""
    topology = inventory(4)
    rows = ring([2, 3], range(2), 64 << 20, rails=range(6), first_s=0.5)
    rows += ring([0, 1], range(12), 4 << 20, rails=(4, 5), first_s=2)
    rows += ring([0, 2], range(15, 40), 4 << 20, rails=(4, 5))
    found = recognize_hour(table(rows), topology, None, HOUR0)
    restarted = {tuple(r["hosts"]): r["restarts"] for r in job_rows(found).values()}
    assert restarted == {("host02", "host03"): 0, ("host00", "host01", "host02"): 1}


def test_a_restart_window_shorter_than_the_silence_makes_the_resumed_traffic_a_new_job():
    topology = inventory(2)
    minutes = [m for m in range(60) if not 20 <= m < 25]  # five silent minutes
    rows = ring([0, 1], minutes, 4 << 20) + ring([0, 1], minutes, 96 << 20, flows=4)
    impatient = replace(DEFAULT_PARAMS, restart_window_ns=4 * MINUTE_NS)
    found = recognize_hour(table(rows), topology, None, HOUR0, params=impatient)
    columns = ("first_seen", "last_seen", "restarts")
    lives = sorted(zip(*(found.jobs[name].cast(pa.int64()).to_pylist() for name in columns)))
    assert lives == [(HOUR0 + SECOND, HOUR0 + 19 * MINUTE_NS + 59 * SECOND, 0),
                     (HOUR0 + 25 * MINUTE_NS + SECOND, HOUR0 + 59 * MINUTE_NS + 59 * SECOND, 0)]


def test_a_checkpoint_save_longer_than_a_restart_gap_is_no_restart():
    """A large model's save keeps its GPUs quiet to each other for over a minute while they write
    to storage: the job is busy, and its traffic after the save does not restart it."""
    topology = inventory(2)
    minutes = [m for m in range(10) if m not in (4, 5)]  # two minutes of saving
    rows = ring([0, 1], minutes, 4 << 20, first_s=1, last_s=59)
    for minute in (3, 4, 5):  # the save begins after the sync that ends minute 3
        at = HOUR0 + minute * MINUTE_NS
        first = at + (59 if minute == 3 else 0) * SECOND
        rows += [pair_row(at, f"10.0.{h}.0", "10.200.0.1", 1 << 30, 4, first, at + 60 * SECOND - 1) for h in (0, 1)]
    found = recognize_hour(table(rows), topology, None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["restarts"] == 0
    # without the writes, the same silence is a stop and the traffic after it a restart
    quiet = recognize_hour(table([r for r in rows if r["dst_addr"] != "10.200.0.1"]), topology, None, HOUR0)
    assert [j["restarts"] for j in job_rows(quiet).values()] == [1]


def test_restart_with_a_replaced_host():
    topology = inventory(4)
    rows = ring([0, 1, 2], range(20), 4 << 20) + ring([0, 1, 3], range(24, 60), 4 << 20)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["restarts"] == 1 and job["hosts"] == ["host00", "host01", "host03"]
    replaced = found.events.filter(pc.equal(found.events["kind"], "host_replaced")).to_pylist()
    assert json.loads(replaced[0]["detail"]) == {"removed": ["host02"], "added": ["host03"]}
    spans = {r["host"]: (r["first_ns"], r["last_ns"]) for r in found.membership.to_pylist()}
    assert spans["host02"] == (HOUR0 + SECOND, HOUR0 + 19 * MINUTE_NS + 59 * SECOND)
    assert spans["host03"] == (HOUR0 + 24 * MINUTE_NS + SECOND, HOUR0 + 59 * MINUTE_NS + 59 * SECOND)
    assert found.membership.num_rows == 4 * 8


def test_new_job_on_hosts_another_just_left():
    topology = inventory(2)
    # job A until 20:10, job B (other activation and bucket sizes) from 20:30 on the same hosts
    rows = ring([0, 1], range(20), 4 << 20) + ring([0, 1], range(20), 96 << 20, flows=4)
    rows += ring([0, 1], [20], 4 << 20, last_s=10) + ring([0, 1], [20], 96 << 20, flows=4, last_s=10)
    rows += ring([0, 1], range(21, 40), 6 << 20) + ring([0, 1], range(21, 40), 200 << 20, flows=4)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert len(job_rows(found)) == 2
    statuses = sorted(r["status"] for r in job_rows(found).values())
    assert statuses == ["ended", "ended"]
    assert sorted(found.events["kind"].to_pylist()) == ["end", "end", "start", "start"]


OLD_SIZES, NEW_SIZES, SIZE_FLOWS = (4 << 20, 96 << 20), (6 << 20, 200 << 20), (12, 4)


def hosts_changing_hands(shared_size: int) -> list[dict]:
    """A 4-host job until 20:07, a job on host00 and host01 from 20:14 on (other sizes). Their
    traffic from host00 to host01 shares one row per rail, which spans the whole minute and is
    labelled `shared_size` (the size with the most flows in it)."""
    rows = [r for size, n in zip(OLD_SIZES, SIZE_FLOWS) for r in ring([0, 1, 2, 3], range(20), size, flows=n)]
    at = HOUR0 + 20 * MINUTE_NS
    rows += [{**pair_row(at, f"10.0.0.{rail}", f"10.0.1.{rail}", shared_size, 12, at + SECOND, at + 59 * SECOND),
              "distinct_sizes": 4} for rail in range(8)]

    def shared_pair(row):
        return row["src_addr"].startswith("10.0.0.") and row["dst_addr"].startswith("10.0.1.")

    for old_size, new_size, n in zip(OLD_SIZES, NEW_SIZES, SIZE_FLOWS):
        rows += [r for r in ring([0, 1, 2, 3], [20], old_size, flows=n, last_s=7) if not shared_pair(r)]
        rows += [r for r in ring([0, 1], [20], new_size, flows=n, first_s=14) if not shared_pair(r)]
        rows += ring([0, 1], range(21, 40), new_size, flows=n)
    return rows


def changed_hands(found: Recognition) -> tuple[str, str, dict, dict, dict]:
    """(old id, new id, first_seen and last_seen by id, membership spans by (id, host))."""
    by_size = dict(zip(found.jobs["n_hosts"].to_pylist(), found.jobs["job_id"].to_pylist()))
    first_seen = dict(zip(found.jobs["job_id"].to_pylist(), found.jobs["first_seen"].cast(pa.int64()).to_pylist()))
    last_seen = dict(zip(found.jobs["job_id"].to_pylist(), found.jobs["last_seen"].cast(pa.int64()).to_pylist()))
    spans = {(r["job_id"], r["host"]): (r["first_ns"], r["last_ns"]) for r in found.membership.to_pylist()}
    return by_size[4], by_size[2], first_seen, last_seen, spans


def test_a_job_taking_hosts_within_the_minute_another_ends_gets_its_traffic_from_then():
    # the shared rows carry the new job's size: the new job begins right after the old one's end
    found = recognize_hour(table(hosts_changing_hands(NEW_SIZES[1])), inventory(4), None, HOUR0)
    at = HOUR0 + 20 * MINUTE_NS
    old_end, new_start = at + 7 * SECOND, at + 7 * SECOND + 1
    old_id, new_id, first_seen, last_seen, spans = changed_hands(found)
    for host in ("host00", "host01", "host02"):
        assert spans[old_id, host] == (HOUR0 + SECOND, old_end)
    assert spans[new_id, "host01"] == (new_start, HOUR0 + 39 * MINUTE_NS + 59 * SECOND)
    assert last_seen[old_id] == old_end and first_seen[new_id] == new_start
    events = {(r["job_id"], r["kind"]): r["at_ns"] for r in found.events.to_pylist()}
    assert events[old_id, "end"] == old_end and events[new_id, "start"] == new_start

    # A flow of the old job's last step and one of the new job's first step, from the same NIC.
    flows = pa.table({"time_flow_start_ns": [at + 6 * SECOND, at + 15 * SECOND],
                      "time_flow_end_ns": [at + 7 * SECOND, at + 16 * SECOND],
                      "src_addr": ["10.0.1.0"] * 2, "dst_addr": ["10.0.0.0"] * 2,
                      "bytes": [OLD_SIZES[0], NEW_SIZES[0]], "sampler_address": ["10.9.0.1"] * 2,
                      "sampling_rate": [1, 1], "src_port": pa.array([None, None], pa.int32())})
    split = {job_id: part["bytes"].to_pylist() for job_id, part in split_flows_by_job(flows, found.membership)}
    assert split == {old_id: [OLD_SIZES[0]], new_id: [NEW_SIZES[0]]}


def test_a_pair_row_both_jobs_share_labelled_by_the_old_jobs_size_does_not_stretch_it():
    # The shared rows carry the old job's activation size and end with the new job's traffic:
    # the old job still ends with its other rows, and the new one begins with its own.
    found = recognize_hour(table(hosts_changing_hands(OLD_SIZES[0])), inventory(4), None, HOUR0)
    at = HOUR0 + 20 * MINUTE_NS
    old_id, new_id, first_seen, last_seen, spans = changed_hands(found)
    assert last_seen[old_id] == at + 7 * SECOND and first_seen[new_id] == at + 14 * SECOND
    assert spans[old_id, "host00"] == (HOUR0 + SECOND, at + 7 * SECOND)
    assert spans[new_id, "host00"] == (at + 14 * SECOND, HOUR0 + 39 * MINUTE_NS + 59 * SECOND)
    # the new job's first flows are its own, not the old job's
    flows = pa.table({"time_flow_start_ns": [at + 15 * SECOND], "time_flow_end_ns": [at + 16 * SECOND],
                      "src_addr": ["10.0.1.0"], "dst_addr": ["10.0.0.0"],
                      "bytes": [NEW_SIZES[0]], "sampler_address": ["10.9.0.1"], "sampling_rate": [1],
                      "src_port": pa.array([None], pa.int32())})
    assert [job_id for job_id, _ in split_flows_by_job(flows, found.membership)] == [new_id]


def test_a_job_taking_hosts_where_both_jobs_share_a_size_starts_with_its_own_pairs():
    topology = inventory(6)
    old_size, activation = 5 << 20, 96 << 20
    rows = ring(list(range(6)), range(20), old_size)
    # 20:07 the 6-host job ends; 20:14 a job starts on host00-host03. Its stage pairs (0-2, 1-3)
    # are new; on 0-1 and 2-3 its all-to-all uses a family of sizes, one of them the old job's,
    # so those rows span the whole minute and half of them carry the old job's size.
    at = HOUR0 + 20 * MINUTE_NS

    def all_to_all(minutes, first_s):
        return [r for pair in ([0, 1], [2, 3]) for rails, size in ((range(4), old_size), (range(4, 8), 6 << 20))
                for r in ring(pair, minutes, size, rails=rails, first_s=first_s)]

    rows += [r for r in ring(list(range(6)), [20], old_size, last_s=7) if r["src_addr"][:7] not in ("10.0.0.", "10.0.2.")]
    rows += all_to_all([20], 1) + all_to_all(range(21, 40), 1)
    rows += [r for pair in ([0, 2], [1, 3]) for r in ring(pair, [20], activation, first_s=14) + ring(pair, range(21, 40), activation)]
    found = recognize_hour(table(rows), topology, None, HOUR0)

    by_size = dict(zip(found.jobs["n_hosts"].to_pylist(), found.jobs["job_id"].to_pylist()))
    old_id, new_id = by_size[6], by_size[4]
    first_seen = dict(zip(found.jobs["job_id"].to_pylist(), found.jobs["first_seen"].cast(pa.int64()).to_pylist()))
    # it begins with its own pairs' traffic, or with the all-to-all on the shared pairs in the
    # moments before (its first collective reaches its pairs within them)
    begins = at + 14 * SECOND - DEFAULT_PARAMS.handover_lead_in_ns
    assert first_seen[new_id] == begins
    spans = {(r["job_id"], r["host"]): (r["first_ns"], r["last_ns"]) for r in found.membership.to_pylist()}
    assert spans[old_id, "host00"][1] == begins - 1  # the old job holds it until then
    assert spans[old_id, "host05"][1] == at + 7 * SECOND


def ring_flows(hosts, from_s, to_s, sizes) -> list[dict]:
    """Flows of a ring over `hosts` on every rail: one of each size per pair every 2 s from
    `from_s` to `to_s` (seconds into the hour), each lasting 1 ms."""
    return [{"time_flow_start_ns": HOUR0 + at * SECOND, "time_flow_end_ns": HOUR0 + at * SECOND + 10**6,
             "src_addr": f"10.0.{a}.{rail}", "dst_addr": f"10.0.{b}.{rail}", "bytes": size, "sampler_address": "10.9.0.1"}
            for at in range(from_s, to_s + 1, 2) for rail in range(8)
            for a, b in zip(hosts, hosts[1:] + hosts[:1]) for size in sizes]


@pytest.mark.parametrize(
    ("old_end_s", "new_start_s"),
    [(146, 152), (20 * 60 + 16, 20 * 60 + 28)],
    ids=["a-young-job-hands-over", "a-job-hands-over-within-a-minute"],
)
def test_a_job_with_other_sizes_on_the_hosts_a_job_left_seconds_before_in_the_minute(old_end_s, new_start_s):
    """The two jobs talk on the same NIC pairs within one minute: the pair rows split at the
    silence between them, so neither job's traffic is read as the other's, even when the old job
    is minutes old (its sizes may not all be known) or its traffic reaches into the new one's minute."""
    rows = ring_flows([0, 1], 0, old_end_s, OLD_SIZES) + ring_flows([0, 1], new_start_s, 40 * 60, NEW_SIZES)
    raw = pa.Table.from_pylist(rows)
    flows = conform(raw.append_column("minute", minute_of(raw["time_flow_start_ns"])), FLOWS)
    found = recognize_hour(minute_aggregates(flows), inventory(2), None, HOUR0)

    assert found.jobs.num_rows == 2
    first_seen = found.jobs["first_seen"].cast(pa.int64()).to_pylist()
    old_id, new_id = (found.jobs["job_id"][i].as_py() for i in np.argsort(first_seen))
    last_seen = dict(zip(found.jobs["job_id"].to_pylist(), found.jobs["last_seen"].cast(pa.int64()).to_pylist()))
    assert last_seen[old_id] == HOUR0 + old_end_s * SECOND + 10**6
    assert max(first_seen) == HOUR0 + new_start_s * SECOND
    split = {job_id: set(part["bytes"].to_pylist()) for job_id, part in split_flows_by_job(flows, found.membership)}
    assert split == {old_id: set(OLD_SIZES), new_id: set(NEW_SIZES)}


def test_a_new_job_on_part_of_the_hosts_a_short_job_left_is_another_job():
    topology = inventory(4)
    # a 4-host job of two minutes (young: its sizes are not all known yet), silent from 01:50;
    # 20 s later a job with other sizes starts on two of its hosts
    rows = ring([0, 1, 2, 3], [0], 4 << 20) + ring([0, 1, 2, 3], [1], 4 << 20, last_s=50)
    rows += ring([0, 1], [2], 6 << 20, first_s=10) + ring([0, 1], range(3, 10), 6 << 20)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert sorted(r["n_hosts"] for r in job_rows(found).values()) == [2, 4]


def test_same_hosts_after_a_pause_with_other_sizes_is_a_new_job():
    topology = inventory(2)
    rows = ring([0, 1], range(10), 4 << 20) + ring([0, 1], range(10), 96 << 20, flows=4)
    rows += ring([0, 1], range(15, 30), 4 << 20) + ring([0, 1], range(15, 30), 300 << 20, flows=4)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert len(job_rows(found)) == 2
    assert all(r["restarts"] == 0 for r in job_rows(found).values())


def test_a_new_job_after_a_pause_is_told_by_its_timed_sizes_not_by_a_samplers_estimates():
    # rails 4-7 behind packet samplers: their sizes are estimates, whole multiples of a packet
    # times the rate, and two jobs' estimates recur alike; rails 0-3 show each job's own sizes,
    # which are its signature. Job B begins on the same hosts 41 s after job A's last traffic
    topology = inventory(2)

    def job(minutes, sizes, **span):
        timed = [dict(row, sampling_rate=1) for size, flows in zip(sizes, SIZE_FLOWS)
                 for row in ring([0, 1], minutes, size, rails=range(4), flows=flows, **span)]
        estimates = [dict(row, sampling_rate=1024) for size in (64 << 20, 512 << 20)
                     for row in ring([0, 1], minutes, size, rails=range(4, 8), **span)]
        return timed + estimates

    rows = job(range(9), OLD_SIZES) + job([9], OLD_SIZES, last_s=19) + job(range(10, 20), NEW_SIZES, first_s=0)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    assert len(job_rows(found)) == 2
    assert all(r["restarts"] == 0 for r in job_rows(found).values())


def test_a_ring_whose_flows_differ_by_a_few_header_bytes_is_a_job():
    topology = inventory(4)
    # 12 transfers of one size per pair and minute, each told a few bytes apart: no exact repeat
    rows = [dict(row, top_size_flows=1, distinct_sizes=row["flows"], bytes=row["bytes"] + 3000)
            for row in ring([0, 1, 2, 3], range(5), 4 << 20)]
    # and pairs whose two flows are of unlike sizes for two minutes: no job traffic (a job's pairs
    # behind a flow cache, whose sizes never repeat either, talk minute after minute)
    rows += [dict(row, top_size_flows=1, distinct_sizes=2, bytes=(4 << 20) + (40 << 20))
             for row in ring([4, 5], range(2), 4 << 20, flows=2)]
    found = recognize_hour(table(rows), inventory(6), None, HOUR0)
    assert [r["n_hosts"] for r in job_rows(found).values()] == [4]
    assert [r["n_gpus"] for r in job_rows(found).values()] == [32]


def test_traffic_on_part_of_a_jobs_nics_begun_before_its_last_record_ended_continues_it():
    # behind a flow cache a job's records reach into the next minute, and their sizes (sums of
    # transfers) change every minute; in minute 6 only half its rails report
    rows = []
    for minute in range(10):
        rails = range(4) if minute == 6 else range(8)
        rows += ring([0, 1, 2, 3], [minute], (4 << 20) + minute * 4096, rails=rails, first_s=0.5, last_s=61)
    found = recognize_hour(table(rows), inventory(4), None, HOUR0)
    assert [r["n_gpus"] for r in job_rows(found).values()] == [32]


def test_a_part_of_a_running_job_talking_beside_it_in_the_minute_is_the_job():
    # minute 10: the job's pipeline rails 6-7 between hosts 0 and 1 form a component of their own,
    # out of step with the rest and with a size not seen before, while the job talks on its other rails
    hosts = [0, 1, 2, 3, 4]
    rows = ring(hosts, range(10), 4 << 20) + ring(hosts, range(10), 96 << 20, flows=4)
    rows += ring(hosts, [10], 4 << 20, rails=range(6)) + ring(hosts, [10], 96 << 20, rails=range(6), flows=4)
    rows += ring([0, 1], [10], 7 << 20, rails=(6, 7), first_s=5, last_s=50)
    found = recognize_hour(table(rows), inventory(5), None, HOUR0)
    assert [r["n_gpus"] for r in job_rows(found).values()] == [40]


def parts_then_whole(hosts_a, hosts_b, minutes, size=4 << 20, bucket=96 << 20):
    """A 4-host job whose first minute shows two separate pipelines (no DP sync yet), then whole."""
    first, rest = minutes[0], minutes[1:]
    rows = ring(hosts_a, [first], size) + ring(hosts_b, [first], size)
    return rows + ring(hosts_a + hosts_b, rest, size) + ring(hosts_a + hosts_b, rest, bucket, flows=4)


def test_a_job_first_seen_in_parts_is_one_job():
    topology = inventory(4)
    found = recognize_hour(table(parts_then_whole([0, 2], [1, 3], list(range(5, 30)))), topology, None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["n_hosts"] == 4
    assert found.events["kind"].to_pylist() == ["start", "end"]
    assert set(found.membership["job_id"].to_pylist()) == {job["job_id"]}


def test_a_restart_seen_in_parts_resumes_the_job():
    topology = inventory(4)
    rows = ring([0, 1, 2, 3], range(10), 4 << 20) + ring([0, 1, 2, 3], range(10), 96 << 20, flows=4)
    rows += parts_then_whole([0, 2], [1, 3], list(range(14, 30)))
    found = recognize_hour(table(rows), topology, None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["restarts"] == 1 and job["n_hosts"] == 4


def test_a_running_job_whose_hosts_another_takes_next_hour_ends_there():
    topology = inventory(2)
    first = recognize_hour(table(ring([0, 1], range(30, 60), 4 << 20, last_s=30)), topology, None, HOUR0)
    (old_id,) = job_rows(first)
    assert job_rows(first)[old_id]["status"] == "running"  # silent only 30 s at the hour's end
    later = [{**row, "minute": row["minute"] + HOUR_NS, "first_start_ns": row["first_start_ns"] + HOUR_NS,
              "last_end_ns": row["last_end_ns"] + HOUR_NS} for row in ring([0, 1], range(5, 20), 9 << 20)]
    second = recognize_hour(table(later), topology, json.loads(json.dumps(first.state)), HOUR0 + HOUR_NS)
    assert job_rows(second)[old_id]["status"] == "ended"
    assert len(job_rows(second)) == 2
    ends = second.events.filter(pc.equal(second.events["kind"], "end"))["job_id"].to_pylist()
    assert old_id in ends


def test_a_job_seen_until_the_hour_end_closes_in_the_next_hour():
    topology = inventory(2)
    rows = ring([0, 1], range(60), 4 << 20)
    first = recognize_hour(table(rows), topology, None, HOUR0)
    empty = FLOW_MINUTES.empty_table()
    second = recognize_hour(empty, topology, json.loads(json.dumps(first.state)), HOUR0 + HOUR_NS)
    (job,) = job_rows(second).values()
    assert job["status"] == "ended"
    assert second.events["kind"].to_pylist() == ["end"]
    assert second.state["jobs"] == []  # silent for longer than a restart could be


# --- the state handed to the next hour -------------------------------------------------------------


def test_state_round_trips_through_json():
    # host02-host03 stopped 20 minutes before the hour's end (carried: it may still restart),
    # host00-host01 runs to the end
    topology = inventory(4)
    rows = ring([2, 3], range(10, 40), 6 << 20) + ring([0, 1], range(50, 60), 4 << 20)
    rows += ring([0, 1], range(50, 60), 96 << 20, flows=4)
    found = recognize_hour(table(rows), topology, None, HOUR0)
    state = RecognitionState.load(json.loads(json.dumps(found.state)))
    assert state.dump() == found.state
    assert RecognitionState.load(state.dump()) == state
    stopped, running = state.tracks  # in creation order
    def nics_of(hosts):
        return tuple(sorted(f"10.0.{h}.{g}" for h in hosts for g in range(8)))

    assert (stopped.nics, stopped.status, stopped.reported_end) == (nics_of([2, 3]), "ended", True)
    assert stopped.last_end_ns == HOUR0 + 39 * MINUTE_NS + 59 * SECOND
    assert (running.nics, running.status, running.restarts) == (nics_of([0, 1]), "running", 0)
    # (size, flows, minutes): 8 rails both ways, 12 and 4 flows per row, over 10 minutes
    assert running.signature == ((4 << 20, 16 * 12 * 10, 10), (96 << 20, 16 * 4 * 10, 10))
    assert RecognitionState.load(None) == RecognitionState.load({}) == RecognitionState()


def test_a_state_of_another_version_is_refused():
    found = recognize_hour(table(ring([0, 1], range(50, 60), 4 << 20)), inventory(2), None, HOUR0)
    older = {**found.state, "version": STATE_VERSION - 1}
    with pytest.raises(ValueError, match=f"version {STATE_VERSION - 1}, this Prism reads version {STATE_VERSION}"):
        recognize_hour(FLOW_MINUTES.empty_table(), inventory(2), older, HOUR0 + HOUR_NS)


# --- on simulated scenarios -----------------------------------------------------------------------


def membership_warehouse(recognitions: list[tuple[int, Recognition]]) -> dict[str, pa.Table]:
    """The warehouse tables the scorer needs, with job_gpus taken from the membership."""
    return {
        "jobs": pa.concat_tables([r.jobs for _, r in recognitions]),
        "job_gpus": pa.concat_tables([r.membership.select(["job_id", "addr"]) for _, r in recognitions]),
        "comm_pairs": pa.table({"job_id": pa.array([], pa.string()), "src_addr": pa.array([], pa.string()),
                                "dst_addr": pa.array([], pa.string()), "kind": pa.array([], pa.string())}),
    }


def test_tiny_scenario_jobs_and_restarts(scenario_dir):
    flows, flow_minutes, topology, truth = scenario_flows(scenario_dir("tiny"))
    recognitions = recognize_hours(flow_minutes, topology)
    assert len(recognitions) == 2  # the scenario crosses an hour boundary
    figures = job_scores.score(truth, membership_warehouse(recognitions), {})
    assert figures["jobs_matched_exactly"].value == 1.0
    assert figures["jobs_split_or_merged"].value == 0
    # the hung job and the job that later starts on its hosts are two jobs
    assert figures["prism_jobs"].value == figures["true_jobs"].value == 3


# Behind realistic exporters (flow caches, sFlow sampling, ms clocks, loss, header bytes) a job's
# records carry no exact repeated sizes and no fine timing; before tracking relied on neither,
# recognition matched 1 of 9 true jobs on this dev hour (seed 3; seeds 0-2 are held out).
REALISTIC_JOBS_EXACT = 0.3


def test_realistic_exporters_keep_jobs_whole(scenario_dir):
    _, flow_minutes, topology, truth = scenario_flows(scenario_dir("realistic", 3))
    figures = job_scores.score(truth, membership_warehouse(recognize_hours(flow_minutes, topology)), {})
    assert figures["jobs_matched_exactly"].value >= REALISTIC_JOBS_EXACT


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_small_scenario_recognition(scenario_dir, seed):
    _, flow_minutes, topology, truth = scenario_flows(scenario_dir("small", seed))
    recognitions = recognize_hours(flow_minutes, topology)
    figures = job_scores.score(truth, membership_warehouse(recognitions), {})
    assert figures["jobs_matched_exactly"].value == 1.0
    assert figures["jobs_split_or_merged"].value == 0
    assert figures["prism_jobs"].value == figures["true_jobs"].value
    restarted = truth["jobs"].filter(pc.greater(truth["jobs"]["restarts"], 0))["restarts"].to_pylist()
    found = pa.concat_tables([r.jobs for _, r in recognitions]).group_by("job_id").aggregate([("restarts", "max")])
    assert sorted(r for r in found["restarts_max"].to_pylist() if r) == sorted(restarted)


@pytest.mark.slow
def test_fleet_minute_recognition_time(scenario_dir):
    _, flow_minutes, topology, truth = scenario_flows(scenario_dir("fleet"))
    minute = flow_minutes["minute"].cast(pa.int64()).to_numpy()
    busiest = np.bincount(np.unique(minute, return_inverse=True)[1]).argmax()
    one = flow_minutes.filter(pa.array(minute == np.unique(minute)[busiest]))
    recognize_minute(one, topology)  # warm-up
    began = time.perf_counter()
    found = recognize_minute(one, topology)
    assert time.perf_counter() - began < 1.0
    assert len(found) >= 10
    figures = job_scores.score(truth, membership_warehouse(recognize_hours(flow_minutes, topology)), {})
    assert figures["jobs_matched_exactly"].value >= 0.99
    assert figures["jobs_split_or_merged"].value == 0


def test_a_job_behind_flow_caches_is_one_job_with_one_id_across_hours():
    # Behind flow caches every record is a sum of transfers: no size repeats on any pair, and each
    # rail's leaf cuts its records at its own moments, so the rails' minutes are out of step. The
    # pairs talk minute after minute; a one-off copy to a host of another job does not.
    rows = []
    for minute in range(50, 70):
        rails = range(4) if minute == 60 else range(8)  # half the rails' records of minute 60 lost
        for rail in rails:
            for pair, row in enumerate(ring([0, 1, 2, 3], [minute], 1, rails=[rail], flows=3,
                                            first_s=0.4 + 6.1 * rail, last_s=59.9 - 3.3 * rail)):
                rows.append(dict(row, top_size_flows=1, distinct_sizes=3,
                                 bytes=7_000_003 * (minute + 1) + 104_729 * rail + 1_301 * pair))
    rows += ring([4, 5], range(50, 70), 4 << 20)  # another job, to receive the copy
    copy_at = HOUR0 + 55 * MINUTE_NS
    rows.append(pair_row(copy_at, "10.0.0.0", "10.0.4.0", 3 << 30, 1, copy_at + 20 * SECOND, copy_at + 22 * SECOND))
    (_, first), (_, second) = recognize_hours(table(rows), inventory(6))
    cached = {r["job_id"]: r for r in first.jobs.to_pylist() if r["n_hosts"] == 4}
    assert [r["n_gpus"] for r in cached.values()] == [32]
    assert [r["job_id"] for r in second.jobs.to_pylist() if r["n_hosts"] == 4] == list(cached)
    assert sorted(r["n_hosts"] for r in first.jobs.to_pylist()) == [2, 4]


def test_a_job_behind_flow_caches_restarting_on_a_replaced_host_keeps_its_id():
    # A steady job's cache merges each queue pair's transfers into records that run on past their
    # minute; their sums recur minute after minute (two records of one sum). Four silent minutes
    # later the job warms up on its hosts but one: its first minute's records are single transfers
    # (the pairs idle between them), then sums again, other ones. Its sizes tell nothing across the
    # restart: the hosts decide.
    rows = [dict(row, bytes=row["top_size"] * 2) for row in
            ring([0, 1, 2], range(20), 61_068_093_440, flows=2, first_s=0.5, last_s=65)]
    rows += ring([0, 1, 3], [24], 750_000_128, flows=12)
    rows += [dict(row, bytes=row["top_size"] * 2) for row in
             ring([0, 1, 3], range(25, 50), 57_318_093_312, flows=2, first_s=0.5, last_s=65)]
    found = recognize_hour(table(rows), inventory(4), None, HOUR0)
    (job,) = job_rows(found).values()
    assert job["restarts"] == 1 and job["hosts"] == ["host00", "host01", "host03"]


def test_a_rail_whose_cache_sums_look_alike_by_chance_is_job_traffic_from_its_first_minute():
    # Rails 0-6 of a job over two hosts report transfers one by one; rail 7's leaf keeps a cache
    # whose records run on past their minute. Two sums of as many transfers look alike (a
    # "repeated" size) in most minutes, not in the first two: the rail's pair still tells nothing by
    # its sizes, so all its minutes are the job's, and its life begins with the job's.
    rows = ring([0, 1], range(30, 50), 50 << 20, rails=range(7))
    for minute in range(30, 50):
        at = HOUR0 + minute * MINUTE_NS
        for src, dst in (("10.0.0.7", "10.0.1.7"), ("10.0.1.7", "10.0.0.7")):
            row = pair_row(at, src, dst, 1_205_862_400, 2, at + SECOND // 2, at + 70 * SECOND)
            if minute < 32:
                row.update(flows=3, top_size=80 << 20, bytes=2_506_096_640, distinct_sizes=3)
            rows.append(dict(row, top_size_flows=1, bytes=row["bytes"] + 20_971_520 * (minute >= 32)))
    (_, found), = recognize_hours(table(rows), inventory(2))
    assert [r["n_gpus"] for r in found.jobs.to_pylist()] == [16]


def test_a_rail_whose_cache_shows_a_pause_the_other_rails_bridge_stays_in_its_job():
    # Every rail's leaf keeps a cache whose records run on past their minute, cut at the leaf's own
    # moments (the rails are out of step, and no size repeats); the job pauses its GPU traffic for
    # 17 s (a save to storage). Rail 7's cache ends its record at the pause, the others' hold
    # theirs through it: rail 7's life goes on, and it stays in the job.
    rows = []
    for minute in range(30, 50):
        at = HOUR0 + minute * MINUTE_NS
        for rail in range(8):
            first_s, last_s = 0.4 + 1.1 * rail, 61.0 + 0.5 * rail  # each leaf cuts at its own moments
            if rail == 7 and minute in (34, 35):
                first_s, last_s = (0.4, 50.0) if minute == 34 else (7.0, 65.0)
            for src, dst in ((0, 1), (1, 0)):
                rows.append(dict(pair_row(at, f"10.0.{src}.{rail}", f"10.0.{dst}.{rail}", 700_000_000 + 7_919 * minute, 3,
                                          at + round(first_s * SECOND), at + round(last_s * SECOND)),
                                 top_size_flows=1, distinct_sizes=3, bytes=2_500_000_000 + 104_729 * rail))
    (_, found), = recognize_hours(table(rows), inventory(2))
    assert [r["n_gpus"] for r in found.jobs.to_pylist()] == [16]


@pytest.mark.parametrize(("runs_on_s", "one_job"), [(6.0, True), (0.0, False)], ids=["records-run-on", "records-end"])
def test_rails_whose_cache_sums_recur_are_one_job_only_where_their_records_run_past_the_minute(runs_on_s, one_job):
    # Each rail's leaf merges a step's transfers into one record: the sums recur on the rail
    # (sized), but each leaf's timeouts give its own sum, and rails 4-7 are cut at their leaves'
    # own moments (out of step, no size in common). Records that run on past their minute's end
    # (a cache holding the flow) show neither when the rail's traffic starts nor when it ends:
    # the rails' shared life decides. Ending inside the minute, they are timed: out of step, apart.
    rows = []
    for rail in range(8):
        cut = rail >= 4
        rows += [dict(row, bytes=row["top_size"] * 6) for row in ring(
            [0, 1, 2, 3], range(30, 50), 50_000_000 + 3_000_000 * rail, rails=[rail], flows=6,
            first_s=0.4 + (5.3 * rail if cut else 0.0), last_s=(59.9 + runs_on_s) if cut else 59.9)]
    (_, found), = recognize_hours(table(rows), inventory(4))
    assert sorted(r["n_gpus"] for r in found.jobs.to_pylist()) == ([32] if one_job else [4, 4, 4, 4, 16])
