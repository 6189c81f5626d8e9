"""Scores job recognition, tracking and parallelism against the simulator's truth.

Truth jobs and Prism jobs are associated when they share addresses while both are alive (hosts are
reused by later jobs, so addresses alone are ambiguous). A Prism job's address set is the union of
its `job_gpus` addresses over all hours; its life spans its `jobs` rows over all hours.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.evaluate.figures import Figure, ratio

# Lives must overlap by more than this to associate two jobs: recognition works a minute at a
# time, so a job that starts seconds after another left the same hosts may share its last minute.
# A job that lived less than twice that needs only half its life in common (a 13 s job is one).
LIFE_OVERLAP_NS = 60_000_000_000
DEGREES = ("dp", "pp", "tp")


def score(truth: dict[str, pa.Table], warehouse: dict[str, pa.Table], noise: dict) -> dict[str, Figure]:
    true_jobs = _true_jobs(truth)
    prism_jobs = _prism_jobs(warehouse)
    links = _association(truth["job_gpus"], warehouse["job_gpus"], true_jobs, prism_jobs)

    true_size = _lookup(links["true_id"], true_jobs["job_id"], true_jobs["n_addrs"])
    prism_size = _lookup(links["prism_id"], prism_jobs["job_id"], prism_jobs["n_addrs"])
    shared = links["shared"].to_numpy()
    exact_ids = pc.unique(links["true_id"].filter(pa.array((shared == true_size) & (shared == prism_size))))
    split = _count_repeated(links["true_id"])
    merged = _count_repeated(links["prism_id"])
    best = _best_matches(links)

    n_true = true_jobs.num_rows
    figures = {
        "jobs_matched_exactly": Figure(ratio(len(exact_ids), n_true), 0.99),
        "jobs_split_or_merged": Figure(split + merged, 0, at_most=True),
        "true_jobs": Figure(n_true),
        "prism_jobs": Figure(prism_jobs.num_rows),
    }
    for kind, target in (("pp", 1.0), ("dp", 0.99)):
        precision, recall = _pair_scores(truth["pairs"], warehouse["comm_pairs"], true_jobs, best, kind)
        figures[f"{kind}_pair_precision"] = Figure(precision, target)
        figures[f"{kind}_pair_recall"] = Figure(recall, target)
    figures["degrees_exact"] = Figure(ratio(_degrees_exact(true_jobs, prism_jobs, best), n_true), 0.95)
    return figures


def _true_jobs(truth: dict[str, pa.Table]) -> pa.Table:
    """Truth jobs whose traffic reaches the network, with their address count and life."""
    jobs = truth["jobs"].filter(pc.field("has_network")).select(["job_id", "start", "end", *DEGREES])
    counts = truth["job_gpus"].group_by("job_id", use_threads=False).aggregate([("addr", "count_distinct")])
    jobs = jobs.join(counts, "job_id", join_type="left outer")
    return pa.table(
        {
            "job_id": jobs["job_id"],
            "n_addrs": pc.fill_null(jobs["addr_count_distinct"], 0),
            "start": jobs["start"].cast(pa.int64()),
            "end": jobs["end"].cast(pa.int64()),
            **{d: jobs[d] for d in DEGREES},
        }
    ).sort_by("job_id")


def _prism_jobs(warehouse: dict[str, pa.Table]) -> pa.Table:
    """Prism jobs over all hours: address count from job_gpus, life from the jobs rows, and each
    degree when every hour that inferred it agrees (null otherwise)."""
    by_job = warehouse["jobs"].group_by("job_id", use_threads=False).aggregate(
        [("first_seen", "min"), ("last_seen", "max")]
        + [(d, agg) for d in DEGREES for agg in ("min", "max")]
    )
    counts = warehouse["job_gpus"].group_by("job_id", use_threads=False).aggregate([("addr", "count_distinct")])
    by_job = by_job.join(counts, "job_id", join_type="left outer")
    agreed = {
        d: pc.if_else(pc.equal(by_job[f"{d}_min"], by_job[f"{d}_max"]), by_job[f"{d}_min"], None)
        for d in DEGREES
    }
    return pa.table(
        {
            "job_id": by_job["job_id"],
            "n_addrs": pc.fill_null(by_job["addr_count_distinct"], 0),
            "start": by_job["first_seen_min"].cast(pa.int64()),
            "end": by_job["last_seen_max"].cast(pa.int64()),
            **agreed,
        }
    ).sort_by("job_id")


def _association(true_gpus: pa.Table, prism_gpus: pa.Table, true_jobs: pa.Table, prism_jobs: pa.Table) -> pa.Table:
    """true_id, prism_id, shared (addresses), together_ns (time both alive) for every pair of jobs
    sharing addresses while alive."""
    true_addrs = true_gpus.select(["job_id", "addr"]).group_by(["job_id", "addr"], use_threads=False).aggregate([])
    prism_addrs = prism_gpus.select(["job_id", "addr"]).group_by(["job_id", "addr"], use_threads=False).aggregate([])
    joined = true_addrs.join(prism_addrs, "addr", left_suffix="_true", right_suffix="_prism", join_type="inner")
    shared = joined.group_by(["job_id_true", "job_id_prism"], use_threads=False).aggregate([("addr", "count")])
    links = pa.table(
        {"true_id": shared["job_id_true"], "prism_id": shared["job_id_prism"], "shared": shared["addr_count"]}
    )
    true_start = _lookup(links["true_id"], true_jobs["job_id"], true_jobs["start"])
    true_end = _lookup(links["true_id"], true_jobs["job_id"], true_jobs["end"])
    prism_start = _lookup(links["prism_id"], prism_jobs["job_id"], prism_jobs["start"])
    prism_end = _lookup(links["prism_id"], prism_jobs["job_id"], prism_jobs["end"])
    together = np.minimum(true_end, prism_end) - np.maximum(true_start, prism_start)
    # Truth jobs without network traffic are absent from true_jobs (their lookups are -1).
    known = (true_start >= 0) & (prism_start >= 0)
    links = links.append_column("together_ns", pa.array(together))
    order = [("true_id", "ascending"), ("shared", "descending"), ("together_ns", "descending"), ("prism_id", "ascending")]
    shorter_life = np.minimum(true_end - true_start, prism_end - prism_start)
    enough = together > np.minimum(LIFE_OVERLAP_NS, shorter_life / 2)
    return links.filter(pa.array(enough & known)).sort_by(order)


def _lookup(keys: pa.ChunkedArray, table_keys: pa.ChunkedArray, values: pa.ChunkedArray) -> np.ndarray:
    """values[table_keys == key] as int64 for each key, -1 where the key is absent."""
    index = pc.index_in(keys, value_set=table_keys.combine_chunks())
    found = pc.is_valid(index).to_numpy(zero_copy_only=False)
    if not len(values):
        return np.full(len(keys), -1, np.int64)
    looked_up = values.combine_chunks().cast(pa.int64()).to_numpy(zero_copy_only=False)[pc.fill_null(index, 0).to_numpy()]
    return np.where(found, looked_up, -1)


def _count_repeated(ids: pa.ChunkedArray) -> int:
    """How many ids occur on more than one association (a split or a merge)."""
    counts = pc.value_counts(ids)
    return int(pc.sum(pc.greater(counts.field("counts"), 1)).as_py() or 0)


def _best_matches(links: pa.Table) -> pa.Table:
    """true_id -> prism_id of the Prism job sharing the most addresses with it, then the longest
    time alive with it (the order of `links`)."""
    true_ids = links["true_id"].to_numpy(zero_copy_only=False)
    first = np.r_[True, true_ids[1:] != true_ids[:-1]] if len(true_ids) else np.zeros(0, bool)
    return links.filter(pa.array(first)).select(["true_id", "prism_id"])


def _pair_scores(
    true_pairs: pa.Table, prism_pairs: pa.Table, true_jobs: pa.Table, best: pa.Table, kind: str
) -> tuple[float, float]:
    """Precision and recall of `kind` pairs, comparing each truth job with its best Prism match
    (pairs of unmatched jobs count as misses on their side)."""
    keys = ["job_id", "src_addr", "dst_addr"]
    truth_kind = true_pairs.filter(
        pc.and_(pc.equal(true_pairs["kind"], kind), pc.is_in(true_pairs["job_id"], value_set=true_jobs["job_id"]))
    ).select(keys).group_by(keys, use_threads=False).aggregate([])
    prism_kind = prism_pairs.filter(pc.equal(prism_pairs["kind"], kind)).select(keys)
    prism_kind = prism_kind.group_by(keys, use_threads=False).aggregate([])
    matched = truth_kind.join(best, "job_id", right_keys="true_id", join_type="inner")
    hits = matched.join(
        prism_kind, ["prism_id", "src_addr", "dst_addr"], right_keys=keys, join_type="inner"
    ).num_rows
    return ratio(hits, prism_kind.num_rows), ratio(hits, truth_kind.num_rows)


def _degrees_exact(true_jobs: pa.Table, prism_jobs: pa.Table, best: pa.Table) -> int:
    matched = true_jobs.join(best, "job_id", right_keys="true_id", join_type="inner")
    inferred = prism_jobs.select(["job_id", *DEGREES]).rename_columns(["prism_id", *(f"{d}_prism" for d in DEGREES)])
    both = matched.join(inferred, "prism_id", join_type="inner")
    same = np.ones(both.num_rows, bool)
    for d in DEGREES:
        same &= pc.fill_null(pc.equal(both[d], both[f"{d}_prism"]), False).to_numpy(zero_copy_only=False)
    return int(same.sum())
