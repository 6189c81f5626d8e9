"""Training steps of one job, reconstructed from its network flows hour by hour.

What a step is. A step runs from the start of its forward compute to the end of its optimizer
update, and the next step starts right then (the simulator's truth uses the same definition). The
network shows neither end directly: a gradient sync over the data-parallel (DP) pairs closes each
step, the optimizer runs silently after it, and the next step's first traffic comes some compute
later. So each boundary is placed from two marks:

* A, from the closing sync: its end plus the optimizer time. That is 0 when the phase ends with
  a second collective over the same pairs after a pause (ZeRO-1/2 all-gathers the updated shards
  after the optimizer); it is measured against B where the job has pipeline traffic, and otherwise
  assumed to be OPTIMIZER_SHARE of a step (the optimizer is invisible on the network).
* B, from the next step's start: stage 0 of a pipeline sends its first micro-batches one forward
  pass f apart, so the first two sends t1, t2 put the compute start at t1 - f. When the first
  stages share a host (their hops ride NVLink), the first visible sends come k forward passes in;
  k follows from the gap before them (k backward passes of 2 f, the optimizer, k forward passes).
  Without pipeline traffic B is the next step's first traffic (exact for ZeRO-3 gathers).

A normal boundary is B from pipeline sends, else the earlier of A and B. A gap much longer than
usual at the step's pace is a checkpoint if the job writes bulk data out of the job during it (the
boundary is B: saving belongs to the step that ends; without pipeline sends the next step's lead
is scaled by its sync's length, as step jitter scales both), otherwise a stall before the next
step (the boundary is A). Saves take the job's usual time (median over three or more in view):
a B beyond A plus that holds a stall after the save, the boundary is A plus the usual save; B
from first traffic near it is noisier than the usual save, which replaces it.

Finding the sync phases. DP flows that overlap form bursts; gradient syncs are the heavy ones
(bytes x flows per pair, so stages syncing at once weigh as one), set apart from ZeRO-3 gathers
and MoE all-to-all on the same pairs. The quiet gaps between heavy bursts fall into a few length
regimes (stages syncing one after another, the optimizer pause of ZeRO-1/2, the compute between
steps, checkpoints); the step boundaries are the cut between regimes whose longer gaps recur most
regularly in time, cutting the traffic into like units. Heavy bursts between two boundary gaps
form one sync phase; consecutive phases short of the usual bytes join (a warm-up step's pauses
look like step gaps). Jobs without visible DP traffic (pure pipelines, or DP groups inside a
host) use their pipeline activation sends the same way, with one more condition: a step gap
turns from the cool-down's lone backward sends to the warm-up's lone forward sends (a slow
step's micro-batch gaps can outlast usual step gaps, but sit between exchanges).

What BOCD does. LLMPrism runs BOCD over the intervals between DP communications, in time order.
Here a step is a periodic pattern of several bursts (stages, RS + AG, gathers, all-to-all), not a
change in a stationary series: over the time-ordered gap series of the `small` jobs,
prism_core.bocd at threshold 0.95 finds no change point at all; over per-flow intervals it flagged
the point after a boundary for a third of them (16-way ring job). So BOCD runs over the gap
lengths sorted instead, where each regime is a segment and a step boundary regime starts with a
jump: its MAP change points (Normal-Gamma segments of log10 length spread REGIME_SPREAD, over at
most REGIME_POINTS quantiles, each change moved to the widest spacing around it) are the candidate
cuts, and the regularity rule picks the step cut among them. It replaced a grid of cuts every 5%
of length. Measured (truth pairs, one hour per run, no next hour): fleet seed 0 exact job-hours
0.972 both ways, steps within 1% 99.905% (grid 99.924%: two first-step starts), boundary error
0.047% both; fleet seed 1 equal (0.96, 99.87%, 0.048%); small seeds 0-4 equal. BOCD at threshold
0.95 instead of MAP found the grid's step cut in 28 of 36 fleet jobs; MAP with the refinement
keeps the grid's exact set of gaps in 32, 1-3 more (lone warm-up gaps) in the other 4. Segmenting
rounded distinct lengths instead of quantiles lost the cut in 4 jobs. prism_core.diagnosis uses
BOCD on regimes of step time.

Hours. A step is emitted by the first run whose flows decide its end: usually the hour it ends
in. A step whose sync ends in the last moments of an hour, before the next step's first traffic,
is decided once the quiet after the sync outlasts the gaps inside a phase (or the sync ended with
the all-gather of every stage's updated shards: the optimizer ran) and no checkpoint save can
follow it: the end is A then (the next step cannot start before its own traffic, after the
hour). A save may follow while the quiet is shorter than the job's saves took to start writing,
or on the save cadence (every k steps) once three saves showed it. Otherwise, and for jobs
without DP traffic, the next hour's run emits the step. The state carries the flows after the last emitted boundary, the step number,
the attempt, restarts not yet behind a step and the job's usual timings, so a re-run with the
same state gives the same steps. A phase short of its usual bytes (a hang or failure cut it) ends
no step, nor does a phase after which the job fell silent with a pair short of the flows it
carried in every recent step (a pipeline stage that hangs late in a step leaves only a send or
two out), nor a checkpoint step after which the job fell silent while its peers began the next
step without one GPU: that GPU more likely hung during the save than in the next step's first
moments. After a restart the first step starts with the job's traffic after the downtime. The
first phase of a job new to Prism closes a step only if the view holds the step's start: the job
started in view (warm-up), start markers give the step a usual length, the view opened during
the save before it (the step starts the job's usual tail after the save's last write, a tail
learned like the save's length from three or more saves in view), or the step's sync is the job's
first traffic in view and the usual lead before it (per ns of sync) puts the start in view, and
after any save's writes, by more than the lead missed the hour's boundaries by.

Timings. A job's usual timings come from MIN_STEPS steps in view (MIN_STEPS_WHOLE once it has been
silent for longer than it ran in view: no more will come), else from the previous hours. A job seen
whole with fewer, and none known before, learns them from its last step (unless a save precedes
it): the phase before it, even one the view cut into, ends the step before where the last one
starts, so the two give the period, the gap to the step's first traffic and, with pipeline sends,
the optimizer's tail after the step before's last send. The last step then ends that tail after its
own last send, scaled to its pace by the spacing of each step's last two sends (0.001 s off of an
8.8 s step on fleet seed 3, 0.04 s unscaled), or without pipeline sends OPTIMIZER_SHARE of the
period after its sync (0.001 s of 12.8 s, fleet seed 6).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.bocd import NormalGammaPrior, bocd
from prism_core.constants import CHECKPOINT_FLOW_BYTES, DP, KIND_CODES, OTHER, PP
from prism_core.parallelism import reverse_in_flight, warm_up_votes
from prism_core.schema import STEPS


MERGE_NS = 1_000_000  # flows closer than this are one activity (launch jitter, exporter skew)
CLUSTER_NS = 15_000_000  # one collective's flows start within this of each other across exporters
TRANSFER_NS = 2_000_000  # a pair's flows starting within this are one transfer (its channels)
HEAVY_SEPARATION = 2.5  # gradient syncs weigh this many times other DP bursts (bytes x flows / pairs^2)
MAX_IRREGULARITY = 0.15  # mean relative deviation of boundary spacing from its local median
SMALL_SAMPLE_PENALTY = 0.2  # irregularity a class of one gap would have to beat
MAX_UNIT_EXCESS = 2.0  # no step carries more than twice the sync flows of its neighbours
CUT_RATIO = 1.05  # a cut keeping every gap sits this far below the shortest
REGIME_SPREAD = 0.05  # log10 spread of the lengths of one regime of gaps (BOCD's prior, ~12%)
REGIME_POINTS = 1000  # BOCD segments at most this many quantiles of the gap lengths
REPEAT_SHARE = 0.5  # a last burst with this much of its bytes on pairs the phase used repeats them
SAME_SHAPE = 0.1  # an all-gather of the updated shards repeats the reduce-scatter's bytes and flows
OPTIMIZER_SHARE = 0.04  # optimizer time / step time when no pipeline traffic shows it
LONG_GAP_SHARE = 0.1  # an inter-step gap this share of a step above usual is a checkpoint or stall
COMPLETE_SHARE = 0.9  # a sync phase with fewer bytes or flows than this share of usual was cut short
LAST_COMPLETE_SHARE = 0.97  # the same for a phase after which the job falls silent (hang, failure)
WARMUP_RATIO = 1.15  # a job whose next step is this much slower than usual started in view
SILENCE_STEPS = 4.0  # this many steps without traffic after a sync: the job stopped after it
BULK_WRITE_BYTES = CHECKPOINT_FLOW_BYTES  # one outbound flow this large out of the job is a checkpoint write
SAVE_START_SHARE = 0.25  # a save writes within this share of a step after the sync, unless seen slower
SIZE_BITS = 40  # flow sizes up to 1 TB fit below a pair's code in one int64 key
MAX_CARRY_NS = 600_000_000_000  # flows carried to the next hour reach back at most this far
MIN_STEPS = 8  # fewer steps in view than this: the job's timings come from the previous hours
MIN_STEPS_WHOLE = 4  # the same for a job seen whole, silent for longer than it ran: no more will come
MIN_SAVES = 3  # the usual save is a median over this many checkpoints (one may be a stall with other bulk traffic)


@dataclass
class Timeline:
    steps: pa.Table  # prism_core.schema.STEPS
    state: dict  # JSON-serializable; the `previous` of the next hour


def divide_steps(
    job_id: str,
    job_flows: pa.Table,
    comm_pairs: pa.Table,
    previous: dict | None,
    hour_start_ns: int,
    hour_end_ns: int,
    restarts_ns: Sequence[int] = (),
    job_gpus: pa.Table | None = None,
) -> Timeline:
    """Steps of `job_id` decided by this hour's flows: the job's flows of the hour (sent by its
    members), its directed pairs labelled dp / pp / other, the state the previous hour returned
    (None for a job new to Prism), the job tracker's restart instants (the job's first traffic
    after each downtime; the attempt increments at each) and, where known, the host of each of
    its addresses (`job_gpus`: addr, host). Flows carried from the previous hour start before
    `hour_start_ns`; only flows older than MAX_CARRY_NS before `hour_end_ns` are dropped from the
    carry."""
    state = _State.load(previous)
    traffic = _Traffic.build(job_flows, comm_pairs, state.carry, job_gpus)
    seen_until = state.last_close_ns if state.last_close_ns is not None else -(1 << 62)
    restarts = np.unique(np.array([*state.pending_restarts_ns, *(r for r in restarts_ns if r > seen_until)], np.int64))
    min_steps = _min_steps(traffic, hour_end_ns)
    phases = _sync_phases(traffic, hour_end_ns, state.baseline.get("gap_threshold_ns"), min_steps)
    typical = _typical(phases, state.baseline, min_steps)
    if min_steps == MIN_STEPS_WHOLE and not typical.known:
        # a job seen whole with too few steps to learn its timings will show no more: its last step stands in
        typical = _typical(phases, {**state.baseline, **_last_step_timings(phases, traffic)}, min_steps)
    rows = _steps(phases, typical, traffic, state, restarts, hour_start_ns, hour_end_ns)

    first_step = state.next_step
    state.next_step += len(rows)
    state.attempt = rows[-1]["attempt"] if rows else state.attempt
    # restarts no emitted step is behind yet count for the next hour (within the carry's reach)
    behind = state.last_close_ns if state.last_close_ns is not None else -(1 << 62)
    state.pending_restarts_ns = [int(r) for r in restarts if r > max(behind, hour_end_ns - MAX_CARRY_NS)]
    state.baseline = typical.as_baseline(phases.gap_threshold_ns)
    carry_from = max(state.last_end_ns if state.last_end_ns is not None else -(1 << 62), hour_end_ns - MAX_CARRY_NS)
    state.carry = traffic.carry(carry_from)
    return Timeline(_steps_table(job_id, rows, first_step), state.dump())


# --- traffic ------------------------------------------------------------------------------------


@dataclass
class _Traffic:
    """One job's comm-pair flows as arrays sorted by start (ns), plus its outbound bulk writes."""

    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray
    kind: np.ndarray  # DP | PP | OTHER
    pair: np.ndarray  # index into `pairs`
    exporter: np.ndarray  # index into `exporters`
    pairs: list[str]  # "src>dst"
    exporters: list[str]
    bulk_writes: np.ndarray  # start of each large flow from the job to an address not its GPU
    bulk_write_ends: np.ndarray  # and its end, in the same order
    host_of: dict[str, str]  # address -> host, where known

    COLUMNS = ("start", "end", "nbytes", "kind", "pair", "exporter")

    @classmethod
    def build(cls, job_flows: pa.Table, comm_pairs: pa.Table, carry: dict | None,
              job_gpus: pa.Table | None = None) -> _Traffic:
        kinds = _pair_kinds(comm_pairs)
        gpus = _job_gpus(kinds)
        # only GPU-to-GPU pairs carry training traffic (not storage, monitoring or NFS pairs)
        kinds = kinds.filter(pc.and_(pc.is_in(kinds["src_addr"], value_set=gpus),
                                     pc.is_in(kinds["dst_addr"], value_set=gpus)))
        src = job_flows["src_addr"].combine_chunks().dictionary_encode()
        dst = job_flows["dst_addr"].combine_chunks().dictionary_encode()
        # each flow's pair row, through integer keys on the flows' own address dictionaries
        n_dst = max(len(dst.dictionary), 1)
        pair_src = pc.index_in(kinds["src_addr"], value_set=src.dictionary).to_numpy(zero_copy_only=False)
        pair_dst = pc.index_in(kinds["dst_addr"], value_set=dst.dictionary).to_numpy(zero_copy_only=False)
        pair_key = np.where(np.isnan(pair_src) | np.isnan(pair_dst), -1,
                            np.nan_to_num(pair_src) * n_dst + np.nan_to_num(pair_dst)).astype(np.int64)
        by_key = np.argsort(pair_key)
        flow_key = src.indices.to_numpy().astype(np.int64) * n_dst + dst.indices.to_numpy()
        found = np.minimum(np.searchsorted(pair_key[by_key], flow_key), len(by_key) - 1) if len(by_key) else None
        on_pair = pair_key[by_key][found] == flow_key if found is not None else np.zeros(len(flow_key), bool)
        pair = by_key[found[on_pair]] if found is not None else np.empty(0, np.int64)

        nbytes = job_flows["bytes"].to_numpy()
        outside = ~pc.is_in(dst.dictionary, value_set=gpus).to_numpy(zero_copy_only=False)
        outbound = outside[dst.indices.to_numpy()] & (nbytes >= BULK_WRITE_BYTES)
        start = job_flows["time_flow_start_ns"].to_numpy()

        carried = _decode_carry(carry)
        pairs = [f"{s}>{d}" for s, d in zip(kinds["src_addr"].to_pylist(), kinds["dst_addr"].to_pylist())]
        exporter_text = pc.fill_null(job_flows["sampler_address"], "").combine_chunks().dictionary_encode()
        exporters = list(carried["exporters"])
        exporter = _extend(exporters, exporter_text.dictionary.to_pylist())[exporter_text.indices.to_numpy()]
        columns = {
            "start": start[on_pair],
            "end": job_flows["time_flow_end_ns"].to_numpy()[on_pair],
            "nbytes": nbytes[on_pair],
            "kind": kinds["kind"].to_numpy()[pair],
            "pair": pair,
            "exporter": exporter[on_pair],
        }
        # the carried flows' codes point into the lists they were carried with
        carried["pair"] = _extend(pairs, carried["pairs"])[carried["pair"]]
        columns["kind"] = _activations_only(columns["kind"], columns["pair"], columns["nbytes"])
        columns = {name: np.concatenate([carried[name], values]).astype(np.int64) for name, values in columns.items()}
        start_order = columns["start"]
        if not np.all(start_order[1:] >= start_order[:-1]):  # flows usually come sorted already
            order = np.argsort(start_order, kind="stable")
            columns = {name: values[order] for name, values in columns.items()}
        write_start = np.concatenate([carried["bulk_writes"], start[outbound]])
        write_end = np.concatenate([carried["bulk_write_ends"], job_flows["time_flow_end_ns"].to_numpy()[outbound]])
        by_start = np.argsort(write_start, kind="stable")
        host_of = dict(zip(job_gpus["addr"].to_pylist(), job_gpus["host"].to_pylist())) if job_gpus is not None else {}
        return cls(**columns, pairs=pairs, exporters=exporters,
                   bulk_writes=write_start[by_start].astype(np.int64), bulk_write_ends=write_end[by_start].astype(np.int64),
                   host_of=host_of)

    def pair_ends(self) -> list[list[str]]:
        """[src, dst] of each pair."""
        return [name.split(">", 1) for name in self.pairs]

    def carry(self, from_ns: int) -> dict | None:
        """The flows (and bulk writes) from `from_ns` on, compactly, for the next hour."""
        rows = np.flatnonzero(self.start >= from_ns)
        if not len(rows):
            return None
        pair_used, pair = np.unique(self.pair[rows], return_inverse=True)
        exporter_used, exporter = np.unique(self.exporter[rows], return_inverse=True)
        values = {name: getattr(self, name)[rows] for name in self.COLUMNS}
        values["pair"], values["exporter"] = pair, exporter
        packed = np.stack([values[name] for name in self.COLUMNS]).astype("<i8")
        later_writes = self.bulk_writes >= from_ns
        return {
            "flows": base64.b64encode(zlib.compress(packed.tobytes(), 6)).decode("ascii"),
            "pairs": [self.pairs[i] for i in pair_used],
            "exporters": [self.exporters[i] for i in exporter_used],
            "bulk_writes": self.bulk_writes[later_writes].tolist(),
            "bulk_write_ends": self.bulk_write_ends[later_writes].tolist(),
        }

    def cluster_start(self, rows: np.ndarray) -> int:
        """When the earliest of `rows` (one collective, say) started: per exporter the first start
        within CLUSTER_NS of the earliest, the median over exporters (clock skew cancels)."""
        first = self.start[rows].min()
        rows = rows[self.start[rows] <= first + CLUSTER_NS]
        return _median_per_group(self.start[rows], self.exporter[rows], np.minimum)

    def cluster_end(self, rows: np.ndarray) -> int:
        """When the collective of `rows` finished: each pair's last transfer ends at its earliest
        channel's end (single flows stretch), and the collective at the median of the pairs that end
        within CLUSTER_NS of the latest ones (the group that finished last; clock skew averages)."""
        by_pair = rows[np.lexsort((self.start[rows], self.pair[rows]))]
        pair = self.pair[by_pair]
        last_of_pair = np.r_[pair[1:] != pair[:-1], True]
        group = np.cumsum(np.r_[True, pair[1:] != pair[:-1]]) - 1
        final = self.start[by_pair] >= self.start[by_pair][last_of_pair][group] - TRANSFER_NS
        ends = np.full(group[-1] + 1, np.iinfo(np.int64).max)
        np.minimum.at(ends, group[final], self.end[by_pair][final])
        latest = np.sort(ends)[-2] if len(ends) > 1 else ends[0]
        return int(np.median(ends[ends >= latest - CLUSTER_NS]))

    def first_sends(self, rows: np.ndarray) -> tuple[int, int] | None:
        """(t1, f) of a step whose pipeline traffic starts with `rows` (kind PP): the pairs that
        send first send their first two micro-batches one forward pass f apart, the first at t1;
        medians over those pairs (clock skew cancels in f)."""
        if not len(rows):
            return None
        by_pair = rows[np.lexsort((self.start[rows], self.pair[rows]))]
        pair, start = self.pair[by_pair], self.start[by_pair]
        first_of_pair = np.r_[True, pair[1:] != pair[:-1]]
        t1 = start[first_of_pair][np.cumsum(first_of_pair) - 1]
        later = np.flatnonzero(start > t1 + TRANSFER_NS)
        later = later[np.r_[True, pair[later][1:] != pair[later][:-1]]] if len(later) else later
        if not len(later):
            return None
        t1, t2 = t1[later], start[later]
        earliest = t1.min()
        forward = t2[np.argmin(t1)] - earliest
        leading = t1 <= earliest + min(CLUSTER_NS, forward // 2)
        return int(np.median(t1[leading])), int(np.median(t2[leading] - t1[leading]))


def _pair_kinds(comm_pairs: pa.Table) -> pa.Table:
    """One row per directed pair, sorted, with its kind code (dp before pp before other)."""
    code = pa.array([KIND_CODES[k] for k in comm_pairs["kind"].to_pylist()], pa.int64())
    table = pa.table({"src_addr": comm_pairs["src_addr"], "dst_addr": comm_pairs["dst_addr"], "kind": code})
    table = table.group_by(["src_addr", "dst_addr"], use_threads=False).aggregate([("kind", "min")])
    return table.rename_columns(["src_addr", "dst_addr", "kind"]).sort_by([("src_addr", "ascending"),
                                                                          ("dst_addr", "ascending")])


def _job_gpus(kinds: pa.Table) -> pa.Array:
    """The job's GPU addresses: the ends of its DP and pipeline pairs (of all its pairs if it has
    neither)."""
    collective = kinds.filter(pc.less_equal(kinds["kind"], PP))
    ends = collective if collective.num_rows else kinds
    return pc.unique(pa.concat_arrays([ends["src_addr"].combine_chunks(), ends["dst_addr"].combine_chunks()]))


def _activations_only(kind: np.ndarray, pair: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Pipeline pairs carry one activation size per micro-batch; other sizes on them (the tied
    embedding all-reduce between the first and last stage of a 2-stage pipeline) are not
    pipeline sends: kind OTHER."""
    on_pipeline = np.flatnonzero(kind == PP)
    if not len(on_pipeline):
        return kind
    key = pair[on_pipeline] << SIZE_BITS | np.minimum(nbytes[on_pipeline], (1 << SIZE_BITS) - 1)
    sizes, count = np.unique(key, return_counts=True)
    size_pair = sizes >> SIZE_BITS
    most = np.lexsort((count, size_pair))  # per pair, its most frequent size comes last
    last_of_pair = np.r_[size_pair[most][1:] != size_pair[most][:-1], True]
    activation = np.full(int(pair.max()) + 1, -1, np.int64)
    activation[size_pair[most][last_of_pair]] = sizes[most][last_of_pair]
    kind = kind.copy()
    kind[on_pipeline[key != activation[pair[on_pipeline]]]] = OTHER
    return kind


def _extend(names: list[str], more: list[str]) -> np.ndarray:
    """Append the names of `more` that `names` lacks; the index of each of `more` in `names`."""
    index = {name: i for i, name in enumerate(names)}
    for name in more:
        if name not in index:
            index[name] = len(names)
            names.append(name)
    return np.array([index[name] for name in more], np.int64)


def _decode_carry(carry: dict | None) -> dict:
    empty = {name: np.empty(0, np.int64) for name in _Traffic.COLUMNS}
    if not carry:
        return {**empty, "pairs": [], "exporters": [], "bulk_writes": np.empty(0, np.int64),
                "bulk_write_ends": np.empty(0, np.int64)}
    packed = np.frombuffer(zlib.decompress(base64.b64decode(carry["flows"])), "<i8").reshape(len(_Traffic.COLUMNS), -1)
    writes = np.asarray(carry["bulk_writes"], np.int64)
    return {**dict(zip(_Traffic.COLUMNS, packed)), "pairs": list(carry["pairs"]),
            "exporters": list(carry["exporters"]), "bulk_writes": writes,
            # a state written before write ends were carried: their starts stand in
            "bulk_write_ends": np.asarray(carry.get("bulk_write_ends", writes), np.int64)}


def _median_per_group(values: np.ndarray, groups: np.ndarray, reduce: np.ufunc) -> int:
    order = np.argsort(groups, kind="stable")
    groups, values = groups[order], values[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    return int(np.median(reduce.reduceat(values, starts)))


# --- sync phases ----------------------------------------------------------------------------------


@dataclass
class _Phases:
    """Sync phases in time order, each closing a step (if complete), and what follows each."""

    flows: list[np.ndarray]  # traffic rows of each phase's heavy bursts
    start_ns: np.ndarray  # the phase's first burst starts
    close_ns: np.ndarray  # its last burst ends
    nbytes: np.ndarray
    nflows: np.ndarray
    after_optimizer: np.ndarray  # bool: the phase ends with a collective after the optimizer
    closed: np.ndarray  # bool: nothing later can still join the phase
    next_ns: np.ndarray  # first traffic after the phase (-1: none in view)
    first_send_ns: np.ndarray  # the next step's first pipeline sends (-1: none)
    forward_ns: np.ndarray  # and one forward pass between them
    bulk_write: np.ndarray  # bool: bulk writes between the phase and the next traffic
    write_delay_ns: np.ndarray  # end of the phase -> the first bulk write after it (-1: none in view)
    written_until_ns: np.ndarray  # end of the last bulk write after the phase, before the next traffic (-1: none)
    inner_gap_ns: int  # the longest quiet between bursts of one phase (at least MERGE_NS)
    has_dp: bool
    gap_threshold_ns: float | None


def _min_steps(traffic: _Traffic, hour_end_ns: int) -> int:
    """How many steps in view the job's timings are learned from: MIN_STEPS, or MIN_STEPS_WHOLE
    when the job has been silent for longer than it ran in view (a short job that ended: waiting
    for more steps would leave its steps out for good)."""
    if not len(traffic.start):
        return MIN_STEPS
    last = int(traffic.end.max())
    return MIN_STEPS_WHOLE if hour_end_ns - last > last - int(traffic.start.min()) else MIN_STEPS


def _sync_phases(traffic: _Traffic, hour_end_ns: int, gap_threshold_ns: float | None, min_steps: int) -> _Phases:
    """The job's sync phases (see the module doc) and what follows each; `gap_threshold_ns` is
    the previous hours' boundary gap, kept while too few steps are in view to find it again."""
    has_dp = bool(np.any(traffic.kind == DP))
    signal = np.flatnonzero(traffic.kind == (DP if has_dp else PP))
    if not len(signal):
        signal = np.arange(len(traffic.start))
    burst, b_start, b_end = _bursts(traffic.start[signal], traffic.end[signal])
    b_bytes = np.bincount(burst, traffic.nbytes[signal], minlength=len(b_start))
    if has_dp:
        # bytes and flows per pair: a sync of several stages at once weighs as one stage's sync
        b_flows = np.bincount(burst, minlength=len(b_start))
        burst_pair = np.sort(burst * len(traffic.pairs) + traffic.pair[signal])
        distinct = burst_pair[np.r_[True, burst_pair[1:] != burst_pair[:-1]]]
        b_pairs = np.bincount(distinct // len(traffic.pairs), minlength=len(b_start))
        heavy = _upper_class(np.log(np.maximum(b_bytes, 1.0) * b_flows / b_pairs.astype(float) ** 2))
    else:
        heavy = np.ones(len(b_start), bool)
    candidates = np.flatnonzero(heavy)

    gaps = b_start[candidates[1:]] - b_end[candidates[:-1]]
    candidate_of_burst = np.cumsum(heavy) - 1
    on_candidate = heavy[burst]
    pipeline_only = not has_dp and bool(np.any(traffic.kind == PP))
    turn = _pipeline_turns(traffic, signal, burst) if pipeline_only else np.ones(len(gaps), bool)
    gap_threshold_ns = _boundary_gap_threshold(gaps, b_end[candidates[:-1]], candidate_of_burst[burst[on_candidate]],
                                               traffic.bulk_writes, gap_threshold_ns, turn, min_steps)
    between_phases = turn & (gaps >= gap_threshold_ns)
    # phase p holds candidates[first[p]:first[p + 1]]
    first = np.r_[0, np.flatnonzero(between_phases) + 1] if len(candidates) else np.empty(0, int)
    first = _join_partial_phases(first, b_bytes[candidates], b_start[candidates], b_end[candidates])
    last = np.r_[first[1:] - 1, len(candidates) - 1] if len(candidates) else np.empty(0, int)

    flows, start_ns, close_ns, nbytes, after_optimizer = [], [], [], [], []
    gathered_every_stage = False  # of the last phase: see below
    flow_rank = np.argsort(burst, kind="stable")  # signal rows grouped by burst
    burst_from = np.searchsorted(burst[flow_rank], np.arange(len(b_start) + 1))
    for lo, hi in zip(first, last):
        members = candidates[lo : hi + 1]
        rows = [signal[flow_rank[burst_from[b] : burst_from[b + 1]]] for b in members]
        repeated, same_flows, every_pair = _repeated_share(traffic, rows) if has_dp else (0.0, False, False)
        all_gather = same_flows and abs(repeated - 1.0) <= SAME_SHAPE
        if repeated >= REPEAT_SHARE and not all_gather:
            # a different collective on the same pairs right after the optimizer: the next
            # step's ZeRO-3 parameter gather, its first traffic, not part of this sync
            members, rows, repeated = members[:-1], rows[:-1], 0.0
        flows.append(np.concatenate(rows))
        start_ns.append(traffic.cluster_start(rows[0]))
        close_ns.append(traffic.cluster_end(rows[-1]))
        nbytes.append(float(b_bytes[members].sum()))
        after_optimizer.append(repeated >= REPEAT_SHARE)
        # every stage's updated shards gathered at once: the optimizer ran, the sync is over
        gathered_every_stage = all_gather and every_pair
    n = len(first)
    inner_gap_ns = int(np.max(gaps[~between_phases], initial=MERGE_NS))
    close = np.array(close_ns, np.int64)
    closed = np.ones(n, bool)
    if n:
        closed[-1] = hour_end_ns - int(b_end[candidates[-1]]) >= gap_threshold_ns or gathered_every_stage
    next_ns = np.full(n, -1, np.int64)
    first_send_ns = np.full(n, -1, np.int64)
    forward_ns = np.full(n, -1, np.int64)
    bulk_write = np.zeros(n, bool)
    written_until_ns = np.full(n, -1, np.int64)
    first_write = np.r_[traffic.bulk_writes, -1][np.searchsorted(traffic.bulk_writes, close, side="right")]
    write_delay_ns = np.where(first_write >= 0, first_write - close, -1)
    for p in range(n):
        # the next step's first traffic may open the next phase (pipeline-only jobs)
        until = close[p + 1] if p + 1 < n else np.iinfo(np.int64).max
        lo, hi = np.searchsorted(traffic.start, [traffic.end[flows[p]].max() + 1, until])
        window = np.arange(lo, hi)
        if not has_dp:  # other traffic after a pipeline step's last send (a tied embedding) is its own
            window = window[traffic.kind[window] == PP]
        if len(window):
            next_ns[p] = traffic.cluster_start(window)
            # the first sends come within a small part of a step: look no further
            soon = window[: np.searchsorted(traffic.start[window], next_ns[p] + (until - close[p]) // 4)]
            sends = traffic.first_sends(soon[traffic.kind[soon] == PP])
            if sends is not None:
                first_send_ns[p], forward_ns[p] = sends
        saved_until = next_ns[p] if len(window) else until
        # the writes after the phase and before the next traffic (bulk writes are sorted by start)
        saving = slice(np.searchsorted(traffic.bulk_writes, close[p], side="right"),
                       np.searchsorted(traffic.bulk_writes, saved_until, side="left"))
        bulk_write[p] = saving.stop > saving.start
        written_until_ns[p] = traffic.bulk_write_ends[saving].max(initial=-1)
    return _Phases(flows, np.array(start_ns, np.int64), close, np.array(nbytes),
                   np.array([len(rows) for rows in flows], float), np.array(after_optimizer, bool),
                   closed, next_ns, first_send_ns, forward_ns, bulk_write, write_delay_ns, written_until_ns,
                   inner_gap_ns, has_dp,
                   float(gap_threshold_ns) if np.isfinite(gap_threshold_ns) else None)


def _pipeline_turns(traffic: _Traffic, rows: np.ndarray, burst: np.ndarray) -> np.ndarray:
    """Per gap between consecutive bursts of the pipeline sends `rows` (burst of each): whether it
    turns from backward to forward sends, as a step gap does. A step opens with warm-up forwards
    before any gradient comes back and closes with cool-down backwards after the last forward; in
    between, both directions of a stage link are in flight together. So a step gap follows lone
    backward sends and precedes lone forward sends, while a slow step's micro-batch gaps (a
    warm-up step's can outlast usual step gaps) do not. A link joins two hosts (where the hosts
    are known): a stage boundary inside a host may send forward and backward through different
    NICs. A direction's lone sends come right before exchanges (warm-up) or right after them
    (cool-down); of a link's two directions, the one with more warm-up-like sends is forward (the
    first backward, before the exchanges, looks like warm-up too). A link without exchanges of its
    own (the first stage's, when there are no more micro-batches than stages) is timed against the
    exchanges of every link. Every gap when no lone sends show a direction."""
    n_gaps = int(burst[-1]) if len(burst) else 0
    hosts = [[traffic.host_of.get(addr, addr) for addr in ends] for ends in traffic.pair_ends()]
    links = [f"{src}>{dst}" if src != dst else name for (src, dst), name in zip(hosts, traffic.pairs)]
    names, direction_of_pair = np.unique(np.array(links, dtype=object), return_inverse=True)
    index = {name: i for i, name in enumerate(names)}
    none = len(names)
    reverse_of = np.array([index.get(">".join(name.split(">")[::-1]), none) for name in names] + [none], np.int64)
    direction, start, end = direction_of_pair[traffic.pair[rows]], traffic.start[rows], traffic.end[rows]
    reverse = reverse_of[direction]
    answered = reverse_in_flight(direction, reverse, start, end)
    lead = np.zeros(len(rows))  # > 0 on forward directions
    for link in (np.minimum(direction, reverse), np.zeros_like(direction)):
        score = np.bincount(direction, warm_up_votes(link, start, answered), minlength=none + 1)
        lead = np.where(lead == 0, score[direction] - score[reverse], lead)
    if not np.any(lead):
        return np.ones(n_gaps, bool)
    flows = np.bincount(burst)
    lone_forward = np.bincount(burst, ~answered & (lead > 0)) == flows
    lone_backward = np.bincount(burst, ~answered & (lead < 0)) == flows
    return lone_backward[:-1] & lone_forward[1:]


def _join_partial_phases(first: np.ndarray, nbytes: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Consecutive phases short of a usual phase's bytes join while that brings them closer to
    it: a warm-up step runs slower, and its pauses between micro-batches can look like step gaps.
    A silence longer than a usual step keeps them apart (a failure: the cut phase stays short and
    ends no step)."""
    if len(first) < 2:
        return first
    bounds = np.r_[first, len(nbytes)]
    cumulative = np.r_[0.0, np.cumsum(nbytes)]
    phase_bytes = cumulative[bounds[1:]] - cumulative[bounds[:-1]]
    usual = np.median(phase_bytes)
    phase_end = end[bounds[1:] - 1]
    complete_ends = phase_end[phase_bytes >= COMPLETE_SHARE * usual]
    # fewer than two complete phases: no usual step, so no silence is known to part them
    step = float(np.median(np.diff(complete_ends))) if len(complete_ends) > 1 else np.inf
    joined, carried = [], np.inf
    for p in range(len(first)):
        short = phase_bytes[p] < COMPLETE_SHARE * usual
        closer = abs(carried + phase_bytes[p] - usual) < abs(carried - usual)
        if not (short and closer) or start[first[p]] - phase_end[p - 1] > step:
            joined.append(first[p])
            carried = 0.0
        carried += phase_bytes[p]
    return np.array(joined, first.dtype)


def _repeated_share(traffic: _Traffic, bursts: list[np.ndarray]) -> tuple[float, bool, bool]:
    """(bytes the phase's earlier bursts moved on the pairs of its last burst per byte of that
    burst, whether they did so in as many flows, whether those were all of the earlier bytes).
    About (1, True) when the last burst repeats a collective on the same pairs bucket for bucket
    (the all-gather of the updated shards after the optimizer, ZeRO-1/2), and all of them when it
    gathers every stage's shards at once; near 0 when pipeline stages sync one after another on
    their own pairs; a ZeRO-3 parameter gather moves the whole shard at once, in fewer flows."""
    if len(bursts) < 2:
        return 0.0, False, False
    last, earlier = bursts[-1], np.concatenate(bursts[:-1])
    repeated = np.isin(traffic.pair[earlier], traffic.pair[last])
    repeated_bytes = traffic.nbytes[earlier][repeated].sum()
    share = repeated_bytes / traffic.nbytes[last].sum()
    every_pair = repeated_bytes >= (1.0 - SAME_SHAPE) * traffic.nbytes[earlier].sum()
    return float(share), abs(repeated.sum() / len(last) - 1.0) <= SAME_SHAPE, bool(every_pair)


def _bursts(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flows (sorted by start) that overlap or nearly touch form one burst: (burst of each flow,
    burst starts, burst ends)."""
    if not len(start):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    reach = np.maximum.accumulate(end)
    opens = np.r_[True, start[1:] > reach[:-1] + MERGE_NS]
    burst = np.cumsum(opens) - 1
    first = np.flatnonzero(opens)
    return burst, start[first], np.maximum.reduceat(end, first)


def _upper_class(weight: np.ndarray) -> np.ndarray:
    """The upper of two classes of `weight` (log scale) by Otsu's split, when the two class means
    are at least log(HEAVY_SEPARATION) apart; otherwise every element."""
    n = len(weight)
    if n < 2:
        return np.ones(n, bool)
    ordered = np.sort(weight)
    below = np.arange(1, n)
    sum_below = np.cumsum(ordered)[:-1]
    mean_below = sum_below / below
    mean_above = (ordered.sum() - sum_below) / (n - below)
    split = int(np.argmax(below * (n - below) * (mean_above - mean_below) ** 2))
    if mean_above[split] - mean_below[split] < np.log(HEAVY_SEPARATION):
        return np.ones(n, bool)
    return weight >= ordered[split + 1]


def _boundary_gap_threshold(
    gaps: np.ndarray, at: np.ndarray, flow_candidate: np.ndarray, bulk_writes: np.ndarray, previous: float | None,
    eligible: np.ndarray | None = None, min_steps: int = MIN_STEPS,
) -> float:
    """The shortest gap between two candidate bursts that still separates two steps.

    The gap lengths fall into a few regimes: stages syncing one after another, the optimizer pause,
    the compute between steps, checkpoints, and for pipelines the micro-batch cadence. BOCD finds
    where the sorted lengths change regime (`_regime_cuts`); each such cut keeps the gaps above
    it, and marks steps when those gaps recur
    regularly in time, no unit between two of them carries much more traffic than its neighbours
    (as a regime boundary in the middle of the hour would), and they are not mostly checkpoint
    saves. Of those, the most regular wins (a finer cut adds the micro-batch cadence, whose warm-up
    and cool-down break the rhythm once per step), small classes handicapped as their regularity
    may be luck (the micro-batches of a warm-up step alone). Only `eligible` gaps (default: all)
    can separate steps. Without such a cut, the previous hour's."""
    eligible = np.ones(len(gaps), bool) if eligible is None else eligible
    fallback = previous if previous is not None else (float(gaps[eligible].min()) if eligible.any() else np.inf)
    if np.sum(eligible & (gaps >= fallback)) < min_steps:
        return fallback
    log_gaps = np.log10(np.maximum(gaps, 1))
    cuts = _regime_cuts(log_gaps[eligible])
    best, best_score, seen = fallback, np.inf, set()
    for cut in cuts:
        kept = np.flatnonzero(eligible & (log_gaps >= cut))
        if len(kept) in seen:
            continue
        seen.add(len(kept))
        irregularity = _irregularity(at[kept])
        # few gaps can look regular by chance: rank by an upper bound, ~1/sqrt(n) wide
        score = irregularity + SMALL_SAMPLE_PENALTY / np.sqrt(len(kept))
        if irregularity > MAX_IRREGULARITY or score >= best_score:
            continue
        if _unit_excess(kept, flow_candidate) > MAX_UNIT_EXCESS:
            continue
        saving = np.searchsorted(bulk_writes, at[kept] + gaps[kept]) > np.searchsorted(bulk_writes, at[kept])
        if np.mean(saving) < 0.5:
            shortest_kept = float(gaps[kept].min())
            dropped = gaps[eligible & (gaps < shortest_kept)].astype(float)
            # halfway (in log) to the longest gap left inside steps
            best = float(np.sqrt(shortest_kept * dropped.max())) if len(dropped) else shortest_kept / CUT_RATIO
            best_score = score
    return best


def _regime_cuts(log_gaps: np.ndarray) -> np.ndarray:
    """The lengths (log10) where the gap lengths change regime, and the shortest (a cut that
    keeps every gap): BOCD's MAP segmentation of the sorted lengths (of REGIME_POINTS quantiles
    of them, for speed), each change moved to the widest spacing of all the sorted lengths
    around it."""
    ordered = np.sort(log_gaps)
    picks = np.unique(np.linspace(0, len(ordered) - 1, min(len(ordered), REGIME_POINTS)).round().astype(np.int64))
    sample = ordered[picks]
    prior = NormalGammaPrior(mu=float(np.median(sample)), kappa=0.01, alpha=1.0, beta=REGIME_SPREAD**2)
    changes = bocd(sample, prior=prior).changepoints
    spacing = np.diff(ordered)
    around = zip(picks[np.maximum(changes - 1, 0)], picks[np.minimum(changes + 1, len(picks) - 1)])
    return np.r_[ordered[0], [ordered[lo + 1 + np.argmax(spacing[lo:hi])] for lo, hi in around]]


def _unit_excess(boundary_gaps: np.ndarray, flow_candidate: np.ndarray) -> float:
    """The most flows any unit between boundary gaps carries against the median of its 8
    neighbours (units cut by the window carry fewer, never more)."""
    unit = np.searchsorted(boundary_gaps, flow_candidate)  # gap i separates candidates i and i + 1
    flows = np.bincount(unit, minlength=len(boundary_gaps) + 1).astype(float)
    if len(flows) < 3:
        return np.inf
    window = np.lib.stride_tricks.sliding_window_view(np.pad(flows, 4, mode="reflect"), 9)
    local = np.median(np.delete(window, 4, axis=1), axis=1)
    return float(np.max(flows / np.maximum(local, 1.0)))


def _irregularity(times: np.ndarray) -> float:
    """Mean deviation of the spacing of `times` from the median of its 8 neighbours, each capped
    at 1: near 0 for one event per step, high when two kinds of gaps interleave (an even number
    of neighbours keeps an alternating pattern from matching itself)."""
    spacing = np.diff(times).astype(float)
    if len(spacing) < 3:
        return np.inf
    window = np.lib.stride_tricks.sliding_window_view(np.pad(spacing, 4, mode="reflect"), 9)
    local = np.median(np.delete(window, 4, axis=1), axis=1)
    return float(np.mean(np.minimum(np.abs(spacing / local - 1.0), 1.0)))


# --- boundaries ---------------------------------------------------------------------------------


@dataclass
class _Typical:
    """The job's usual timings: from this hour's normal steps, else from the previous hours."""

    period_ns: float
    gap_ns: float  # end of a sync phase -> the next step's first traffic
    phase_bytes: float
    phase_flows: float
    fill: int  # forward passes before the first visible pipeline send (stages on one host hide)
    close_to_end_ns: float | None  # end of a sync phase -> end of the step, where measured
    lead_ns: float | None  # start of a step -> its first traffic
    lead_per_sync: float | None  # the same per ns of the step's sync phase (both scale with jitter)
    sync_ns: float | None  # length of a sync phase
    forward_ns: float | None  # one forward pass between the first pipeline sends of a step
    write_delay_ns: float | None  # longest seen from a sync's end to its checkpoint's first write
    save_ns: float | None  # a checkpoint's save: A -> the next step's start
    save_tail_ns: float | None  # a save's last write ends -> the next step's start

    @property
    def known(self) -> bool:
        """Whether the usual period and gap are known: steps can be told only then."""
        return bool(np.isfinite(self.period_ns) and np.isfinite(self.gap_ns))

    def close_to_end(self) -> float:
        if self.close_to_end_ns is not None:
            return self.close_to_end_ns
        return OPTIMIZER_SHARE * self.period_ns if np.isfinite(self.period_ns) else 0.0

    def as_baseline(self, gap_threshold_ns: float | None) -> dict:
        return {"period_ns": self.period_ns, "gap_ns": self.gap_ns, "phase_bytes": self.phase_bytes,
                "phase_flows": self.phase_flows,
                "fill": self.fill, "close_to_end_ns": self.close_to_end_ns, "lead_ns": self.lead_ns,
                "lead_per_sync": self.lead_per_sync, "sync_ns": self.sync_ns, "forward_ns": self.forward_ns,
                "write_delay_ns": self.write_delay_ns, "save_ns": self.save_ns, "save_tail_ns": self.save_tail_ns,
                "gap_threshold_ns": gap_threshold_ns}


def _typical(phases: _Phases, baseline: dict, min_steps: int) -> _Typical:
    def median(values: np.ndarray, name: str) -> float | None:
        return float(np.median(values)) if len(values) >= min_steps else baseline.get(name)

    phase_bytes = median(phases.nbytes, "phase_bytes") or 0.0
    phase_flows = median(phases.nflows, "phase_flows") or 0.0
    complete = _complete(phases, phase_bytes, phase_flows)
    period = median(np.diff(phases.close_ns[complete]), "period_ns")
    followed = complete & (phases.next_ns >= 0)
    gap = median((phases.next_ns - phases.close_ns)[followed], "gap_ns")
    typical = _Typical(period or np.inf, gap or np.inf, phase_bytes, phase_flows, baseline.get("fill", 1),
                       baseline.get("close_to_end_ns"), baseline.get("lead_ns"), baseline.get("lead_per_sync"),
                       baseline.get("sync_ns"), baseline.get("forward_ns"), baseline.get("write_delay_ns"),
                       baseline.get("save_ns"), baseline.get("save_tail_ns"))
    if period is None or gap is None:
        return typical
    typical.forward_ns = median(phases.forward_ns[followed & (phases.forward_ns > 0)], "forward_ns")
    normal = followed & ~_long_gap(phases, typical)
    sends = normal & (phases.first_send_ns >= 0)
    if not phases.has_dp and sends.sum() >= min_steps:
        # stages sharing a host hide the first sends of a step
        typical.fill = max(1, int(np.round(np.median(_fill_passes(phases, period)[sends]))))
    start = _next_start(phases, typical)
    typical.close_to_end_ns = median((start - phases.close_ns)[sends], "close_to_end_ns")
    timed = normal & (_next_sync(phases) > 0)
    lead = phases.next_ns - _boundaries(phases, typical)
    typical.lead_ns = median(lead[normal], "lead_ns")
    typical.lead_per_sync = median((lead / _next_sync(phases))[timed], "lead_per_sync")
    typical.sync_ns = median((phases.close_ns - phases.start_ns)[complete], "sync_ns")
    saving = _checkpoints(phases, typical)
    if np.any(saving):
        typical.write_delay_ns = float(max(phases.write_delay_ns[saving].max(), typical.write_delay_ns or 0.0))
    if saving.sum() >= MIN_SAVES:
        saved_until = _saved_until(phases, typical)
        typical.save_ns = float(np.median((saved_until - _after_sync(phases, typical))[saving]))
        typical.save_tail_ns = float(np.median((saved_until - phases.written_until_ns)[saving]))
    return typical


def _fill_passes(phases: _Phases, period_ns: float) -> np.ndarray:
    """Forward passes before each phase's next first pipeline send, unrounded: without DP the
    phase ends with the last visible gradient send, and the gap after it holds k backward passes
    (b = 2 f), the optimizer, and k forward passes before the first send."""
    unexplained = phases.first_send_ns - phases.close_ns - OPTIMIZER_SHARE * period_ns
    return unexplained / (3 * phases.forward_ns)


def _last_step_timings(phases: _Phases, traffic: _Traffic) -> dict:
    """The usual timings of a job seen whole from its last step alone, when too few steps are in
    view to learn them (and no previous hour knew them): the step closed by the last phase ran
    from the end of the step before it, closed by the phase before (one the view cut into still
    closes its step), so the two phases give its period, the gap before its first traffic, and
    with pipeline sends its first forward passes and the optimizer's tail after the step before's
    last send. That tail (stage 0's last backward pass and the optimizer) is compute: it is scaled
    to the last step's pace by the spacing of each step's last two sends (a jittered step stretches
    its micro-batches alike). Without pipeline sends the tail stays OPTIMIZER_SHARE of the period.
    A usual phase carries the larger bytes of the two (the view may cut the first, the job's end
    the last). Empty without two phases, the first followed by the next step's traffic, or with a
    checkpoint save between them (the gap would hold the save, not the optimizer's tail)."""
    if len(phases.close_ns) < 2 or phases.next_ns[-2] < 0 or phases.bulk_write[-2]:
        return {}
    before_close, period = int(phases.close_ns[-2]), int(phases.close_ns[-1] - phases.close_ns[-2])
    timings = {"period_ns": period, "gap_ns": int(phases.next_ns[-2]) - before_close,
               "phase_bytes": float(phases.nbytes[-2:].max()), "phase_flows": float(phases.nflows[-2:].max())}
    if phases.first_send_ns[-2] >= 0:
        forward = int(phases.forward_ns[-2])
        fill = 1 if phases.has_dp else max(1, int(np.round(_fill_passes(phases, period)[-2])))
        tail = int(phases.first_send_ns[-2]) - fill * forward - before_close
        spacings = [_last_send_spacing(traffic, phases.flows[p]) for p in (-2, -1)]
        pace = spacings[1] / spacings[0] if all(spacings) else 1.0
        timings |= {"forward_ns": forward, "fill": fill, "close_to_end_ns": tail * pace}
    return timings


def _last_send_spacing(traffic: _Traffic, rows: np.ndarray) -> int | None:
    """Between the starts of the last two sends of `rows` (flows starting within CLUSTER_NS of
    each other are one send, across channels and exporters); None with fewer than two."""
    starts = np.sort(traffic.start[rows])
    sends = starts[np.r_[True, np.diff(starts) > CLUSTER_NS]]
    return int(sends[-1] - sends[-2]) if len(sends) > 1 else None


def _checkpoints(phases: _Phases, typical: _Typical) -> np.ndarray:
    """Phases followed by a checkpoint save: a long gap with bulk writes out of the job."""
    return _long_gap(phases, typical) & phases.bulk_write


def _long_gap(phases: _Phases, typical: _Typical) -> np.ndarray:
    """Whether the gap after each phase is longer than usual (a checkpoint or a stall), at the
    pace of the step (a warm-up or degraded step runs slower; its first sends show by how much)."""
    pace = np.where(phases.forward_ns > 0, phases.forward_ns / (typical.forward_ns or np.inf), 1.0)
    pace = np.where(np.isfinite(pace) & (pace > 0), pace, 1.0)
    expected = typical.gap_ns * pace + LONG_GAP_SHARE * typical.period_ns
    return (phases.next_ns >= 0) & (phases.next_ns - phases.close_ns > expected)


def _next_start(phases: _Phases, typical: _Typical) -> np.ndarray:
    """B: the next step's compute start from its first pipeline sends, else its first traffic."""
    from_sends = phases.first_send_ns - typical.fill * phases.forward_ns
    return np.where(phases.first_send_ns >= 0, from_sends, phases.next_ns)


def _lead(phases: _Phases, typical: _Typical) -> np.ndarray:
    """Compute of the next step before its first traffic: scaled by the next sync's length when
    that is a usual one (step jitter stretches both alike), the usual lead otherwise (a straggler
    stretches the sync with waiting, not the compute)."""
    if typical.lead_ns is None:
        return np.zeros(len(phases.close_ns), np.int64)
    next_sync = _next_sync(phases)
    scaled = (typical.lead_per_sync or 0.0) * next_sync
    return np.where(_usual_sync(next_sync, typical), scaled, typical.lead_ns).astype(np.int64)


def _usual_sync(sync_ns: np.ndarray, typical: _Typical) -> np.ndarray:
    """Whether each sync phase lasts about the usual sync (a straggler stretches it with waiting)."""
    return np.abs(sync_ns / (typical.sync_ns or np.inf) - 1.0) <= LONG_GAP_SHARE


def _next_sync(phases: _Phases) -> np.ndarray:
    """Length of the sync phase after each phase (-1 for the last)."""
    return np.r_[phases.close_ns[1:] - phases.start_ns[1:], -1]


def _after_sync(phases: _Phases, typical: _Typical) -> np.ndarray:
    """A: the end of each phase plus the optimizer."""
    return phases.close_ns + np.where(phases.after_optimizer, 0.0, typical.close_to_end()).astype(np.int64)


def _saved_until(phases: _Phases, typical: _Typical) -> np.ndarray:
    """Where a save after each phase ended: B (from the next step's first traffic where no
    pipeline sends)."""
    return np.where(phases.first_send_ns >= 0, _next_start(phases, typical), phases.next_ns - _lead(phases, typical))


def _boundaries(phases: _Phases, typical: _Typical) -> np.ndarray:
    """End of the step each phase closes. A normal gap: B from pipeline sends, else the earlier
    of A and B (the next step's first traffic may come well after its start). A long gap with
    bulk writes: a checkpoint, B, except that B beyond A plus the job's usual save holds a stall
    before the next step after the save (the boundary is A plus the usual save), and that B from
    first traffic less a usual lead (no pipeline sends) within that margin of the usual save is
    noisier than the save is (the lead varies with the step's compute); without pipeline sends,
    once the job's saves show their usual tail and it is shorter than the lead, the boundary is
    the save's last write plus that tail. A long gap without: a stall before the next step, A.
    Nothing after the phase: A."""
    after_sync = _after_sync(phases, typical)
    start = _next_start(phases, typical)
    followed = phases.next_ns >= 0
    # pipeline sends time the next step's start; other first traffic may come later than it
    earlier = np.where(followed, np.minimum(after_sync, start), after_sync)
    normal_end = np.where(phases.first_send_ns >= 0, start, earlier)
    long_gap = _long_gap(phases, typical)
    save = np.maximum(_saved_until(phases, typical) - after_sync, 0)
    if typical.save_ns is not None:
        margin = LONG_GAP_SHARE * typical.period_ns
        stalled = save > typical.save_ns + margin
        noisy = (phases.first_send_ns < 0) & (save >= typical.save_ns - margin)
        save = np.where(stalled | noisy, typical.save_ns, save)
    if typical.save_tail_ns is not None:
        # without pipeline sends, the end of the save's writes plus the usual tail marks the next
        # step's start more sharply than its first traffic less an estimated lead, when that lead
        # is the longer (both vary in proportion: a sync-only job's first traffic comes at the
        # step's end, ZeRO-3 gathers and MoE all-to-all at its start)
        by_writes = (phases.first_send_ns < 0) & (phases.written_until_ns >= 0) & (
            _lead(phases, typical) > typical.save_tail_ns)
        save = np.where(by_writes, phases.written_until_ns + typical.save_tail_ns - after_sync, save)
    checkpoint = _checkpoints(phases, typical)
    return np.where(checkpoint, after_sync + save.astype(np.int64), np.where(long_gap, after_sync, normal_end))


def _steps(
    phases: _Phases, typical: _Typical, traffic: _Traffic, state: _State, restarts: np.ndarray, hour_start_ns: int,
    hour_end_ns: int,
) -> list[dict]:
    """Walk the phases in time order and emit the steps they close (none until the job's usual
    timings are known: too few steps in view so far, they wait in the carry); the state follows
    the last emitted step."""
    if not typical.known:
        return []
    boundary = _boundaries(phases, typical)
    complete = _complete(phases, typical.phase_bytes, typical.phase_flows)
    saved = _checkpoints(phases, typical)
    silence = SILENCE_STEPS * typical.period_ns
    usual_gap = ~_long_gap(phases, typical)
    stopped = _silences(traffic, silence, state.last_close_ns)
    rows: list[dict] = []
    end, close = state.last_end_ns, state.last_close_ns
    for p in range(len(phases.close_ns)):
        if close is not None and np.any((stopped[:, 0] >= close) & (stopped[:, 1] <= phases.start_ns[p])):
            # the job was silent for steps without a restart reported: what came before was
            # another job's tail or a stop; this phase opens the view again
            end = close = None
        followed = phases.next_ns[p] >= 0
        quiet = hour_end_ns - phases.close_ns[p]
        # the last phase is over once quiet longer than inside any phase, or once the next step
        # began; its step, once no save can follow it (the saving is the step's)
        over = phases.closed[p] or (phases.has_dp and quiet > phases.inner_gap_ns) or _next_step_began(phases, p, typical)
        unsaved = phases.has_dp and not phases.bulk_write[p] and not _save_may_follow(
            state.next_step + len(rows), state.checkpoint_steps, typical, quiet)
        decided = over and (followed or quiet >= silence or unsaved)
        if not decided or boundary[p] >= hour_end_ns:
            break
        if not _ends_step(phases, p, typical, restarts, complete, traffic) or (
                end is not None and _hung_before_it_ended(phases, p, boundary, complete, traffic, typical, hour_end_ns)):
            if end is None and followed and usual_gap[p]:
                # the view opened inside this phase's step; the next step follows as usual
                end, close = int(boundary[p]), int(phases.close_ns[p])
            continue
        after = close if close is not None else -(1 << 62)
        restarted = restarts[(restarts > after) & (restarts <= phases.close_ns[p])]
        start = end
        if len(restarted):
            start = _attempt_start(phases, p, boundary, traffic, int(restarted[-1]), typical)
            state.checkpoint_steps = []  # a restarted job may save on another cadence
        elif end is None:
            start = _opening_start(phases, p, boundary, complete, traffic, typical, hour_start_ns)
            if start is None:  # the view opened inside this step: its end is only a reference
                end, close = int(boundary[p]), int(phases.close_ns[p])
                continue
        attempt = state.attempt + int(np.sum(restarts <= phases.close_ns[p]))
        sync = phases.has_dp
        rows.append({"start": int(min(start, boundary[p] - 1)), "end": int(boundary[p]),
                     "sync_start": int(phases.start_ns[p]) if sync else None,
                     "sync_s": (phases.close_ns[p] - phases.start_ns[p]) / 1e9 if sync else None,
                     "attempt": attempt})
        if saved[p]:
            state.checkpoint_steps = [*state.checkpoint_steps[-2:], state.next_step + len(rows) - 1]
        end, close = int(boundary[p]), int(phases.close_ns[p])
    state.last_end_ns, state.last_close_ns = end, close
    return rows


def _hung_before_it_ended(phases: _Phases, p: int, boundary: np.ndarray, complete: np.ndarray, traffic: _Traffic,
                          typical: _Typical, hour_end_ns: int) -> bool:
    """Whether a GPU hung before it finished the step phase p closes, although its peers did.

    The job fell silent in the next step, which its peers began without one GPU: that GPU hung
    after its last transfer in this step (in its optimizer or checkpoint save: the step is not
    done) or in the next step before its first one (this step is done). The flows are the same; a
    hang is as likely at any moment, so the longer of the two spans holds it: from the GPU's last
    transfer, sent or received, to the boundary, against the offset of its first send in a step
    (median over the steps before; of the GPUs that sent nothing in the next step, the one due
    first). Only a step that saved a checkpoint is judged so: the save makes the first span long.
    Otherwise the spans are of a size (the optimizer's tail against the next step's first compute)
    and the call would be a coin's (fleet seeds 0 and 2 had one hang each way); the step stays
    counted, as its peers finished it. A GPU is missing once its peers' traffic went on for a
    jitter's margin after it was due (a job ending at its time limit cuts its last collective
    short: some GPUs sent, none was due)."""
    silence = SILENCE_STEPS * typical.period_ns
    if phases.next_ns[p] < 0 or not phases.bulk_write[p] or not np.isfinite(silence):
        return False
    lo = np.searchsorted(traffic.start, phases.next_ns[p])
    reach = np.maximum.accumulate(traffic.end[lo:])
    quiet = np.r_[traffic.start[lo + 1:], hour_end_ns] - reach
    silent = np.flatnonzero(quiet >= silence)
    if not len(silent):
        return False  # the job went on (or the hour ended too soon to tell)
    stopped = int(reach[silent[0]])
    if np.any(complete[p + 1:] & (phases.close_ns[p + 1:] <= stopped)):
        return False
    done = np.flatnonzero(complete[: p + 1])[-MIN_STEPS - 1:]
    if len(done) < 2 or done[-1] != p:
        return False
    bounds = boundary[done]
    ends = np.array(traffic.pair_ends()).reshape(-1, 2)
    gpus, endpoint = np.unique(ends, return_inverse=True)
    sender, receiver = endpoint.reshape(ends.shape).T
    rows = np.arange(np.searchsorted(traffic.start, bounds[0]), lo)
    window = np.searchsorted(bounds, traffic.start[rows], side="right") - 1
    rows, window = rows[window < len(bounds) - 1], window[window < len(bounds) - 1]
    first = np.full((len(bounds) - 1, len(gpus)), np.iinfo(np.int64).max)
    np.minimum.at(first, (window, sender[traffic.pair[rows]]), traffic.start[rows] - bounds[window])
    offset = np.median(np.where(first == np.iinfo(np.int64).max, np.nan, first), axis=0)
    # a GPU is busy with a step until its last transfer, sent or received (a peer's send into a
    # hung GPU's memory still completes, so only its own sends tell it began the next step)
    in_step = rows[window == len(bounds) - 2]
    last = np.full(len(gpus), -1, np.int64)
    np.maximum.at(last, sender[traffic.pair[in_step]], traffic.end[in_step])
    np.maximum.at(last, receiver[traffic.pair[in_step]], traffic.end[in_step])
    later = np.arange(lo, lo + silent[0] + 1)
    sent_after = np.zeros(len(gpus), bool)
    sent_after[sender[traffic.pair[later]]] = True
    seen_for = traffic.start[later].max() - boundary[p]
    missing = np.flatnonzero((last >= 0) & ~sent_after & (offset + LONG_GAP_SHARE * typical.period_ns < seen_for))
    if not len(missing):
        return False
    due_first = missing[np.argmin(offset[missing])]
    return bool(boundary[p] - last[due_first] > offset[due_first])


def _next_step_began(phases: _Phases, p: int, typical: _Typical) -> bool:
    """Whether the next step's first pipeline sends followed phase p at the usual gap, one usual
    forward pass apart: the optimizer ran in between, so nothing more joins the phase (the
    cool-down's sends inside a phase are backward ones, a backward pass apart)."""
    if phases.first_send_ns[p] < 0 or not typical.forward_ns or not np.isfinite(typical.gap_ns):
        return False
    gap = phases.first_send_ns[p] - phases.close_ns[p]
    return bool(abs(gap - typical.gap_ns) <= LONG_GAP_SHARE * typical.gap_ns
                and abs(phases.forward_ns[p] - typical.forward_ns) <= LONG_GAP_SHARE * typical.forward_ns)


def _save_may_follow(step: int, checkpoint_steps: list[int], typical: _Typical, quiet_ns: int) -> bool:
    """Whether a checkpoint save may still follow step number `step`, whose sync ended `quiet_ns`
    ago without a bulk write since. Saves recur every k steps (a training loop's save interval):
    once the last three checkpoint steps show k, exactly when the step is k after the last.
    Otherwise while the quiet is no longer than the job's saves took to start writing (with the
    step jitter's margin), or, with none seen, than SAVE_START_SHARE of a step."""
    if len(checkpoint_steps) == 3 and checkpoint_steps[2] - checkpoint_steps[1] == checkpoint_steps[1] - checkpoint_steps[0]:
        return (step - checkpoint_steps[2]) % (checkpoint_steps[2] - checkpoint_steps[1]) == 0
    if typical.write_delay_ns is not None:
        return quiet_ns <= (1 + LONG_GAP_SHARE) * typical.write_delay_ns
    return quiet_ns <= SAVE_START_SHARE * typical.period_ns


def _silences(traffic: _Traffic, longer_than: float, since: int | None) -> np.ndarray:
    """(from, to) of each stretch longer than `longer_than` without job traffic nor bulk writes
    (a checkpoint save is quiet on the job's pairs, not silent), from `since` (the last emitted
    step's sync, whose flows the carry may not hold) on, shape (n, 2)."""
    known = [] if since is None else [since]
    times = np.sort(np.r_[known, traffic.start, traffic.bulk_writes]).astype(np.int64)
    ends = np.sort(np.r_[known, traffic.end, traffic.bulk_writes]).astype(np.int64)
    if len(times) < 2:
        return np.empty((0, 2), np.int64)
    reach = np.maximum.accumulate(ends[:-1])
    quiet = np.flatnonzero(times[1:] - reach > longer_than)
    return np.stack([reach[quiet], times[1:][quiet]], axis=1)


def _complete(phases: _Phases, phase_bytes: float, phase_flows: float) -> np.ndarray:
    """Phases that carry a usual phase's bytes in a usual phase's flows (a ZeRO-3 parameter
    gather alone moves as many bytes as a reduce-scatter, in fewer flows)."""
    return (phases.nbytes >= COMPLETE_SHARE * phase_bytes) & (phases.nflows >= COMPLETE_SHARE * phase_flows)


def _pair_short(phases: _Phases, p: int, complete: np.ndarray, traffic: _Traffic) -> bool:
    """Whether a pair that carried the same number of flows in each of the last complete phases
    before p (MIN_STEPS_WHOLE of them at least, else nothing tells) carries fewer in phase p. A
    step moves the same transfers over every pair each time (a pipeline step every
    micro-batch's activations and gradients over every stage link), so a pair short of them
    holds a step cut short, or one whose last transfers are still to come, however few are
    missing; pairs whose counts vary (sampled exporters), or whose last transfer would come
    after the phase's last one, tell nothing."""
    before = np.flatnonzero(complete[:p])[-MIN_STEPS:]
    if len(before) < MIN_STEPS_WHOLE:
        return False
    n_pairs = len(traffic.pairs)
    # each pair's flows in each of those phases, and when its last transfer came after the
    # phase's start
    usual = np.zeros((len(before), n_pairs), np.int64)
    due = np.full((len(before), n_pairs), -1, np.int64)
    for row, q in enumerate(before):
        flows = phases.flows[q]
        pair = traffic.pair[flows]
        usual[row] = np.bincount(pair, minlength=n_pairs)
        np.maximum.at(due[row], pair, traffic.start[flows] - phases.start_ns[q])
    # a view that ends early (a job whose hosts another took over) cuts the phase's tail, not
    # transfers its peers outlived
    seen = phases.start_ns[p] + due.max(axis=0) < phases.close_ns[p]
    steady = np.all(usual == usual[0], axis=0) & (usual[0] > 0) & seen
    counts = np.bincount(traffic.pair[phases.flows[p]], minlength=n_pairs)
    return bool(np.any(counts[steady] < usual[0][steady]))


def _ends_step(phases: _Phases, p: int, typical: _Typical, restarts: np.ndarray, complete: np.ndarray,
               traffic: _Traffic) -> bool:
    """Whether phase p closes a step that finished. Followed by the next step's traffic: if it
    carries its usual bytes. Followed by silence or a failure, the step's end is unseen: it
    finished if the phase carries all its bytes and no pair is short of its usual flows (a hung
    member sends no more), no checkpoint was being saved (its end is unknown), and, before a
    restart, the failure more likely came during the next step's compute than before this step's
    optimizer ended."""
    if not complete[p]:
        return False
    failed = np.any((restarts > phases.close_ns[p]) & (restarts <= phases.next_ns[p]))
    if phases.next_ns[p] >= 0 and not failed:
        return True
    if phases.bulk_write[p] or phases.nbytes[p] < LAST_COMPLETE_SHARE * typical.phase_bytes:
        return False
    if _pair_short(phases, p, complete, traffic):
        return False
    return not failed or (typical.lead_ns or 0.0) > typical.close_to_end()


def _opening_start(
    phases: _Phases, p: int, boundary: np.ndarray, complete: np.ndarray, traffic: _Traffic, typical: _Typical,
    view_from_ns: int,
) -> int | None:
    """Start of the step closed by the first phase in view, if the view (from `view_from_ns`)
    holds all of it: the job started in view (warm-up: its next step runs markedly slower than
    usual, or its next steps speed up step by step from somewhat slower; or its own first sends
    give it a warm-up length), the step's own start markers follow a quiet gap and give it a
    usual length, or, when its sync is the job's first traffic in view, the usual lead before
    it does. None if the view opened inside the step."""
    later = np.flatnonzero(complete[p + 1 :])
    if not len(later) or not np.isfinite(typical.period_ns):
        return None
    after = p + 1 + later[0]
    period = typical.period_ns
    next_length = boundary[after] - boundary[p]
    saving = phases.bulk_write[p] or phases.bulk_write[after]  # a checkpoint, not a warm-up
    lengths = np.diff(boundary[p:][complete[p:]][:4])
    speeding_up = len(lengths) == 3 and lengths[0] >= (1 + LONG_GAP_SHARE / 2) * period
    speeding_up = speeding_up and bool(np.all(np.diff(lengths) < 0))
    if (next_length >= WARMUP_RATIO * period or speeding_up) and not saving:
        return _attempt_start(phases, p, boundary, traffic, None, typical)
    step_traffic_until = _step_traffic_until(phases, p)
    before = np.arange(np.searchsorted(traffic.start, step_traffic_until))

    # usual and warm-up lengths are the local rhythm's: the steps that follow (a degradation
    # later in the hour moves the hour's median)
    following = np.diff(boundary[p:][complete[p:]][:6])
    local = float(np.median(following)) if len(following) >= 3 else period

    def usual(start: int) -> bool:
        return abs(boundary[p] - start - local) <= LONG_GAP_SHARE / 2 * local

    if len(before):
        reach = np.maximum.accumulate(traffic.end[before])
        # the view may open right at the step's start, or the step starts after a quiet gap in view
        after_quiet = np.r_[0, before[1:][traffic.start[before[1:]] - reach[:-1] >= 0.8 * typical.gap_ns]]
        for first in after_quiet:
            start = _marked_start(traffic, np.arange(first, before[-1] + 1), typical)
            length = boundary[p] - start
            warming = first == 0 and WARMUP_RATIO * local <= length <= 2 * WARMUP_RATIO * local
            if usual(start) or (warming and next_length > (1 + LONG_GAP_SHARE / 2) * local and not saving):
                return start
    # the view opened during the save that ended the step before: this one starts the job's
    # usual tail after the save's last write
    first_traffic = traffic.start[before[0]] if len(before) else step_traffic_until
    saved = slice(0, np.searchsorted(traffic.bulk_writes, first_traffic, side="left"))
    if typical.save_tail_ns is not None and saved.stop > 0:
        start = int(traffic.bulk_write_ends[saved].max() + typical.save_tail_ns)
        if start <= first_traffic and usual(start):
            return start
    if not len(before):
        # the view opened in the compute before the sync: the step started the usual lead
        # before it, if that lies in view by more than the lead misses by, and after the save
        start = _start_by_lead(phases, p, boundary, typical, traffic.bulk_write_ends[saved].max(initial=view_from_ns))
        if start is not None and usual(start):
            return start
    return None


def _start_by_lead(phases: _Phases, p: int, boundary: np.ndarray, typical: _Typical, not_before: int) -> int | None:
    """Start of the step closed by phase p from its sync alone: the usual lead per ns of sync
    before the sync (step jitter stretches compute and sync alike). None unless it is later than
    `not_before` by more than the lead missed the boundaries of the hour's usual steps by, when
    the sync is not a usual one (a straggler stretches it with waiting), or when too few steps
    show the lead's accuracy."""
    sync = phases.close_ns[p] - phases.start_ns[p]
    if typical.lead_per_sync is None or not _usual_sync(sync, typical):
        return None
    timed = (phases.next_ns >= 0) & ~_long_gap(phases, typical) & _usual_sync(_next_sync(phases), typical)
    if timed.sum() < MIN_STEPS_WHOLE:
        return None
    missed = np.abs(phases.next_ns - _lead(phases, typical) - boundary)[timed].max()
    start = int(phases.start_ns[p] - typical.lead_per_sync * sync)
    return start if start - missed >= not_before else None


def _attempt_start(
    phases: _Phases, p: int, boundary: np.ndarray, traffic: _Traffic, since: int | None, typical: _Typical
) -> int:
    """Start of the first step of an attempt (after `since`, the tracker's restart, or from the
    job's first traffic), closed by phase p: from the traffic before the phase when there is
    some; when the sync itself is the first traffic, the step's length is extrapolated from the
    next step's warm-up (the first step is slower still)."""
    fresh = since is None
    since = since if since is not None else -(1 << 62)
    lo, hi = np.searchsorted(traffic.start, [since, _step_traffic_until(phases, p)])
    if fresh and hi - lo > 1:
        # a new job's traffic starts after its last silence of steps (before: another job's tail)
        reach = np.maximum.accumulate(traffic.end[lo : hi - 1])
        silent = np.flatnonzero(traffic.start[lo + 1 : hi] - reach > 2 * typical.period_ns)
        lo += silent[-1] + 1 if len(silent) else 0
    if hi > lo:
        return _marked_start(traffic, np.arange(lo, hi), typical)
    later = float(boundary[p + 1] - boundary[p]) if p + 1 < len(boundary) else typical.period_ns
    length = later * later / typical.period_ns if np.isfinite(typical.period_ns) else later
    # not before the job's last traffic ahead of the downtime
    down_since = traffic.end[:lo].max() if lo else -(1 << 62)
    return int(max(boundary[p] - length, down_since))


def _step_traffic_until(phases: _Phases, p: int) -> int:
    """Where the traffic that can mark the start of the step closed by phase p ends: before its
    sync, or, without DP, the phase itself (a pipeline step's traffic is its phase)."""
    return int(phases.start_ns[p] - CLUSTER_NS if phases.has_dp else phases.close_ns[p])


def _marked_start(traffic: _Traffic, rows: np.ndarray, typical: _Typical) -> int:
    """Compute start of a step whose traffic begins with `rows`: from its first pipeline sends,
    else its first traffic (ZeRO-3 gathers and MoE all-to-all come at or just after the start)."""
    sends = traffic.first_sends(rows[traffic.kind[rows] == PP])
    return sends[0] - typical.fill * sends[1] if sends is not None else traffic.cluster_start(rows)


def _steps_table(job_id: str, rows: list[dict], first_step: int) -> pa.Table:
    n = len(rows)
    start = np.array([r["start"] for r in rows], np.int64)
    end = np.array([r["end"] for r in rows], np.int64)
    return pa.table(
        {
            "job_id": pa.array([job_id] * n, pa.string()),
            "step": pa.array(np.arange(first_step, first_step + n), pa.int64()),
            "start": pa.array(start, pa.int64()).cast(STEPS.field("start").type),
            "end": pa.array(end, pa.int64()).cast(STEPS.field("end").type),
            "duration_s": pa.array((end - start) / 1e9, pa.float64()),
            "sync_start": pa.array([r["sync_start"] for r in rows], pa.int64()).cast(STEPS.field("sync_start").type),
            "sync_s": pa.array([r["sync_s"] for r in rows], pa.float64()),
            "attempt": pa.array([r["attempt"] for r in rows], pa.int32()),
        },
        schema=STEPS,
    )


# --- state --------------------------------------------------------------------------------------


@dataclass
class _State:
    next_step: int = 0
    attempt: int = 0
    pending_restarts_ns: list[int] = field(default_factory=list)  # not yet behind an emitted step
    last_end_ns: int | None = None  # end of the last emitted step; None until a boundary is seen
    last_close_ns: int | None = None  # end of the sync phase that closed it
    checkpoint_steps: list[int] = field(default_factory=list)  # the last three saving, this attempt
    baseline: dict | None = None
    carry: dict | None = None

    @classmethod
    def load(cls, previous: dict | None) -> _State:
        state = cls(**(previous or {}))
        state.baseline = dict(state.baseline or {})
        return state

    def dump(self) -> dict:
        return {"next_step": self.next_step, "attempt": self.attempt, "pending_restarts_ns": self.pending_restarts_ns,
                "last_end_ns": self.last_end_ns, "last_close_ns": self.last_close_ns,
                "checkpoint_steps": self.checkpoint_steps, "baseline": self.baseline, "carry": self.carry}
