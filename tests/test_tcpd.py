import json
import os
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bocd_bench import PUBLISHED_COVER, PUBLISHED_F1, RESULTS, TCPD_DIR, tcpd_summary
from prism_core import tcpd

needs_tcpd = pytest.mark.skipif(not (TCPD_DIR / "annotations.json").exists(), reason="TCPD data not present")


# --- metrics: the doctest values of TCPDBench's metrics.py ----------------------------------------


def test_f_measure_matches_tcpdbench():
    assert tcpd.f_measure({1: [10, 20], 2: [11, 20], 3: [10], 4: [0, 5]}, [10, 20])[0] == 1.0
    assert tcpd.f_measure({1: [], 2: [10], 3: [50]}, [10])[0] == pytest.approx(0.9090909090909091, abs=1e-15)
    assert tcpd.f_measure({1: [], 2: [10], 3: [50]}, [])[0] == pytest.approx(0.8, abs=1e-15)


def test_f_measure_returns_precision_against_the_union_and_recall_per_annotator():
    f1, precision, recall = tcpd.f_measure({"a": [10], "b": [30]}, [10, 50])
    assert precision == pytest.approx(2 / 3)  # {0, 10, 50}: 0 and 10 match the union {0, 10, 30}
    assert recall == pytest.approx(0.75)  # a: {0, 10} both found; b: {0, 30} half found
    assert f1 == pytest.approx(2 * precision * recall / (precision + recall))


def test_f_measure_margin_and_one_to_one_matching():
    # 15 is 5 from 10: inside the margin; a prediction is matched to one change point only
    assert tcpd.f_measure({"a": [10]}, [15])[1:] == (1.0, 1.0)
    assert tcpd.f_measure({"a": [10]}, [16])[1:] == (0.5, 0.5)
    assert tcpd.f_measure({"a": [10, 12]}, [11])[1:] == (1.0, pytest.approx(2 / 3))


def test_f_measure_keeps_tcpdbench_greedy_order():
    # Greedy matching follows the iteration order of Python sets, as in TCPDBench; sorting the
    # change points first would give 0.923 here. Value from TCPDBench's own code.
    f1 = tcpd.f_measure({"0": [6], "1": [3, 10, 15, 19]}, [1, 2, 8, 9, 13, 15])[0]
    assert f1 == pytest.approx(0.7964601769911505, abs=1e-15)


def test_covering_matches_tcpdbench():
    cover = tcpd.covering({1: [10, 20], 2: [10], 3: [0, 5]}, [10, 20], 45)
    assert cover == pytest.approx(0.7962962962962963, abs=1e-15)
    assert tcpd.covering({1: [], 2: [10], 3: [40]}, [10], 45) == pytest.approx(0.7954144620811286, abs=1e-15)
    assert tcpd.covering({1: [], 2: [10], 3: [40]}, [], 45) == pytest.approx(0.8189300411522634, abs=1e-15)


def test_covering_of_single_segmentations():
    # cover_single doctests of metrics.py, segments written as change points over 6 points
    assert tcpd.covering({"a": [3]}, [3, 5], 6) == pytest.approx(5 / 6)
    assert tcpd.covering({"a": []}, [4], 6) == pytest.approx(4 / 6)
    assert tcpd.covering({"a": [3]}, [2, 4], 6) == pytest.approx(4 / 6)
    assert tcpd.covering({"a": [1, 2, 3]}, [], 6) == pytest.approx(2 / 6)
    assert tcpd.covering({"a": [7, -1]}, [], 6) == 1.0  # outside the series: ignored


def test_clean_predictions_dedupes_and_drops_the_ends():
    np.testing.assert_array_equal(tcpd.clean_predictions([9, 0, 3, 3, 8, 1, -2, 12], 10), [1, 3, 8])


def test_zscore_uses_the_sample_deviation_and_ignores_missing_values():
    values = np.array([[1.0, 10.0], [2.0, np.nan], [3.0, 30.0]])
    z = tcpd.zscore(values)
    np.testing.assert_allclose(z[:, 0], [-1.0, 0.0, 1.0])
    np.testing.assert_allclose(z[[0, 2], 1], [-np.sqrt(0.5), np.sqrt(0.5)])
    assert np.isnan(z[1, 1])


def test_evaluate_scores_a_detector_on_the_protocol(tmp_path):
    root = tmp_path / "tcpd"
    (root / "datasets" / "toy").mkdir(parents=True)
    raw = [0.0] * 10 + [5.0] * 9 + [None]
    (root / "datasets" / "toy" / "toy.json").write_text(
        json.dumps({"name": "toy", "n_obs": 20, "n_dim": 1, "series": [{"raw": raw}], "time": {"index": []}})
    )
    (root / "annotations.json").write_text(json.dumps({"toy": {"1": [10], "2": [11]}}))
    series = tcpd.load_all(root)
    assert series[0].values.shape == (20, 1) and np.isnan(series[0].values[19, 0])

    seen = []

    def detector(z):
        seen.append(z)
        return [0, 10, 10, 19]  # 0 and n - 1 are dropped, duplicates merged

    (score,) = tcpd.evaluate(series, detector)
    assert np.nanstd(seen[0], ddof=1) == pytest.approx(1.0)
    assert score.changepoints == [10]
    # annotator 2's segments (11 and 9 points) are covered at 10/11 and 9/10
    assert (score.f1, score.cover) == (1.0, pytest.approx((1 + (11 * 10 / 11 + 9 * 9 / 10) / 20) / 2))
    summary = tcpd.summarize([score])
    assert summary["univariate"] == {"count": 1, "mean_f1": 1.0, "mean_cover": score.cover}
    assert summary["multivariate"]["count"] == 0


# --- BOCD on the benchmark ----------------------------------------------------------------------


@needs_tcpd
def test_bocd_default_reaches_the_published_tcpd_scores(tmp_path):
    summary = tcpd_summary(TCPD_DIR)
    univariate = summary["univariate"]
    n_dims = {name: scores["n_dim"] for name, scores in summary["series"].items()}
    assert univariate["count"] == sum(d == 1 for d in n_dims.values()) == 31
    assert univariate["mean_f1"] >= PUBLISHED_F1
    assert univariate["mean_cover"] >= PUBLISHED_COVER
    # regression anchors: series every method gets right, and the published per-series BOCPD figures
    assert summary["series"]["nile"]["changepoints"] == [28]
    assert summary["series"]["quality_control_3"]["f1"] == 1.0
    assert summary["series"]["brent_spot"]["f1"] == pytest.approx(0.5207667731629393)
    assert summary["series"]["run_log"]["f1"] == 1.0  # the multivariate series

    # write the per-series figures into the repo only when asked
    asked = os.environ.get("PRISM_WRITE_BENCHMARKS") == "1"
    target = RESULTS / "tcpd.json" if asked else tmp_path / "tcpd.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(summary, indent=2) + "\n")
    assert json.loads(Path(target).read_text())["univariate"] == univariate
