"""Whether a job resumed after a silence on the connections (queue pairs) it had."""

from __future__ import annotations

import numpy as np

from prism_core.queue_pairs import resumed_on_same_connections


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
