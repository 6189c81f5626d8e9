"""Whether a job resumed after a silence on the connections (queue pairs) it had; one transfer's
records on several queue pairs read as one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from prism_core import queue_pairs
from prism_core.queue_pairs import coalesced_channels, resumed_on_same_connections


def test_a_resume_on_the_same_ports_continues_and_one_on_new_ports_or_without_ports_does_not():
    # four pairs send every second until 100 s, are silent 60 s, then send again from 160 s:
    # the same source ports in `same`, new ones in `new`, one of four pairs new in `mostly`
    times = np.r_[np.arange(0.0, 100.0), np.arange(160.0, 200.0)]
    start = np.repeat(times, 4)
    src = np.tile(np.arange(4), len(times))
    dst = (src + 1) % 4
    after = start >= 160
    same = 49152 + src
    new = same + np.where(after, 7, 0)
    mostly = same + np.where(after & (src == 0), 7, 0)
    silence = (np.array([99.0]), np.array([160.0]))
    check = lambda port, share=0.5: resumed_on_same_connections(src, dst, port, start, *silence, 30.0, share).tolist()
    assert check(same) == [True]
    assert check(new) == [False]
    assert check(mostly) == [True] and check(mostly, share=0.9) == [False]
    assert check(np.full(len(start), -1)) == [False]  # records without ports tell nothing
    # the same connections but another pair's: a connection is its ends and its port
    assert resumed_on_same_connections(src, np.where(after, (src + 2) % 4, dst), same, start, *silence, 30.0,
                                       0.5).tolist() == [False]


def _records(rows):
    names = ("time_flow_start_ns", "time_flow_end_ns", "src_addr", "dst_addr", "bytes", "src_port", "sampling_rate")
    return pa.table({name: [row[i] for row in rows] for i, name in enumerate(names)},
                    schema=pa.schema([(n, pa.string() if n.endswith("addr") else
                                       pa.int32() if n == "src_port" else pa.int64()) for n in names]))


MS, US = 1_000_000, 1_000
# one transfer a -> b on three queue pairs, started 0.3 ms apart, ending apart (one on a slow path)
ONE_TRANSFER = [
    (10 * MS, 110 * MS, "a", "b", 100, 49200, 1),
    (10 * MS + 300 * US, 112 * MS, "a", "b", 100, 49153, 1),
    (10 * MS + 600 * US, 150 * MS, "a", "b", 100, 49301, None),
]
# a ring's three chunks a -> c on two queue pairs, each 0.1 ms, their starts skewed more than
# that: the k-th record of each queue pair is the k-th chunk's
RING = [
    (200 * MS, 200 * MS + 100 * US, "a", "c", 64, 49200, 1),
    (200 * MS + 100 * US, 200 * MS + 200 * US, "a", "c", 64, 49200, 1),
    (200 * MS + 150 * US, 200 * MS + 250 * US, "a", "c", 64, 49201, 1),
    (200 * MS + 200 * US, 200 * MS + 300 * US, "a", "c", 64, 49200, 1),
    (200 * MS + 250 * US, 200 * MS + 350 * US, "a", "c", 64, 49201, 1),
    (200 * MS + 350 * US, 200 * MS + 450 * US, "a", "c", 64, 49201, 1),
]


def _coalesced(rows, nics=("a", "b", "c", "d", "e", "f", "g"), chunk_rows=1 << 20):
    table = coalesced_channels(_records(rows), pa.array(nics, pa.string()), 0.002, 0.1, 0.9, chunk_rows)
    return [tuple(row.values()) for row in table.to_pylist()]


def test_a_transfers_queue_pairs_read_as_one_record():
    rows = [
        *ONE_TRANSFER,
        (10 * MS, 110 * MS, "b", "a", 7, 49153, 1),  # the other direction, one queue pair
        *RING,
        (300 * MS, 301 * MS, "a", "c", 64, 49201, 1),  # later than 2 ms: another transfer on two
        (300 * MS + 100 * US, 301 * MS, "a", "c", 64, 49200, 1),  # queue pairs
        (400 * MS, 401 * MS, "a", "d", 50, 49200, 1),  # one queue pair's transfer ...
        (400 * MS, 401 * MS, "a", "d", 50, 49200, 1),  # ... and another on the same queue pair
    ]
    assert _coalesced(rows) == [
        (10 * MS, 149_400_000, "a", "b", 300, 49153, 1),  # as long as its longest queue pair; the lowest port
        rows[3],
        (200 * MS, 200 * MS + 100 * US, "a", "c", 128, 49200, 1),
        (200 * MS + 100 * US, 200 * MS + 200 * US, "a", "c", 128, 49200, 1),
        (200 * MS + 200 * US, 200 * MS + 300 * US, "a", "c", 128, 49200, 1),
        (300 * MS, 301 * MS, "a", "c", 128, 49200, 1),
        *rows[12:],
    ]
    for chunk_rows in (1, 2, 5):  # read a few NIC pairs at a time: the same
        assert _coalesced(rows, chunk_rows=chunk_rows) == _coalesced(rows)


def test_records_stay_as_they_are_where_a_nic_pair_does_not_split_its_transfers_evenly():
    rows = ONE_TRANSFER + RING
    assert len(_coalesced(rows)) == 4
    two_sizes = [(300 * MS, 301 * MS, "a", "g", 64, 49201, 1), (300 * MS, 302 * MS, "a", "g", 4096, 49200, 1)]
    # an all-to-all's sends, each of its own size
    all_to_all = [(400 * MS + i * US, 400 * MS + (i + 100) * US, "a", "c", 64 * (1 + i % 3), 49200 + i, 1)
                  for i in range(0, 30, 10)]
    # two transfers on two queue pairs, the second one's record on one of them lost
    lost = [(600 * MS, 600 * MS + 100 * US, "a", "f", 10, 49200, 1),
            (600 * MS + 100 * US, 600 * MS + 200 * US, "a", "f", 10, 49200, 1),
            (600 * MS + 200 * US, 600 * MS + 300 * US, "a", "f", 10, 49201, 1)]
    sampled_back = [(300 * MS, 300 * MS, "c", "a", 64, 49200, 64)]  # a packet sampled one way
    no_ports = [(500 * MS, 501 * MS, "a", "e", 9, None, 1)] * 2
    # a job's pairs are weighed against each other: one pair that does not split evenly keeps
    # every record of the job
    for odd in (two_sizes, all_to_all, lost, sampled_back, no_ports):
        assert _coalesced(rows + odd) == [tuple(row.values()) for row in _records(rows + odd).to_pylist()]
    # records to or from an address not among the job's NICs (storage, another job) stay as they
    # are, and do not count
    to_storage = [(300 * MS, 301 * MS, "a", "storage", 64, 49200 + i, 1) for i in (0, 1, 1)]
    assert _coalesced(rows + to_storage) == _coalesced(rows) + to_storage
    assert _coalesced(RING, nics=["a"]) == RING


def test_one_port_each_by_table_is_the_hashed_count(monkeypatch):
    """Whether every pair's records come from one source port: the same through a table of the
    pairs' keys as by hashing (the path of keys spanning too many values), both ways."""
    from prism_core import queue_pairs

    rng = np.random.default_rng(7)
    pair = rng.integers(0, 500, 5_000) * 3
    one_port = (pair * 7 % 65_536).astype(np.int32)
    two_ports = one_port.copy()
    two_ports[rng.integers(0, len(pair))] += 1
    for port, expected in ((one_port, True), (two_ports, False)):
        assert queue_pairs._one_port_each(pair, port) is expected
        with monkeypatch.context() as patch:
            patch.setattr(queue_pairs, "MAX_DENSE_SPAN_PER_VALUE", 0)
            assert queue_pairs._one_port_each(pair, port) is expected
