"""Seeds until precise: add seeds until the ratio to the baseline is known to within ±``rel``, or a cap.

The rule (``Rule``): run ``start`` seeds of every format (the same seeds, so the ratio is paired); while the
paired ratio's interval has a half-width above ``rel`` times the ratio, add ``step`` seeds of every format,
up to ``cap`` seeds. The half-width is the larger of the interval's two sides (``half_width``), so "±10%"
holds on both sides of a skewed bootstrap interval.

Stopping when the interval is narrow selects samples whose spread happens to look small, and the expanded
percentile bootstrap already covers a little less than its level at five seeds: measured over synthetic
experiments (benchmarks/sequential_coverage.py), a 95% interval that this rule stops on covers the true ratio
in 0.91-0.93 of them (starting at five or six seeds), below 0.93 in most scenarios. The rule therefore computes its
interval at ``LEVEL`` (0.97), which brings the coverage of the interval it stops on, and reports, to 0.944-0.961
in those simulations (benchmarks/RESULTS.md, "seeds until precise"). The table's own intervals stay 95%.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import stats

LEVEL = 0.97  # the rule's interval level: corrected for the stopping rule (module docstring)


@dataclass(frozen=True)
class Rule:
    """Add ``step`` seeds from ``start`` until the half-width is <= ``rel`` x the ratio, or ``cap`` seeds."""

    rel: float = 0.10
    start: int = 6
    step: int = 2
    cap: int = 24
    level: float = LEVEL

    def __post_init__(self):
        if not (isinstance(self.rel, (int, float)) and not isinstance(self.rel, bool) and 0 < self.rel < 1):
            raise ValueError(f"rel={self.rel!r} is out of range; allowed: 0 < rel < 1 (0.1 = ±10%)")
        for name, lo in (("start", 2), ("step", 1), ("cap", 2)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}={v!r} is out of range; allowed: an integer >= {lo}")
        if self.cap < self.start:
            raise ValueError(f"cap={self.cap} is below start={self.start}; allowed: cap >= start")
        if not 0.5 < self.level < 1:
            raise ValueError(f"level={self.level!r} is out of range; allowed: 0.5 < level < 1")

    def next_count(self, n: int) -> int:
        """Seeds per format after the next addition (``cap`` at most)."""
        return min(self.cap, max(n, self.start) + self.step) if n >= self.start else self.start


@dataclass(frozen=True)
class Decision:
    """What the rule says after ``seeds`` seeds: ``precise`` (half-width <= rel x ratio), ``stop`` (precise, or
    the cap reached), and ``next_seeds`` (seeds per format to have next; == seeds when stopping)."""

    interval: stats.Interval | None
    half_width: float | None
    seeds: int
    precise: bool
    stop: bool
    next_seeds: int
    message: str


def half_width(iv: stats.Interval | None) -> float | None:
    """The larger side of the interval as a fraction of its estimate; None without an interval, inf when
    an end is open (censored runs) or the estimate is 0."""
    if iv is None or iv.low is None or iv.high is None:
        return None
    if iv.estimate <= 0 or math.isinf(iv.high):
        return math.inf
    return max(iv.high - iv.estimate, iv.estimate - iv.low) / iv.estimate


def paired_ratio(num, den, num_keys, den_keys, rule: Rule, *, num_censored=None, den_censored=None,
                 resamples: int = stats.RESAMPLES, seed: int = stats.RNG_SEED) -> stats.Interval | None:
    """The ratio's interval at the rule's level (``stats.ratio_interval``, paired by seed)."""
    return stats.ratio_interval(num, den, num_censored=num_censored, den_censored=den_censored,
                                num_keys=num_keys, den_keys=den_keys, level=rule.level, resamples=resamples,
                                seed=seed)


def decide(iv: stats.Interval | None, seeds: int, rule: Rule, name: str = "ratio") -> Decision:
    """The rule's decision for an interval from ``seeds`` seeds per format."""
    hw = half_width(iv)
    pct = f"{100 * rule.level:g}%"
    precise = hw is not None and hw <= rule.rel
    capped = seeds >= rule.cap
    nxt = seeds if (precise or capped) else rule.next_count(seeds)
    what = f"{name}: no interval" if hw is None else f"{name} {iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}] ({pct})"
    want = f"±{100 * rule.rel:g}%"
    if precise:
        msg = f"precise: {what}, ±{100 * hw:.1f}% <= {want} after {seeds} seeds per format"
    elif capped:
        got = "no interval" if hw is None else f"±{100 * hw:.1f}%"
        msg = (f"NOT YET PRECISE: {what}, {got} > {want} after {seeds} seeds per format, the cap ({rule.cap}); "
               "the interval is wider than asked, more seeds would narrow it")
    else:
        got = "no interval" if hw is None else f"±{100 * hw:.1f}%"
        msg = f"not yet precise: {what}, {got} > {want} after {seeds} seeds per format; next: {nxt} seeds"
    return Decision(iv, hw, seeds, precise, precise or capped, nxt, msg)


def check_sweep(runs, baseline: str, rule: Rule) -> list[tuple[str, Decision]]:
    """The rule's decision for every format's ratio to ``baseline`` over a sweep's runs (``report.measured``:
    censored runs enter as in the report, and open the interval). Seeds count where both have a run."""
    from .report import formats_in_order, measured

    base = measured([r for r in runs if r.format == baseline])
    out = []
    for name in formats_in_order(runs, baseline):
        if name == baseline:
            continue
        m = measured([r for r in runs if r.format == name])
        seeds = len(stats.seed_pairs(m.seeds, base.seeds))
        iv = None
        if m.values and base.values and not all(base.censored):
            iv = paired_ratio(m.values, base.values, m.seeds, base.seeds, rule, num_censored=m.censored,
                              den_censored=base.censored)
        out.append((name, decide(iv, seeds, rule, f"{name}/{baseline}")))
    if not out:
        raise ValueError(f"no format besides the baseline {baseline!r} in the sweep: nothing to make precise")
    return out
