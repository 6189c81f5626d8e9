"""The issues scorer (prism_core.evaluate.issues) on hand-made truth faults and Prism issues."""

import json

import numpy as np
import pyarrow as pa
import pytest

from prism_core.evaluate import issues as issue_scorer
from prism_core.evaluate import sensitivity
from prism_core.schema import ISSUES

NS = 1_000_000_000
HOUR0_NS = 1_795_338_000 * NS  # 2026-11-22T10:00Z


def ts(seconds: list[float]) -> pa.Array:
    return pa.array([HOUR0_NS + int(s * NS) for s in seconds]).cast(ISSUES.field("start").type)


def scorer_case() -> tuple[dict, dict]:
    """Truth: job t1 (faulty, addresses a0-a3 on host0 and host1) and t2 (clean, b0-b3) for an
    hour; Prism knows them as p1 and p2."""
    gpus = {"t1": ["a0", "a1", "a2", "a3"], "t2": ["b0", "b1", "b2", "b3"]}
    truth_gpus = pa.table({"job_id": [j for j, a in gpus.items() for _ in a], "addr": sum(gpus.values(), [])})
    prism_gpus = pa.table({"job_id": ["p" + j[1:] for j, a in gpus.items() for _ in a], "addr": sum(gpus.values(), [])})
    faults = pa.table({
        "fault_id": ["f0", "f1", "f2", "f3"], "job_id": ["t1"] * 4,
        "kind": ["straggler", "slow_link", "hang", "slow_step"],
        "subject": ["host1", "a1", "a2", "t1"],
        "start": ts([100, 1000, 3000, 500]), "end": ts([400, 1200, 3500, 506]),
        "wasted_gpu_s": [1000.0, 200.0, 5000.0, 40.0], "params": ["{}"] * 4,
    })
    steps = pa.table({"job_id": ["t1", "t2", "t2"], "start": ts([0, 0, 3700]), "end": ts([5, 5, 3705]),
                      "checkpoint": [False] * 3})
    truth = {"faults": faults, "job_gpus": truth_gpus, "jobs": pa.table({"job_id": ["t1", "t2"], "n_gpus": [4, 4]}),
             "steps": steps}
    issues = pa.table({
        "issue_id": ["i0", "i1", "i2", "i2", "i3", "i4", "i5"],
        "job_id": ["p1", "p1", "p1", "p1", "p1", "p2", "p1"],
        "kind": ["straggler", "slow_link", "hang", "hang", "slow_link", "slow_step", "degradation"],
        "subject": ["host2", "a0->a1", "a2,a3", "a2,a3", "a3", "p2", "p1"],
        "start": ts([110, 1010, 3001, 3001, 1000, 50, 2000]), "end": ts([390, 1190, 3600, 3500, 1190, 55, 2100]),
        "wasted_gpu_s": [1050.0, 150.0, 2000.0, 3000.0, 10.0, 5.0, 1.0],
    })
    return truth, {"issues": issues, "job_gpus": prism_gpus}


def figures_of(truth: dict, warehouse: dict) -> dict:
    return {name: f.value for name, f in issue_scorer.score(truth, warehouse, {}).items()}


def with_issues(warehouse: dict, **columns) -> dict:
    """The warehouse with more issue rows (missing columns: those of the first issue)."""
    first = warehouse["issues"].slice(0, 1).to_pylist()[0]
    n = len(next(iter(columns.values())))
    rows = pa.table({c: columns.get(c, [first[c]] * n) for c in warehouse["issues"].column_names},
                    schema=warehouse["issues"].schema)
    return warehouse | {"issues": pa.concat_tables([warehouse["issues"], rows])}


def test_scorer_matches_by_job_kind_time_and_subject():
    truth, warehouse = scorer_case()
    figures = figures_of(truth, warehouse)
    assert figures["recall_straggler"] == 0.0  # an issue overlaps it, but blames host2 for host1
    assert figures["straggler_top1"] == 0.0
    assert figures["recall_slow_link"] == 1.0  # "a0->a1" names a1
    assert figures["recall_hang"] == 1.0  # two hourly rows of one issue, waste 2000 + 3000
    assert figures["hang_localized"] == 1.0  # "a2,a3" names a2
    assert figures["recall_slow_step"] == 0.0
    assert figures["recall_degradation"] is None  # no such fault: nothing to score
    json.dumps({name: f.as_dict() for name, f in issue_scorer.score(truth, warehouse, {}).items()})  # `--json`
    # issues: slow_link and hang match; the straggler (wrong host), a3 (wrong NIC), the clean job's
    # slow step and the degradation do not
    assert figures["precision"] == pytest.approx(2 / 6)
    assert figures["duplicate_issues"] == 0
    # waste: slow link -25%, hang exact
    assert figures["waste_within_10pct"] == pytest.approx(1 / 2)
    assert figures["median_waste_error"] == pytest.approx(0.125)
    # the slow link cost 200 of the 800 GPU-seconds its job held meanwhile: perceptible
    assert figures["waste_within_10pct_perceptible"] == pytest.approx(1 / 2)
    # at 6 GPU-seconds (under 1% of them) it is below what step times resolve
    waste_column = truth["faults"].schema.get_field_index("wasted_gpu_s")
    truth["faults"] = truth["faults"].set_column(waste_column, "wasted_gpu_s", pa.array([1000.0, 6.0, 5000.0, 40.0]))
    figures = figures_of(truth, warehouse)
    assert figures["waste_within_10pct"] == pytest.approx(1 / 2)
    assert figures["waste_within_10pct_perceptible"] == 1.0


