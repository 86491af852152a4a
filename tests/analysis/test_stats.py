"""emunum.analysis.stats: bootstrap intervals are exact on constructed inputs, cover the truth at their
nominal level on synthetic draws, count censored runs, pair by seed, and give the verdict the interval says."""
from __future__ import annotations

import math

import numpy as np
import pytest

from emunum.analysis import stats


@pytest.mark.parametrize("df", [1, 2, 4, 9, 30])
@pytest.mark.parametrize("p", [0.025, 0.9, 0.975])
def test_student_t_quantile_matches_scipy(p, df):
    scipy_stats = pytest.importorskip("scipy.stats")
    assert stats._t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9, abs=1e-9)


def test_expanded_alpha_is_hesterbergs_formula():
    scipy_stats = pytest.importorskip("scipy.stats")
    for n in (2, 3, 5, 20):
        z = math.sqrt(n / (n - 1)) * scipy_stats.t.ppf(0.975, n - 1)
        assert stats.expanded_alpha(n) == pytest.approx(2 * scipy_stats.norm.cdf(-z), rel=1e-8)


def test_identical_runs_give_a_zero_width_interval():
    iv = stats.mean_interval([700, 700, 700, 700, 700])
    assert (iv.estimate, iv.low, iv.high, iv.n, iv.censored) == (700.0, 700.0, 700.0, 5, 0)
    r = stats.ratio_interval([900] * 4, [600] * 4, num_keys=range(4), den_keys=range(4))
    assert (r.estimate, r.low, r.high) == (1.5, 1.5, 1.5)
    assert stats.verdict(r) is stats.Verdict.SLOWER


def test_two_runs_give_their_range_and_one_run_gives_no_interval():
    iv = stats.mean_interval([400, 600])
    assert (iv.low, iv.high) == (400.0, 600.0)  # expanded alpha at n=2 is ~1e-72: the whole range
    one = stats.mean_interval([400])
    assert (one.estimate, one.low, one.high) == (400.0, None, None)
    assert stats.verdict(stats.ratio_interval([800], [400])) is stats.Verdict.NOT_DISTINGUISHABLE
    assert stats.mean_interval([]) is None


def test_interval_is_reproducible_and_brackets_the_mean():
    x = [812, 905, 770, 1010, 860, 930]
    a, b = stats.mean_interval(x), stats.mean_interval(x)
    assert a == b
    assert min(x) <= a.low < a.estimate < a.high <= max(x)


@pytest.mark.parametrize("n", [5, 10])
@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_mean_interval_covers_the_true_mean_at_about_95_percent(n, dist):
    """400 synthetic experiments of n seeds: the interval holds the true mean about 95% of the time. Measured
    over 1000 experiments with the default 10000 resamples: 0.91 (n=5) and 0.95 (n=10), normal and lognormal
    alike; the bounds below allow 3 binomial standard deviations at 400 trials."""
    rng = np.random.default_rng(1234 + n)
    trials, hits = 400, 0
    for t in range(trials):
        if dist == "normal":
            x, mu = rng.normal(1000, 150, n), 1000.0
        else:
            x, mu = 1000 * rng.lognormal(0, 0.3, n), 1000 * math.exp(0.045)
        iv = stats.mean_interval(x, resamples=4000, seed=t)
        hits += iv.low <= mu <= iv.high
    assert (0.87 if n == 5 else 0.92) <= hits / trials <= 0.985, hits / trials


def test_paired_ratio_interval_covers_the_true_ratio():
    """Seeds shared by both formats (a common per-seed factor) and a true ratio of 1.4."""
    rng = np.random.default_rng(7)
    trials, hits, widths = 300, 0, []
    for t in range(trials):
        seed_effect = rng.lognormal(0, 0.3, 6)
        base = 800 * seed_effect * rng.lognormal(0, 0.05, 6)
        fmt = 1.4 * 800 * seed_effect * rng.lognormal(0, 0.05, 6)
        r = stats.ratio_interval(fmt, base, num_keys=range(6), den_keys=range(6), resamples=2000, seed=t)
        u = stats.ratio_interval(fmt, base, resamples=2000, seed=t)
        # the true ratio of the means: 1.4 * E[exp(N(0, .05^2))] / E[...] = 1.4
        hits += r.low <= 1.4 <= r.high
        widths.append((r.high - r.low, u.high - u.low))
    assert 0.90 <= hits / trials <= 0.995, hits / trials
    # pairing removes the shared seed effect: paired intervals are much narrower than unpaired ones
    w = np.array(widths)
    assert np.median(w[:, 0]) < 0.5 * np.median(w[:, 1])


def test_censored_runs_are_counted_as_lower_bounds_and_open_the_interval():
    iv = stats.mean_interval([500, 600, 4000], censored=[False, False, True])
    assert iv.censored == 1 and iv.is_lower_bound
    assert iv.estimate == 1700.0 and iv.high == math.inf and iv.low >= 500
    r = stats.ratio_interval([500, 4000], [400, 500], num_censored=[False, True], num_keys=[0, 1], den_keys=[0, 1])
    assert r.high == math.inf and r.censored == 1 and r.estimate == 4500 / 900
    r = stats.ratio_interval([500, 600], [400, 4000], den_censored=[False, True])
    assert r.low == 0.0 and r.censored == 1


def test_pairs_match_seeds_once_each_in_numerator_order():
    assert stats.seed_pairs([3, 1, 2, None], [1, 2, 2, 5]) == [(1, 0), (2, 1)]
    assert stats.seed_pairs(None, [1]) == []


def test_ratio_pairs_only_shared_seeds_when_two_or_more_exist():
    # seeds 0 and 1 shared; seed 9 only in the numerator: the estimate is over the pairs
    r = stats.ratio_interval([600, 800, 5000], [400, 400], num_keys=[0, 1, 9], den_keys=[0, 1])
    assert r.estimate == 1400 / 800 and r.n == 2
    # no shared seeds: unpaired over every observation
    r = stats.ratio_interval([600, 800, 5000], [400, 400], num_keys=[5, 6, 9], den_keys=[0, 1])
    assert r.estimate == (6400 / 3) / 400


@pytest.mark.parametrize("low, high, want", [
    (1.1, 1.5, stats.Verdict.SLOWER), (0.5, 0.9, stats.Verdict.FASTER), (0.9, 1.2, stats.Verdict.NOT_DISTINGUISHABLE),
    (1.0, 2.0, stats.Verdict.NOT_DISTINGUISHABLE), (1.2, math.inf, stats.Verdict.SLOWER),
    (0.0, 0.8, stats.Verdict.FASTER),
])
def test_verdict_follows_the_interval(low, high, want):
    assert stats.verdict(stats.Interval(1.0, low, high, 5)) is want


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="non-finite"):
        stats.mean_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="censored has 1 flags for 2 values"):
        stats.mean_interval([1, 2], censored=[True])


def test_t_band_is_the_student_interval():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = [0.90, 0.92, 0.91, 0.95]
    m, lo, hi = stats.t_band(x)
    half = scipy_stats.t.ppf(0.975, 3) * np.std(x, ddof=1) / 2
    assert (lo, hi) == pytest.approx((m - half, m + half), rel=1e-12)
    assert stats.t_band([0.5]) == (0.5, 0.5, 0.5)
