"""Thresholds in one place: `prism run --config FILE` overrides a stage's parameters, and a
mistake in the file is named, never ignored."""

import subprocess
import sys

import pytest

from prism_core.config import DEFAULT_PARAMS, ConfigError, load_params
from prism_core.diagnosis import DiagnosisParams


def write(tmp_path, text: str):
    path = tmp_path / "prism.toml"
    path.write_text(text)
    return path


def test_a_file_overrides_only_the_fields_it_names(tmp_path):
    params = load_params(write(tmp_path, """
        [diagnosis]
        slow_step_delta = 1.25
        min_steps = 12
        severity_bands = [[0.2, "low"], [0.4, "medium"], [0.6, "high"]]
        [recognition]
        jaccard = 1          # an integer where a share is asked
    """))
    assert params.diagnosis.slow_step_delta == 1.25 and params.diagnosis.min_steps == 12
    assert params.diagnosis.severity_bands == ((0.2, "low"), (0.4, "medium"), (0.6, "high"))
    assert params.recognition.jaccard == 1.0 and isinstance(params.recognition.jaccard, float)
    assert params.parallelism == DEFAULT_PARAMS.parallelism
    assert params.diagnosis.hang_watchdog_s == DiagnosisParams().hang_watchdog_s


@pytest.mark.parametrize("text, says", [
    ("[diagnosiss]\nslow_step_delta = 1.2", "unknown section [diagnosiss]"),
    ("[diagnosis]\nslow_step = 1.2", "[diagnosis] has no field 'slow_step'"),
    ("[diagnosis]\nmin_steps = 10.5", "[diagnosis] min_steps = 10.5: expected int"),
    ("[diagnosis]\nslow_step_delta = 'fast'", "expected float"),
    ("[diagnosis\n", "not TOML"),
])
def test_a_mistake_is_named(tmp_path, text, says):
    with pytest.raises(ConfigError, match=None) as raised:
        load_params(write(tmp_path, text))
    assert says in str(raised.value)


def test_the_cli_refuses_a_bad_config_in_one_line(tmp_path):
    path = write(tmp_path, "[timelin]\n")
    result = subprocess.run([sys.executable, "-m", "prism_cli.main", "run", "--flows", "flows", "--config", str(path)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "unknown section [timelin]" in result.stderr


def test_a_threshold_from_the_file_changes_the_analysis(scenario_dir, tmp_path):
    """A slow-step threshold at the jitter's level calls many more steps slow than the default."""
    from pipelines.run import infer_range, run_hours
    from pipelines.warehouse import load_tables

    scenario = scenario_dir("tiny")
    first, end = infer_range(str(scenario / "flows"))
    counts = {}
    for name, text in (("default", ""), ("strict", "[diagnosis]\nslow_step_delta = 1.0001\njitter_sigmas = 0.0\n")):
        root = tmp_path / name
        run_hours(str(scenario / "flows"), str(root), first, end, topology_path=str(scenario / "topology.csv"),
                  params=load_params(write(tmp_path, text)))
        kinds = load_tables(root)["issues"]["kind"].to_pylist()
        counts[name] = kinds.count("slow_step")
    assert counts["strict"] > counts["default"] + 3
