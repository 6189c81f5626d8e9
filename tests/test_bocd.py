import itertools
import math

import numpy as np
import pytest
from scipy.special import gammaln

from prism_core.bocd import BocdResult, NormalGammaPrior, bocd


def piecewise(rng, lengths, means, sds):
    return np.repeat(means, lengths) + np.repeat(sds, lengths) * rng.standard_normal(int(np.sum(lengths)))


def segment_starts(lengths):
    return np.cumsum(lengths)[:-1]


# --- exhaustive reference: every segmentation of a short series -------------------------------


def log_marginal(segment, prior):
    """log p(segment) under the Normal-Gamma prior (closed form)."""
    n = len(segment)
    mean = segment.mean()
    kappa_n = prior.kappa + n
    alpha_n = prior.alpha + n / 2
    beta_n = (
        prior.beta
        + 0.5 * ((segment - mean) ** 2).sum()
        + prior.kappa * n * (mean - prior.mu) ** 2 / (2 * kappa_n)
    )
    return (
        gammaln(alpha_n)
        - gammaln(prior.alpha)
        + prior.alpha * math.log(prior.beta)
        - alpha_n * math.log(beta_n)
        + 0.5 * math.log(prior.kappa / kappa_n)
        - n / 2 * math.log(2 * math.pi)
    )


def all_segmentations(x, hazard, prior):
    """(segment starts, log joint) of every segmentation of x under the BOCD generative model."""
    n = len(x)
    for mask in itertools.product((False, True), repeat=n - 1):
        starts = [0] + [i + 1 for i, cut in enumerate(mask) if cut]
        bounds = starts + [n]
        log_joint = sum(log_marginal(x[a:b], prior) for a, b in zip(bounds, bounds[1:]))
        log_joint += (len(starts) - 1) * math.log(hazard) + (n - len(starts)) * math.log1p(-hazard)
        yield starts, log_joint


def last_start_posterior(x, hazard, prior):
    """P(the segment containing x[-1] starts at s | x), s = 0 .. len(x) - 1."""
    weights = np.zeros(len(x))
    entries = list(all_segmentations(x, hazard, prior))
    top = max(w for _, w in entries)
    for starts, log_joint in entries:
        weights[starts[-1]] += math.exp(log_joint - top)
    return weights / weights.sum()


def test_unpruned_bocd_equals_exhaustive_enumeration():
    rng = np.random.default_rng(7)
    x = np.r_[rng.normal(0, 1, 6), rng.normal(3, 0.5, 5)]
    prior = NormalGammaPrior(mu=0.5, kappa=0.5, alpha=2.0, beta=1.5)
    hazard_lambda, lag = 10.0, 3
    result = bocd(x, hazard_lambda=hazard_lambda, prior=prior, prune_below=0.0, cp_lag=lag)

    # MAP segmentation = the best of all 2^10 segmentations
    best_starts, _ = max(all_segmentations(x, 1 / hazard_lambda, prior), key=lambda e: e[1])
    assert result.changepoints.tolist() == best_starts[1:] == [6]

    for t in range(len(x)):
        posterior = last_start_posterior(x[: t + 1], 1 / hazard_lambda, prior)
        assert result.map_run_length[t] == t - posterior.argmax() + 1
        s = t - lag + 1
        if s > 0:  # cp_prob[s] is the posterior of start s given the data up to s + lag - 1
            assert result.cp_prob[s] == pytest.approx(posterior[s], abs=1e-10)
    # the last lag - 1 points use the posterior after the final point
    final = last_start_posterior(x, 1 / hazard_lambda, prior)
    np.testing.assert_allclose(result.cp_prob[len(x) - lag + 1 :], final[len(x) - lag + 1 :], atol=1e-10)
    assert result.cp_prob[0] == 0.0
    assert result.cp_prob[6] > 0.9  # the change is clear


# --- segmentation quality -------------------------------------------------------------------------


def test_map_finds_mean_changes_at_the_exact_point():
    rng = np.random.default_rng(1)
    lengths = rng.integers(40, 150, 25)
    # levels within the default prior's reach (z-scored data): jumps of 1.2 to 3 noise-free units
    means = [0.0]
    while len(means) < 25:
        level = rng.uniform(-2.0, 2.0)
        if abs(level - means[-1]) >= 1.2:
            means.append(level)
    x = piecewise(rng, lengths, np.array(means), np.full(25, 0.4))
    truth = segment_starts(lengths)

    found = bocd(x).changepoints
    assert len(found) == len(truth)
    distance = np.abs(found - truth)
    assert distance.max() <= 2
    assert np.mean(distance == 0) >= 0.9


def test_map_finds_variance_changes():
    rng = np.random.default_rng(2)
    lengths = np.array([300, 200, 300, 250])
    x = piecewise(rng, lengths, np.zeros(4), np.array([0.3, 2.0, 0.3, 1.5]))
    found = bocd(x).changepoints
    truth = segment_starts(lengths)
    assert len(found) == len(truth)
    assert np.abs(found - truth).max() <= 5


def test_no_changepoints_on_stationary_noise_at_threshold_095():
    x = np.random.default_rng(3).standard_normal(5000)
    result = bocd(x, threshold=0.95)
    assert result.changepoints.size == 0
    assert result.cp_prob.max() < 0.5
    assert bocd(x).changepoints.size == 0  # nor in the MAP segmentation


