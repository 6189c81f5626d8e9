"""Queue pairs: whether a job's transfers after a silence run on the connections they ran on before.

An RDMA transfer runs on a queue pair, and a RoCEv2 NIC derives the UDP source port of its packets
from the queue pair (ECMP entropy), so a flow record's (source, destination, source port) names
the connection. A job whose processes restarted connects anew: its queue pairs, so its source
ports, are new. A job that only paused (a checkpoint saved over a network the flow logs do not
see, a stall) resumes on the connections it had. Records without ports tell nothing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import combined_key


def source_ports(flows: pa.Table, rows: np.ndarray) -> np.ndarray:
    """The source port of each of `rows` of `flows` (-1 where the record has none, or no record
    has ports)."""
    if "src_port" not in flows.column_names:
        return np.full(len(rows), -1, np.int32)
    return pc.fill_null(flows["src_port"], -1).to_numpy().astype(np.int32)[rows]


def resumed_on_same_connections(src: np.ndarray, dst: np.ndarray, port: np.ndarray, start: np.ndarray,
                                 silent_from: np.ndarray, resumed_at: np.ndarray, window: float,
                                 min_share: float) -> np.ndarray:
    """Per silence (the job's traffic stopped by `silent_from` and resumed at `resumed_at`):
    whether at least `min_share` of the connections of its transfers within `window` from the
    resume also carried its transfers within `window` before the silence. `src`, `dst`: integer
    codes of the transfers' ends (>= 0), `port`: source port (< 0 where the record has none),
    `start`: their starts, sorted (the unit of the times and `window`). A silence with no port
    on either side is not resumed on the same connections."""
    return kept_connections_share(src, dst, port, start, silent_from, resumed_at, window) >= min_share


def kept_connections_share(src: np.ndarray, dst: np.ndarray, port: np.ndarray, start: np.ndarray,
                           silent_from: np.ndarray, resumed_at: np.ndarray, window: float) -> np.ndarray:
    """Per silence, as `resumed_on_same_connections`: the share of the connections of the
    transfers within `window` after it that also carried transfers within `window` before it
    (nan where either side has no port: the records tell nothing)."""
    known = port >= 0
    connection = combined_key(src, dst, port)
    kept = np.full(len(resumed_at), np.nan)
    for i, (stop, resume) in enumerate(zip(np.asarray(silent_from).tolist(), np.asarray(resumed_at).tolist())):
        lo, mid = np.searchsorted(start, [stop - window, stop], side="left")
        on, hi = np.searchsorted(start, [resume, resume + window], side="left")
        before = np.unique(connection[lo:mid][known[lo:mid]])
        after = np.unique(connection[on:hi][known[on:hi]])
        if len(before) and len(after):
            kept[i] = np.isin(after, before, assume_unique=True).mean()
    return kept
