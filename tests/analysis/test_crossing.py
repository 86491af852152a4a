"""emunum.analysis.crossing: each estimator finds a known crossing exactly on noiseless curves, and on noisy
synthetic curves with a known crossing the chosen estimator is unbiased and less variable than the first
evaluation past the target."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from emunum.analysis import crossing
from emunum.analysis.crossing import Estimator


def _line(every: int, slope: Fraction, n: int, offset: Fraction = Fraction(0)):
    """(iteration, offset + slope * iteration) every ``every`` iterations: dyadic values, exact in floats."""
    return [(s, float(offset + slope * s)) for s in range(every, every * (n + 1), every)]


@pytest.mark.parametrize("every", [16, 32, 64])
@pytest.mark.parametrize("true_crossing", [403, 437, 600, 777])
def test_noiseless_line_interpolated_and_smoothed_find_the_crossing_exactly(every, true_crossing):
    slope = Fraction(1, 1024)
    pts = _line(every, slope, 80)  # the crossing lies past the first whole window of every k below
    target = float(slope * true_crossing)
    assert crossing.interpolated_crossing(pts, target) == true_crossing
    # a centred moving average of a straight line is the same line wherever its window is whole
    for k in (1, 2, 3):
        assert crossing.smoothed_crossing(pts, target, half_window=k) == true_crossing
    # first: the evaluation at or after the crossing (the grid's resolution)
    assert crossing.first_crossing(pts, target) == every * math.ceil(true_crossing / every)


@pytest.mark.parametrize("estimator", list(Estimator))
def test_a_falling_loss_crosses_from_above(estimator):
    slope = Fraction(-1, 1024)
    pts = _line(16, slope, 60, offset=Fraction(2))  # 2 - s/1024: crosses 1.75 at s = 256
    got = crossing.estimate(estimator, pts, 1.75, above=False)
    assert got == 256


@pytest.mark.parametrize("estimator", list(Estimator))
def test_never_crossing_gives_none_and_non_finite_points_are_skipped(estimator):
    pts = [(20, 0.1), (40, float("nan")), (60, 0.3), (80, float("inf")), (100, 0.5)]
    assert crossing.estimate(estimator, pts, 0.9) is None
    assert not crossing.settled(estimator, pts, 0.9)
    assert crossing.estimate(estimator, [], 0.9) is None


def test_first_point_already_past_the_target_is_returned_as_is():
    assert crossing.interpolated_crossing([(20, 0.95), (40, 0.97)], 0.9) == 20
    assert crossing.first_crossing([(20, 0.95), (40, 0.97)], 0.9) == 20


def test_smoothed_needs_half_window_evaluations_after_its_crossing():
    pts = _line(16, Fraction(1, 1024), 40)
    target = 300 / 1024  # crosses at 300: between the evaluations at 288 and 304
    k = crossing.SMOOTH_HALF_WINDOW
    upto = [p for p in pts if p[0] <= 304 + 16 * (k - 1)]
    assert not crossing.settled(Estimator.SMOOTHED, upto, target)
    upto = [p for p in pts if p[0] <= 304 + 16 * k]
    assert crossing.settled(Estimator.SMOOTHED, upto, target)
    assert crossing.estimate(Estimator.SMOOTHED, upto, target) == 300
    assert crossing.settled(Estimator.INTERPOLATED, [p for p in pts if p[0] <= 304], target)


def test_parse_names_the_field_and_the_allowed_values():
    assert Estimator.parse(" Smoothed ") is Estimator.SMOOTHED
    with pytest.raises(ValueError, match=r"estimator='median'.*first, interpolated, smoothed"):
        Estimator.parse("median")
    with pytest.raises(ValueError, match="half_window=-1"):
        crossing.moving_average([(1, 0.5)], -1)


def _noisy_curves(trials: int, rng, every: int = 20, noise: float = 0.015):
    """Saturating curves a(t) = 0.93 (1 - exp(-t / tau)) with a known crossing of 0.88, plus evaluation-to-
    evaluation noise of ``noise`` (sd, independent per evaluation: the model fluctuating near the target)."""
    target = 0.88
    for _ in range(trials):
        tau = rng.uniform(150, 250)
        true = -tau * math.log(1 - target / 0.93)
        s = np.arange(every, 2000 + every, every)
        a = 0.93 * (1 - np.exp(-s / tau)) + noise * rng.standard_normal(s.size)
        yield true, list(zip(s.tolist(), a.tolist())), target


def test_on_noisy_curves_interpolated_and_smoothed_beat_the_first_crossing():
    """Over 400 synthetic curves with a known crossing: the first evaluation past the target is early (a
    fluctuation crosses first) and spread; interpolation removes the grid's half-interval lag, and smoothing
    removes most of the fluctuation's effect: its error is the least variable and its mean error is within
    5 iterations of 0 (the grid is 20)."""
    rng = np.random.default_rng(33)
    err = {e: [] for e in Estimator}
    for true, pts, target in _noisy_curves(400, rng):
        for e in Estimator:
            err[e].append(crossing.estimate(e, pts, target) - true)
    sd = {e: float(np.std(v, ddof=1)) for e, v in err.items()}
    mean = {e: float(np.mean(v)) for e, v in err.items()}
    assert sd[Estimator.SMOOTHED] < 0.8 * sd[Estimator.FIRST], (sd, mean)
    assert sd[Estimator.INTERPOLATED] <= sd[Estimator.FIRST], (sd, mean)
    assert abs(mean[Estimator.SMOOTHED]) < 5.0, (sd, mean)
    assert mean[Estimator.FIRST] < -5.0, (sd, mean)  # a noisy curve's first crossing comes early
