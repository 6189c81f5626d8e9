"""Departures from the textbook training job, drawn per job: what the `sealed` family varies.

The other scenarios simulate one textbook job, and inference rules can end up reading its
generating constants back (optimizer 4% of the step, backward twice the forward, whole hosts per
job in Megatron's rank order, checkpoints written over the GPU fabric). Each `DIMENSIONS` entry
turns one such assumption into a per-job draw; `Traits` holds one job's values, and its defaults
are the textbook job, so a scenario without a `Variation` is unchanged.

Draws come from their own seed streams: the job mix from `[seed, STREAM, job]`, each dimension
from `[seed, STREAM, job, dimension]`, so switching one dimension on leaves every other draw as it
was (`benchmarks/dimensions.py` measures them one at a time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

STREAM = 0x5EA1ED
RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")  # Megatron's default; the second keeps a replica's stages together
RING_PER_NIC_SHARE = 0.8
DIMENSIONS = (
    "placement",  # GPU-granular jobs sharing hosts, 4-NIC hosts, other rank orders, shuffled host order, rings per NIC
    "optimizer",  # optimizer share of the step 2-15%
    "backward",  # backward / forward 1.5-3.5
    "distributed_optimizer",  # all-gather at step start, reduce-scatter at the end; sync overlapped or not
    "embedding",  # every pipeline job all-reduces its embedding between first and last stage, before the DP sync
    "interleaved",  # interleaved 1F1B: 2-4 model chunks per stage
    "imbalance",  # per-stage compute imbalance (the last stage heaviest)
    "heavy_tail",  # lognormal jitter up to 6% and Pareto stalls
    "storage_network",  # checkpoints over a storage network the flow logs do not see
    "checkpoints",  # checkpoint saves of 0.3-6 steps, varying from save to save
    "fault_sizes",  # fault severity down to the detection threshold
)
# (lo, hi) of each fault's factor (slow_link: the rate fraction left), uniform; fleet's and sealed's
FAULT_SIZES = {"straggler": (1.1, 1.5), "slow_link": (0.2, 0.5), "degradation": (1.1, 1.3), "slow_step": (1.3, 3.0)}
THRESHOLD_FAULT_SIZES = {"straggler": (1.05, 1.6), "slow_link": (0.3, 0.9), "degradation": (1.05, 1.3),
                         "slow_step": (1.05, 3.0)}
JOB_GPUS = (2, 4, 8, 16, 32, 64, 128)
JOB_GPU_WEIGHTS = (0.14, 0.18, 0.24, 0.2, 0.14, 0.07, 0.03)
PARETO_CAP = 40.0  # a stall is at most this many tail scales (a step never takes more than ~3x)


@dataclass(frozen=True)
class Traits:
    """One job's values of the varied assumptions; the defaults are the textbook job."""

    rank_order: str = "tp-dp-pp"
    # a ring's hop between two hosts runs over every NIC pair its group holds there (NCCL builds one
    # ring per NIC, each entering and leaving a host by another GPU); False: one ring, one NIC a host
    ring_per_nic: bool = False
    optimizer_share: float = 0.04  # optimizer time / nominal step
    backward_ratio: float = 2.0  # backward / forward compute of one micro-batch
    distributed_optimizer: bool = False  # with overlap, rs_ag jobs gather parameters under the next step's first forward
    overlap: bool = False  # gradient buckets sync during the last backward; parameter gather under the first forward
    embedding_before_sync: bool = False  # the embedding all-reduce ends before the first and last stage's DP sync
    virtual_stages: int = 1  # interleaved 1F1B model chunks per stage
    stage_factors: tuple[float, ...] = ()  # compute time of each stage relative to the mean; (): balanced
    jitter_sigma: float | None = None  # lognormal step jitter; None: the model's 1-3% draw
    tail_alpha: float = 0.0  # > 0: Pareto(tail_alpha) stalls of tail_scale x the step on top of the jitter
    tail_scale: float = 0.0
    storage_network: bool = False  # checkpoint writes and loads leave no flow record
    checkpoint_steps: tuple[float, float] = (1.0, 3.0)  # a job's checkpoint save time, in steps (uniform)
    checkpoint_spread: float = 0.0  # lognormal sigma of each save's time around the job's


