"""Step division's rules for the first and last steps in view do O(n log n) work in a job's flows.

Work is counted in elements, not seconds: the job's flow arrays are wrapped in an ndarray subclass
that adds up every element a numpy call, ufunc or index reads from them (or from arrays derived
from them) while those rules run; a binary search counts log2 of the array searched per element
looked up. A rule that rescans the flows after every quiet gap touches the square of the flows.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_core.minutes import HOUR_NS
from prism_core.timeline import divide_steps, walk
from prism_core.timeline.traffic import Traffic

HOUR_START_NS = 10 * HOUR_NS
STRETCH_SENDS = 1_000  # pipeline sends in one copy of the stretch before the steps
STRETCH_GAP_NS = 300_000_000  # their mean gap (exponential: quiet gaps of every length)
COPIES = (1, 2, 4)
REGULAR_STEPS, STEP_NS = 12, 10_000_000_000
SLACK = 1.1


class _Counted(np.ndarray):
    """A flow array that counts the elements read from it while `_Counted.active`."""

    active = 0
    touched = 0

    def __getitem__(self, key):
        out = super().__getitem__(key)
        if _Counted.active:
            _Counted.touched += getattr(out, "size", 1)
        return out

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _count(inputs)
        return _counted(getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs)))

    def __array_function__(self, func, types, args, kwargs):
        if func is np.searchsorted and _Counted.active:
            searched, values = args[0], args[1] if len(args) > 1 else kwargs["v"]
            _Counted.touched += getattr(values, "size", 1) * math.ceil(math.log2(len(searched) + 1))
        else:
            _count(args)
        return _counted(func(*_plain(args), **_plain(kwargs)))


def _count(values) -> None:
    if _Counted.active:
        _Counted.touched += sum(value.size for value in _flatten(values) if isinstance(value, _Counted))


def _flatten(values):
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _flatten(value)
        else:
            yield value


def _plain(values):
    if isinstance(values, dict):
        return {name: _plain(value) for name, value in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(_plain(value) for value in values)
    return values.view(np.ndarray) if isinstance(values, _Counted) else values


def _counted(result):
    if isinstance(result, tuple):
        return tuple(_counted(value) for value in result)
    return result.view(_Counted) if type(result) is np.ndarray else result


def _counting(rule):
    def counted(*args, **kwargs):
        _Counted.active += 1
        try:
            return rule(*args, **kwargs)
        finally:
            _Counted.active -= 1
    return counted


@pytest.fixture(scope="module")
def counted_rules():
    """Flow arrays that count, and counting switched on inside the first- and last-step rules."""
    build = Traffic.build.__func__

    def counted_build(cls, *args, **kwargs):
        traffic = build(cls, *args, **kwargs)
        for name in (*Traffic.COLUMNS, "bulk_writes", "bulk_write_ends"):
            setattr(traffic, name, getattr(traffic, name).view(_Counted))
        return traffic

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Traffic, "build", classmethod(counted_build))
        for name in ("opening_start", "attempt_start", "ends_step", "hung_before_it_ended", "silences"):
            patch.setattr(walk, name, _counting(getattr(walk, name)))
        yield


def _job(copies: int, seed: int) -> tuple[pa.Table, pa.Table]:
    """Flows of a 2-stage, 2-replica job whose view opens on `copies` copies of the same stretch of
    pipeline sends at random gaps (no sync: nothing to anchor a step on), then runs regular steps,
    each closed by a DP sync; and its pairs. The first step in view is looked for after every quiet
    gap before its sync: twice the copies, twice the gaps and twice the flows after each."""
    rng = np.random.default_rng(seed)
    pipeline = [("a", "b"), ("b", "a"), ("c", "d"), ("d", "c")]
    collective = [("a", "c"), ("c", "a"), ("b", "d"), ("d", "b")]
    gaps = rng.exponential(STRETCH_GAP_NS, STRETCH_SENDS)
    stretch = np.cumsum(gaps).astype(np.int64)
    stretch_ns = int(stretch[-1] + STRETCH_GAP_NS)
    send_at = (stretch[None, :] + stretch_ns * np.arange(copies)[:, None]).ravel()
    send_pair = np.tile(rng.integers(0, len(pipeline), STRETCH_SENDS), copies)
    steps_from = copies * stretch_ns
    step = np.arange(REGULAR_STEPS)[:, None] * STEP_NS + steps_from
    micro_batches = (step + np.arange(8) * STEP_NS // 16).ravel()  # forward sends, then the sync
    # the sync closes the step a quarter second before the next one's first sends: a short usual
    # gap, so that many gaps of the stretch are quiet enough to open a step
    sync_at = (step[:, 0] + STEP_NS - 250_000_000)[:, None] + np.arange(4) * 1_000_000  # 4 channels
    start = np.r_[send_at, np.repeat(micro_batches, len(pipeline)), np.repeat(sync_at.ravel(), len(collective))]
    pair = np.r_[[pipeline[k] for k in send_pair], np.tile(pipeline, (micro_batches.size, 1)),
                 np.tile(collective, (sync_at.size, 1))]
    nbytes = np.r_[np.full(send_at.size + micro_batches.size * len(pipeline), 12 << 20),
                   np.full(sync_at.size * len(collective), 256 << 20)]
    order = np.argsort(start, kind="stable")
    start = HOUR_START_NS + start[order]
    flows = pa.table({"time_flow_start_ns": start, "time_flow_end_ns": start + 1_000_000,
                      "src_addr": pair[order, 0], "dst_addr": pair[order, 1], "bytes": nbytes[order],
                      "sampler_address": np.array(["x", "y"])[rng.integers(0, 2, len(start))]})
    kinds = ["pp"] * len(pipeline) + ["dp"] * len(collective)
    ends = pipeline + collective
    pairs = pa.table({"src_addr": [s for s, _ in ends], "dst_addr": [d for _, d in ends], "kind": kinds})
    return flows, pairs


def _touched(copies: int, seed: int) -> int:
    flows, pairs = _job(copies, seed)
    _Counted.touched = 0
    found = divide_steps("j", flows, pairs, None, HOUR_START_NS, HOUR_START_NS + HOUR_NS)
    assert found.steps.num_rows >= REGULAR_STEPS - 2  # the regular steps come out
    return _Counted.touched


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 1_000))
def test_first_and_last_step_rules_touch_n_log_n_flow_elements(counted_rules, seed):
    """Twice the flows before the first sync in view: the rules touch at most about n log n times
    as many flow elements, not the four times a rescan after each quiet gap would."""
    touched = [_touched(copies, seed) for copies in COPIES]
    flows = [copies * STRETCH_SENDS for copies in COPIES]
    for (fewer, more), n in zip(itertools.pairwise(touched), flows):
        assert more <= SLACK * 2 * math.log2(2 * n) / math.log2(n) * fewer, touched
