"""Scenario definitions: which jobs run where and when, which faults hit them, how noisy the export is.

`tiny` and `small` are written out job by job so that every shape and fault the scorers need is
present; `fleet` draws its job mix from the seed (Acme-like: many one-host jobs, a few very large
ones); `realistic` runs small's jobs through exporters as they are (`ExportOptions`); `dense` is `fleet` with several queue pairs per
NCCL channel (about 5x the records, the same jobs); `sealed`
draws a smaller mix from its own streams with every `variation` dimension drawn per job (the
evaluation set no rule is tuned on); `replay-*` replay real traces (`replay`). Times are seconds
relative to the scenario start; a negative job start means the job was already running when the
scenario began.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone

import numpy as np

from prism_core.simulate.cluster import GPUS_PER_HOST
from prism_core.simulate.variation import FAULT_SIZES, Traits, Variation
from prism_core.truth import TRUTH_FAULT_KINDS

COLLECTIVES = ("ring", "rs_ag", "tree", "zero")
FOREVER = 1e9  # a job end beyond any scenario
HANG_RESTART_S = 300.0  # longest relaunch after a hung job is killed (fleet draws 60-300 s)


@dataclass(frozen=True)
class FaultSpec:
    kind: str  # one of TRUTH_FAULT_KINDS
    at_s: float  # when it begins (scenario-relative seconds)
    span_s: float = 0.0  # straggler / slow_link: duration; slow_step: window holding `count` steps
    factor: float = 1.0  # straggler, degradation: compute slowdown; slow_link: rate fraction; slow_step: step x
    host: int = 0  # index into the job's hosts (straggler, slow_link, hang, restart replacement)
    rail: int = 0  # NIC rail (slow_link, hang); the nearest rail that carries traffic is used
    gap_s: float = 120.0  # restart: downtime before the job resumes; hang with resume: after the kill
    replace_host: int | None = None  # restart: cluster host replacing job host `host`; -1: any idle one
    count: int = 1  # slow_step: how many single slow steps
    resume: bool = False  # hang: once the watchdog kills it, restart from the last checkpoint

    def __post_init__(self) -> None:
        if self.kind not in TRUTH_FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")


@dataclass(frozen=True)
class JobSpec:
    n_hosts: int
    tp: int
    pp: int
    start_s: float  # allotted start; < 0: already running at the scenario start
    end_s: float  # allotted end: the job stops before a step would overrun it
    step_s: float  # nominal step time (operator-level model), 2-30 s
    micro_batches: int = 8
    collective: str = "ring"
    moe: bool = False
    channels: int = 2  # NCCL channels = queue pairs per NIC pair
    tied_embeddings: bool = False  # first and last pipeline stage all-reduce the embedding
    checkpoint_s: float = 600.0  # checkpoint interval
    hosts: tuple[int, ...] | None = None  # cluster hosts; None: placed by `allocate`
    faults: tuple[FaultSpec, ...] = ()
    gpus_per_host: int | None = None  # GPUs the job holds on each host (2, 4); None: all 8
    first_gpu: tuple[int, ...] | None = None  # with gpus_per_host: the first of its GPUs on each host
    traits: Traits | None = None  # departures from the textbook job (`variation`); None: textbook
    replay: str | None = None  # the job replays this real trace ("AR", "ST": `replay`)

    def __post_init__(self) -> None:
        gpus = self.n_gpus
        if self.tp not in (1, 2, 4, 8) or gpus % (self.tp * self.pp) or self.tp > (self.gpus_per_host or 8):
            raise ValueError(f"{gpus} GPUs cannot hold tp={self.tp} x pp={self.pp}")
        if self.collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {self.collective!r}")
        if self.hosts is not None and len(self.hosts) != self.n_hosts:
            raise ValueError("hosts does not match n_hosts")

    @property
    def n_gpus(self) -> int:
        return self.n_hosts * (self.gpus_per_host or GPUS_PER_HOST)

    @property
    def dp(self) -> int:
        return self.n_gpus // (self.tp * self.pp)


@dataclass(frozen=True)
class FleetMix:
    """How `fleet` draws its jobs: resident large jobs plus arrivals of mostly small ones."""

    resident: tuple[JobSpec, ...]  # running for the whole scenario (hosts placed by `allocate`)
    arrivals: int  # jobs starting between -30 min and the scenario end
    host_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    host_weights: tuple[float, ...] = (0.42, 0.2, 0.16, 0.12, 0.07, 0.03)
    median_minutes: float = 25.0
    faults: tuple[tuple[str, int], ...] = (
        ("straggler", 3),
        ("slow_link", 3),
        ("hang", 2),
        ("restart", 2),
        ("degradation", 2),
        ("slow_step", 4),
    )


@dataclass(frozen=True)
class ExportOptions:
    """How the exporters report flows beyond the scenario's base noise. Every option is off by
    default; a share is the chance that an exporter has the property, and a range is what each
    exporter draws its own value from (timeouts log-uniformly, sFlow rates as powers of two)."""

    flow_cache: float = 0.0  # NetFlow / IPFIX 5-tuple flow cache: transfers merge into records
    idle_timeout_s: tuple[float, float] = (0.01, 15.0)
    active_timeout_s: tuple[float, float] = (1.0, 60.0)
    milliseconds: float = 0.0  # NetFlow v9 clocks: start and end truncated to the millisecond
    sflow: float = 0.0  # sFlow agents (no flow cache): 1-in-N packet samples, no start or end
    sflow_rate: tuple[int, int] = (1024, 8192)
    loss: tuple[float, float] = (0.0, 0.0)  # share of records lost on the way (UDP export)
    double_export: float = 0.0  # leaves that also export what they deliver, from a second agent
    drift_ppm: float = 0.0  # standard deviation of an exporter's clock drift
    header_bytes: bool = False  # bytes count per-packet headers (L2 or L3, per exporter)


@dataclass(frozen=True)
class Scenario:
    name: str
    start: datetime
    minutes: int
    n_hosts: int
    jobs: tuple[JobSpec, ...] = ()
    fleet: FleetMix | None = None
    pod_hosts: int = 32
    n_storage: int = 8
    drained: tuple[int, ...] = ()  # hosts out of service: no traffic at all, no jobs
    cross_job_transfers: int = 1  # one-off transfers between hosts of two different jobs
    duplicate_rate: float = 0.005
    malformed_rate: float = 0.001
    sampled_leaves: int = 1  # exporters that sample 1 in `sampling_rate` packets
    sampling_rate: int = 4
    clock_skew_ms: float = 3.0  # standard deviation of each exporter's clock offset
    file_minutes: int = 10  # one flow file per exporter per this many minutes
    # A hung collective holds the job's GPUs until the NCCL watchdog kills it (PyTorch's default
    # timeout: 10 minutes), or the scheduler's time limit ends the allotment first.
    hang_watchdog_s: float = 600.0
    export: ExportOptions = ExportOptions()
    seed_stream: int = 0  # another stream gives a seed other draws than the scenario it copies
    variation: Variation | None = None  # with `fleet`: draw the mix and each job's traits (`variation`)
    # Queue pairs per NCCL channel (NCCL_IB_QPS_PER_CONNECTION): each is its own 5-tuple, so each
    # job's transfers split into this many flow records, applied after the mix is drawn
    queue_pairs: int = 1

    @property
    def window_s(self) -> float:
        return 60.0 * self.minutes

    @property
    def start_ns(self) -> int:
        return int(self.start.timestamp()) * 1_000_000_000


def _at(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"2026-11-22T{hhmm}:00").replace(tzinfo=timezone.utc)


TINY = Scenario(
    name="tiny",
    start=_at("09:54"),
    minutes=12,
    n_hosts=8,
    jobs=(
        JobSpec(4, tp=8, pp=2, start_s=-150, end_s=FOREVER, step_s=5.0, checkpoint_s=180,
                hosts=(0, 1, 2, 3),
                faults=(FaultSpec("straggler", at_s=240, span_s=120, factor=1.4, host=1),)),
        JobSpec(2, tp=4, pp=1, start_s=45, end_s=600, step_s=3.0, micro_batches=4,
                collective="rs_ag", hosts=(4, 5),
                faults=(FaultSpec("hang", at_s=330, host=1, rail=0),)),
        JobSpec(1, tp=8, pp=1, start_s=-300, end_s=FOREVER, step_s=4.0, hosts=(6,)),
        # starts on the hosts the hung job held until 600 s
        JobSpec(2, tp=8, pp=1, start_s=630, end_s=FOREVER, step_s=2.5, micro_batches=2,
                hosts=(4, 5)),
    ),
)

SMALL = Scenario(
    name="small",
    start=_at("09:50"),
    minutes=20,
    n_hosts=64,
    drained=(62, 63),
    cross_job_transfers=3,
    sampled_leaves=2,
    jobs=(
        JobSpec(16, tp=8, pp=4, start_s=-400, end_s=FOREVER, step_s=12.0, tied_embeddings=True,
                checkpoint_s=300, hosts=tuple(range(0, 16)),
                faults=(FaultSpec("straggler", at_s=300, span_s=240, factor=1.3, host=5),)),
        JobSpec(8, tp=4, pp=2, start_s=40, end_s=700, step_s=6.0, collective="tree",
                checkpoint_s=240, hosts=tuple(range(16, 24)),
                faults=(FaultSpec("slow_link", at_s=250, span_s=200, factor=0.3, host=2, rail=1),)),
        JobSpec(4, tp=8, pp=1, start_s=-200, end_s=FOREVER, step_s=4.0, micro_batches=4,
                collective="zero", checkpoint_s=120, hosts=(24, 25, 26, 27),
                faults=(FaultSpec("restart", at_s=500, gap_s=150, host=2, replace_host=28),)),
        JobSpec(4, tp=2, pp=2, start_s=100, end_s=FOREVER, step_s=8.0, moe=True,
                hosts=(32, 33, 34, 35),
                faults=(FaultSpec("degradation", at_s=650, factor=1.25),)),
        JobSpec(1, tp=8, pp=1, start_s=-500, end_s=FOREVER, step_s=6.0, hosts=(36,)),
        JobSpec(2, tp=2, pp=8, start_s=-100, end_s=FOREVER, step_s=3.0, micro_batches=16,
                channels=1, hosts=(37, 38),
                faults=(FaultSpec("slow_step", at_s=200, span_s=800, factor=2.0, count=4),)),
        # hangs and is killed by the watchdog 10 minutes later (fleet hangs may also resume)
        JobSpec(8, tp=1, pp=2, start_s=120, end_s=FOREVER, step_s=5.0, micro_batches=4,
                collective="rs_ag", hosts=tuple(range(40, 48)),
                faults=(FaultSpec("hang", at_s=330, host=3, rail=0),)),
        JobSpec(8, tp=4, pp=1, start_s=-50, end_s=FOREVER, step_s=7.0, micro_batches=4,
                hosts=tuple(range(48, 56)),
                faults=(FaultSpec("slow_step", at_s=100, span_s=900, factor=1.6, count=3),)),
        # starts within a minute of the tree job leaving these hosts
        JobSpec(8, tp=8, pp=2, start_s=740, end_s=FOREVER, step_s=5.0, micro_batches=4,
                hosts=tuple(range(16, 24))),
        JobSpec(2, tp=8, pp=2, start_s=300, end_s=900, step_s=2.5, channels=1, hosts=(56, 57)),
    ),
)

FLEET = Scenario(
    name="fleet",
    start=_at("10:00"),
    minutes=60,
    n_hosts=360,
    n_storage=32,
    drained=(101, 205, 287, 359),
    cross_job_transfers=12,
    sampled_leaves=4,
    fleet=FleetMix(
        resident=(
            JobSpec(128, tp=8, pp=8, start_s=-900, end_s=FOREVER, step_s=24.0, micro_batches=8,
                    channels=1, tied_embeddings=True, checkpoint_s=900),
            JobSpec(48, tp=8, pp=4, start_s=-2400, end_s=FOREVER, step_s=16.0, micro_batches=8,
                    channels=1, checkpoint_s=600),
            JobSpec(32, tp=4, pp=4, start_s=-600, end_s=FOREVER, step_s=12.0, micro_batches=8,
                    channels=1, collective="rs_ag", checkpoint_s=600),
            JobSpec(16, tp=8, pp=2, start_s=-300, end_s=FOREVER, step_s=12.0, moe=True,
                    micro_batches=4, channels=1, checkpoint_s=600),
        ),
        arrivals=60,
    ),
)

# fleet's hour with 5 queue pairs per channel: the same platform, jobs and faults, 5x the job
# records (each a fifth of the bytes), the density of a fleet whose NICs run several queue pairs per
# connection; the benchmark of issue #19's 50 M-record hour
DENSE = replace(FLEET, name="dense", queue_pairs=5)

# small's jobs on small's cluster, seen through exporters as they are: each leaf draws its own
# flow cache or sFlow sampling (binomial, instead of base noise's exact division), clock, header
# accounting and loss; some export twice
REALISTIC = replace(
    SMALL,
    name="realistic",
    seed_stream=1,
    sampled_leaves=0,
    export=ExportOptions(flow_cache=0.7, milliseconds=0.6, sflow=0.2, loss=(0.001, 0.05),
                         double_export=0.3, drift_ppm=20.0, header_bytes=True),
)

# the sealed evaluation hour: no inference rule is tuned on it
SEALED = Scenario(
    name="sealed", start=_at("11:00"), minutes=60, n_hosts=112, n_storage=16, drained=(47, 95),
    cross_job_transfers=6, sampled_leaves=2,
    fleet=FleetMix(
        resident=(
            JobSpec(16, tp=8, pp=4, start_s=-1200, end_s=FOREVER, step_s=14.0, micro_batches=16, checkpoint_s=900),
            JobSpec(8, tp=4, pp=2, start_s=-600, end_s=FOREVER, step_s=9.0, collective="rs_ag"),
            JobSpec(4, tp=2, pp=1, start_s=-300, end_s=FOREVER, step_s=5.0, micro_batches=4, collective="tree",
                    channels=4),
        ),
        arrivals=52,
        median_minutes=20.0,
        faults=(("straggler", 4), ("slow_link", 3), ("hang", 2), ("restart", 2), ("degradation", 2), ("slow_step", 5)),
    ),
    variation=Variation(),
)

# Real timings (`replay`): AR, 64 GPUs on 8 whole hosts in Megatron's order; ST, 8 GPUs as 2 on
# each of 4 hosts in tp-pp-dp order, so that its DP sync and half its pipeline hops cross hosts.
REPLAY_AR_JOB = JobSpec(8, tp=4, pp=4, start_s=1.0, end_s=FOREVER, step_s=46.5, micro_batches=32,
                        collective="rs_ag", tied_embeddings=True, hosts=tuple(range(8)), replay="AR")
REPLAY_ST_JOB = JobSpec(4, tp=1, pp=4, start_s=1.0, end_s=FOREVER, step_s=2.2, micro_batches=4,
                        collective="rs_ag", tied_embeddings=True, gpus_per_host=2, replay="ST",
                        traits=Traits(rank_order="tp-pp-dp"))
REPLAY_AR = Scenario(name="replay-ar", start=_at("12:00"), minutes=60, n_hosts=8, jobs=(REPLAY_AR_JOB,))
REPLAY_ST = Scenario(name="replay-st", start=_at("12:00"), minutes=60, n_hosts=4,
                     jobs=(replace(REPLAY_ST_JOB, hosts=(0, 1, 2, 3)),))
# the replays beside simulated jobs drawn on whole hosts of their own
REPLAY_MIX = Scenario(
    name="replay-mix", start=_at("12:00"), minutes=60, n_hosts=40, cross_job_transfers=2,
    jobs=(REPLAY_AR_JOB, replace(REPLAY_ST_JOB, hosts=(8, 9, 10, 11))),
    fleet=FleetMix(resident=(), arrivals=14, faults=(("straggler", 1), ("slow_link", 1), ("slow_step", 1))),
    variation=Variation(dimensions=tuple(d for d in Variation().dimensions if d != "placement")),
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (TINY, SMALL, FLEET, DENSE, REALISTIC, SEALED, REPLAY_AR, REPLAY_ST, REPLAY_MIX)
}


def scenario_jobs(scenario: Scenario, seed: int) -> tuple[JobSpec, ...]:
    """The scenario's jobs with every host placed (fleet jobs and their faults drawn from `seed`),
    each channel split into the scenario's queue pairs."""
    return tuple(replace(job, channels=job.channels * scenario.queue_pairs) for job in _placed_jobs(scenario, seed))


