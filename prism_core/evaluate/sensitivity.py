"""How large each truth fault was against the threshold at which Prism's diagnosis reports it.

Recall over faults injected far above the thresholds says nothing about sensitivity, so recall is
also given by size bucket. A fault's size is put in the unit of its kind's threshold:

- slow_step: the step-time multiple (truth `factor`) over `slow_step_delta`, both less 1;
- slow_link: the throughput shortfall (1 - truth `factor`, the rate share) over 1 - `slow_link_ratio`;
- straggler: the share of its job's step time it delayed (GPU time wasted over GPU time the job held
  meanwhile) over `late_min_share`;
- degradation: the rise of the step time over its former level (from the same shares) over
  `degradation_min_shift`.

Hangs and restarts have no size. A sized fault whose size the truth does not give is counted apart.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from prism_core.diagnosis import DEFAULT_PARAMS as DIAGNOSIS_DEFAULTS  # the thresholds fault sizes are measured against

BUCKET_EDGES = (1.0, 1.5)  # multiples of the threshold
BUCKETS = ("under_1x", "1x_to_1.5x", "over_1.5x")
SIZED_KINDS = ("slow_step", "slow_link", "straggler", "degradation")


def relative_sizes(faults: pa.Table, held_gpu_s: np.ndarray) -> np.ndarray:
    """Each fault's size over its kind's threshold (nan: a kind without a size, or none recorded)."""
    params = DIAGNOSIS_DEFAULTS
    kind = np.asarray(faults["kind"].to_pylist(), dtype=object)
    factor = np.array([json.loads(p or "{}").get("factor", np.nan) for p in faults["params"].to_pylist()], float)
    delayed = faults["wasted_gpu_s"].to_numpy() / np.maximum(held_gpu_s, 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = delayed / (1 - delayed)
    size = np.full(faults.num_rows, np.nan)
    size = np.where(kind == "slow_step", (factor - 1) / (params.slow_step_delta - 1), size)
    size = np.where(kind == "slow_link", (1 - factor) / (1 - params.slow_link_ratio), size)
    size = np.where(kind == "straggler", delayed / params.late_min_share, size)
    return np.where(kind == "degradation", rise / params.degradation_min_shift, size)


def bucket_of(relative: np.ndarray) -> np.ndarray:
    """The bucket name of each relative size ("" where there is none)."""
    names = np.array([*BUCKETS, ""], dtype=object)
    return names[np.where(np.isnan(relative), len(BUCKETS), np.searchsorted(BUCKET_EDGES, relative, side="right"))]
