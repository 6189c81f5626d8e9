"""Scores job recognition, tracking and parallelism against the simulator's truth.

Truth jobs and Prism jobs are associated through the addresses they share while both hold them:
hosts are reused by later jobs, and a restarted job may take as replacement a host another job left
earlier, so addresses alone, or shared while both jobs are alive, are ambiguous. An address's span
in a job is its truth `job_gpus` `start`..`end`, and in a Prism job its `job_gpus` `first_seen`..
`last_seen` over all hours; truth or warehouses without address spans fall back to the jobs' lives.
A Prism job's address set is the union of its `job_gpus` addresses over all hours; its life spans
its `jobs` rows over all hours.

A truth job is matched exactly by a Prism job holding the same addresses over the same time: every
address's first and last moment in both within `SPAN_TOLERANCE_NS` (the jobs' lives, where either
side has no address spans), so two jobs run one after the other on the same hosts and merged into
one are not an exact match of either. Every association beyond one a side counts: a truth job
associated with several Prism jobs was split, a Prism job associated with several truth jobs merged
them, and a Prism job associated with none is spurious.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.evaluate.figures import Figure

# An address's spans in two jobs must overlap by more than this to associate the jobs through it:
# recognition works a minute at a time, so a job that starts seconds after another left the same
# hosts may share its last minute. A span shorter than twice that needs only half of it in common
# (a 13 s job is one).
LIFE_OVERLAP_NS = 60_000_000_000
# Prism sees an address from its first flow to its last, a few seconds of compute from the truth's
# step boundaries; recognition works a minute at a time.
SPAN_TOLERANCE_NS = 60_000_000_000
DEGREES = ("dp", "pp", "tp")
AGREED = (*DEGREES, "n_gpus")  # per-job figures every hour of a Prism job must agree on


def score(truth: dict[str, pa.Table], warehouse: dict[str, pa.Table], noise: dict) -> dict[str, Figure]:
    true_jobs = _true_jobs(truth)
    prism_jobs = _prism_jobs(warehouse)
    links = _association(truth["job_gpus"], warehouse["job_gpus"], true_jobs, prism_jobs)

    true_size = _lookup(links["true_id"], true_jobs["job_id"], true_jobs["n_addrs"])
    prism_size = _lookup(links["prism_id"], prism_jobs["job_id"], prism_jobs["n_addrs"])
    same_spans = links["same_spans"].to_numpy()
    exact_ids = pc.unique(links["true_id"].filter(pa.array((same_spans == true_size) & (same_spans == prism_size))))
    split = _count_repeated(links["true_id"])
    merged = _count_repeated(links["prism_id"])
    spurious = prism_jobs.num_rows - len(pc.unique(links["prism_id"]))
    best = _best_matches(links)

    n_true = true_jobs.num_rows
    figures = {
        "jobs_matched_exactly": Figure.share(len(exact_ids), n_true, 0.99),
        "jobs_split_or_merged": Figure(split + merged, 0, at_most=True),
        "jobs_split": Figure(split),
        "jobs_merged": Figure(merged),
        "spurious_jobs": Figure.share(spurious, prism_jobs.num_rows, 0.0, empty=0.0, at_most=True),
        "true_jobs": Figure(n_true),
        "prism_jobs": Figure(prism_jobs.num_rows),
    }
    for kind, target in (("pp", 1.0), ("dp", 0.99)):
        right, found, recalled, true = _pair_counts(truth["pairs"], warehouse["comm_pairs"], true_jobs, best, kind)
        figures[f"{kind}_pair_precision"] = Figure.share(right, found, target)
        figures[f"{kind}_pair_recall"] = Figure.share(recalled, true, target)
    figures["gpus_exact"] = Figure.share(_agreed_exact(true_jobs, prism_jobs, best, ("n_gpus",)), n_true, 0.99)
    figures["degrees_exact"] = Figure.share(_agreed_exact(true_jobs, prism_jobs, best, DEGREES), n_true, 0.95)
    return figures


def _true_jobs(truth: dict[str, pa.Table]) -> pa.Table:
    """Truth jobs whose traffic reaches the network, with their address count and life."""
    jobs = truth["jobs"].filter(pc.field("has_network")).select(["job_id", "start", "end", *AGREED])
    counts = truth["job_gpus"].group_by("job_id", use_threads=False).aggregate([("addr", "count_distinct")])
    jobs = jobs.join(counts, "job_id", join_type="left outer")
    return pa.table(
        {
            "job_id": jobs["job_id"],
            "n_addrs": pc.fill_null(jobs["addr_count_distinct"], 0),
            "start": jobs["start"].cast(pa.int64()),
            "end": jobs["end"].cast(pa.int64()),
            **{d: jobs[d] for d in AGREED},
        }
    ).sort_by("job_id")


def _prism_jobs(warehouse: dict[str, pa.Table]) -> pa.Table:
    """Prism jobs over all hours: address count from job_gpus, life from the jobs rows, and each
    degree and the GPU count when every hour that inferred it agrees (null otherwise)."""
    by_job = warehouse["jobs"].group_by("job_id", use_threads=False).aggregate(
        [("first_seen", "min"), ("last_seen", "max")]
        + [(d, agg) for d in AGREED for agg in ("min", "max")]
    )
    counts = warehouse["job_gpus"].group_by("job_id", use_threads=False).aggregate([("addr", "count_distinct")])
    by_job = by_job.join(counts, "job_id", join_type="left outer")
    agreed = {
        d: pc.if_else(pc.equal(by_job[f"{d}_min"], by_job[f"{d}_max"]), by_job[f"{d}_min"], None)
        for d in AGREED
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
    """true_id, prism_id, shared (addresses held by both at once), same_spans (of those, held over
    the same time: all or none of them by the jobs' lives where either side has no address spans),
    together_ns (time both alive) for every pair of jobs sharing addresses while both hold them."""
    true_spans = _address_spans(true_gpus, true_jobs, "start", "end")
    prism_spans = _address_spans(prism_gpus, prism_jobs, "first_seen", "last_seen")
    joined = true_spans.join(prism_spans, "addr", left_suffix="_true", right_suffix="_prism", join_type="inner")
    start_true, end_true, start_prism, end_prism = (
        joined[c].to_numpy() for c in ("start_true", "end_true", "start_prism", "end_prism")
    )
    overlapping = held_together(start_true, end_true, start_prism, end_prism)
    joined = joined.append_column("same_span", pa.array(_same_time(start_true, end_true, start_prism, end_prism)))
    shared = joined.filter(pa.array(overlapping)).group_by(["job_id_true", "job_id_prism"], use_threads=False)
    shared = shared.aggregate([("addr", "count"), ("same_span", "sum")])
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
    # A job whose addresses' spans are not told on both sides is held to its life: a Prism job
    # that does not say when each address joined is not judged on the truth's host replacements.
    spans_on_both_sides = {"start", "end"} <= set(true_gpus.column_names) and {
        "first_seen", "last_seen"} <= set(prism_gpus.column_names)
    lives_agree = _same_time(true_start, true_end, prism_start, prism_end)
    same_spans = shared["same_span_sum"].to_numpy() if spans_on_both_sides else np.where(
        lives_agree, links["shared"].to_numpy(), 0)
    links = links.append_column("same_spans", pa.array(same_spans)).append_column("together_ns", pa.array(together))
    order = [("true_id", "ascending"), ("shared", "descending"), ("together_ns", "descending"), ("prism_id", "ascending")]
    return links.filter(pa.array(known)).sort_by(order)


def held_together(start_a: np.ndarray, end_a: np.ndarray, start_b: np.ndarray, end_b: np.ndarray) -> np.ndarray:
    """Whether each pair of an address's spans in two jobs overlaps enough to associate the jobs
    through it: by more than LIFE_OVERLAP_NS, or half the shorter span."""
    together = np.minimum(end_a, end_b) - np.maximum(start_a, start_b)
    return together > np.minimum(LIFE_OVERLAP_NS, np.minimum(end_a - start_a, end_b - start_b) / 2)


def _same_time(start_a: np.ndarray, end_a: np.ndarray, start_b: np.ndarray, end_b: np.ndarray) -> np.ndarray:
    """Whether each pair of spans begins and ends within SPAN_TOLERANCE_NS of each other."""
    return (np.abs(start_a - start_b) <= SPAN_TOLERANCE_NS) & (np.abs(end_a - end_b) <= SPAN_TOLERANCE_NS)


def _address_spans(gpus: pa.Table, jobs: pa.Table, start: str, end: str) -> pa.Table:
    """job_id, addr, start, end (int64 ns) per address of each job: the `start`..`end` columns of
    `gpus` over all its rows, or the job's life where they are missing or null (tables written
    before addresses had spans)."""
    def column(name: str) -> pa.ChunkedArray | pa.Array:
        return gpus[name].cast(pa.int64()) if name in gpus.column_names else pa.nulls(gpus.num_rows, pa.int64())

    spans = pa.table({"job_id": gpus["job_id"], "addr": gpus["addr"], "start": column(start), "end": column(end)})
    spans = spans.group_by(["job_id", "addr"], use_threads=False).aggregate([("start", "min"), ("end", "max")])
    life_start = _lookup(spans["job_id"], jobs["job_id"], jobs["start"])
    life_end = _lookup(spans["job_id"], jobs["job_id"], jobs["end"])
    return pa.table(
        {
            "job_id": spans["job_id"],
            "addr": spans["addr"],
            "start": pc.fill_null(spans["start_min"], pa.array(life_start)),
            "end": pc.fill_null(spans["end_max"], pa.array(life_end)),
        }
    )


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


def _pair_counts(
    true_pairs: pa.Table, prism_pairs: pa.Table, true_jobs: pa.Table, best: pa.Table, kind: str
) -> tuple[int, int, int, int]:
    """Prism's `kind` pairs that are right, Prism's, the truth's pairs that Prism found, and the
    truth's, comparing each truth job with its best Prism match (pairs of unmatched jobs count as
    misses on their side; two truth jobs on the same hosts, one after the other, may have the same
    best match, whose pair is then right once)."""
    keys = ["job_id", "src_addr", "dst_addr"]
    truth_kind = true_pairs.filter(
        pc.and_(pc.equal(true_pairs["kind"], kind), pc.is_in(true_pairs["job_id"], value_set=true_jobs["job_id"]))
    ).select(keys).group_by(keys, use_threads=False).aggregate([])
    prism_kind = prism_pairs.filter(pc.equal(prism_pairs["kind"], kind)).select(keys)
    prism_kind = prism_kind.group_by(keys, use_threads=False).aggregate([])
    matched = truth_kind.join(best, "job_id", right_keys="true_id", join_type="inner")
    hits = matched.join(prism_kind, ["prism_id", "src_addr", "dst_addr"], right_keys=keys, join_type="inner")
    right = hits.group_by(["prism_id", "src_addr", "dst_addr"], use_threads=False).aggregate([]).num_rows
    return right, prism_kind.num_rows, hits.num_rows, truth_kind.num_rows


def _agreed_exact(true_jobs: pa.Table, prism_jobs: pa.Table, best: pa.Table, columns: tuple[str, ...]) -> int:
    """Truth jobs whose best Prism match agrees on every one of `columns`."""
    matched = true_jobs.join(best, "job_id", right_keys="true_id", join_type="inner")
    inferred = prism_jobs.select(["job_id", *columns]).rename_columns(["prism_id", *(f"{d}_prism" for d in columns)])
    both = matched.join(inferred, "prism_id", join_type="inner")
    same = np.ones(both.num_rows, bool)
    for d in columns:
        same &= pc.fill_null(pc.equal(both[d], both[f"{d}_prism"]), False).to_numpy(zero_copy_only=False)
    return int(same.sum())
