"""Golden check: the whole pipeline on `small` seed 0 writes exactly the recorded tables.

A change meant to keep Prism's output (a refactor) must pass this unchanged. A change meant to alter
it re-records the digest with `python -m benchmarks.golden record --small-seeds 0 --fleet-seeds ''`
and says in its commit which tables changed and why (benchmarks/golden.py).
"""

import json

from benchmarks.golden import RESULTS, differences, run_scenario


def test_small_hour_tables_match_the_recorded_digest(scenario_dir, tmp_path):
    expected = json.loads((RESULTS / "small-0.json").read_text())
    assert differences(expected, run_scenario(scenario_dir("small"), tmp_path / "wh")) == []
