"""The accuracy benchmark's protocol (benchmarks.accuracy): a development set, and a sealed set
scored beside it in its own section."""

import json
import sys

import pytest

from benchmarks import accuracy
from prism_core.evaluate.figures import Figure


def test_no_scenario_is_in_both_sets():
    dev = {(family, seed) for family, seeds in accuracy.DEV.items() for seed in seeds}
    sealed = {(family, seed) for family, seeds in accuracy.SEALED.items() for seed in seeds}
    assert sealed and not dev & sealed


def test_sets_pool_apart_and_a_missing_family_is_skipped(tmp_path, monkeypatch, capsys):
    found = {("small", 0): 9, ("small", 1): 1, ("fleet", 100): 3}  # faults found, of 10 each

    def score_one(name, seed):
        return {"issues": {"recall_straggler": Figure.share(found[name, seed], 10, 0.95).as_dict()}}

    monkeypatch.setattr(accuracy, "score_one", score_one)
    monkeypatch.setattr(accuracy, "RESULTS", tmp_path / "accuracy.json")
    monkeypatch.setattr(accuracy, "SEALED", {"fleet": (100,), "no-such-family": (0,)})
    monkeypatch.setattr(sys, "argv", ["accuracy", "--set", "sealed"])
    accuracy.main()
    assert "skipping family 'no-such-family'" in capsys.readouterr().out
    sealed = json.loads(accuracy.RESULTS.read_text())["sealed"]
    assert sealed["skipped"] == ["no-such-family"] and sealed["seeds"] == {"fleet": [100]}
    assert sealed["pooled"]["issues"]["recall_straggler"]["count"] == 3

    # a dev run over two small seeds pools them (10 of 20) and keeps the sealed section
    monkeypatch.setattr(sys, "argv", ["accuracy", "--set", "dev", "--small-seeds", "0-1", "--fleet-seeds", "",
                                      "--sealed-seeds", ""])
    accuracy.main()
    result = json.loads(accuracy.RESULTS.read_text())
    assert result["sealed"] == sealed
    recall = result["dev"]["pooled"]["issues"]["recall_straggler"]
    assert (recall["count"], recall["of"], recall["ok"]) == (10, 20, False)
    assert list(result["dev"]["scenarios"]) == ["small-0", "small-1"]


def test_the_sealed_sets_seeds_of_the_sealed_family_are_refused_as_development(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["accuracy", "--set", "dev", "--sealed-seeds", "2-3"])
    with pytest.raises(SystemExit):
        accuracy.main()
    assert "belong to the sealed set" in capsys.readouterr().err