def _placed_jobs(scenario: Scenario, seed: int) -> tuple[JobSpec, ...]:
    if scenario.fleet is None:
        return allocate(scenario.jobs, scenario)
    if scenario.variation is not None:
        return _varied_jobs(scenario, scenario.variation, seed)
    rng = np.random.default_rng([seed, 0x5EED])
    placed = allocate(scenario.jobs + scenario.fleet.resident + _arrivals(scenario, rng), scenario)
    return _with_faults(placed, scenario, rng)


def _varied_jobs(scenario: Scenario, varied: Variation, seed: int) -> tuple[JobSpec, ...]:
    """The mix of a scenario with a `variation`: its resident jobs and arrivals drawn by the
    variation, with traits, host order and fault sizes of its dimensions."""
    mix = scenario.fleet
    resident = tuple(
        replace(job, tied_embeddings=job.tied_embeddings or traits.embedding_before_sync, traits=traits)
        for i, job in enumerate(mix.resident)
        for traits in [varied.traits(10_000 + i, job.pp, job.micro_batches, job.dp, job.collective, seed)])
    arrivals = tuple(JobSpec(**varied.arrival(i, scenario.window_s, mix.median_minutes, seed)) for i in range(mix.arrivals))
    placed = allocate(scenario.jobs + resident + arrivals, scenario)
    reordered = []
    for i, job in enumerate(placed):
        order = varied.host_order(i, job.n_hosts, seed) if job.replay is None else np.arange(job.n_hosts)
        reordered.append(replace(job, hosts=tuple(job.hosts[k] for k in order),
                                 first_gpu=job.first_gpu and tuple(job.first_gpu[k] for k in order)))
    return _with_faults(tuple(reordered), scenario, varied.rng(seed, 0xFA), varied.fault_sizes)