@dataclass(frozen=True)
class Variation:
    """A `fleet`-like hour drawn from its own streams and distributions, with `dimensions` drawn
    per job instead of textbook."""

    dimensions: tuple[str, ...] = DIMENSIONS
    four_nic_share: float = 0.4  # hosts with 4 NICs (with "placement")

    def __post_init__(self) -> None:
        unknown = set(self.dimensions) - set(DIMENSIONS)
        if unknown:
            raise ValueError(f"unknown dimensions {sorted(unknown)}")

    def rng(self, seed: int, *key: int) -> np.random.Generator:
        return np.random.default_rng([seed, STREAM, *key])

    def four_nic_hosts(self, n_hosts: int, seed: int) -> tuple[int, ...]:
        if "placement" not in self.dimensions:
            return ()
        draw = self.rng(seed, 0x41C).random(n_hosts) < self.four_nic_share
        return tuple(int(h) for h in np.flatnonzero(draw))

    @property
    def fault_sizes(self) -> dict[str, tuple[float, float]]:
        return THRESHOLD_FAULT_SIZES if "fault_sizes" in self.dimensions else FAULT_SIZES

    def arrival(self, key: int, window_s: float, median_minutes: float, seed: int) -> dict:
        """JobSpec fields of an arriving job (sizes in GPUs, GPU-granular with "placement"),
        traits included."""
        rng = self.rng(seed, key)
        n_gpus = int(rng.choice(JOB_GPUS, p=np.asarray(JOB_GPU_WEIGHTS) / sum(JOB_GPU_WEIGHTS)))
        per_host = 8
        if "placement" in self.dimensions and n_gpus <= 16:
            per_host = int(self._dimension_rng(seed, key, "placement", 0).choice([g for g in (2, 4, 8) if g <= n_gpus]))
        start = float(rng.uniform(-1800, window_s - 120))
        minutes = float(np.clip(rng.lognormal(np.log(median_minutes), 0.9), 3, 180))
        tp = int(rng.choice([t for t in (1, 2, 4, 8) if t <= per_host]))
        n_gpus = max(n_gpus, per_host)
        pp = int(rng.choice([p for p in (1, 2, 4, 8) if n_gpus % (tp * p) == 0 and p <= max(n_gpus // 8, 2)]))
        dp = n_gpus // (tp * pp)
        collective = str(rng.choice(("ring", "rs_ag", "tree", "zero"), p=(0.4, 0.35, 0.1, 0.15)))
        collective = "rs_ag" if collective == "zero" and pp > 1 else collective  # ZeRO-3 has no pipeline
        micro_batches = (int(rng.choice([4, 8, 16, 32], p=[0.3, 0.35, 0.25, 0.1])) if pp > 1
                         else int(rng.choice([1, 2, 4, 8])))
        traits = self.traits(key, pp, micro_batches, dp, collective, seed)
        return dict(
            n_hosts=n_gpus // per_host,
            gpus_per_host=None if per_host == 8 else per_host,
            tp=tp,
            pp=pp,
            start_s=round(start, 1),
            end_s=round(start + 60 * minutes, 1),
            # larger jobs run larger global batches: longer steps
            step_s=round(float(np.clip(rng.lognormal(np.log(5.0 * (n_gpus / 8) ** 0.3), 0.5), 1.5, 40)), 2),
            micro_batches=micro_batches,
            collective=collective,
            moe=bool(2 <= dp <= 4 and rng.random() < 0.15),  # all-to-all grows as dp^2
            channels=int(rng.choice([1, 2, 4], p=[0.5, 0.35, 0.15])),
            tied_embeddings=traits.embedding_before_sync,
            checkpoint_s=float(rng.choice([240, 300, 600, 900, 1200])),
            traits=traits,
        )

    def traits(self, key: int, pp: int, micro_batches: int, dp: int, collective: str, seed: int) -> Traits:
        """A job's traits: each dimension drawn from its own stream, the others textbook."""
        traits = Traits()
        for name in self.dimensions:
            rng = self._dimension_rng(seed, key, name, 1)
            traits = replace(traits, **_DRAWS[name](rng, pp, micro_batches, dp, collective))
        return traits

    def host_order(self, key: int, n_hosts: int, seed: int) -> np.ndarray:
        """Rank order of a placed job's hosts: as allocated, or (with "placement", half the jobs)
        shuffled, as a scheduler's host list may come."""
        if "placement" not in self.dimensions:
            return np.arange(n_hosts)
        rng = self._dimension_rng(seed, key, "placement", 2)
        return rng.permutation(n_hosts) if rng.random() < 0.5 else np.arange(n_hosts)

    def _dimension_rng(self, seed: int, key: int, name: str, part: int) -> np.random.Generator:
        return self.rng(seed, key, 1 + DIMENSIONS.index(name), part)


def _placement(rng, pp, m, dp, collective) -> dict:
    # most jobs let NCCL spread their rings over their NICs; some pin one (NCCL_IB_HCA, few channels)
    return {"rank_order": str(rng.choice(RANK_ORDERS)), "ring_per_nic": bool(rng.random() < RING_PER_NIC_SHARE)}


def _optimizer(rng, pp, m, dp, collective) -> dict:
    return {"optimizer_share": round(float(rng.uniform(0.02, 0.15)), 4)}


def _backward(rng, pp, m, dp, collective) -> dict:
    return {"backward_ratio": round(float(rng.uniform(1.5, 3.5)), 3)}


def _distributed_optimizer(rng, pp, m, dp, collective) -> dict:
    return {"distributed_optimizer": bool(collective == "rs_ag" and rng.random() < 0.7),
            "overlap": bool(dp > 1 and collective in ("ring", "rs_ag", "tree") and rng.random() < 0.5)}


def _embedding(rng, pp, m, dp, collective) -> dict:
    return {"embedding_before_sync": pp > 1}


def _interleaved(rng, pp, m, dp, collective) -> dict:
    # Megatron interleaves only when the micro-batches fill whole rounds of the pipeline
    if pp < 2 or m % pp or rng.random() < 0.4:
        return {}
    return {"virtual_stages": int(rng.choice([2, 3, 4]))}


def _imbalance(rng, pp, m, dp, collective) -> dict:
    if pp < 2:
        return {}
    factors = rng.lognormal(0.0, 0.06, pp)
    factors[0] *= rng.uniform(1.0, 1.2)  # the embedding
    factors[-1] *= rng.uniform(1.0, 1.6)  # the output layer and the loss
    return {"stage_factors": tuple(round(float(f), 4) for f in factors / factors.mean())}


def _heavy_tail(rng, pp, m, dp, collective) -> dict:
    return {"jitter_sigma": round(float(rng.uniform(0.01, 0.06)), 4),
            "tail_alpha": round(float(rng.uniform(1.5, 3.0)), 3), "tail_scale": round(float(rng.uniform(0.01, 0.05)), 4)}


def _storage_network(rng, pp, m, dp, collective) -> dict:
    return {"storage_network": bool(rng.random() < 0.6)}


def _checkpoints(rng, pp, m, dp, collective) -> dict:
    return {"checkpoint_steps": (0.3, 6.0), "checkpoint_spread": round(float(rng.uniform(0.1, 0.5)), 3)}


def _fault_sizes(rng, pp, m, dp, collective) -> dict:
    return {}  # drawn with the faults (`Variation.fault_sizes`)


_DRAWS = {
    "placement": _placement,
    "optimizer": _optimizer,
    "backward": _backward,
    "distributed_optimizer": _distributed_optimizer,
    "embedding": _embedding,
    "interleaved": _interleaved,
    "imbalance": _imbalance,
    "heavy_tail": _heavy_tail,
    "storage_network": _storage_network,
    "checkpoints": _checkpoints,
    "fault_sizes": _fault_sizes,
}
