"""Small vectorized helpers shared by the stages."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def group_indices(keys: np.ndarray) -> Iterator[tuple[object, np.ndarray]]:
    """(key, row indices) for each distinct key, in key order; rows keep their order."""
    order = np.argsort(keys, kind="stable")
    distinct, starts = np.unique(keys[order], return_index=True)
    return zip(distinct.tolist(), np.split(order, starts[1:]))