def allocate(jobs: tuple[JobSpec, ...], scenario: Scenario) -> tuple[JobSpec, ...]:
    """Place jobs without hosts on free hosts (first-fit, contiguous when possible), in start order
    after the jobs placed by hand;
    a job of `gpus_per_host` takes the lowest free aligned block of that many GPUs on each host.

    A job holds its hosts until its allotted end, also after a hang; a host replaced in a restart
    stays out (under repair) until the job ends, and its replacement is held from the restart on.
    Explicitly placed jobs must not overlap; an unplaced job that does not fit is dropped (the
    queue of a full cluster).
    """
    busy_until = np.full((scenario.n_hosts, GPUS_PER_HOST), -np.inf)  # per GPU
    busy_until[list(scenario.drained)] = np.inf
    placed: list[JobSpec] = []
    for job in sorted(jobs, key=lambda j: (j.hosts is None, j.start_s)):  # placed jobs first
        width = job.gpus_per_host or GPUS_PER_HOST
        free_blocks = (busy_until <= job.start_s).reshape(scenario.n_hosts, -1, width).all(axis=2)
        hosts, first = job.hosts, job.first_gpu or (0,) * job.n_hosts
        if hosts is None:
            hosts = _first_fit(free_blocks.any(axis=1), job.n_hosts)
            if hosts is None:
                continue
            first = tuple(int(block) * width for block in free_blocks[hosts].argmax(axis=1))
        elif not free_blocks[list(hosts), np.asarray(first) // width].all():
            raise ValueError(f"hosts {hosts} are busy at {job.start_s}")
        busy_until[np.asarray(hosts)[:, None], np.asarray(first)[:, None] + np.arange(width)] = job.end_s
        for fault in job.faults:
            if fault.kind == "restart" and fault.replace_host is not None:
                if busy_until[fault.replace_host].max() > fault.at_s:
                    raise ValueError(f"replacement host {fault.replace_host} is busy")
                busy_until[fault.replace_host] = job.end_s
        placed.append(replace(job, hosts=tuple(int(h) for h in hosts),
                              first_gpu=first if job.gpus_per_host else None))
    return tuple(placed)


def _first_fit(free: np.ndarray, n: int) -> np.ndarray | None:
    """Lowest block of `n` consecutive free hosts, else the lowest `n` free hosts (fragmented)."""
    run = np.convolve(free.astype(int), np.ones(n, int), mode="valid")
    blocks = np.flatnonzero(run == n)
    if blocks.size:
        return np.arange(blocks[0], blocks[0] + n)
    idle = np.flatnonzero(free)
    return idle[:n] if idle.size >= n else None


def _arrivals(scenario: Scenario, rng: np.random.Generator) -> tuple[JobSpec, ...]:
    mix = scenario.fleet
    weights = np.asarray(mix.host_weights) / sum(mix.host_weights)
    jobs = []
    for _ in range(mix.arrivals):
        n_hosts = int(rng.choice(mix.host_counts, p=weights))
        start = float(rng.uniform(-1800, scenario.window_s - 120))
        minutes = float(np.clip(rng.lognormal(np.log(mix.median_minutes), 0.8), 4, 240))
        tp = int(rng.choice([8, 4, 2, 1], p=[0.6, 0.2, 0.1, 0.1]))
        # deeper pipelines for bigger jobs
        pp = int(rng.choice([p for p in (1, 2, 4, 8)
                             if p <= 2 * n_hosts and (n_hosts * GPUS_PER_HOST) % (tp * p) == 0]))
        dp = n_hosts * GPUS_PER_HOST // (tp * pp)
        collective = str(rng.choice(COLLECTIVES, p=[0.55, 0.2, 0.15, 0.1]))
        if collective == "zero" and pp > 1:
            collective = "rs_ag"  # ZeRO-3 does not combine with pipeline parallelism
        jobs.append(
            JobSpec(
                n_hosts,
                tp=tp,
                pp=pp,
                start_s=round(start, 1),
                end_s=round(start + 60 * minutes, 1),
                # larger jobs run larger global batches: longer steps
                step_s=round(float(np.clip(rng.lognormal(np.log(4.0 * n_hosts**0.25), 0.5), 2, 30)), 2),
                micro_batches=int(rng.choice([4, 8, 16])) if pp > 1 else int(rng.choice([1, 2, 4])),
                collective=collective,
                moe=bool(2 <= dp <= 4 and rng.random() < 0.2),  # all-to-all grows as dp^2
                channels=int(rng.choice([1, 2], p=[0.7, 0.3])),
                tied_embeddings=bool(pp > 1 and rng.random() < 0.5),
                checkpoint_s=float(rng.choice([300, 600, 900])),
            )
        )
    return tuple(jobs)


def _with_faults(
    jobs: tuple[JobSpec, ...], scenario: Scenario, rng: np.random.Generator,
    sizes: dict[str, tuple[float, float]] = FAULT_SIZES,
) -> tuple[JobSpec, ...]:
    """Give some placed network jobs one fault each, inside the part of their life the scenario sees."""
    window = scenario.window_s

    def seen(job: JobSpec) -> tuple[float, float]:
        return max(job.start_s, 0.0), min(job.end_s, window)

    def spare_host(at: float, until: float) -> int | None:
        """A host no job holds during [at, until), to replace a failed one."""
        held = set(scenario.drained)
        for other in jobs:
            if other.start_s < until and other.end_s > at:
                held.update(other.hosts)
                held.update(f.replace_host for f in other.faults if f.replace_host is not None)
        idle = [h for h in range(scenario.n_hosts) if h not in held]
        return idle[0] if idle else None

    def room(job: JobSpec) -> float:
        """How much later than the earliest fault time a hang can come and still be killed by the
        watchdog, and restarted, before the job's allotment ends."""
        lo, hi = seen(job)
        return job.end_s - HANG_RESTART_S - scenario.hang_watchdog_s - (lo + 0.15 * (hi - lo))

    candidates = [
        i for i, j in enumerate(jobs)
        if j.n_hosts > 1 and seen(j)[1] - seen(j)[0] > 600 and (j.dp > 1 or j.pp > 1) and j.replay is None
    ]
    order = [int(i) for i in rng.permutation(candidates)]
    jobs = list(jobs)
    for kind, count in scenario.fleet.faults:
        for nth in range(min(count, len(order))):
            # a hung 1k-GPU job would leave the fleet silent for the rest of the hour; allotments
            # run for hours or days, so the watchdog, not the time limit, kills a hung job: a
            # hang goes to a job whose allotment outlasts the watchdog and a restart after it
            i = next((i for i in reversed(order) if kind != "hang" or (jobs[i].n_hosts <= 32 and room(jobs[i]) > 0)),
                     None)
            if i is None:  # no job left that this kind fits: fewer faults, not a crash
                break
            order.remove(i)
            lo, hi = seen(jobs[i])
            at = round(float(lo + rng.uniform(0.15, 0.55) * (hi - lo)), 1)
            if kind == "hang":
                at = min(at, round(lo + 0.15 * (hi - lo) + room(jobs[i]), 1))
            # the first restart of the scenario moves to a spare host, the others resume in place
            spare = spare_host(at, jobs[i].end_s) if kind == "restart" and nth == 0 else None
            jobs[i] = replace(jobs[i], faults=(_draw_fault(kind, at, hi, jobs[i], spare, rng, sizes),))
    return tuple(jobs)


def _draw_fault(kind: str, at: float, seen_until: float, job: JobSpec, spare: int | None,
                rng: np.random.Generator, sizes: dict[str, tuple[float, float]]) -> FaultSpec:
    host = int(rng.integers(job.n_hosts))
    rail = int(rng.integers(GPUS_PER_HOST))
    rest = seen_until - at
    if kind == "straggler":
        return FaultSpec(kind, at, span_s=round(0.4 * rest, 1), host=host,
                         factor=round(float(rng.uniform(*sizes[kind])), 2))
    if kind == "slow_link":
        return FaultSpec(kind, at, span_s=round(0.4 * rest, 1), host=host, rail=rail,
                         factor=round(float(rng.uniform(*sizes[kind])), 2))
    if kind == "hang":
        return FaultSpec(kind, at, host=host, rail=rail, resume=bool(rng.random() < 0.5),
                         gap_s=round(float(rng.uniform(60, HANG_RESTART_S)), 1))
    if kind == "restart":
        return FaultSpec(kind, at, gap_s=round(float(rng.uniform(60, 300)), 1), host=host,
                         replace_host=spare)
    if kind == "degradation":
        return FaultSpec(kind, at, factor=round(float(rng.uniform(*sizes[kind])), 2))
    return FaultSpec(kind, at, span_s=round(rest - 60, 1), count=3,
                     factor=round(float(rng.uniform(*sizes[kind])), 2))
