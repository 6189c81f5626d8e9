"""`write_scenario`: plan every job, stream the flows a minute at a time, then write the truth.

Output layout under `out_dir` (`flows/` and `truth/` are replaced on every run):

    flows/<YYYY-MM-DDTHH-MM>_<leaf>.parquet|jsonl|jsonl.gz   one file per exporter per 10 minutes
    topology.csv                                             GPU NIC inventory: addr,host,gpu,leaf,pod
    truth/{jobs,job_gpus,pairs,steps,faults}.parquet         prism_core.truth.TRUTH_TABLES
    truth/noise.json                                         noise counts, exporters, background, parameters
    truth/export.json                                        export options, what each exporter did

Memory stays bounded by one minute of flows plus the export buffers, whatever the scenario length.

Truth conventions (what a scorer can rely on):
- Times are whole microseconds, clipped to the scenario window. `jobs.start` is the first step or
  the window start for a job already running; `jobs.end` is its last traffic (a hang's onset, a
  failure in its last restart gap) or the window end.
- `jobs.n_hosts` / `n_gpus` are the job's size; `hosts` and `job_gpus` hold every host it ever
  used, so a restart onto a replacement host lists both (the newcomer takes the replaced host's
  ranks). `job_gpus` has a row per GPU the job holds on each host (all 8 for a job of whole hosts,
  also those NVLink keeps off the network; a GPU-granular job's own), with the address of the NIC
  serving it (two GPUs of a 4-NIC host share one) and the span of the attempts its host served in
  (`start`: the job's start or the resume that brought the host in; `end`: the failure that
  replaced it, or the job's end).
- `pairs`: directed GPU NIC pairs that carry the job's traffic. `dp`: the gradient collective
  (ring, tree, reduce-scatter/all-gather, ZeRO-3 parameter gathers); `pp`: activations and their
  gradients; `other`: MoE all-to-all and the tied-embedding all-reduce between first and last
  stage. A pair can carry several kinds (one row each). Checkpoint writes to storage are not pairs.
- `has_network`: whether the job's GPUs talk over the fabric (one-host jobs still read storage).
- `steps`: completed steps wholly inside the window, numbered over the job's life (a job seen
  mid-life starts at a high number; a restart continues the count while training resumes from the
  checkpoint). A step runs from its first forward (with the distributed optimizer, from its
  parameter all-gather) to the end of its optimizer (and checkpoint save).
- `faults`: straggler (subject host), slow_link (NIC address), hang (the NIC that fell silent
  first; until the watchdog or the allotment's time limit kills the job, or the window ends),
  restart (job id; until it is back at full speed; a hang with `resume` is followed by a restart
  from its kill, with `"after_hang": true` in its params),
  degradation (job id; to its end), slow_step (job id; one row per step). `params` holds the
  fault's size (`factor`: compute slowdown, link rate fraction or step multiple) and, for jobs with
  traits, `step_slowdown`; a replayed trace's slow worker or slow stage is a straggler naming the
  host(s) of the slow ranks (`replay`).
- `noise.json` `scenario.jobs` holds each job's spec, with its traits where it has any.
- Background endpoints (storage 10.200.x, management 10.250.x) are not in `topology.csv`; one-off
  transfers between two jobs' hosts are listed in noise.json under `cross_job_transfers`.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prism_core.simulate import replay
from prism_core.simulate.background import Background
from prism_core.simulate.cluster import GPUS_PER_HOST, Cluster
from prism_core.simulate.export import FORMATS, HUGE_BYTES, FlowSink
from prism_core.simulate.schedule import JobPlan, plan_job
from prism_core.simulate.scenarios import SCENARIOS, Scenario, scenario_jobs
from prism_core.simulate.traffic import KIND_NAMES, FlowBatch
from prism_core.truth import TRUTH_TABLES


@dataclass(frozen=True)
class SimulationSummary:
    records: int  # distinct valid flow records
    malformed: int  # malformed rows injected (on top of records)
    duplicates: int  # duplicate rows injected (on top of records)
    files: int  # flow files
    bytes_written: int  # size of the flow files
    jobs: int
    single_host_jobs: int  # their traffic stays on NVLink: invisible to flow logs
    seconds: float


def write_scenario(
    scenario: str | Scenario,
    out_dir: str | Path,
    seed: int = 0,
    *,
    fmt: str = "parquet",
    progress: Callable[[int, int], None] | None = None,
    whatif_dir: str | Path | None = None,
) -> SimulationSummary:
    """Simulate `scenario` into `out_dir`; the same scenario and seed give byte-identical files.
    Replayed jobs read their traces from `whatif_dir` (default `replay.DEFAULT_WHATIF`)."""
    began = time.perf_counter()
    if fmt not in FORMATS:  # before any directory is made: a refused call leaves nothing behind
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if isinstance(scenario, str):
        scenario = SCENARIOS[scenario]
    given_seed, seed = seed, seed + (scenario.seed_stream << 32)
    out = Path(out_dir)
    for sub in ("flows", "truth"):
        shutil.rmtree(out / sub, ignore_errors=True)
        (out / sub).mkdir(parents=True)
    four_nic = scenario.variation.four_nic_hosts(scenario.n_hosts, seed) if scenario.variation else ()
    cluster = Cluster(scenario.n_hosts, scenario.pod_hosts, scenario.n_storage, four_nic_hosts=four_nic)
    specs = [spec for spec in scenario_jobs(scenario, seed) if spec.end_s > 0]
    plans = [replay.plan_replay(i, spec, cluster, scenario.window_s, whatif_dir) if spec.replay else
             plan_job(i, spec, cluster, scenario.window_s, seed, scenario.hang_watchdog_s)
             for i, spec in enumerate(specs)]
    background = Background(scenario, cluster, plans, seed)
    sink = FlowSink(out / "flows", fmt, scenario, cluster, seed)

    # A step's flows can start minutes after the step (checkpoints): they wait in `pending`
    # until their own minute, so each minute is written once and in time order.
    pending = FlowBatch.empty()
    for minute in range(scenario.minutes):
        lo = 60.0 * minute if minute else -np.inf
        hi = 60.0 * (minute + 1)
        flows = FlowBatch.concat(
            [pending, background.minute(minute)]
            + [p.flows(lo, hi, np.random.default_rng([seed, i, minute, 0xF10])) for i, p in enumerate(plans)]
        )
        due = flows.start < hi
        sink.write(minute, flows.take(due & (flows.start >= 0)))
        pending = flows.take(~due)
        if progress is not None:
            progress(minute + 1, scenario.minutes)
    sink.close()

    _write_truth(out / "truth", plans, cluster, scenario)
    with open(out / "topology.csv", "w", newline="") as f:
        writer = csv.writer(f)
        topology = cluster.topology()
        writer.writerow(topology.column_names)
        writer.writerows(zip(*(topology[c].to_pylist() for c in topology.column_names)))
    counts = sink.counts
    noise = {
        "seed": given_seed,
        "format": fmt,
        "rows_written": counts.records + counts.duplicates + sum(counts.malformed.values()),
        "records": counts.records,
        "duplicates": counts.duplicates,
        "malformed": counts.malformed,
        "malformed_total": sum(counts.malformed.values()),
        "huge_bytes_threshold": HUGE_BYTES,
        "files": counts.files,
        "exporters": sink.exporters,
        "cross_job_transfers": background.cross_job,
        "storage_addrs": cluster.addrs[cluster.storage_base: cluster.mgmt_base].to_pylist(),
        "management_addrs": cluster.addrs[cluster.mgmt_base:].to_pylist(),
        "drained_hosts": [cluster.host_name(h) for h in scenario.drained],
        "scenario": _parameters(scenario, plans),
    }
    (out / "truth" / "noise.json").write_text(json.dumps(noise, indent=1, sort_keys=True, default=str))
    export = {"seed_stream": scenario.seed_stream, **sink.layer.describe()}
    (out / "truth" / "export.json").write_text(json.dumps(export, indent=1, sort_keys=True))
    return SimulationSummary(
        records=counts.records,
        malformed=sum(counts.malformed.values()),
        duplicates=counts.duplicates,
        files=counts.files,
        bytes_written=counts.bytes_written,
        jobs=len(plans),
        single_host_jobs=sum(p.spec.n_hosts == 1 for p in plans),
        seconds=time.perf_counter() - began,
    )


def _parameters(scenario: Scenario, plans: list[JobPlan]) -> dict:
    """The scenario's and its jobs' settings; options left unset (None) are left out, and the
    export options and seed stream, which export.json holds."""
    params = {k: v for k, v in asdict(scenario).items()
              if k not in ("jobs", "fleet", "export", "seed_stream") and v is not None}
    params["jobs"] = {p.job_id: {k: v for k, v in asdict(p.spec).items() if v is not None} for p in plans}
    return params


def _write_truth(truth_dir: Path, plans: list[JobPlan], cluster: Cluster, scenario: Scenario) -> None:
    def ts(seconds) -> pa.Array:
        # whole microseconds: ample for truth, and readable as Python datetimes
        us = np.round(np.asarray(seconds, float) * 1e6).astype(np.int64)
        return pa.array(scenario.start_ns + us * 1000, pa.timestamp("ns", tz="UTC"))

    def names(hosts) -> list[str]:
        return [cluster.host_name(h) for h in hosts]

    parts: dict[str, list[pa.Table]] = {name: [] for name in TRUTH_TABLES}

    def add(name: str, **columns) -> None:
        n = max(len(v) for v in columns.values() if not np.isscalar(v))
        columns = {k: [v] * n if np.isscalar(v) else v for k, v in columns.items()}
        parts[name].append(pa.table(columns, schema=TRUTH_TABLES[name]))

    for plan in plans:
        spec, model = plan.spec, plan.model
        hosts = list(dict.fromkeys(h for attempt in plan.hosts for h in attempt.tolist()))
        add("jobs", job_id=[plan.job_id], hosts=[names(hosts)], n_hosts=spec.n_hosts,
            n_gpus=spec.n_gpus, dp=spec.dp, pp=spec.pp, tp=spec.tp, start=ts([plan.start_s]),
            end=ts([plan.end_s]), collective=spec.collective, moe=spec.moe,
            micro_batches=spec.micro_batches, has_network=plan.has_network, restarts=plan.restarts)

        # every GPU the job ever used, with the ranks of its slot (a replacement host takes over
        # the ranks of the host it replaced) and the span of the attempts its host served in
        slots = {}
        for placement in plan.placements:
            for i, h in enumerate(placement.hosts.tolist()):
                slots[h] = (i, placement.first_gpu[i])
        served = {h: [span for attempt, span in zip(plan.hosts, plan.attempt_spans) if h in attempt]
                  for h in hosts}
        per_host = plan.placements[0].per_host
        host = np.repeat(hosts, per_host)
        offset = np.tile(np.arange(per_host), len(hosts))
        gpu = np.array([slots[h][1] for h in host], np.int64) + offset
        tp_rank, dp_rank, stage = model.coords(np.array([slots[h][0] for h in host], np.int64) * per_host + offset)
        add("job_gpus", job_id=plan.job_id, addr=cluster.addrs.take(cluster.gpu_nic[host * GPUS_PER_HOST + gpu]),
            host=names(host), gpu=gpu, pp_stage=stage, dp_rank=dp_rank, tp_rank=tp_rank,
            start=ts([min(s for s, _ in served[h]) for h in host]),
            end=ts([max(e for _, e in served[h]) for h in host]))

        pairs = np.unique(np.concatenate([np.stack([t.src, t.dst, t.kind], axis=1)
                                          for t in plan.templates]), axis=0)
        pairs = pairs[np.isin(pairs[:, 2], list(KIND_NAMES))]
        if len(pairs):
            add("pairs", job_id=plan.job_id, src_addr=cluster.addrs.take(pairs[:, 0]),
                dst_addr=cluster.addrs.take(pairs[:, 1]), kind=[KIND_NAMES[k] for k in pairs[:, 2]])

        steps = plan.steps
        seen = steps["complete"] & (steps["start"] >= 0) & (steps["end"] <= scenario.window_s)
        if seen.any():
            add("steps", job_id=plan.job_id, step=steps["number"][seen], start=ts(steps["start"][seen]),
                end=ts(steps["end"][seen]), attempt=steps["attempt"][seen],
                checkpoint=steps["checkpoint"][seen])

        for f in plan.faults:
            add("faults", fault_id=[f["fault_id"]], job_id=plan.job_id, kind=f["kind"],
                subject=f["subject"], start=ts([f["start"]]), end=ts([f["end"]]),
                wasted_gpu_s=f["wasted"], params=f["params"])

    for name, schema in TRUTH_TABLES.items():
        table = pa.concat_tables(parts[name]) if parts[name] else schema.empty_table()
        pq.write_table(table, truth_dir / f"{name}.parquet")