def test_a_straggler_is_right_only_on_its_host():
    truth, warehouse = scorer_case()
    right = with_issues(warehouse, issue_id=["i6"], subject=["host1"], start=ts([120]), end=ts([380]))
    figures = figures_of(truth, right)
    assert figures["recall_straggler"] == figures["straggler_top1"] == 1.0
    assert figures["precision"] == pytest.approx(3 / 7)  # host2's issue stays false beside it


def test_a_slow_stage_is_named_by_any_of_its_hosts():
    truth, warehouse = scorer_case()
    subject = truth["faults"]["subject"].to_pylist()
    subject[0] = "host1,host3"  # a slow last stage over two hosts
    truth["faults"] = truth["faults"].set_column(3, "subject", pa.array(subject))
    named = with_issues(warehouse, issue_id=["i6"], subject=["host3"], start=ts([120]), end=ts([380]))
    assert figures_of(truth, named)["recall_straggler"] == 1.0
    assert figures_of(truth, warehouse)["recall_straggler"] == 0.0  # host2 is not one of them


def test_two_issues_on_one_fault_one_is_right_the_other_false():
    """A second slow-link issue naming a1 on the same fault: one fault, one match."""
    truth, warehouse = scorer_case()
    again = with_issues(warehouse, issue_id=["i7"], kind=["slow_link"], subject=["a1"], start=ts([1050]),
                        end=ts([1150]), wasted_gpu_s=[60.0])
    figures = figures_of(truth, again)
    assert figures["recall_slow_link"] == 1.0
    assert figures["precision"] == pytest.approx(2 / 7)
    assert figures["duplicate_issues"] == 1
    # the fault's waste is its matched issue's (the longer overlap, 150), not the sum of both
    assert figures["median_waste_error"] == pytest.approx(0.125)


def test_pairing_keeps_every_pair_it_can():
    """Issue A overlaps slow steps f0 and f1 (f0 the more), issue B only f0: A goes to f1 so that
    both faults are found, though A-f0 alone would overlap the most."""
    overlap = np.array([[100, 10], [1, 0]])
    assert issue_scorer.one_to_one(overlap).tolist() == [1, 0]
    assert issue_scorer.one_to_one(np.array([[100, 10], [0, 0]])).tolist() == [0, -1]
    assert issue_scorer.one_to_one(np.zeros((0, 2))).tolist() == []


def test_false_issues_on_clean_and_spurious_jobs_count_per_clean_job_hour():
    truth, warehouse = scorer_case()
    # a job Prism made up (addresses no truth job holds) reports a straggler
    warehouse["job_gpus"] = pa.concat_tables([warehouse["job_gpus"], pa.table({"job_id": ["p9"], "addr": ["z0"]})])
    spurious = with_issues(warehouse, issue_id=["i8"], job_id=["p9"], subject=["host9"])
    for case, false_issues in ((warehouse, 1), (spurious, 2)):
        figure = issue_scorer.score(truth, case, {})["false_issues_per_clean_job_hour"]
        # the clean job t2's slow step (and p9's straggler) over the two hours t2 ran
        assert (figure.count, figure.of, figure.value) == (false_issues, 2, false_issues / 2)
        assert figure.ok and figure.at_most


def test_scorer_tells_reused_hosts_apart_by_time():
    truth, warehouse = scorer_case()
    # a later truth job on t1's hosts, and a Prism job p3 for it: p3's slow link must not match f1
    truth["job_gpus"] = pa.concat_tables([truth["job_gpus"], pa.table({"job_id": ["t3"] * 4, "addr": ["a0", "a1", "a2", "a3"]})])
    truth["jobs"] = pa.table({"job_id": ["t1", "t2", "t3"], "n_gpus": [4, 4, 4]})
    warehouse["job_gpus"] = pa.concat_tables([warehouse["job_gpus"], pa.table({"job_id": ["p3"] * 4, "addr": ["a0", "a1", "a2", "a3"]})])
    late = with_issues(warehouse, issue_id=["i9"], job_id=["p3"], kind=["slow_link"], subject=["a0->a1"],
                       start=ts([5000]), end=ts([5100]))
    assert figures_of(truth, late)["precision"] == pytest.approx(2 / 7)


def test_a_hang_named_after_the_whole_job_is_found_but_not_localized():
    truth, warehouse = scorer_case()
    subject = warehouse["issues"]["subject"].to_pylist()
    subject[2:4] = ["p1", "p1"]
    warehouse["issues"] = warehouse["issues"].set_column(3, "subject", pa.array(subject))
    figures = figures_of(truth, warehouse)
    assert figures["recall_hang"] == 1.0
    assert figures["hang_localized"] == 0.0


