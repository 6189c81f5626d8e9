"""The simulator's export layer: each ExportOptions field alone does what exporters do."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from prism_core.ingest import dedupe, parse_flow_file
from prism_core.simulate import SCENARIOS, write_scenario
from prism_core.simulate.cluster import Cluster
from prism_core.simulate.exporters import L3_HEADERS, ExportLayer, FlowCache, Records
from prism_core.simulate.scenarios import ExportOptions
from prism_core.simulate.traffic import ROCE_PORT, UDP, FlowBatch

TINY = SCENARIOS["tiny"]
MS = 1_000_000


def transfers(start_s, end_s, nbytes=4096 * 100, src_port=50000) -> Records:
    """Transfers on one queue pair (NIC 0 -> NIC 8), or on `src_port` per transfer."""
    start, end = np.asarray(start_s, float), np.asarray(end_s, float)
    n = len(start)
    batch = FlowBatch(start, end, np.zeros(n, np.int32), np.full(n, 8, np.int32),
                      np.broadcast_to(np.asarray(nbytes, np.int64), n).copy(),
                      np.broadcast_to(np.asarray(src_port, np.int32), n).copy(),
                      np.full(n, ROCE_PORT, np.int32), np.full(n, UDP, np.int16))
    return Records.of_transfers(batch, np.zeros(n, np.int32))


def cache(idle_s: float, active_s: float) -> FlowCache:
    return FlowCache(np.array([idle_s]), np.array([active_s]))


def spans(records: Records) -> list[tuple[float, float]]:
    order = np.argsort(records.start)
    return list(zip(records.start[order].tolist(), records.end[order].tolist()))


def test_flow_cache_merges_a_queue_pairs_transfers_and_splits_at_the_idle_timeout():
    # three transfers 2 ms apart, a pause of 0.5 s, two more; a second queue pair in between
    sent = Records.concat([
        transfers([0.0, 0.003, 0.006, 0.507, 0.510], [0.001, 0.004, 0.007, 0.508, 0.511]),
        transfers([0.002], [0.0025], src_port=50001),
    ])
    flows_cache = cache(idle_s=0.1, active_s=30.0)
    records = Records.concat([flows_cache.update(sent, now_s=60.0), flows_cache.flush()])
    assert len(records) == 3
    one_pair = records.take(records.src_port == 50000)
    assert spans(one_pair) == [(0.0, 0.007), (0.507, 0.511)]
    assert sorted(one_pair.nbytes.tolist()) == [2 * 409600, 3 * 409600]
    assert sorted(one_pair.packets.tolist()) == [200, 300]
    # a shorter idle timeout than the 2 ms gaps: one record per transfer
    short = cache(idle_s=0.001, active_s=30.0)
    assert len(short.update(sent, now_s=60.0)) + len(short.flush()) == 6


def test_flow_cache_cuts_at_the_active_timeout_and_splits_a_long_transfer_by_time():
    # a 2.5 s transfer, then 10 ms transfers every 0.2 s from 2.6 s to 3.8 s
    every = np.round(np.arange(2.6, 3.9, 0.2), 1)
    sent = transfers([0.0, *every], [2.5, *every + 0.01], nbytes=[10**9, *[4096] * len(every)])
    flows_cache = cache(idle_s=1.0, active_s=1.0)
    records = Records.concat([flows_cache.update(sent, now_s=60.0), flows_cache.flush()])
    # cut every second from the first packet; after the cut at 3.0 s the next record starts
    # with the next transfer (at 3.0 s itself here)
    assert np.ravel(spans(records)) == pytest.approx([0.0, 1.0, 1.0, 2.0, 2.0, 2.81, 3.0, 3.81])
    by_start = records.take(np.argsort(records.start))
    assert by_start.nbytes.tolist() == [4 * 10**8, 4 * 10**8, 2 * 10**8 + 2 * 4096, 5 * 4096]
    assert records.packets.sum() == sent.packets.sum()


def test_flow_cache_fed_a_minute_at_a_time_gives_the_records_of_one_pass():
    rng = np.random.default_rng(4)
    start = np.sort(rng.uniform(0, 180, 3000))
    sent = transfers(start, start + rng.uniform(0.001, 0.05, 3000), src_port=50000 + rng.integers(0, 4, 3000))
    whole = cache(idle_s=0.3, active_s=5.0)
    expected = Records.concat([whole.update(sent, now_s=180.0), whole.flush()])
    streamed = cache(idle_s=0.3, active_s=5.0)
    parts = [streamed.update(sent.take((start >= m * 60) & (start < (m + 1) * 60)), (m + 1) * 60.0)
             for m in range(3)]
    got = Records.concat(parts + [streamed.flush()])
    key = lambda r: sorted(zip(r.start.tolist(), r.end.tolist(), r.nbytes.tolist(), r.src_port.tolist()))
    assert key(got) == key(expected)
    assert len(got) < len(sent) / 2  # it merged


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """export(options) -> directory of tiny seed 0 simulated with those options."""
    made: dict = {}

    def export(options: ExportOptions) -> Path:
        if options not in made:
            out = tmp_path_factory.mktemp("export")
            write_scenario(replace(TINY, export=options), out, seed=0)
            made[options] = out
        return made[options]

    return export


def flows(out: Path) -> pa.Table:
    """The clean rows of every flow file, as ingest reads them."""
    return pa.concat_tables([parse_flow_file(p.read_bytes(), str(p)).clean for p in sorted((out / "flows").iterdir())])


def export_truth(out: Path) -> dict:
    return json.loads((out / "truth" / "export.json").read_text())


def test_by_default_every_exporter_sends_each_transfer_once(scenario_dir):
    truth = export_truth(scenario_dir("tiny"))
    assert {info["kind"] for info in truth["exporters"].values()} == {"per_transfer"}
    counts = truth["counts"]
    assert counts["records"] == counts["transfers"] > 0
    assert counts["copies"] == counts["lost"] == counts["unsampled"] == 0


def test_milliseconds_truncate_each_exporters_times(exported, scenario_dir):
    plain, truncated = flows(scenario_dir("tiny")), flows(exported(ExportOptions(milliseconds=1.0)))
    for name in ("time_flow_start_ns", "time_flow_end_ns"):
        assert np.array_equal(np.sort(truncated[name].to_numpy()), np.sort(plain[name].to_numpy()) // MS * MS)
    assert (truncated["time_flow_start_ns"].to_numpy() % MS == 0).all()


def test_sflow_samples_packets_binomially_and_estimates_bytes():
    scenario = replace(TINY, sampled_leaves=0, export=ExportOptions(sflow=1.0, sflow_rate=(1024, 1024)))
    layer = ExportLayer(scenario, Cluster(TINY.n_hosts), seed=0)
    n, size = 20_000, 4096 * 2000  # 2,000 packets a transfer: about 2 samples each
    start = np.linspace(0, 50, n)
    batch = FlowBatch(start, start + 0.01, np.zeros(n, np.int32), np.full(n, 8, np.int32),
                      np.full(n, size, np.int64), np.full(n, 50000, np.int32), np.full(n, ROCE_PORT, np.int32),
                      np.full(n, UDP, np.int16))
    records, _ = layer.observe(batch, 60.0, np.random.default_rng(0))
    assert (records.rate == 1024).all()
    estimated = records.nbytes * records.rate  # what ingest makes of them
    assert estimated.sum() == pytest.approx(n * size, rel=0.02)
    # binomial, not an exact division: unequal counts, and some transfers with no sample at all
    assert len(np.unique(records.packets)) > 3
    assert layer.counts.unsampled == n - len(records) > 0.1 * n
    # no flow start or end: one instant, inside its transfer
    assert (records.start == records.end).all()
    transfer = np.searchsorted(start, records.start, side="right") - 1
    assert (records.start - start[transfer] <= 0.01).all()


def test_loss_drops_the_drawn_share_of_records(exported, scenario_dir):
    out = exported(ExportOptions(loss=(0.03, 0.03)))
    counts = export_truth(out)["counts"]
    assert counts["lost"] / counts["records"] == pytest.approx(0.03, abs=0.01)
    missing = flows(scenario_dir("tiny")).num_rows - flows(out).num_rows
    assert missing == pytest.approx(counts["lost"], rel=0.1)


def test_double_export_repeats_records_from_second_agents_on_their_own_clocks(exported, scenario_dir):
    out = exported(ExportOptions(double_export=1.0))
    exporters = export_truth(out)["exporters"]
    assert sum(info["kind"] == "second_agent" for info in exporters.values()) == 8  # tiny's 8 leaves
    layer = ExportLayer(TINY, Cluster(TINY.n_hosts), 0)
    offset = {address: exporters[name]["clock_offset_ns"]
              for address, name in zip(layer.addresses.to_pylist(), layer.names)}

    def true_times(table: pa.Table) -> set[tuple]:
        """(5-tuple, start on no exporter's clock) of each distinct record."""
        shift = np.array([offset[a] for a in table["sampler_address"].to_pylist()])
        start = table["time_flow_start_ns"].to_numpy() - shift
        return set(zip(*(table[c].to_pylist() for c in ("src_addr", "dst_addr", "src_port", "dst_port")),
                       start.tolist()))

    table = flows(out)
    second = np.array([int(a.rsplit(".", 1)[1]) > 128 for a in table["sampler_address"].to_pylist()])
    copies, originals = table.filter(second), table.filter(~second)
    plain = flows(scenario_dir("tiny"))
    assert true_times(originals) == true_times(plain)
    # every flow to a GPU NIC crosses the leaf delivering it, and comes again from its second agent
    to_gpus = plain.filter(pc.invert(pc.starts_with(plain["dst_addr"], "10.2")))
    assert true_times(copies) == true_times(to_gpus)
    # ingest counts each flow once again
    assert dedupe(table)[0].num_rows == pytest.approx(dedupe(plain)[0].num_rows, rel=1e-3)


def test_drift_grows_with_time(exported, scenario_dir):
    out = exported(ExportOptions(drift_ppm=50.0))
    leaf = export_truth(out)["exporters"]["leaf-p00-r0"]
    mine = lambda table: table.filter(pc.equal(table["sampler_address"], "172.31.0.1"))
    plain = np.sort(mine(flows(scenario_dir("tiny")))["time_flow_start_ns"].to_numpy())
    drifted = np.sort(mine(flows(out))["time_flow_start_ns"].to_numpy())
    since_start = plain - (TINY.start_ns + leaf["clock_offset_ns"])
    error = drifted - plain
    assert np.abs(error - leaf["clock_drift_ppm"] * 1e-6 * since_start).max() <= 1
    late, early = since_start > 600e9, since_start < 60e9
    assert np.abs(error[late]).min() > 10 * np.abs(error[early]).max()


def test_header_bytes_make_equal_transfers_report_unequal_bytes(exported, scenario_dir):
    plain, counted = flows(scenario_dir("tiny")), flows(exported(ExportOptions(header_bytes=True)))
    roce = lambda table: table.filter(pc.equal(table["proto"], UDP))
    payload, packets = (roce(plain)[c].to_numpy() for c in ("bytes", "packets"))
    reported = roce(counted)["bytes"].to_numpy()
    assert (reported >= payload + packets * L3_HEADERS[UDP]).all()
    sizes, counts = np.unique(payload, return_counts=True)
    most_common = sizes[np.argmax(counts)]
    assert len(np.unique(reported[payload == most_common])) > 10


def test_realistic_generates_and_ingests(tmp_path):
    out = tmp_path / "realistic"
    summary = write_scenario("realistic", out, seed=0)
    noise = json.loads((out / "truth" / "noise.json").read_text())
    truth = export_truth(out)
    kinds = {info["kind"] for info in truth["exporters"].values()}
    assert {"flow_cache", "sflow", "second_agent"} <= kinds
    assert truth["counts"]["lost"] > 0 and truth["counts"]["records"] < truth["counts"]["transfers"]
    parsed = [parse_flow_file(p.read_bytes(), str(p)) for p in sorted((out / "flows").iterdir())]
    assert sum(p.rows_read for p in parsed) == noise["rows_written"]
    assert sum(p.quarantine.num_rows for p in parsed) == noise["malformed_total"]
    table = pa.concat_tables([p.clean for p in parsed])
    minute = table["minute"].cast(pa.int64()).to_numpy()
    # a minute at a time, as the pipeline does: clocks drift apart over the hour
    kept = sum(dedupe(table.filter(pa.array(minute == m)))[0].num_rows for m in np.unique(minute))
    assert kept == pytest.approx(summary.records, rel=0.005)
