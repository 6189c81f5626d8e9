"""prism_core.arrays: the fast paths give exactly numpy's answers."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from prism_core.arrays import (
    MAX_SLICED_DROPS,
    MAX_SLICED_STRING_DROPS,
    MIN_GROUP_SORTED_ALONE,
    KeyGroups,
    combined_key,
    encoded,
    filter_rows,
    group_first_index,
    group_indices,
    group_median,
    group_medians,
    group_mode,
    group_reduce,
    kth_within_groups,
    lookup,
    nearest_within,
    rolling_median,
    searchsorted_many,
    segment_median,
    stable_order,
    unique_counts,
    unique_inverse,
    unique_rows,
    with_codes,
)


@pytest.mark.parametrize("low, high", [(0, 5), (-40_000, 20_000), (-3, 70_000), (-2**31, 2**31), (0, 10**15)])
def test_stable_order_is_numpys_stable_argsort(low, high):
    """Narrow spans take the radix paths (one pass or two; negative keys included), wide ones numpy's."""
    keys = np.random.default_rng(high).integers(low, high, 5_000)
    assert np.array_equal(stable_order(keys), np.argsort(keys, kind="stable"))
    assert np.array_equal(stable_order(keys, scattered=True), np.argsort(keys, kind="stable"))
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


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16])
def test_unique_inverse_of_integers_spanning_few_values_is_numpys_unique(dtype):
    info = np.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    values = np.random.default_rng(3).integers(low, high, 5_000, endpoint=True).astype(dtype)
    values[:2] = low, high  # the span's ends (an int8's whole range)
    expected_values, expected_codes = np.unique(values, return_inverse=True)
    got_values, got_codes = unique_inverse(values)
    assert np.array_equal(got_values, expected_values) and got_values.dtype == expected_values.dtype
    assert np.array_equal(got_codes, expected_codes)


def test_unique_inverse_of_nothing():
    values, codes = unique_inverse(np.zeros(0, np.int64))
    assert len(values) == len(codes) == 0


@pytest.mark.parametrize("distinct", [0, 1, 7, 3_000])
def test_unique_counts_is_numpys_unique(distinct):
    rng = np.random.default_rng(distinct)
    values = rng.choice(rng.integers(-10**12, 10**12, distinct), 10_000) if distinct else np.zeros(0, np.int64)
    expected_values, expected_counts = np.unique(values, return_counts=True)
    got_values, got_counts = unique_counts(values)
    assert np.array_equal(got_values, expected_values) and got_values.dtype == expected_values.dtype
    assert np.array_equal(got_counts, expected_counts)


@pytest.mark.parametrize("dtypes", [(np.int64, np.int64), (np.int32, np.int16, np.int64), (np.uint32, np.int64)])
@pytest.mark.parametrize("rows", [0, 1, 2_000])
def test_unique_rows_is_numpys_unique_over_rows(dtypes, rows):
    """Signed columns take the packed path (negative values included); unsigned ones numpy's own."""
    rng = np.random.default_rng(rows + len(dtypes))
    columns = [rng.integers(0 if np.dtype(t).kind == "u" else -50, 50, rows).astype(t) for t in dtypes]
    stacked = np.stack(columns, axis=1)
    expected_rows, expected_first, expected_inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    got_rows, got_first, got_inverse = unique_rows(*columns, return_index=True, return_inverse=True)
    assert np.array_equal(got_rows, expected_rows) and got_rows.dtype == expected_rows.dtype
    assert np.array_equal(got_first, expected_first)
    assert np.array_equal(got_inverse, expected_inverse.ravel())
    assert np.array_equal(unique_rows(*columns), expected_rows)


def test_group_indices_keeps_row_order_within_a_key():
    groups = list(group_indices(np.array([3, 1, 3, 2, 1])))
    assert [(key, rows.tolist()) for key, rows in groups] == [(1, [1, 4]), (2, [3]), (3, [0, 2])]


def test_combined_key_tells_combinations_apart_and_keeps_their_order():
    step = np.array([0, 0, 1, 1, 2, 0])
    stage = np.array([-1, 3, -1, 0, 3, -1])  # -1: unknown
    key = combined_key(step, stage)
    assert key[0] == key[5] and len(np.unique(key)) == 5
    assert np.array_equal(np.argsort(key, kind="stable"), np.lexsort((stage, step)))


def test_group_reductions_give_each_row_its_groups_value():
    key = np.array([5, 2, 5, 9, 2, 5])
    values = np.array([4.0, 1.0, 8.0, 7.0, 3.0, 6.0])
    assert group_reduce(key, values, np.maximum).tolist() == [8.0, 3.0, 8.0, 7.0, 3.0, 8.0]
    assert group_reduce(key, np.ones(6, np.int64), np.add).tolist() == [3, 2, 3, 1, 2, 3]
    assert group_median(key, values).tolist() == [6.0, 2.0, 6.0, 7.0, 2.0, 6.0]  # 2: mean of the middle two
    # the most frequent value, the smallest on a tie
    assert group_mode(np.array([1, 1, 1, 4, 4]), np.array([3, 2, 3, 7, 5])).tolist() == [3, 3, 3, 5, 5]
    assert group_first_index(np.array([2, 2, 5, 7, 7, 7])).tolist() == [0, 0, 2, 3, 3, 3]