def test_recall_by_size_against_the_diagnosis_thresholds():
    """Three slow links at 0.8, 0.6 and 0.3 of their rate: 0.67x, 1.33x and 2.33x the shortfall
    the default 0.7 threshold needs. Prism finds the two larger ones."""
    assert sensitivity.DIAGNOSIS_DEFAULTS.slow_link_ratio == 0.7
    truth, warehouse = scorer_case()
    links = pa.table({
        "fault_id": ["g0", "g1", "g2"], "job_id": ["t1"] * 3, "kind": ["slow_link"] * 3, "subject": ["a1", "a2", "a3"],
        "start": ts([1500, 1800, 2100]), "end": ts([1600, 1900, 2200]), "wasted_gpu_s": [10.0, 20.0, 30.0],
        "params": [json.dumps({"factor": f}) for f in (0.8, 0.6, 0.3)],
    })
    truth["faults"] = pa.concat_tables([truth["faults"], links])
    found = with_issues(warehouse, issue_id=["j1", "j2"], kind=["slow_link"] * 2, subject=["a2", "a3"],
                        start=ts([1800, 2100]), end=ts([1900, 2200]))
    figures = figures_of(truth, found)
    assert figures["recall_slow_link_under_1x"] == 0.0
    assert figures["recall_slow_link_1x_to_1.5x"] == 1.0
    assert figures["recall_slow_link_over_1.5x"] == 1.0  # f1 has no factor recorded: in no bucket
    # the straggler wasted 1000 of the 1200 GPU-seconds its job held: far above 1% of a step
    assert figures["recall_straggler_over_1.5x"] == 0.0
    assert figures["recall_straggler_under_1x"] is None
    # f1 and the slow step have no factor in their params
    assert figures["faults_without_size"] == 2


def test_a_prism_job_seen_on_part_of_a_jobs_addresses_is_that_job_not_the_one_before_on_them():
    # t0 held a0 and a1 in the hour before; t1 holds a0-a3 now, and Prism saw it on a0 and a1 only
    at = ts([-3600, -1800, 0, 3600])
    truth_gpus = pa.table({"job_id": ["t0", "t0", "t1", "t1", "t1", "t1"], "addr": ["a0", "a1", "a0", "a1", "a2", "a3"],
                           "start": pa.concat_arrays([at.take([0, 0]), at.take([2] * 4)]),
                           "end": pa.concat_arrays([at.take([1, 1]), at.take([3] * 4)])})
    prism_gpus = pa.table({"job_id": ["p1", "p1"], "addr": ["a0", "a1"], "first_seen": at.take([2, 2]),
                           "last_seen": at.take([3, 3])})
    assert issue_scorer.associate_jobs(truth_gpus, prism_gpus) == {("t1", "p1")}


@pytest.mark.parametrize("natural_stall_s, beyond", [(8.0, 1), (12.0, 0)])
def test_slow_step_faults_beyond_the_jobs_natural_stalls(natural_stall_s, beyond):
    """t1 steps every 5 s; slow-step fault f3 (500-506 s) makes step 100 take 10 s, twice its
    neighbours. Step 150 stalls by nature (no fault there): at 8 s the fault is beyond every natural
    stall of its job, at 12 s it is not. The 12 s warm-up step opening the job is no natural
    stall."""
    truth, warehouse = scorer_case()
    durations = np.full(200, 5.0)
    durations[[0, 150, 100]] = 12.0, natural_stall_s, 10.0
    starts = 5.0 * np.arange(200)
    truth["steps"] = pa.table({"job_id": ["t1"] * 200, "start": ts(list(starts)), "end": ts(list(starts + durations)),
                               "checkpoint": [False] * 200, "attempt": [0] * 200})
    figure = issue_scorer.score(truth, warehouse, {})["recall_slow_step_beyond_natural"]
    assert (figure.count, figure.of) == (0, beyond)


def test_false_slow_steps_are_told_by_the_truths_step_under_them():
    truth, warehouse = scorer_case()
    # t2's steps: 5 s each, but a stall of 9 s at 50 s and a checkpoint save at 100 s
    durations = [5.0] * 30
    durations[10], durations[20] = 9.0, 20.0
    starts = np.r_[0.0, np.cumsum(durations)[:-1]]
    truth["steps"] = pa.table({"job_id": ["t2"] * 30, "start": ts(list(starts)), "end": ts(list(starts + durations)),
                               "checkpoint": [k == 20 for k in range(30)]})
    case = with_issues(warehouse, issue_id=["s1", "s2", "s3"], job_id=["p2"] * 3, kind=["slow_step"] * 3,
                       subject=["p2"] * 3, start=ts([starts[10], starts[20], starts[5]]),
                       end=ts([starts[10] + 9, starts[20] + 20, starts[5] + 5]))
    figures = figures_of(truth, case)
    # p2's own slow step i4 (50-55 s) lies on the stall too
    assert (figures["false_slow_steps"], figures["false_slow_steps_on_long_steps"],
            figures["false_slow_steps_on_checkpoints"]) == (4, 2, 1)
