"""The job-stage scorer (prism_core.evaluate.jobs) on hand-made truth and warehouse tables."""

import pyarrow as pa
import pytest

from prism_core.evaluate import jobs as job_scores
from prism_core.schema import TS

HOUR0 = 1_795_334_400 * 10**9  # 2026-11-22 00:00 UTC
SECOND = 10**9
NO_PAIRS = pa.table({c: pa.array([], pa.string()) for c in ("job_id", "src_addr", "dst_addr", "kind")})


def ts(seconds: list[float]) -> pa.Array:
    return pa.array([HOUR0 + int(s * SECOND) for s in seconds], TS)


def ones(n: int) -> dict[str, pa.Array]:
    """dp, pp and tp of 1 for n jobs."""
    return {d: pa.array([1] * n, pa.int32()) for d in ("dp", "pp", "tp")}


def truth_and_warehouse():
    """Two true jobs on two hosts each; the warehouse found both, the first across two hours."""
    addrs = {"sim-a": ["10.0.0.0", "10.0.1.0"], "sim-b": ["10.0.2.0", "10.0.3.0"]}
    truth = {
        "jobs": pa.table({"job_id": ["sim-a", "sim-b"], "start": ts([0, 0]), "end": ts([7000, 3000]),
                          "has_network": [True, True], "dp": [2, 1], "pp": [1, 2], "tp": [1, 1], "n_gpus": [2, 2]}),
        "job_gpus": pa.table({"job_id": ["sim-a"] * 2 + ["sim-b"] * 2, "addr": addrs["sim-a"] + addrs["sim-b"]}),
        "pairs": pa.table({"job_id": ["sim-a", "sim-a", "sim-b", "sim-b"],
                           "src_addr": ["10.0.0.0", "10.0.1.0", "10.0.2.0", "10.0.3.0"],
                           "dst_addr": ["10.0.1.0", "10.0.0.0", "10.0.3.0", "10.0.2.0"],
                           "kind": ["dp", "dp", "pp", "pp"]}),
    }
    warehouse = {
        "jobs": pa.table({"job_id": ["job-a", "job-a", "job-b"], "first_seen": ts([0, 0, 0]),
                          "last_seen": ts([3599, 7000, 3000]), "dp": pa.array([2, 2, 1], pa.int32()),
                          "pp": pa.array([1, 1, 2], pa.int32()), "tp": pa.array([1, 1, 1], pa.int32()),
                          "n_gpus": pa.array([2, 2, 2], pa.int32())}),
        "job_gpus": pa.table({"job_id": ["job-a"] * 2 + ["job-b"] * 2, "addr": addrs["sim-a"] + addrs["sim-b"]}),
        "comm_pairs": truth["pairs"].set_column(0, "job_id", pa.array(["job-a", "job-a", "job-b", "job-b"])),
    }
    return truth, warehouse


def set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def test_scorer_on_a_perfect_warehouse():
    truth, warehouse = truth_and_warehouse()
    figures = job_scores.score(truth, warehouse, {})
    assert all(f.ok for f in figures.values() if f.target is not None)
    assert figures["degrees_exact"].value == figures["gpus_exact"].value == 1.0
    assert figures["spurious_jobs"].value == 0.0


def test_a_job_split_across_hours_is_not_matched_exactly():
    truth, warehouse = truth_and_warehouse()
    # job-a's second hour came out under another id; one DP pair was called PP; job-b's pp is wrong
    warehouse["jobs"] = pa.table(
        {"job_id": ["job-a", "job-a2", "job-b"], "first_seen": ts([0, 3600, 0]), "last_seen": ts([3599, 7000, 3000]),
         "dp": pa.array([2, 2, 1], pa.int32()), "pp": pa.array([1, 1, 1], pa.int32()),
         "tp": pa.array([1, 1, 1], pa.int32()), "n_gpus": pa.array([2, 2, 2], pa.int32())}
    )
    warehouse["job_gpus"] = pa.concat_tables(
        [warehouse["job_gpus"], pa.table({"job_id": ["job-a2"] * 2, "addr": ["10.0.0.0", "10.0.1.0"]})]
    )
    kinds = warehouse["comm_pairs"]["kind"].to_pylist()
    warehouse["comm_pairs"] = set_column(warehouse["comm_pairs"], "kind", pa.array(["pp"] + kinds[1:]))
    figures = job_scores.score(truth, warehouse, {})
    assert figures["jobs_split"].value == figures["jobs_split_or_merged"].value == 1
    assert figures["jobs_merged"].value == 0
    # job-a holds sim-a's GPUs for its first hour only, job-a2 for its second: neither is sim-a
    assert figures["jobs_matched_exactly"].value == 0.5
    assert figures["pp_pair_precision"].value == pytest.approx(2 / 3)
    assert figures["pp_pair_recall"].value == 1.0
    assert figures["dp_pair_recall"].value == 0.5
    assert figures["dp_pair_precision"].value == 1.0
    assert figures["degrees_exact"].value == 0.5