def test_rolling_median_stays_in_its_segment_and_skips_invalid_values():
    values = np.array([1.0, 2.0, 100.0, 3.0, 10.0, 20.0, 30.0])
    valid = np.array([True, True, False, True, True, True, True])
    segment = np.array([0, 0, 0, 0, 1, 1, 1])
    rolled = rolling_median(values, valid, segment, 1)
    # position 2 (invalid itself) sees 2 and 3; position 3 sees 3 only (its right neighbour is
    # in the next segment)
    assert rolled.tolist() == [1.5, 1.5, 2.5, 3.0, 15.0, 20.0, 25.0]
    # a segment without a valid value takes the median of all valid values
    assert segment_median(values, valid & (segment == 1), segment).tolist() == [20.0] * 7


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_group_helpers_on_no_rows_return_no_rows(dtype):
    """A filter that leaves no row must not fail the hour (issue #18)."""
    key, values, none = np.zeros(0, np.int64), np.zeros(0, dtype), np.zeros(0, bool)
    assert len(combined_key(key, key)) == 0 and len(group_first_index(key)) == 0
    assert group_reduce(key, values, np.maximum).dtype == dtype and len(group_reduce(key, values, np.add)) == 0
    assert len(group_median(key, values)) == 0
    assert len(group_mode(key, key)) == 0
    assert len(rolling_median(values.astype(float), none, key, 3)) == 0
    assert len(segment_median(values.astype(float), none, key)) == 0


@pytest.mark.parametrize("one_large_group", [False, True])
def test_group_median_is_numpys_median_per_group(one_large_group):
    """Groups of like sizes take the padded rows, one large group the sort of all values."""
    rng = np.random.default_rng(int(one_large_group))
    key = rng.integers(0, 300, 6_000) * 13 - 7
    values = rng.normal(size=len(key)).round(1)  # ties
    if one_large_group:
        key[:3_000] = 5
    expected = np.array([np.median(values[key == k]) for k in key])
    assert np.array_equal(group_median(key, values), expected)


def test_group_medians_of_large_groups_of_sizes_that_differ_are_numpys():
    """Groups of a size class above MIN_GROUP_SORTED_ALONE whose sizes differ are sorted one by one."""
    rng = np.random.default_rng(3)
    sizes = MIN_GROUP_SORTED_ALONE + 1 + rng.integers(0, MIN_GROUP_SORTED_ALONE - 1, 12)
    key = np.r_[np.repeat(np.arange(12) * 7, sizes), rng.integers(100, 140, 500)]
    rng.shuffle(key)
    values = rng.normal(size=len(key)).round(1)
    expected = [np.median(values[key == k]) for k in np.unique(key)]
    assert np.array_equal(group_medians(key, values), expected)


def test_group_medians_of_equal_groups_side_by_side_are_numpys():
    """Groups of one size, consecutive in key order, are sorted where they lie; one per group."""
    rng = np.random.default_rng(2)
    key = np.r_[np.repeat(np.arange(40), 25), np.repeat([50, 51], [30, 45])]
    rng.shuffle(key)
    values = rng.normal(size=len(key)).round(1)
    expected = [np.median(values[key == k]) for k in np.unique(key)]
    assert np.array_equal(group_medians(key, values), expected)
    assert len(group_medians(np.zeros(0, np.int64), np.zeros(0))) == 0


def test_key_groups_first_rows_are_numpys_before_and_after_the_rows_are_ordered():
    key = np.random.default_rng(4).integers(0, 30, 400)
    groups = KeyGroups(key)
    expected = np.unique(key, return_index=True)[1]
    assert np.array_equal(groups.first_rows(), expected)
    assert len(groups.order) == len(key)  # the rows in their stable order by group, as group_medians puts them
    assert np.array_equal(groups.first_rows(), expected)


@pytest.mark.parametrize("drops", [0, 10, MAX_SLICED_DROPS + 1, MAX_SLICED_STRING_DROPS + 1])
def test_filter_rows_is_pyarrows_filter(drops):
    """Slices, text slices beside copied numbers, or pyarrow's filter: the same rows."""
    rng = np.random.default_rng(drops)
    n = 3 * MAX_SLICED_STRING_DROPS
    table = pa.table({"addr": [f"10.0.{i % 251}.{i % 7}" for i in range(n)], "bytes": rng.integers(0, 10**9, n)})
    keep = np.ones(n, bool)
    keep[rng.choice(n, drops, replace=False)] = False
    filtered = filter_rows(table, keep)
    assert filtered.schema == table.schema and filtered.equals(table.filter(pa.array(keep)))