def test_threshold_095_marks_clear_steps_exactly():
    rng = np.random.default_rng(4)
    lengths = rng.integers(30, 80, 20)
    levels = np.where(np.arange(20) % 2 == 0, 0.0, 1.0) + rng.uniform(-0.2, 0.2, 20)
    noise = 0.05
    x = piecewise(rng, lengths, levels, np.full(20, noise))
    # prior matched to the noise (beta / alpha = noise variance), mean free to wander (small kappa)
    prior = NormalGammaPrior(mu=0.5, kappa=0.01, alpha=1.0, beta=noise**2)
    result = bocd(x, prior=prior, threshold=0.95)
    truth = segment_starts(lengths)
    np.testing.assert_array_equal(result.changepoints, truth)
    assert result.cp_prob[truth].min() > 0.99
    others = np.delete(result.cp_prob, truth)
    assert others.max() < 0.05


def test_map_run_length_counts_points_since_the_last_change():
    rng = np.random.default_rng(5)
    x = piecewise(rng, [100, 100], [0.0, 4.0], [0.5, 0.5])
    run_length = bocd(x).map_run_length
    assert run_length[0] == 1
    assert run_length[99] == 100
    np.testing.assert_array_equal(run_length[110:], np.arange(11, 101))


# --- pruning and cost ---------------------------------------------------------------------------


def test_pruning_gives_the_unpruned_result_on_a_short_series():
    rng = np.random.default_rng(6)
    x = piecewise(rng, [120, 80, 150, 100], [0.0, 1.5, -1.0, 0.5], [0.5, 0.7, 0.4, 0.6])
    exact = bocd(x, prune_below=0.0)
    pruned = bocd(x, prune_below=1e-4)
    assert exact.max_live_runs == len(x)
    assert pruned.max_live_runs < 150
    np.testing.assert_array_equal(pruned.changepoints, exact.changepoints)
    np.testing.assert_array_equal(pruned.map_run_length, exact.map_run_length)
    # pruned runs read as 0 instead of < 1e-4; the rest moves by the pruned mass only
    np.testing.assert_allclose(pruned.cp_prob, exact.cp_prob, atol=2e-3)


def test_live_run_lengths_stay_bounded_as_the_series_grows():
    # Stationary noise is the worst case: every recent start keeps some posterior mass.
    rng = np.random.default_rng(8)
    short = bocd(rng.standard_normal(5_000)).max_live_runs
    long = bocd(rng.standard_normal(20_000)).max_live_runs
    assert long < 1_000  # the exact algorithm keeps all 20,000
    assert long < 1.25 * short  # saturated: independent of the length


# --- inputs ---------------------------------------------------------------------------------------


def test_multivariate_sums_independent_dimensions():
    rng = np.random.default_rng(9)
    quiet = rng.normal(0.0, 0.5, 400)
    changing = piecewise(rng, [150, 250], [0.0, 2.0], [0.5, 0.5])
    both = np.column_stack([quiet, changing])
    assert bocd(both).changepoints.tolist() == bocd(changing).changepoints.tolist() == [150]

    # one column is the univariate series
    one = bocd(changing[:, None])
    np.testing.assert_array_equal(one.cp_prob, bocd(changing).cp_prob)

    # evidence adds up over dimensions: a small shift that half the dimensions miss alone
    rng = np.random.default_rng(3)
    weak = np.column_stack([piecewise(rng, [200, 200], [0.0, 0.5], [1.0, 1.0]) for _ in range(6)])
    assert sum(bocd(weak[:, i]).changepoints.size == 0 for i in range(6)) >= 3
    found = bocd(weak).changepoints
    assert len(found) == 1 and abs(found[0] - 200) <= 10


def test_missing_values_carry_no_evidence():
    rng = np.random.default_rng(11)
    x = piecewise(rng, [200, 200], [0.0, 2.0], [0.5, 0.5])
    with_gaps = x.copy()
    with_gaps[[50, 51, 52, 300]] = np.nan
    assert bocd(with_gaps).changepoints.tolist() == [200]
    # an all-missing dimension changes nothing
    padded = np.column_stack([x, np.full(len(x), np.nan)])
    np.testing.assert_allclose(bocd(padded).cp_prob, bocd(x).cp_prob)


def test_shifting_data_and_prior_together_changes_nothing():
    rng = np.random.default_rng(12)
    x = piecewise(rng, [150, 100, 150], [0.0, 2.0, -1.0], [0.5, 0.3, 0.6])
    prior = NormalGammaPrior(mu=0.0, kappa=0.1, alpha=1.0, beta=0.5)
    shifted = NormalGammaPrior(mu=1e6, kappa=0.1, alpha=1.0, beta=0.5)
    base, moved = bocd(x, prior=prior), bocd(x + 1e6, prior=shifted)
    np.testing.assert_array_equal(moved.changepoints, base.changepoints)
    np.testing.assert_allclose(moved.cp_prob, base.cp_prob, atol=1e-6)


def test_short_inputs():
    empty = bocd(np.zeros(0))
    assert isinstance(empty, BocdResult) and empty.changepoints.size == 0 and empty.cp_prob.size == 0
    single = bocd(np.array([3.0]))
    assert single.changepoints.size == 0 and single.map_run_length.tolist() == [1]
    assert single.cp_prob.tolist() == [0.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hazard_lambda": 1.0},
        {"prune_below": 1.0},
        {"prune_below": -0.1},
        {"cp_lag": 0},
        {"prior": NormalGammaPrior(beta=0.0)},
    ],
)
def test_rejects_invalid_settings(kwargs):
    with pytest.raises(ValueError):
        bocd(np.zeros(10), **kwargs)


def test_rejects_three_dimensional_input():
    with pytest.raises(ValueError):
        bocd(np.zeros((4, 2, 2)))
