"""What the flow records can resolve: each exporter's habits, estimated from its records, and
per job and hour whether they show steps, only the step period, or only the job.

Exporters differ (docs/exporters.md): a NetFlow v9 clock counts milliseconds, an sFlow agent
samples 1 in N packets and has no flow start or end, a flow cache merges a queue pair's transfers
into one record until the flow has been idle for its idle timeout. None of that is announced in
the records, but each leaves a mark on them:

- the clock: timestamps on a lattice (every start and end a multiple of 1 us or 1 ms);
- sampling: `sampling_rate` above 1 (goflow2 carries it), or records with start == end (an
  instant: the collector's or the agent's time of a sample);
- a flow cache: two records of one 5-tuple are never closer than the idle timeout (quiet gaps
  shorter than it were merged into the record), so the low end of those gaps estimates it; and
  records cut by the active timeout cluster at it (`long_record_s`). Sparse transfers leave
  such gaps too (a queue pair sending a few large transfers per step of a minute), so wide gaps
  alone are no cache: its *merged records* must show as well, records that hold idle time
  (long, far slower than the exporter's fast records) and whose size no record without idle
  time shares (a merge's bytes are a sum of transfers; a transfer that ran slow, or a small
  one that waited, has siblings of its size that did not).

`tally_exporters` counts these per exporter over a batch of records (a minute in the pipeline);
tallies add up (`merge_tallies`) and `exporter_profiles` turns the hour's into one profile
per exporter, kept in the hour's ingest state (`_state/.../exporters.json`).

`job_resolution` decides per job and hour from the profiles of the exporters that carried the
job's records: `steps` when enough of them come from exporters that report transfers one by one
(the timeline then reads only those: a flow cache's or an sFlow agent's records would blur the
boundaries), else `period` when the records' rhythm (`rhythm_period_s`) shows the step period, else
`jobs_only`. Every threshold is a field of `ResolutionParams`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import (
    CODES_SUFFIX, MAD_TO_SIGMA, column_hash, combination_ids, encoded, filter_rows, first_seen_ids, group_median,
    kth_within_groups, lookup, row_hash, sorted_within_groups, stable_order, uncoded_columns, unique_counts, value_codes,
)
from prism_core.parallelism import family_codes
from prism_core.schema import FIVE_TUPLE, ISSUE_KINDS

EXPORTER_KINDS = ("per_transfer", "flow_cache", "sampled", "unknown")
# Log-spaced bins of gaps and durations (seconds): 1 us to ~3 hours, 20 bins per decade.
BINS_PER_DECADE = 20
LOWEST_S = 1e-6
N_BINS = 10 * BINS_PER_DECADE
NO_EXPORTER = ""  # records without a sampler_address are tallied as one exporter of this name
MS_NS, US_NS = 1_000_000, 1_000
SIZE_BINS = 1 << 15  # log-spaced size bins per exporter (at 0.25% per bin, up to ~10^35 bytes)


@dataclass(frozen=True)
class ResolutionParams:
    # --- estimating an exporter -------------------------------------------------------------------
    # count; an exporter with fewer records in the hour is `unknown` (read as per_transfer)
    min_records: int = 30
    # share; timestamps on a lattice (us, ms) at least this often mean the clock counts in it
    lattice_share: float = 0.98
    # share; records with start == end at least this often mean the exporter (one that reports no
    # sampling rate) has no start and end
    instant_share: float = 0.9
    # 1-in-N; sampled exporters above this rate miss most transfers (below it, e.g. 1 in 4, a
    # collective's transfers are all seen)
    max_sampling_rate: int = 16
    # s; a record longer than this is no single transfer (a cache's active timeout may have cut
    # it): the gap after it says nothing of the idle timeout
    max_transfer_s: float = 0.5
    # share; more records than this lasting over max_transfer_s are a flow cache's (merged transfers)
    long_share: float = 0.05
    # quantile of the gaps between consecutive records of a 5-tuple (after a short record): the
    # estimated idle timeout (a flow cache never leaves a gap below it)
    merge_gap_quantile: float = 0.02
    # s; an exporter whose records leave no gap below this merges a collective's transfers
    # (a flow cache's idle timeout); per-transfer exporters leave gaps of microseconds
    max_transfer_gap_s: float = 0.005
    # quantile of record durations read as the longest records (a cache's active timeout)
    long_record_quantile: float = 0.99
    # a record that may hold idle time: lasting at least merged_min_s (far above a millisecond
    # clock's error) at a rate below slow_rate_share of the exporter's fast rate (the
    # fast_rate_quantile of its records' rates in the batch; a cache with an idle timeout of tens
    # of ms merges sends with little idle between them, so its merges are only somewhat slow) ...
    merged_min_s: float = 0.05
    slow_rate_share: float = 0.6
    fast_rate_quantile: float = 0.9
    # ... whose size no other record of the exporter in the hour has (sizes binned this wide,
    # relative; a neighbouring bin counts: header bytes spread one transfer size by ~0.1%): a
    # merged record (a sum of transfers) ...
    sibling_size_tolerance: float = 0.0025
    # share; ... and wide gaps (merge_gap above max_transfer_gap_s) make a flow cache when at
    # least this share of the records are merged ones (sparse per-transfer records have none)
    min_merged_share: float = 0.0001

    # --- one transfer on several queue pairs (prism_core.queue_pairs.coalesced_channels) -----------
    # s; a NIC pair's records starting within this of one another make one run of transfers (NCCL
    # posts a transfer's channels together; a millisecond clock rounds them apart by a tick) ...
    channel_start_s: float = 0.002
    # share; ... split evenly over its queue pairs when its largest record is at most this much
    # above its smallest (header bytes, a remainder of the split)
    channel_size_spread: float = 0.1
    # share; ... and only in a job whose every NIC pair on several queue pairs splits at least this
    # share of its runs so (an all-to-all's sends of their own sizes split none; a 1% loss of
    # records leaves ~2% of a pair's runs short of a record, and the stages read a job with some
    # transfers merged and others not otherwise than one read either way)
    channel_even_share: float = 0.99

    # --- deciding per job and hour ----------------------------------------------------------------
    # share; steps are resolved when at least this share of the job's records comes from
    # exporters that report transfers one by one...
    min_resolving_share: float = 0.1
    # count; ... and at least this many of them
    min_resolving_records: int = 200
    # share of the step period; a clock coarser than this blurs the boundaries
    max_clock_share: float = 0.005
    # the steps the timeline divides must keep time: at least this share of them closer to the
    # median of the steps around them (step_window of them; slow steps, checkpoints and warm-up
    # are few, a level shift keeps time locally) than to half or twice it ...
    min_steady_share: float = 0.8
    step_window: int = 9
    # count; ... judged from this many steps of the hour on (fewer say too little)
    min_steps_judged: int = 10
    # issue kinds reported for a job-hour whose steps are not resolved: a restart or a hang is a
    # silence of the whole job, the others judge a step, a host or a link by its steps
    unresolved_issue_kinds: tuple[str, ...] = ("restart", "hang")
    # issue kinds that judge a host or a link by single transfers (a straggler's late sends, a
    # slow link's throughput; a slow link makes its receivers late, so a straggler is told from
    # one only where the link's throughput shows): reported where the steps are resolved and...
    transfer_issue_kinds: tuple[str, ...] = ("straggler", "slow_link")
    # count; a record times its transfer when it lasts at least this many ticks of its exporter's
    # clock (a clock truncating start and end puts the length up to a tick off: a millisecond
    # clock makes a transfer of a few hundred microseconds nothing or a whole tick; a cache's
    # merged records or a sampler's instants time no transfer) ...
    timed_min_ticks: int = 10
    # share; ... and a job's transfers are timed where more than this share of its NICs exchange
    # transfers of a size whose records usually are (a slow link shows in the throughput of the
    # NIC's transfers: its gradient syncs, the job's longest, while its pipeline sends may all
    # be too short). A NIC is judged against its peers (a link against the same sizes elsewhere,
    # a host against its stage peers): most of them must show. The NICs behind a sampling switch
    # are not judged, and a slow link there may read as its receivers' straggling
    min_timed_share: float = 0.5

    # --- the records' rhythm ----------------------------------------------------------------------
    # count; a pair's rhythm needs at least this many gaps between its records
    min_pair_records: int = 5
    # quantile of a pair's quiet gaps read as its longest regular quiet (the one between steps)
    long_gap_quantile: float = 0.97
    # share of that quiet; a record starting after a quiet this long is a major onset
    major_gap_share: float = 0.5
    # share of a pair's intervals between major onsets within period_tolerance of their median
    # for the pair to keep time
    min_regular_share: float = 0.5
    # share of the period; pairs whose median intervals spread less than this (interquartile)
    # agree on the period
    max_pair_spread: float = 0.1
    # bins of the onset series (whose autocorrelation shows the period) per period the pairs
    # suggest, within [min_bin_s, max_bin_s] s
    bins_per_period: int = 50
    min_bin_s: float = 0.005
    max_bin_s: float = 1.0
    # s; the periods looked for
    min_period_s: float = 0.2
    max_period_s: float = 300.0
    # robust deviations (1.4826 MAD) of the autocorrelation a period's peak stands above its median
    min_rhythm_score: float = 6.0
    # share of the best peak's height; a shorter period dividing it with a peak this high is the
    # period (the best peak may be a multiple)
    submultiple_share: float = 0.75
    # share; a period divides another within this much of their ratio
    multiple_tolerance: float = 0.04
    # count; a rhythm needs at least this many periods in the records' span
    min_periods: int = 6
    # a pair's intervals repeat after at most this many (`_step_intervals`: a ZeRO job's per-layer
    # gathers behind a short idle timeout), this share of them within period_tolerance
    max_pattern: int = 64
    pattern_share: float = 0.8
    # share; an interval this close to a pair's median one keeps its time, and the
    # autocorrelation's period agrees with the pairs' within this much
    period_tolerance: float = 0.1
    # share of a flow cache's idle timeout (its profile's `merge_gap_s`); a record starting after
    # a quiet shorter than this continues one the cache's active timeout cut (a cache leaves no
    # shorter quiet otherwise), not a major onset: where the idle timeout is longer than every
    # quiet of a step, a pair's records are active-timeout cuts whose rhythm is the timeout's
    continued_gap_share: float = 0.5


DEFAULT_PARAMS = ResolutionParams()


@dataclass
class ExporterTally:
    """Per exporter (`exporters`, sorted), counts that add up over batches of records."""

    exporters: list[str] = field(default_factory=list)
    records: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    on_us: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # start and end whole us
    on_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # start and end whole ms
    instants: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # start == end
    sampled: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sampling_rate > 1
    max_rate: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gaps: np.ndarray = field(default_factory=lambda: np.zeros((0, N_BINS), np.int64))  # after short records
    durations: np.ndarray = field(default_factory=lambda: np.zeros((0, N_BINS), np.int64))  # positive
    # sizes (exporter * SIZE_BINS + size bin) of the records that may hold idle time
    # (`_sizes_by_speed`) and of the others, with their counts: a size the others hold too is a
    # transfer's that sometimes ran slow, one they never hold is a merge's
    slow_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    slow_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    plain_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    plain_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def merge(self, other: ExporterTally) -> ExporterTally:
        return merge_tallies([self, other])

    def merged_records(self) -> np.ndarray:
        """Per exporter, its records that look like a flow cache's merges: slow long records
        of a size (bin or neighbour: bins are `sibling_size_tolerance` wide) none of its other
        records holds."""
        plain_below = np.r_[0, np.cumsum(self.plain_counts)]
        lo = np.searchsorted(self.plain_sizes, self.slow_sizes - 1, side="left")
        hi = np.searchsorted(self.plain_sizes, self.slow_sizes + 1, side="right")
        explained = plain_below[hi] > plain_below[lo]
        merged = np.zeros(len(self.exporters), np.int64)
        np.add.at(merged, self.slow_sizes[~explained] // SIZE_BINS, self.slow_counts[~explained])
        return merged


_COUNTS = ("records", "on_us", "on_ms", "instants", "sampled", "max_rate", "gaps", "durations")


def merge_tallies(tallies: Sequence[ExporterTally]) -> ExporterTally:
    """The tallies added up, exporter by exporter (by name), all at once: an hour's ~60 minutes
    merged pairwise sorted the growing size counts again at each step (0.3-0.7 s an hour)."""
    if not tallies:
        return ExporterTally()
    names = sorted(set().union(*(tally.exporters for tally in tallies)))
    merged = ExporterTally(names, *(np.zeros((len(names), *getattr(tallies[0], f).shape[1:]), np.int64)
                                    for f in _COUNTS))
    positions = [np.searchsorted(names, tally.exporters).astype(np.int64) for tally in tallies]
    # a tally names each exporter once: its positions are distinct, so indexed updates add up
    # exactly (without `ufunc.at`, ~10x slower on the histograms' rows)
    for tally, at in zip(tallies, positions):
        for name in _COUNTS:
            if name == "max_rate":
                merged.max_rate[at] = np.maximum(merged.max_rate[at], tally.max_rate)
            else:
                getattr(merged, name)[at] += getattr(tally, name)
    for kind in ("slow", "plain"):
        keys, counts = [], []
        for tally, at in zip(tallies, positions):
            own = getattr(tally, f"{kind}_sizes")
            keys.append(at[own // SIZE_BINS] * SIZE_BINS + own % SIZE_BINS)
            counts.append(getattr(tally, f"{kind}_counts"))
        unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        summed = np.bincount(inverse, weights=np.concatenate(counts), minlength=len(unique)).astype(np.int64)
        setattr(merged, f"{kind}_sizes", unique)
        setattr(merged, f"{kind}_counts", summed)
    return merged



def tally_exporters(flows: pa.Table, params: ResolutionParams = DEFAULT_PARAMS,
                    five_tuples: np.ndarray | None = None) -> ExporterTally:
    """The counts of each exporter's records in `flows` (FLOWS columns; the 5-tuple's may be
    left out where `five_tuples` gives each row's `column_hash` of FIVE_TUPLE, which a minute's
    merge has from its duplicates' check). Gaps are between consecutive records of one 5-tuple from one
    exporter within the batch, after a record shorter than `max_transfer_s` (after a longer one,
    a flow cache's active timeout may have cut the flow with no gap at all); gaps of zero or less
    (overlapping transfers) count in the first bin."""
    if flows.num_rows == 0:
        return ExporterTally()
    codes, names = encoded(flows, "sampler_address", fill=NO_EXPORTER)
    dictionary = names.to_pylist()
    order_of_names = np.argsort(dictionary)
    rank = np.empty(len(dictionary), np.int64)
    rank[order_of_names] = np.arange(len(dictionary))
    exporter = rank[codes]
    n = len(dictionary)
    start = flows["time_flow_start_ns"].to_numpy()
    end = flows["time_flow_end_ns"].to_numpy()
    rate = pc.fill_null(flows["sampling_rate"], 1).to_numpy()

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(exporter[mask], minlength=n).astype(np.int64)

    duration = end - start
    # one 64-bit hash per (exporter, 5-tuple): a collision (odds ~n^2 / 2^64) only mixes two
    # flows' gaps, and one key sorts much faster than six
    if five_tuples is None:
        five_tuples = column_hash(flows, FIVE_TUPLE)
    tuple_ids = row_hash(exporter, five_tuples)
    # by start, then stably by 5-tuple (two stable sorts of presorted data beat a lexsort 2x);
    # the 5-tuples numbered as their hashes first show (the gaps are counted whatever order the
    # 5-tuples come in), a radix sort when a batch has fewer than 2^16 of them (a minute has ~10 k)
    by_start = np.argsort(start, kind="stable")
    order = by_start[stable_order(first_seen_ids(tuple_ids)[by_start])]
    ordered_ids, ordered_start, ordered_end = tuple_ids[order], start[order], end[order]
    follows = ordered_ids[1:] == ordered_ids[:-1]
    follows &= (ordered_end - ordered_start)[:-1] < params.max_transfer_s * 1e9
    gap = (ordered_start[1:] - ordered_end[:-1])[follows]
    gap_exporter = exporter[order[1:][follows]]
    max_rate = np.zeros(n, np.int64)
    np.maximum.at(max_rate, exporter, rate)
    positive = duration > 0
    # a time's remainder within its millisecond (fits 32 bits) tells both lattices: one 64-bit
    # division per time, not two
    start_in_ms, end_in_ms = (start % MS_NS).astype(np.int32), (end % MS_NS).astype(np.int32)
    return ExporterTally(
        exporters=[dictionary[i] for i in order_of_names],
        records=np.bincount(exporter, minlength=n).astype(np.int64),
        on_us=count((start_in_ms % US_NS == 0) & (end_in_ms % US_NS == 0)),
        on_ms=count((start_in_ms == 0) & (end_in_ms == 0)),
        instants=count(duration == 0),
        sampled=count(rate > 1),
        max_rate=max_rate,
        gaps=_histogram(gap_exporter, gap, n),
        durations=_histogram(exporter[positive], duration[positive], n),
        **_sizes_by_speed(exporter, duration, pc.fill_null(flows["bytes"], 0).to_numpy(), n, params),
    )


def _sizes_by_speed(exporter: np.ndarray, duration_ns: np.ndarray, nbytes: np.ndarray, n: int,
                    params: ResolutionParams) -> dict[str, np.ndarray]:
    """The size bins of the records that may hold idle time, long (`merged_min_s`) and slow
    (below `slow_rate_share` of their exporter's fast rate in the batch), with counts, and of the
    others. A transfer slowed by contention, or a small one that waited on its peer, shares its
    size with transfers that did not; a cache's merge is a sum of transfers that single
    transfers seldom match."""
    positive = duration_ns > 0
    rate = np.where(positive, nbytes / np.maximum(duration_ns, 1), np.inf)
    fast_rate = _fast_rates(rate[positive], exporter[positive], n, params.fast_rate_quantile)
    slow = (duration_ns >= params.merged_min_s * 1e9) & (rate < params.slow_rate_share * fast_rate[exporter])
    size_bin = np.floor(np.log(np.maximum(nbytes, 1)) / np.log1p(params.sibling_size_tolerance)).astype(np.int64)
    key = exporter.astype(np.int64) * SIZE_BINS + np.minimum(size_bin, SIZE_BINS - 1)
    slow_sizes, slow_counts = unique_counts(key[slow])
    plain_sizes, plain_counts = unique_counts(key[~slow])
    return {"slow_sizes": slow_sizes, "slow_counts": slow_counts.astype(np.int64),
            "plain_sizes": plain_sizes, "plain_counts": plain_counts.astype(np.int64)}


def _fast_rates(rate: np.ndarray, exporter: np.ndarray, n: int, quantile: float) -> np.ndarray:
    """Each exporter's fast rate: the `quantile` of its (finite) records' rates, the value of
    rank floor(quantile * (count - 1)); infinite for an exporter without any. The rates grouped by
    exporter (a radix sort), then one selection per exporter (a batch has ~100): ~1/3 of the
    cost of sorting every rate."""
    counts = np.bincount(exporter, minlength=n)
    ends = np.cumsum(counts)
    ranks = np.floor(quantile * np.maximum(counts - 1, 0)).astype(np.int64)
    grouped = rate[stable_order(exporter)]
    fast_rate = np.full(n, np.inf)
    for e in np.flatnonzero(counts):
        fast_rate[e] = np.partition(grouped[ends[e] - counts[e]:ends[e]], ranks[e])[ranks[e]]
    return fast_rate


@dataclass(frozen=True)
class ExporterProfile:
    """What one exporter's records of the hour show (`exporter_profiles`)."""

    sampler_address: str
    records: int
    kind: str  # EXPORTER_KINDS
    clock_ns: int  # 1, 1_000 or 1_000_000: the lattice its timestamps sit on
    instant_share: float  # records with start == end
    sampling_rate: int  # 1-in-N (1: every packet)
    merge_gap_s: float | None  # estimated idle timeout: no two records of a 5-tuple are closer
    long_record_s: float | None  # the longest records' duration (a cache's active timeout)
    merged_share: float = 0.0  # records that look like merges of transfers (`ExporterTally.merged_records`)

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(values: dict) -> ExporterProfile:
        return ExporterProfile(**values)


def exporter_profiles(tally: ExporterTally, params: ResolutionParams = DEFAULT_PARAMS) -> list[ExporterProfile]:
    """One profile per exporter of the tally (an hour's, in the pipeline), in address order."""
    profiles = []
    merged_records = tally.merged_records()
    for i, name in enumerate(tally.exporters):
        records = int(tally.records[i])
        clock_ns = (MS_NS if tally.on_ms[i] >= params.lattice_share * records
                    else US_NS if tally.on_us[i] >= params.lattice_share * records else 1)
        instant_share = float(tally.instants[i] / records) if records else 0.0
        rate = int(tally.max_rate[i]) if tally.sampled[i] * 2 >= records else 1
        merge_gap = _quantile(tally.gaps[i], params.merge_gap_quantile)
        long_records = int(tally.durations[i][_bin_of(params.max_transfer_s):].sum())
        # wide gaps are a cache's only where its merged records show: sparse transfers leave them too
        merges = (merge_gap is not None and merge_gap > params.max_transfer_gap_s
                  and merged_records[i] >= params.min_merged_share * records)
        if records < params.min_records:
            kind = "unknown"
        # an exporter that says it samples 1 in a few is NetFlow's sampling, whose records keep
        # their transfers' spans: on a millisecond clock, its transfers shorter than a tick (an
        # all-to-all's chunks) are instants without being samples
        elif rate > params.max_sampling_rate or (rate == 1 and instant_share >= params.instant_share):
            kind = "sampled"
        elif merges or long_records > params.long_share * records:
            kind = "flow_cache"
        else:
            kind = "per_transfer"
        profiles.append(ExporterProfile(name, records, kind, clock_ns, round(instant_share, 4), rate,
                                        merge_gap, _quantile(tally.durations[i], params.long_record_quantile),
                                        round(float(merged_records[i] / records), 5) if records else 0.0))
    return profiles


@dataclass(frozen=True)
class JobResolution:
    resolution: str  # schema.RESOLUTIONS
    period_s: float | None  # the step period the records' rhythm shows (None: no rhythm)
    resolving_exporters: frozenset[str]  # the exporters whose records the timeline reads
    transfers_timed: bool  # the records time single transfers (`transfer_issue_kinds` shown)


RHYTHM_COLUMNS = ("time_flow_start_ns", "time_flow_end_ns", "src_addr", "dst_addr", "sampler_address")


def job_resolution(flows: pa.Table, profiles: dict[str, ExporterProfile],
                   params: ResolutionParams = DEFAULT_PARAMS, members: pa.Array | None = None) -> JobResolution:
    """What the job's records of the hour (`flows`: start, end, src_addr, dst_addr,
    sampler_address) can resolve, given the hour's exporter profiles (by address; an exporter
    without a profile reads as per_transfer: nothing says otherwise). `members`: the job's
    addresses; its rhythm is read from the records between them (traffic to storage or a
    monitoring agent keeps clocks of its own), all records without."""
    rhythm, ends = flows, None
    if members is not None:
        ends = tuple(lookup(flows, name, members) for name in ("src_addr", "dst_addr"))
        between = (ends[0] >= 0) & (ends[1] >= 0)
        if not between.all():  # a copy of what the rhythm reads, only where it is not all of it
            read = [name for name in uncoded_columns(flows.column_names)
                    if name.removesuffix(CODES_SUFFIX) in RHYTHM_COLUMNS]
            rhythm = filter_rows(flows.select(read), between)
    period = rhythm_period_s(rhythm, params, _idle_timeouts_ns(rhythm, profiles))
    exporter, names = encoded(flows, "sampler_address", fill=NO_EXPORTER)
    counts = np.bincount(exporter, minlength=len(names)).tolist()
    one_by_one = {name: count for name, count in zip(names.to_pylist(), counts)
                  if reports_one_by_one(profiles.get(name))}
    # a clock coarser than a share of the step period blurs the boundaries
    resolving = {name for name in one_by_one
                 if period is None or _clock_ns(profiles.get(name)) * 1e-9 <= params.max_clock_share * period}
    resolving_records = sum(one_by_one[name] for name in resolving)
    if (resolving_records >= params.min_resolving_records
            and resolving_records >= params.min_resolving_share * flows.num_rows):
        timed = _transfers_timed(flows, exporter, names, profiles, params, members, ends)
        return JobResolution("steps", period, frozenset(resolving), timed)
    return JobResolution("period" if period is not None else "jobs_only", period, frozenset(), False)


def issue_kinds_shown(resolved: JobResolution, params: ResolutionParams = DEFAULT_PARAMS) -> tuple[str, ...]:
    """The issue kinds a job-hour's records can show: every kind where they resolve its steps and
    time its transfers; without the transfers' timing, none that judges a host or a link by
    single transfers; without steps, only the job's silences (a restart, a hang)."""
    if resolved.resolution != "steps":
        return params.unresolved_issue_kinds
    return tuple(kind for kind in ISSUE_KINDS if resolved.transfers_timed or kind not in params.transfer_issue_kinds)


def _transfers_timed(flows: pa.Table, exporter: np.ndarray, names: pa.Array, profiles: dict[str, ExporterProfile],
                     params: ResolutionParams, members: pa.Array | None,
                     member_ends: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
    """Whether most of the NICs the job's records show (more than `min_timed_share` of those of
    `members`, or of any address without) exchange transfers whose length their clocks time
    (`timed_sizes`), on exporters that report transfers one by one. `exporter`: each record's
    code among `names`; `member_ends`: each record's source's and destination's index in
    `members` (-1: none), where the caller looked them up already."""
    shortest = np.array([shortest_timed_s(profiles.get(name), params) for name in names.to_pylist()])[exporter]
    duration_s = (flows["time_flow_end_ns"].to_numpy() - flows["time_flow_start_ns"].to_numpy()) * 1e-9
    timed = timed_sizes(flows["bytes"].to_numpy(), duration_s, shortest)
    nics = members if members is not None else pc.unique(pa.concat_arrays(
        [flows[name].combine_chunks().cast(pa.string()) for name in ("src_addr", "dst_addr")]))
    src, dst = member_ends or tuple(lookup(flows, name, nics) for name in ("src_addr", "dst_addr"))

    def shown(records: np.ndarray | slice) -> np.ndarray:
        """Per NIC: at either end of one of the `records` (an end of none, -1, marks the extra last slot)."""
        marked = np.zeros(len(nics) + 1, bool)
        marked[src[records]] = True
        marked[dst[records]] = True
        return marked[:-1]

    # of the NICs the records show (one that sends and receives nothing shows nothing at any clock)
    seen = shown(slice(None))
    covered = seen if timed.all() else shown(timed)
    return covered.sum() > params.min_timed_share * seen.sum()


def shortest_timed_s(profile: ExporterProfile | None, params: ResolutionParams = DEFAULT_PARAMS) -> float:
    """The shortest record (seconds) whose length the exporter's clock resolves well enough to
    measure a transfer's throughput by (`timed_min_ticks`); none (inf) for an exporter whose
    records are no single transfers (a cache's merges, a sampler's instants)."""
    if not reports_one_by_one(profile):
        return np.inf
    return params.timed_min_ticks * _clock_ns(profile) * 1e-9


def timed_sizes(nbytes: np.ndarray, duration_s: np.ndarray, shortest_s: np.ndarray) -> np.ndarray:
    """Per record: whether the records of its size family usually (their median) last at least
    `shortest_s`, the shortest its exporter's clock times. A size, not a record: the records of a
    size that happen to last longer than the rest are its slowest, and measuring those alone
    would read every link as slow."""
    timed = duration_s >= shortest_s
    if timed.all():  # a fine clock: no size to look at
        return timed
    return group_median(family_codes(nbytes), duration_s) >= shortest_s


def steps_keep_time(durations_s: np.ndarray, synchronized: np.ndarray | None = None,
                    params: ResolutionParams = DEFAULT_PARAMS) -> bool:
    """Whether the hour's divided steps (durations in order) look like a training job's: most of
    them close to the median of their neighbours. Steps divided from records that blur the
    boundaries (a rail's subset, sizes made unique by header bytes) come out split and merged at
    random; such steps are not reported (`analysis`). A step longer than its neighbours that
    holds the job's DP synchronization (`synchronized`, per step) is a whole step that took
    longer: a job with heavy-tailed steps (stalls of a few tenths of a step, often) has many,
    and they are what the diagnosis judges. A split step is shorter than its neighbours, two merged
    longer: a step is steady closer to the local median than to half or twice it (within a factor
    of sqrt 2), whatever the job's own jitter, which a narrower band would take for blur."""
    n = len(durations_s)
    if n < params.min_steps_judged:
        return True
    half = params.step_window // 2
    padded = np.pad(np.asarray(durations_s, float), half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    local = np.median(windows, axis=1)
    steady = np.abs(np.log(np.asarray(durations_s, float) / local)) <= np.log(2.0) / 2
    if synchronized is not None:
        steady |= synchronized & (durations_s > local)
    return bool(steady.mean() >= params.min_steady_share)


def demoted(resolved: JobResolution) -> JobResolution:
    """What is left of a `steps` resolution whose steps do not keep time: the period, if any."""
    return JobResolution("period" if resolved.period_s is not None else "jobs_only", resolved.period_s, frozenset(),
                         False)


def reports_one_by_one(profile: ExporterProfile | None) -> bool:
    """Whether the exporter reports transfers one by one (one without a profile: nothing says
    otherwise)."""
    return profile is None or profile.kind in ("per_transfer", "unknown")


def samples_packets(profile: ExporterProfile | None) -> bool:
    """Whether the exporter samples packets (sFlow): its records are instants inside transfers,
    whose start is no transfer's."""
    return profile is not None and profile.kind == "sampled"


def keeps_flow_cache(profile: ExporterProfile | None) -> bool:
    """Whether the exporter keeps a flow cache: its records may merge several transfers."""
    return profile is not None and profile.kind == "flow_cache"


def _clock_ns(profile: ExporterProfile | None) -> int:
    return profile.clock_ns if profile is not None else 1


def _idle_timeouts_ns(flows: pa.Table, profiles: dict[str, ExporterProfile]) -> np.ndarray | None:
    """Per record: its exporter's idle timeout (the profile's `merge_gap_s`, ns) where the
    exporter keeps a flow cache, 0 elsewhere; None when no exporter does."""
    cached = {name: profile.merge_gap_s for name, profile in profiles.items()
              if keeps_flow_cache(profile) and profile.merge_gap_s}
    if not cached or flows.num_rows == 0:
        return None
    names = pa.array(sorted(cached), pa.string())
    gaps = np.r_[np.array([cached[name] for name in names.to_pylist()]) * 1e9, 0.0]
    return gaps[lookup(flows, "sampler_address", names, fill=NO_EXPORTER)]  # -1, not cached: the 0 at the end


def rhythm_period_s(flows: pa.Table, params: ResolutionParams = DEFAULT_PARAMS,
                    idle_timeout_ns: np.ndarray | None = None) -> float | None:
    """The job's step period from the rhythm of its records, or None where they show none.
    `idle_timeout_ns`: per record, its exporter's flow-cache idle timeout (0 without a cache).

    A step shows on every pair once: a DP pair is quiet between its syncs, a PP pair between the
    last send of a step and the first of the next (the pipeline's flush and the sync). So each
    pair's *major onsets* are its records that start after a quiet at least `major_gap_share` of
    its longest regular quiet (the `long_gap_quantile` of its gaps); micro-batch sends, chunks of
    one collective and a record continuing the one a flow cache's active timeout cut (no gap)
    are not. Two estimates of the period follow from them: the median over the pairs that keep
    time (most intervals between their major onsets close to the median one) of each pair's
    median interval, and the autocorrelation of all pairs' onsets
    (`_autocorrelation_period`). The period is the first when the pairs agree with each other
    (`_agreed_period`), else the second when it agrees with the first (`period_tolerance`); a
    rhythm neither supports is no rhythm."""
    major = _major_onsets(flows, params, idle_timeout_ns)
    if major is None:
        return None
    onsets, owner = major
    same = owner[1:] == owner[:-1]
    interval, of_pair = _step_intervals(np.diff(onsets)[same], owner[1:][same], params)
    interval = sorted_within_groups(of_pair, interval)  # the onsets come sorted by pair
    opens = np.flatnonzero(np.r_[True, of_pair[1:] != of_pair[:-1]]) if len(of_pair) else np.zeros(0, np.int64)
    counts = np.diff(np.r_[opens, len(of_pair)])
    enough = counts >= params.min_pair_records
    if not enough.any():
        return None
    # a pair keeps time when most of its intervals are close to their median (random traffic's
    # are spread over every length)
    median_of_pair = np.repeat(interval[opens + counts // 2], counts)
    close = np.abs(interval - median_of_pair) <= params.period_tolerance * median_of_pair
    regular = np.add.reduceat(close, opens) >= params.min_regular_share * counts
    keeps_time = enough & regular
    if not keeps_time.any():
        return None
    medians = interval[opens[keeps_time] + counts[keeps_time] // 2] * 1e-9
    pairs_period = float(np.median(medians))
    if pairs_period < params.min_period_s:
        return None
    agreed = _agreed_period(medians, pairs_period, params)
    if agreed is not None:
        return agreed
    correlated = _autocorrelation_period(onsets, owner, pairs_period / params.bins_per_period, params)
    if correlated is not None and abs(correlated - pairs_period) <= params.period_tolerance * pairs_period:
        return correlated
    return None


def _agreed_period(medians: np.ndarray, pairs_period: float, params: ResolutionParams) -> float | None:
    """The period the pairs' median intervals agree on (the middle half of them within
    `max_pair_spread` of their median); failing that, once each pair within `period_tolerance` of
    a whole number of `pairs_period`'s steps is read at one step: a cadence that a merged interval
    breaks now and then (two collectives a step behind a flow cache, a pause between them now and
    then under the idle timeout) repeats only after whole steps, and `_step_intervals` finds that
    longer pattern. None where neither agrees."""
    steps = np.maximum(np.rint(medians / pairs_period), 1)
    whole_steps = np.abs(medians - steps * pairs_period) <= params.period_tolerance * pairs_period
    for read in (medians, np.where(whole_steps, medians / steps, medians)):
        low, period, high = np.quantile(read, [0.25, 0.5, 0.75])
        if high - low <= params.max_pair_spread * period:
            return float(period)
    return None


def _step_intervals(interval: np.ndarray, of_pair: np.ndarray,
                    params: ResolutionParams) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's intervals between major onsets (in time order, sorted by pair) summed over its
    pattern: the fewest consecutive intervals after which its intervals repeat, `pattern_share` of
    them within `period_tolerance` of the pair's median interval (`max_pattern` at most; 1 where
    none repeats). A step shows on most pairs once, but behind a short idle timeout a ZeRO job's
    per-layer gathers are records of their own: a cadence, with the step's end (the optimizer's
    quiet) one interval unlike the others, every step."""
    opens = np.flatnonzero(np.r_[True, of_pair[1:] != of_pair[:-1]]) if len(of_pair) else np.zeros(0, np.int64)
    if not len(opens):
        return interval, of_pair
    counts = np.diff(np.r_[opens, len(of_pair)])
    group = np.repeat(np.arange(len(opens)), counts)
    median = sorted_within_groups(of_pair, interval)[opens + counts // 2].astype(np.float64)
    pattern = np.zeros(len(opens), np.int64)
    # the intervals of the pairs still looked at (whole runs, in order), with their group and the
    # difference their pair's median allows: compared by shifted slices, no gathers of them per k
    looked_group, looked_interval = group, interval
    allowed = params.period_tolerance * median[group]
    looked = np.ones(len(opens), bool)
    for k in range(1, params.max_pattern + 1):
        same = looked_group[k:] == looked_group[:-k]  # an interval and the one k later, of one pair
        if not same.any():
            break
        alike = same & (np.abs(looked_interval[k:] - looked_interval[:-k]) <= allowed[:-k])
        compared = np.where(looked, np.maximum(counts - k, 0), 0)  # the pairs of intervals k apart
        repeats = np.bincount(looked_group[:-k], weights=alike, minlength=len(opens)) >= params.pattern_share * compared
        pattern[(pattern == 0) & repeats & (compared >= params.min_pair_records)] = k
        looking = (pattern == 0) & (counts - k > params.min_pair_records)  # not found, intervals left
        if not looking.any():
            break
        kept = looking[looked_group]
        if not kept.all():
            looked_group, looked_interval, allowed = looked_group[kept], looked_interval[kept], allowed[kept]
        looked = looking
    if not np.any(pattern > 1):
        return interval, of_pair
    pattern = np.maximum(pattern, 1)[group]
    last = np.arange(len(interval)) + pattern - 1  # the window's last interval
    whole = last < len(interval)
    whole[whole] = of_pair[last[whole]] == of_pair[whole]
    summed = np.cumsum(interval)
    first = np.flatnonzero(whole)
    return summed[last[first]] - summed[first] + interval[first], of_pair[first]


def _major_onsets(flows: pa.Table, params: ResolutionParams,
                  idle_timeout_ns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(start ns, pair code) of each pair's major onsets, sorted by pair then time; None when
    no pair has enough records to tell its quiets apart. A record after a quiet shorter than
    `continued_gap_share` of its cache's idle timeout continues one the active timeout cut."""
    if flows.num_rows < 2:
        return None
    start = flows["time_flow_start_ns"].to_numpy()
    end = flows["time_flow_end_ns"].to_numpy()
    pair = _pair_codes(flows)
    # records usually come in start order: then a stable order by pair alone (linear) is that
    order = stable_order(pair) if np.all(start[1:] >= start[:-1]) else np.lexsort((start, pair))
    # the ids sorted are each id as many times as it shows: counted, not gathered
    pair, start = np.repeat(np.arange(int(pair.max()) + 1), np.bincount(pair)), start[order]
    first = np.r_[True, pair[1:] != pair[:-1]]
    previous_end = np.zeros_like(end)
    np.take(end, order[:-1], out=previous_end[1:])
    quiet_ns = start - previous_end
    del previous_end
    opens = np.flatnonzero(first)
    gaps_of_pair = np.diff(np.r_[opens, len(pair)]) - 1
    usable = gaps_of_pair >= params.min_pair_records
    if not usable.any():
        return None
    # each pair's longest regular quiet: a high quantile of its gaps (a pair's first record has
    # none: it sorts last, above every gap)
    quiet_ns[first] = quiet_ns[~first].max(initial=0) + 1
    rank = np.floor(params.long_gap_quantile * np.maximum(gaps_of_pair - 1, 0)).astype(np.int64)
    long_quiet = kth_within_groups(pair, quiet_ns, rank)
    # per pair, the shortest quiet a major onset follows: after a long one, and not continuing a
    # record (a pair is one exporter's: its idle timeout is the pair's; a record's quiet compares
    # as float, once, with the larger of the two bounds)
    long_gap = np.full(int(pair.max()) + 1, np.inf)
    long_gap[pair[opens[usable]]] = long_quiet[usable].astype(np.float64)
    least_quiet = params.major_gap_share * long_gap
    if idle_timeout_ns is not None:
        continued = np.zeros(len(long_gap))
        continued[pair[opens]] = params.continued_gap_share * idle_timeout_ns[order[opens]]
        least_quiet = np.fmax(least_quiet, continued)  # a NaN timeout bounds nothing, as before
    major = quiet_ns >= least_quiet[pair]
    major &= ~first
    if not major.any():
        return None
    return start[major], pair[major]


PAIR_COLUMNS = ("sampler_address", "src_addr", "dst_addr")  # a pair: one exporter's records of one address pair


def _pair_codes(flows: pa.Table) -> np.ndarray:
    """Per record, its pair's code: `combination_ids` of its PAIR_COLUMNS' `encoded` codes, numbered
    alike, but worked out over the distinct combinations (a job's few thousand pairs) instead of
    every record: the records' codes as they come (`value_codes`) packed into one key, hashed once
    (~2x faster than every column renumbered, then packed and ranked, per record)."""
    codes, sizes = [], []
    for name in PAIR_COLUMNS:
        code, values = value_codes(flows, name)
        codes.append(code)
        sizes.append(len(values) + 1)  # a null's -1 too
    if math.prod(sizes) >= 1 << 62:  # the key would overflow
        return combination_ids(*(encoded(flows, name)[0] for name in PAIR_COLUMNS))
    # the last column most significant, as combination_ids orders them
    key = codes[2] * sizes[1]
    key += codes[1]
    key *= sizes[0]
    key += codes[0]
    encoding = pc.dictionary_encode(pa.array(key))  # the combinations in the order they first show
    combination = encoding.dictionary.to_numpy() + (sizes[1] + 1) * sizes[0] + 1  # each code + 1: digits from 0
    digits = []
    for size in sizes:
        digits.append(combination % size - 1)
        combination //= size
    # each column's codes in the order they first show (as `encoded` numbers them): the order in
    # which the combinations first show keeps it
    return combination_ids(*(_in_order_shown(column) for column in digits))[encoding.indices.to_numpy()]


def _in_order_shown(codes: np.ndarray) -> np.ndarray:
    """`codes` (-1 for null) renumbered 0, 1, ... in the order they first show; null stays -1."""
    shown = pc.unique(pa.array(codes)).to_numpy()
    shown = shown[shown >= 0]
    renumbered = np.full(int(codes.max(initial=-1)) + 2, -1, np.int64)  # code -1 reads the last entry
    renumbered[shown] = np.arange(len(shown))
    return renumbered[codes]


def _autocorrelation_period(onsets: np.ndarray, owner: np.ndarray, bin_s: float,
                            params: ResolutionParams) -> float | None:
    """The period of the major onsets' autocorrelation: every pair weighs the same (its onsets
    share a unit weight), the onsets are binned (`bin_s`, within [min_bin_s, max_bin_s]: a
    step's jitter smears a peak over a few percent of it) and the period is the lag of the strongest peak,
    or the shortest lag whose peak is nearly as strong and divides it (a rhythm repeats at every
    multiple). The peak must stand `min_rhythm_score` robust deviations above the correlation of
    the lags looked at."""
    if len(onsets) < 2:
        return None
    bin_s = min(max(bin_s, params.min_bin_s), params.max_bin_s)
    weight = 1.0 / np.bincount(owner)[owner]
    bins = ((onsets - onsets.min()) // int(bin_s * 1e9)).astype(np.int64)
    n_bins = int(bins.max()) + 1
    min_lag = max(int(np.ceil(params.min_period_s / bin_s)), 2)
    top = min(int(params.max_period_s / bin_s), n_bins // params.min_periods)
    if top <= min_lag + 2:
        return None
    series = np.bincount(bins, weights=weight, minlength=n_bins)
    series -= series.mean()
    size = 1 << int(np.ceil(np.log2(2 * n_bins)))
    spectrum = np.fft.rfft(series, size)
    correlation = np.fft.irfft(spectrum * np.conj(spectrum), size)[:n_bins]
    if correlation[0] <= 0:
        return None
    # unbiased: a longer lag compares fewer bins
    correlation = correlation / correlation[0] * n_bins / np.maximum(n_bins - np.arange(n_bins), 1)
    window = correlation[min_lag:top + 1]
    peaks = np.flatnonzero((window[1:-1] >= window[:-2]) & (window[1:-1] > window[2:])) + 1
    if not len(peaks):
        return None
    middle = float(np.median(window))
    spread = MAD_TO_SIGMA * float(np.median(np.abs(window - middle))) or np.finfo(float).eps
    best = peaks[np.argmax(window[peaks])]
    if (window[best] - middle) / spread < params.min_rhythm_score:
        return None
    ratio = (best + min_lag) / (peaks + min_lag)
    divides = np.abs(ratio - np.round(ratio)) <= params.multiple_tolerance * np.round(ratio)
    strong = peaks[(window[peaks] - middle >= params.submultiple_share * (window[best] - middle)) & divides]
    lag = int(strong[0]) + min_lag
    # between bins: the vertex of the parabola through the peak and its neighbours
    left, centre, right = correlation[lag - 1], correlation[lag], correlation[min(lag + 1, n_bins - 1)]
    curvature = left - 2 * centre + right
    shift = 0.5 * (left - right) / curvature if curvature < 0 else 0.0
    return float((lag + shift) * bin_s)


def _bin_of(seconds: float | np.ndarray) -> np.ndarray:
    # each step in one new array, not one each (a minute's ~200 k records, twice per tally)
    position = np.maximum(seconds, LOWEST_S, out=np.empty(np.shape(seconds)))
    position /= LOWEST_S
    np.log10(position, out=position)
    position *= BINS_PER_DECADE
    np.floor(position, out=position)
    # at least 0 already (from LOWEST_S up); capped before the cast, as numpy's clip is slow on integers
    np.minimum(position, N_BINS - 1, out=position)
    return position.astype(np.int64)


def _histogram(exporter: np.ndarray, seconds_ns: np.ndarray, n: int) -> np.ndarray:
    cell = _bin_of(seconds_ns * 1e-9)
    return np.bincount(exporter * N_BINS + cell, minlength=n * N_BINS).reshape(n, N_BINS).astype(np.int64)


def _quantile(histogram: np.ndarray, q: float) -> float | None:
    """The lower edge of the bin holding the q-quantile (s), None for an empty histogram."""
    total = int(histogram.sum())
    if total == 0:
        return None
    cell = int(np.searchsorted(np.cumsum(histogram), q * total, side="left"))
    return float(LOWEST_S * 10 ** (cell / BINS_PER_DECADE))
