"""Scored figures and how scenarios pool (prism_core.evaluate.figures)."""

from prism_core.evaluate.figures import Figure, pool


def scored(exact: Figure, error: float, false_issues: Figure) -> dict:
    return {"steps": {"job_hours_exact_count": exact.as_dict(),
                      "boundary_error_share": Figure(error, 0.003, at_most=True).as_dict()},
            "issues": {"false_issues_per_clean_job_hour": false_issues.as_dict()}}


def test_pooled_shares_add_their_counts_and_other_figures_give_their_range():
    """Scenarios pool by their counts, not by averaging their shares: 9/10 and 1/2 are 10/12."""
    pooled = pool([scored(Figure.share(9, 10, 0.99), 0.001, Figure.share(0, 4, 1.0, at_most=True)),
                   scored(Figure.share(1, 2, 0.99), 0.004, Figure.share(3, 2, 1.0, at_most=True))])
    assert pooled["steps"]["job_hours_exact_count"] == {"value": 10 / 12, "count": 10, "of": 12, "target": 0.99,
                                                        "ok": False}
    assert pooled["steps"]["boundary_error_share"] == {"min": 0.001, "max": 0.004, "target": 0.003, "ok": False,
                                                       "at_most": True}
    # a rate pools by its counts too, and stays an upper bound: 3 false issues over 6 job-hours
    assert pooled["issues"]["false_issues_per_clean_job_hour"] == {
        "value": 0.5, "count": 3, "of": 6, "target": 1.0, "ok": True, "at_most": True}
    assert Figure.share(0, 0, 0.95, empty=None).value is None  # no such fault: nothing to score
