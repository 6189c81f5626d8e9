"""`prism evaluate` fails when a figure misses its target, and reports only with --no-fail."""

import json

import pytest
from typer.testing import CliRunner

import pipelines.evaluation
from prism_cli.main import app
from prism_core.evaluate.figures import Figure

runner = CliRunner()


@pytest.fixture
def scores(monkeypatch):
    """The figures the scorer returns (a dict to fill), whatever truth and warehouse are named."""
    figures: dict[str, dict[str, dict]] = {}
    monkeypatch.setattr(pipelines.evaluation, "evaluate_warehouse", lambda truth, root: figures)
    return figures


def evaluate(*options: str):
    return runner.invoke(app, ["evaluate", "--truth", "truth", "--warehouse", "wh", *options])


def test_a_missed_target_fails_after_the_table(scores):
    scores["issues"] = {"precision": Figure.share(8, 10, 0.90).as_dict(),
                        "false_issues_per_clean_job_hour": Figure.share(1, 4, 1.0, at_most=True).as_dict()}
    result = evaluate()
    assert result.exit_code == 1
    assert "0.8000 (8/10)" in result.output and ">= 0.9" in result.output and "<= 1.0" in result.output
    assert "1 figures miss their target: issues.precision" in result.output
    assert evaluate("--no-fail").exit_code == 0
    result = evaluate("--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["issues"]["precision"]["ok"] is False
    assert "issues.precision" in result.stderr


def test_targets_met_or_absent_pass(scores):
    scores["issues"] = {"precision": Figure.share(9, 10, 0.90).as_dict(), "issues": Figure(10).as_dict(),
                        "recall_hang": Figure.share(0, 0, 0.95, empty=None).as_dict()}
    result = evaluate()
    assert result.exit_code == 0, result.output
    assert "miss their target" not in result.output
