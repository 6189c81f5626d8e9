"""benchmarks/adversarial.py stays runnable: nothing else imports it, and it once went stale
unseen (a renamed module, a membership column added) while its figures file kept old numbers."""

from benchmarks.adversarial import run_size


def test_adversarial_job_is_analyzed_at_a_small_size():
    figures = run_size(20_000, seed=0, repeat=1)
    assert figures["flows"] == 20_000
    assert {"analyze_job_s", "divide_steps_s", "steps", "issues"} <= figures.keys()