def test_two_true_jobs_merged_into_one_are_not_exact_and_count_a_merge():
    """sim-a and sim-b run one after the other on the same two GPUs with the same DP pair, and
    Prism merges them: the same addresses, but neither's time. Its one pair is right once
    (precision 1, not 2), and each truth job found it."""
    pair = {"src_addr": ["10.0.0.0"], "dst_addr": ["10.0.1.0"], "kind": ["dp"]}
    truth = {
        "jobs": pa.table({"job_id": ["sim-a", "sim-b"], "start": ts([0, 2000]), "end": ts([1900, 3500]),
                          "has_network": [True, True], "n_gpus": [2, 2], **ones(2)}),
        "job_gpus": pa.table({"job_id": ["sim-a", "sim-a", "sim-b", "sim-b"], "addr": ["10.0.0.0", "10.0.1.0"] * 2}),
        "pairs": pa.table({"job_id": ["sim-a", "sim-b"], **{k: v * 2 for k, v in pair.items()}}),
    }
    warehouse = {
        "jobs": pa.table({"job_id": ["job-ab"], "first_seen": ts([0]), "last_seen": ts([3500]),
                          "n_gpus": pa.array([2], pa.int32()), **ones(1)}),
        "job_gpus": pa.table({"job_id": ["job-ab"] * 2, "addr": ["10.0.0.0", "10.0.1.0"]}),
        "comm_pairs": pa.table({"job_id": ["job-ab"], **pair}),
    }
    figures = job_scores.score(truth, warehouse, {})
    assert figures["jobs_matched_exactly"].value == 0.0
    assert figures["jobs_merged"].value == figures["jobs_split_or_merged"].value == 1
    assert not figures["jobs_split_or_merged"].ok
    assert figures["dp_pair_precision"].value == 1.0
    assert figures["dp_pair_recall"].value == 1.0
    # per-address spans tell the same: each address held 0-1900 s and 2000-3500 s, seen 0-3500 s
    truth["job_gpus"] = truth["job_gpus"].append_column("start", ts([0, 0, 2000, 2000])).append_column(
        "end", ts([1900, 1900, 3500, 3500]))
    warehouse["job_gpus"] = warehouse["job_gpus"].append_column("first_seen", ts([0, 0])).append_column(
        "last_seen", ts([3500, 3500]))
    assert job_scores.score(truth, warehouse, {})["jobs_matched_exactly"].value == 0.0


def test_an_address_seen_for_part_of_its_span_is_not_exact():
    """Prism saw 10.0.1.0 in job-b only from 1000 s of sim-b's 0-3000 s."""
    truth, warehouse = truth_and_warehouse()
    truth["job_gpus"] = truth["job_gpus"].append_column("start", ts([0, 0, 0, 0])).append_column(
        "end", ts([7000, 7000, 3000, 3000]))
    warehouse["job_gpus"] = warehouse["job_gpus"].append_column("first_seen", ts([0, 0, 50, 1000])).append_column(
        "last_seen", ts([7000, 7000, 3000, 3000]))
    figures = job_scores.score(truth, warehouse, {})
    # sim-b's first address is seen 50 s late, inside the tolerance; its second is not
    assert figures["jobs_matched_exactly"].value == 0.5
    assert figures["jobs_split_or_merged"].value == 0


def test_a_spurious_job_and_a_wrong_gpu_count_count():
    truth, warehouse = truth_and_warehouse()
    warehouse["jobs"] = pa.concat_tables([
        set_column(warehouse["jobs"], "n_gpus", pa.array([2, 2, 4], pa.int32())),
        pa.table({"job_id": ["job-x"], "first_seen": ts([100]), "last_seen": ts([200]),
                  "dp": pa.array([1], pa.int32()), "pp": pa.array([1], pa.int32()), "tp": pa.array([1], pa.int32()),
                  "n_gpus": pa.array([2], pa.int32())}),
    ])
    warehouse["job_gpus"] = pa.concat_tables(
        [warehouse["job_gpus"], pa.table({"job_id": ["job-x"] * 2, "addr": ["10.0.9.0", "10.0.9.1"]})])
    figures = job_scores.score(truth, warehouse, {})
    spurious = figures["spurious_jobs"]
    assert (spurious.count, spurious.of, spurious.ok) == (1, 3, False)
    assert figures["gpus_exact"].value == 0.5  # job-b says 4 GPUs for sim-b's 2
    assert figures["jobs_matched_exactly"].value == 1.0  # the address sets are still right


