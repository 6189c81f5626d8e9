"""prism_core.arrays: the fast paths give exactly numpy's answers."""

import numpy as np
import pytest

from prism_core.arrays import group_indices, stable_order, unique_inverse


@pytest.mark.parametrize("low, high", [(0, 5), (-40_000, 20_000), (-3, 70_000), (0, 10**15)])
def test_stable_order_is_numpys_stable_argsort(low, high):
    """Narrow spans take the radix path (negative keys included), wide ones numpy's."""
    keys = np.random.default_rng(high).integers(low, high, 5_000)
    assert np.array_equal(stable_order(keys), np.argsort(keys, kind="stable"))
    small = keys.astype(np.int8) if high <= 5 else keys
    assert np.array_equal(stable_order(small), np.argsort(small, kind="stable"))


def test_stable_order_of_int8_keys_spanning_their_whole_range():
    keys = np.array([127, -128, 0, 127, -128], np.int8)
    assert stable_order(keys).tolist() == [1, 4, 2, 0, 3]


@pytest.mark.parametrize("distinct", [1, 7, 3_000])
def test_unique_inverse_is_numpys_unique(distinct):
    rng = np.random.default_rng(distinct)
    values = rng.choice(rng.integers(-10**12, 10**12, distinct), 10_000)
    expected_values, expected_codes = np.unique(values, return_inverse=True)
    got_values, got_codes = unique_inverse(values)
    assert np.array_equal(got_values, expected_values) and got_values.dtype == expected_values.dtype
    assert np.array_equal(got_codes, expected_codes)


def test_unique_inverse_of_nothing():
    values, codes = unique_inverse(np.zeros(0, np.int64))
    assert len(values) == len(codes) == 0


def test_group_indices_keeps_row_order_within_a_key():
    groups = list(group_indices(np.array([3, 1, 3, 2, 1])))
    assert [(key, rows.tolist()) for key, rows in groups] == [(1, [1, 4]), (2, [3]), (3, [0, 2])]
