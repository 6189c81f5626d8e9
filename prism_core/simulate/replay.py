"""Real timings as flows: a job that replays a What-if trace (`/work/shared/data/whatif`, AR or ST).

A trace holds, for a sample of steps of a real Megatron job, every operation of tensor rank 0 of
each (dp rank, stage), with its start (from the step's start, clocks aligned across ranks) and
duration, but no bytes and no addresses. The replay's choices:

- Steps: the sampled steps are played back to back, in their order and over again, from the job's
  start: each lasts the trace's step time (the latest end of any operation), so the truth's steps
  are the trace's own. Step numbers count from 0 at the job's start.
- Placement: the job spec's (`scenarios.REPLAY_*_JOB`); every tensor rank does what rank 0 did.
- Transfers: a transfer moves data only once both ends are in it, so its flow starts at the later
  of the two operations' starts (a pipeline send and the receive with its `seq_id` on the next
  stage; a ring member and its successor) and ends when the sender's operation ends. Collectives
  are rings: parameter all-gather and gradient reduce-scatter over the stage's dp ranks, the
  embedding all-reduce between first and last stage, the gradient-norm all-reduce
  (`optimizer-clip-main-grad`) over a replica's stages. Tensor-parallel all-reduces stay on NVLink.
- Sizes: a kind of transfer moves NIC_RATE x its shortest duration in the trace (its fastest
  instance taken as pure transfer; the pipeline's four send and receive kinds share one size); the
  gradient-norm all-reduce, a few floats, moves 1 KiB per hop.
- Exporter: the scenario's (`export.FlowSink`), as for simulated jobs.
- Truth: the steps; the ranks that compute slowest (their compute over 1.25x the median rank's)
  as a straggler fault for the whole run, naming their host(s), with `factor` their compute
  slowdown, `step_slowdown` the authors' what-if step time with the slowdown removed against the
  measured one (`mw-*.json` for one slow worker, `ms-*.json` for a slow stage), and the GPU time
  that costs as waste.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism_core.simulate.cluster import Cluster, Placement
from prism_core.simulate.model import NIC_RATE, JobModel, align
from prism_core.simulate.scenarios import JobSpec
from prism_core.simulate.schedule import JobPlan, StepLog
from prism_core.simulate.traffic import DP, OTHER, PP, Links, Template
from prism_core.simulate.variation import Traits

DEFAULT_WHATIF = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "whatif"
P2P = ("forward-send", "forward-recv", "backward-send", "backward-recv")
SLOW_RANK_RATIO = 1.25  # compute this much above the median rank's marks a slow rank
NORM_BYTES = 1024  # the gradient-norm all-reduce of a few floats, per hop


class TraceError(FileNotFoundError):
    """The real traces are missing or do not fit the job; the message says why."""


def whatif_dir(path: str | Path | None) -> Path:
    """The directory of the What-if traces, checked."""
    path = Path(path) if path is not None else DEFAULT_WHATIF
    if not (path / "README.md").exists():
        raise TraceError(f"no What-if traces in {path}: the replay scenarios need the directory holding "
                         "trace-AR.parquet and trace-ST.parquet (pass whatif_dir, or prism simulate --whatif DIR)")
    return path


class Trace:
    """One trace's operations as dense arrays: `ops[optype]` is (start, end), each shaped (step,
    dp, stage) for collectives and compute, (step, dp, stage, seq_id) for pipeline transfers;
    NaN where the trace has no such operation."""

    def __init__(self, directory: Path, name: str):
        self.name = name
        meta = dict(line.split(":", 1) for line in (directory / f"meta-{name}.yaml").read_text().splitlines() if ":" in line)
        self.dp, self.pp, self.tp = (int(meta[f"{k}_size"]) for k in ("dp", "pp", "tp"))
        table = pq.read_table(directory / f"trace-{name}.parquet")
        optype = pc.cast(table["optype"], "string").to_numpy(zero_copy_only=False)
        step_ids = table["step"].to_numpy()
        self.step_ids, step = np.unique(step_ids, return_inverse=True)
        dp_rank, stage, seq = (table[c].to_numpy().astype(np.int64) for c in ("dp_rank", "stage", "seq_id"))
        start = table["start_ts"].to_numpy().astype(float)
        end = start + table["duration"].to_numpy().astype(float)
        self.durations = np.zeros(len(self.step_ids))
        np.maximum.at(self.durations, step, end)
        self.micro_batches = int(seq[np.isin(optype, P2P)].max()) + 1
        self.ops: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.shortest: dict[str, float] = {}
        for kind in np.unique(optype):
            rows = optype == kind
            shape = (len(self.step_ids), self.dp, self.pp) + ((self.micro_batches,) if kind in P2P else ())
            index = (step[rows], dp_rank[rows], stage[rows]) + ((seq[rows],) if kind in P2P else ())
            begins, ends = np.full(shape, np.nan), np.full(shape, np.nan)
            begins[index], ends[index] = start[rows], end[rows]
            self.ops[str(kind)] = (begins, ends)
            self.shortest[str(kind)] = float((end[rows] - start[rows]).min())
        self.what_if = {f"{kind}": json.loads((directory / f"{kind}-{name}.json").read_text()) for kind in ("mw", "ms")}

    def compute(self) -> np.ndarray:
        """Mean forward + backward compute of each (dp rank, stage) over the trace."""
        return sum(np.nanmean(self.ops[kind][1] - self.ops[kind][0], axis=0)
                   for kind in ("forward-compute", "backward-compute"))


def plan_replay(index: int, spec: JobSpec, cluster: Cluster, window_s: float,
                directory: str | Path | None = None) -> JobPlan:
    """The plan of a job replaying trace `spec.replay` (see module doc)."""
    trace = Trace(whatif_dir(directory), spec.replay)
    if (trace.dp, trace.pp, trace.tp) != (spec.dp, spec.pp, spec.tp):
        raise TraceError(f"trace {spec.replay} is dp{trace.dp} pp{trace.pp} tp{trace.tp}, "
                         f"the job dp{spec.dp} pp{spec.pp} tp{spec.tp}")
    job_id = f"sim-job-{index:03d}"
    placement = Placement.of(spec.hosts, spec.first_gpu, spec.gpus_per_host)
    model = _model(spec, trace)
    salt = index + 1
    templates = [_step_template(trace, k, model, placement, cluster.gpu_nic, salt) for k in range(len(trace.step_ids))]

    log, t, number = StepLog(), spec.start_s, 0
    while t < min(spec.end_s, window_s):
        k = number % len(templates)
        end = t + trace.durations[k]
        log.add(start=t, base=t, compute_end=end, end=end, jitter=1.0, template=k, checkpoint=False, save=0.0,
                attempt=0, number=number, complete=True, cut=-1)
        t, number = end, number + 1
    steps = log.arrays()
    start_s, end_s = max(spec.start_s, 0.0), min(t, window_s)
    no_checkpoint = Links(placement, cluster.gpu_nic, -1, 1.0).template(0.0, 1, salt)
    return JobPlan(
        job_id=job_id, spec=spec, model=model, placements=[placement], attempt_spans=[(start_s, end_s)],
        templates=templates, checkpoints=[no_checkpoint], checkpoint_loads=[no_checkpoint],
        loads=np.empty((0, 3)), steps=steps, cutoffs=[], faults=_slow_ranks(trace, job_id, steps, spec, placement,
                                                                             model, cluster, window_s),
        start_s=start_s, end_s=end_s, restarts=0,
    )


def _model(spec: JobSpec, trace: Trace) -> JobModel:
    """The job's shape and the trace's typical times and sizes (no checkpoints)."""
    def typical(kind: str) -> float:
        begins, ends = trace.ops[kind]
        return float(np.nanmedian(ends - begins))

    return JobModel(
        tp=spec.tp, pp=spec.pp, dp=spec.dp, micro_batches=trace.micro_batches, channels=spec.channels,
        collective=spec.collective, moe=False, tied_embeddings="embedding-grads-all-reduce" in trace.ops,
        fwd_s=typical("forward-compute"), bwd_s=typical("backward-compute"), opt_s=typical("optimizer"),
        act_bytes=_size(trace, *P2P, channels=spec.channels),
        bucket_bytes=(_size(trace, "grads-reduce-scatter", channels=spec.channels),),
        param_bytes=0, a2a_bytes=0, emb_bytes=_size(trace, "embedding-grads-all-reduce", channels=spec.channels),
        ckpt_every=np.iinfo(np.int64).max, ckpt_save_s=1.0, ckpt_bytes=0, jitter_sigma=0.0,
        traits=spec.traits or Traits(),
    )


def _size(trace: Trace, *kinds: str, channels: int) -> int:
    return int(align(NIC_RATE * min(trace.shortest[kind] for kind in kinds), channels))


def _step_template(trace: Trace, k: int, model: JobModel, placement: Placement, gpu_nic: np.ndarray,
                   salt: int) -> Template:
    """Every flow of the trace's k-th step."""
    tp, dp, pp, m = model.tp, model.dp, model.pp, model.micro_batches
    links = Links(placement, gpu_nic, -1, 1.0)

    def step(kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of the operations of `kind` in step k."""
        return trace.ops[kind][0][k], trace.ops[kind][1][k]

    def transfer(sender: tuple, receiver: tuple, mine: tuple[np.ndarray, np.ndarray],
                 theirs: tuple[np.ndarray, np.ndarray], nbytes: int, flow_kind: int) -> None:
        """Flows of every tensor rank from `sender` to `receiver` (dp, stage index arrays) for the
        operations `mine` (the sender's start, end) and `theirs` (the receiver's)."""
        start = np.fmax(mine[0], theirs[0])
        end = np.maximum(mine[1], start + nbytes / NIC_RATE)
        seen = np.isfinite(mine[0]) & np.isfinite(theirs[0])
        t = np.arange(tp)[:, None]
        a = model.rank(t, *(x[seen] for x in sender))
        b = model.rank(t, *(x[seen] for x in receiver))
        links.add(a, b, np.broadcast_to(start[seen], a.shape), nbytes, flow_kind,
                  end=np.broadcast_to(end[seen], a.shape))

    d, s, i = np.meshgrid(np.arange(dp), np.arange(pp - 1), np.arange(m), indexing="ij")
    forward_send, forward_recv = step("forward-send"), step("forward-recv")
    backward_send, backward_recv = step("backward-send"), step("backward-recv")
    transfer((d, s), (d, s + 1), tuple(x[d, s, i] for x in forward_send),
             tuple(x[d, s + 1, i] for x in forward_recv), model.act_bytes, PP)
    transfer((d, s + 1), (d, s), tuple(x[d, s + 1, i] for x in backward_send),
             tuple(x[d, s, i] for x in backward_recv), model.act_bytes, PP)

    d, s = np.meshgrid(np.arange(dp), np.arange(pp), indexing="ij")
    for kind, nbytes in (("params-all-gather", _size(trace, "params-all-gather", channels=model.channels)),
                         ("grads-reduce-scatter", model.bucket_bytes[0])):
        if dp > 1 and kind in trace.ops:
            ops = step(kind)
            transfer((d, s), ((d + 1) % dp, s), tuple(x[d, s] for x in ops),
                     tuple(x[(d + 1) % dp, s] for x in ops), nbytes, DP)
    if pp > 1 and "embedding-grads-all-reduce" in trace.ops:
        ops, d = step("embedding-grads-all-reduce"), np.arange(dp)
        first, last = np.zeros(dp, np.int64), np.full(dp, pp - 1)
        for a, b in ((first, last), (last, first)):
            transfer((d, a), (d, b), tuple(x[d, a] for x in ops), tuple(x[d, b] for x in ops),
                     model.emb_bytes, OTHER)
    if pp > 1 and "optimizer-clip-main-grad" in trace.ops:
        ops, d, s = step("optimizer-clip-main-grad"), *np.meshgrid(np.arange(dp), np.arange(pp), indexing="ij")
        transfer((d, s), (d, (s + 1) % pp), tuple(x[d, s] for x in ops),
                 tuple(x[d, (s + 1) % pp] for x in ops), int(align(NORM_BYTES, model.channels)), OTHER)
    return links.template(float(trace.durations[k]), model.channels, salt)


def _slow_ranks(trace: Trace, job_id: str, steps: dict[str, np.ndarray], spec: JobSpec, placement: Placement,
                model: JobModel, cluster: Cluster, window_s: float) -> list[dict]:
    """The trace's slow ranks as a straggler fault row (see module doc); none if no rank is slow."""
    compute = trace.compute()
    ratio = compute / np.median(compute)
    slow_d, slow_s = np.nonzero(ratio > SLOW_RANK_RATIO)
    seen = (steps["start"] >= 0) & (steps["end"] <= window_s)
    if not len(slow_d) or not seen.any():
        return []
    one_stage = len(np.unique(slow_s)) == 1 and len(slow_d) == trace.dp > 1
    what_if = trace.what_if["ms" if one_stage else "mw"]
    step_slowdown = what_if["tori"] / what_if["trem"]
    slots = model.rank(np.arange(model.tp)[:, None], slow_d, slow_s).ravel()
    hosts = sorted({int(h) for h in placement.hosts[slots // placement.per_host]})
    run_s = steps["end"][seen] - steps["start"][seen]
    params = {"factor": round(float(ratio[slow_d, slow_s].mean()), 3), "step_slowdown": round(step_slowdown, 4),
              "slow_ranks": [{"dp_rank": int(d), "stage": int(s)} for d, s in zip(slow_d, slow_s)],
              "cause": "slow stage" if one_stage else "slow worker", "trace": spec.replay}
    return [dict(kind="straggler", subject=",".join(cluster.host_name(h) for h in hosts),
                 start=float(steps["start"][seen][0]), end=float(steps["end"][seen][-1]),
                 wasted=float(spec.n_gpus * (run_s * (1 - 1 / step_slowdown)).sum()),
                 params=json.dumps(params, sort_keys=True), fault_id=f"{job_id}-f0")]