def test_scorer_matches_a_job_that_lived_less_than_the_usual_overlap():
    """A 13 s job recognized exactly is matched although lives must usually share a minute."""
    truth, warehouse = truth_and_warehouse()
    truth["jobs"] = set_column(truth["jobs"], "end", ts([7000, 13]))
    warehouse["jobs"] = set_column(warehouse["jobs"], "last_seen", ts([3599, 7000, 13]))
    figures = job_scores.score(truth, warehouse, {})
    assert figures["jobs_matched_exactly"].value == 1.0
    assert figures["pp_pair_recall"].value == 1.0


def test_scorer_does_not_link_jobs_through_a_host_reused_later():
    """sim-a ends at 1000 s; sim-c restarts at 4000 s with sim-a's old host 10.0.1.0 replacing
    10.0.3.0. Both jobs are alive together, but never hold that host at the same time."""
    addrs = ["10.0.0.0", "10.0.1.0", "10.0.2.0", "10.0.3.0", "10.0.1.0"]
    spans = {"start": ts([0, 0, 0, 0, 4000]), "end": ts([1000, 1000, 7000, 4000, 7000])}
    truth = {
        "jobs": pa.table({"job_id": ["sim-a", "sim-c"], "start": ts([0, 0]), "end": ts([1000, 7000]),
                          "has_network": [True, True], "n_gpus": [2, 2], **ones(2)}),
        "job_gpus": pa.table({"job_id": ["sim-a"] * 2 + ["sim-c"] * 3, "addr": addrs, **spans}),
        "pairs": NO_PAIRS,
    }
    warehouse = {
        "jobs": pa.table({"job_id": ["job-a", "job-c"], "first_seen": ts([0, 0]), "last_seen": ts([1000, 7000]),
                          "n_gpus": pa.array([2, 2], pa.int32()), **ones(2)}),
        "job_gpus": pa.table({"job_id": ["job-a"] * 2 + ["job-c"] * 3, "addr": addrs,
                              "first_seen": spans["start"], "last_seen": spans["end"]}),
        "comm_pairs": NO_PAIRS,
    }
    figures = job_scores.score(truth, warehouse, {})
    assert figures["jobs_split_or_merged"].value == 0
    assert figures["jobs_matched_exactly"].value == 1.0
    # tables without address spans fall back to the jobs' lives, which overlap: a split and a merge each way
    truth["job_gpus"] = truth["job_gpus"].drop_columns(["start", "end"])
    warehouse["job_gpus"] = warehouse["job_gpus"].drop_columns(["first_seen", "last_seen"])
    figures = job_scores.score(truth, warehouse, {})
    assert figures["jobs_split"].value == figures["jobs_merged"].value == 2


def test_a_replaced_host_is_judged_on_spans_where_prism_gives_them_and_on_lives_where_not():
    """sim-r's host 10.0.1.0 fails at 3000 s and 10.0.2.0 replaces it from 3100 s."""
    addrs = ["10.0.0.0", "10.0.1.0", "10.0.2.0"]
    truth = {
        "jobs": pa.table({"job_id": ["sim-r"], "start": ts([0]), "end": ts([7000]), "has_network": [True],
                          "n_gpus": [2], **ones(1)}),
        "job_gpus": pa.table({"job_id": ["sim-r"] * 3, "addr": addrs, "start": ts([0, 0, 3100]),
                              "end": ts([7000, 3000, 7000])}),
        "pairs": NO_PAIRS,
    }
    warehouse = {
        "jobs": pa.table({"job_id": ["job-r"], "first_seen": ts([0]), "last_seen": ts([7000]),
                          "n_gpus": pa.array([2], pa.int32()), **ones(1)}),
        "job_gpus": pa.table({"job_id": ["job-r"] * 3, "addr": addrs}),
        "comm_pairs": NO_PAIRS,
    }
    assert job_scores.score(truth, warehouse, {})["jobs_matched_exactly"].value == 1.0  # no spans: its life
    spans = {"first_seen": ts([0, 0, 3100]), "last_seen": ts([7000, 3000, 7000])}
    warehouse["job_gpus"] = pa.table({"job_id": ["job-r"] * 3, "addr": addrs, **spans})
    assert job_scores.score(truth, warehouse, {})["jobs_matched_exactly"].value == 1.0
    # Prism saying the failed host stayed to the end is wrong about it
    warehouse["job_gpus"] = set_column(warehouse["job_gpus"], "last_seen", ts([7000, 7000, 7000]))
    assert job_scores.score(truth, warehouse, {})["jobs_matched_exactly"].value == 0.0