@pytest.mark.parametrize("seed", range(6))
def test_kth_within_groups_is_that_of_the_groups_sorted(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 300, int(rng.integers(1, 40)))
    group = np.repeat(np.sort(rng.choice(10_000, len(sizes), replace=False)), sizes)
    scale = 10 ** int(rng.integers(0, 13))
    # spread values, a heavy tail (long quiets over many short ones), and ties
    values = [rng.integers(-scale, scale + 1, len(group)), (rng.pareto(1.0, len(group)) * scale).astype(np.int64),
              rng.integers(0, 3, len(group))][seed % 3]
    kth = rng.integers(0, sizes)
    expected = values[np.lexsort((values, group))][np.cumsum(sizes) - sizes + kth]
    assert np.array_equal(kth_within_groups(group, values, kth), expected)


def test_kth_within_groups_of_many_small_groups_sorts_them_all():
    """Too many groups to count by magnitude (a table of groups x buckets): numpy's answer still."""
    rng = np.random.default_rng(7)
    group = np.repeat(np.arange(2_000), 2)
    values = rng.integers(-10**15, 10**15, len(group))
    kth = rng.integers(0, 2, 2_000)
    expected = values[np.lexsort((values, group))][2 * np.arange(2_000) + kth]
    assert np.array_equal(kth_within_groups(group, values, kth), expected)


@pytest.mark.parametrize("kept", [1.0, 0.999, 0.3, 0.0])
@pytest.mark.parametrize("fill", [None, "", "unseen"])
def test_lookup_and_encoded_through_codes_are_those_of_the_text(kept, fill):
    """A table's codes (`with_codes`), filtered along with it (slices or copies), give what the
    text itself gives: the index in a value set, and the values numbered in order of first
    appearance (of the rows left), nulls filled or -1."""
    rng = np.random.default_rng(7)
    names = np.array([f"10.0.{i}.1" for i in range(30)] + [""], object)
    text = names[rng.integers(0, len(names), 20_000)]
    text[rng.integers(0, len(text), 12)] = None
    table = pa.concat_tables([pa.table({"addr": pa.array(part, pa.string())}) for part in np.split(text, [7_000])])
    keep = rng.random(len(text)) < kept
    plain, coded = filter_rows(table, keep), filter_rows(with_codes(table, ("addr",)), keep)
    value_set = pa.array(list(names[::3]), pa.string())
    assert np.array_equal(lookup(coded, "addr", value_set, fill), lookup(plain, "addr", value_set, fill))
    (codes, values), (expected_codes, expected_values) = encoded(coded, "addr", fill), encoded(plain, "addr", fill)
    assert np.array_equal(codes, expected_codes) and values.equals(expected_values)
    column = plain["addr"] if fill is None else pc.fill_null(plain["addr"], fill)
    assert values.equals(column.combine_chunks().dictionary_encode().dictionary)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("in_order", [True, False])
def test_searchsorted_many_is_numpys_searchsorted(side, in_order):
    """Many values against few sorted edges, ties and values beyond either end included: placed
    the other way round where the values come sorted, the same integers."""
    rng = np.random.default_rng(11)
    edges = np.sort(rng.integers(0, 100, 40)).astype(np.float64)
    values = rng.integers(-10, 110, 5_000).astype(np.float64)
    values = np.sort(values) if in_order else values
    assert np.array_equal(searchsorted_many(edges, values, side), np.searchsorted(edges, values, side))
    assert np.array_equal(searchsorted_many(edges[:0], values, side), np.zeros(len(values), np.int64))


def test_nearest_within_names_the_nearest_reference_only_within_the_share():
    reference = np.array([100.0, 200.0, 1000.0])
    values = np.array([101.0, 150.0, 197.0, 990.0, 5.0, 2000.0])
    assert nearest_within(values, reference, 0.02).tolist() == [0, -1, 1, 2, -1, -1]
    assert nearest_within(values, np.zeros(0), 0.02).tolist() == [-1] * 6


@pytest.mark.parametrize("span", [1_000, 1 << 62])
def test_key_then_time_order_is_lexsorts(span):
    """One stable sort of (key rank, time offset) where the pair fits in int64; lexsort where not."""
    from prism_core.arrays import _by_key_then_time

    rng = np.random.default_rng(4)
    key = rng.integers(-50, 50, 5_000) * 1_000_003
    times = rng.integers(-span // 2, span // 2, 5_000)
    times[::7] = times[1::7][: len(times[::7])]  # ties in time within a key, kept in row order
    key[::7] = key[1::7][: len(key[::7])]
    assert np.array_equal(_by_key_then_time(key, times), np.lexsort((times, key)))
    assert np.array_equal(_by_key_then_time(key, times.astype(float)), np.lexsort((times, key)))
