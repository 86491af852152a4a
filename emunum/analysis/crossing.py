"""Iterations-to-accuracy estimators: where a validation curve, sampled every few iterations, crosses a target.

A curve is a sequence of (iteration, value) points in increasing iteration order; points whose value is not
finite are skipped. ``above=True`` (accuracy) crosses when value >= target, ``above=False`` (a loss) when
value <= target. Every estimator returns None when its curve never crosses.

- ``first``: the first evaluation at or past the target (the measurement results.json has always had in
  ``iterations_to_accuracy``; its resolution is the evaluation interval).
- ``interpolated``: the straight line between the last evaluation before that one and that one, solved for the
  target: in (previous iteration, first-crossing iteration]. A first point already past the target is returned
  as is (nothing before it to interpolate from).
- ``smoothed``: ``interpolated`` applied to the centred moving average over ``2 k + 1`` evaluations (fewer
  at the ends of the curve, where the window is cut). Only smoothed values with their whole window count, so
  it needs ``k`` evaluations after its crossing (``settled``).

``settled(estimator, points, target)`` says whether more evaluations can still change the estimate: a run that
stops at the target must keep evaluating until then.
"""
from __future__ import annotations

import enum
import math


class Estimator(enum.Enum):
    FIRST = "first"
    INTERPOLATED = "interpolated"
    SMOOTHED = "smoothed"

    @classmethod
    def parse(cls, value, field: str = "estimator") -> "Estimator":
        if isinstance(value, cls):
            return value
        for m in cls:
            if isinstance(value, str) and value.strip().lower() == m.value:
                return m
        raise ValueError(f"{field}={value!r} is not an estimator; allowed: {', '.join(m.value for m in cls)}")


SMOOTH_HALF_WINDOW = 2


def _clean(points) -> list[tuple[float, float]]:
    out = []
    for s, v in points:
        if v is not None and math.isfinite(v):
            out.append((float(s), float(v)))
    return out


def _past(v: float, target: float, above: bool) -> bool:
    return v >= target if above else v <= target


def first_crossing(points, target: float, *, above: bool = True) -> float | None:
    """The first point's iteration whose value is at or past ``target``."""
    return next((s for s, v in _clean(points) if _past(v, target, above)), None)


def _interpolate(pts: list[tuple[float, float]], target: float, above: bool) -> float | None:
    for i, (s, v) in enumerate(pts):
        if _past(v, target, above):
            if i == 0:
                return s
            s0, v0 = pts[i - 1]
            return s0 + (target - v0) / (v - v0) * (s - s0)
    return None


def interpolated_crossing(points, target: float, *, above: bool = True) -> float | None:
    """Linear interpolation between the last point before the first crossing and the first crossing."""
    return _interpolate(_clean(points), target, above)


def moving_average(points, half_window: int) -> list[tuple[float, float, bool]]:
    """(iteration, centred mean over 2 k + 1 points, whether the window was whole) per point."""
    if not isinstance(half_window, int) or isinstance(half_window, bool) or half_window < 0:
        raise ValueError(f"half_window={half_window!r} is out of range; allowed: an integer >= 0")
    pts = _clean(points)
    n, out = len(pts), []
    for i, (s, _) in enumerate(pts):
        lo, hi = max(0, i - half_window), min(n, i + half_window + 1)
        out.append((s, math.fsum(v for _, v in pts[lo:hi]) / (hi - lo), hi - lo == 2 * half_window + 1))
    return out


def smoothed_crossing(points, target: float, *, half_window: int = SMOOTH_HALF_WINDOW,
                      above: bool = True) -> float | None:
    """``interpolated`` on the moving average, over the points whose window is whole (module docstring)."""
    avg = moving_average(points, half_window)
    first_whole = next((i for i, (_, _, whole) in enumerate(avg) if whole), None)
    if first_whole is None:
        return None
    return _interpolate([(s, v) for s, v, whole in avg[first_whole:] if whole], target, above)


def estimate(estimator, points, target: float, *, above: bool = True) -> float | None:
    """The named estimator's crossing of ``points`` (see the module docstring)."""
    e = Estimator.parse(estimator)
    if e is Estimator.FIRST:
        return first_crossing(points, target, above=above)
    if e is Estimator.INTERPOLATED:
        return interpolated_crossing(points, target, above=above)
    return smoothed_crossing(points, target, above=above)


def settled(estimator, points, target: float, *, above: bool = True) -> bool:
    """True once no later evaluation can change ``estimate``: for ``first`` and ``interpolated`` a point at
    or past the target; for ``smoothed`` a whole-window average at or past it."""
    return estimate(estimator, points, target, above=above) is not None
