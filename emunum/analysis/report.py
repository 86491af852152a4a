"""Sweep reports: ``emunum report <sweep dir>`` (the runs are read by ``runs.load_sweep``).

Per format (``summarize``): runs, reached (status "reached"), diverged, failed; iterations to accuracy: mean
with a 95% confidence interval, median, sample standard deviation, min and max; the ratio of its mean to
the baseline format's (``baseline``, default ``fp32``) with a 95% interval, paired by seed, and a verdict
(``slower``, ``faster``, ``not distinguishable``); best and final validation accuracy of the fixed-budget
runs (``stop_at_target=false``) with their intervals. Intervals, censoring and pairing are defined in
``stats``: a run that never reached the target is a censored observation counted at ``iterations_run`` (the
mean is then a lower bound, marked ``>=``, and its interval is open above), never dropped. ``render``
writes text, Markdown or CSV.
"""
from __future__ import annotations

import csv
import enum
import io
import math
from dataclasses import dataclass, field

from . import stats
from .runs import (POOLED_KEYS, Run, Status, find_run_dirs, hydra_config, label_by_config,  # noqa: F401
                   load_run, load_sweep)


class OutputFormat(enum.Enum):
    TEXT = "text"
    MD = "md"
    CSV = "csv"

    @classmethod
    def parse(cls, value, field: str = "format") -> "OutputFormat":
        if isinstance(value, cls):
            return value
        for m in cls:
            if isinstance(value, str) and value.strip().lower() == m.value:
                return m
        raise ValueError(f"{field}={value!r} is not an output format; allowed: {', '.join(m.value for m in cls)}")



@dataclass(frozen=True)
class FormatSummary:
    """Per-format aggregate over runs (see the module docstring and ``stats``).

    ``iters_*`` are over the runs with a measurement (reached, not_reached, diverged; a censored run at its
    ``iterations_run``), None when there is none; ``iters_censored`` of them are lower bounds, and then
    ``iters_mean`` is a lower bound and ``iters_ci_high`` is inf. ``*_ci_*`` are None for fewer than two runs.
    ``best_acc_mean``/``best_acc_max`` are over every run; ``budget_*`` over fixed-budget runs only."""

    format: str
    runs: int
    reached: int
    diverged: int
    failed: int
    iters_mean: float | None
    iters_std: float | None
    iters_min: int | None
    iters_max: int | None
    ratio: float | None  # iters_mean / baseline iters_mean
    best_acc_mean: float | None
    best_acc_max: float | None
    seconds_per_iteration: float | None  # mean measured emulation time (train.py's seconds_per_iteration)
    iters_median: float | None = None
    iters_ci_low: float | None = None
    iters_ci_high: float | None = None
    iters_censored: int = 0
    ratio_ci_low: float | None = None
    ratio_ci_high: float | None = None
    ratio_paired: bool = False  # the ratio's runs were paired by seed
    verdict: str = stats.Verdict.NOT_DISTINGUISHABLE.value  # "baseline" on the baseline's own row
    budget_runs: int = 0  # fixed-budget runs (stop_at_target=false, not failed)
    final_acc: stats.Interval | None = None
    best_acc: stats.Interval | None = None


@dataclass(frozen=True)
class Report:
    summaries: tuple[FormatSummary, ...]
    baseline: str
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------------------
def mean_or_none(xs):
    return sum(xs) / len(xs) if xs else None


def _std(xs):
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def formats_in_order(runs: list[Run], baseline: str | None = None) -> list[str]:
    """Formats in order of first appearance, the baseline first when present."""
    seen = list(dict.fromkeys(r.format for r in runs))
    if baseline in seen:
        seen.remove(baseline)
        seen.insert(0, baseline)
    return seen


@dataclass(frozen=True)
class _Measured:
    """A format's iteration observations: value, censored flag and seed per run with a measurement."""

    values: list
    censored: list
    seeds: list


def measured(rs: list[Run]) -> _Measured:
    """Reached runs at their iterations-to-accuracy (``iterations_estimate`` where present); not_reached/diverged
    runs censored at iterations_run (``max_iters`` from the config when results.json lacks it); failed runs and
    runs without either left out."""
    vals, cens, seeds = [], [], []
    for r in rs:
        if r.status == Status.REACHED:  # the estimator's figure where results.json has one
            v, c = r.iterations_estimate if r.iterations_estimate is not None else r.iterations_to_accuracy, False
        elif r.status in (Status.NOT_REACHED, Status.DIVERGED):
            v, c = (r.iterations_run if r.iterations_run is not None else r.max_iters), True
        else:
            continue
        if v is None:
            continue
        vals.append(v)
        cens.append(c)
        seeds.append(r.seed)
    return _Measured(vals, cens, seeds)


def _finite(xs):
    return [x for x in xs if x is not None and math.isfinite(x)]


def summarize(runs: list[Run], baseline: str = "fp32") -> Report:
    """Per-format summaries and notes (missing baseline, baseline that never reached, failed runs)."""
    if not isinstance(baseline, str) or not baseline:
        raise ValueError(f"baseline={baseline!r} must be a format name")
    notes = []
    names = formats_in_order(runs, baseline)
    by = {n: [r for r in runs if r.format == n] for n in names}
    meas = {n: measured(by[n]) for n in names}
    base = meas.get(baseline)
    if baseline not in by:
        notes.append(f"baseline {baseline!r} is not in the sweep (formats: {', '.join(names)}): no ratios; "
                     "pass --baseline NAME, or add the baseline to the sweep")
    elif not any(c is False for c in base.censored):
        notes.append(f"baseline {baseline!r} never reached the target in {len(by[baseline])} run(s): no ratios")
        base = None
    out = []
    for n in names:
        rs, m = by[n], meas[n]
        it = m.values
        ci = stats.mean_interval(it, m.censored)
        ratio = None
        if base is not None and it:
            ratio = stats.ratio_interval(it, base.values, num_censored=m.censored, den_censored=base.censored,
                                         num_keys=m.seeds, den_keys=base.seeds)
        budget = [r for r in rs if r.stop_at_target is False and r.status != Status.FAILED]
        best = _finite(r.best_accuracy for r in rs)
        out.append(FormatSummary(
            format=n, runs=len(rs), reached=sum(r.status == Status.REACHED for r in rs),
            diverged=sum(r.status == Status.DIVERGED for r in rs), failed=sum(r.status == Status.FAILED for r in rs),
            iters_mean=ci.estimate if ci else None, iters_std=_std(it), iters_min=min(it) if it else None,
            iters_max=max(it) if it else None, ratio=ratio.estimate if ratio else None,
            best_acc_mean=mean_or_none(best), best_acc_max=max(best) if best else None,
            seconds_per_iteration=mean_or_none(_finite(r.seconds_per_iteration for r in rs)),
            iters_median=_median(it), iters_ci_low=ci.low if ci else None, iters_ci_high=ci.high if ci else None,
            iters_censored=sum(m.censored), ratio_ci_low=ratio.low if ratio else None,
            ratio_ci_high=ratio.high if ratio else None,
            ratio_paired=bool(ratio is not None and n != baseline and len(stats.seed_pairs(m.seeds, base.seeds)) >= 2),
            verdict="baseline" if n == baseline else stats.verdict(ratio).value,
            budget_runs=len(budget),
            final_acc=stats.mean_interval(_finite(r.final_accuracy for r in budget)),
            best_acc=stats.mean_interval(_finite(r.best_accuracy for r in budget)),
        ))
    for s in out:
        if s.iters_censored:
            notes.append(f"{s.format}: {s.iters_censored} of {s.runs} run(s) never reached the target; they count "
                         "at the iterations they ran (a lower bound), so its mean is a lower bound (>=) and its "
                         "interval is open above")
        if 0 < s.runs and s.iters_mean is not None and len(measured(by[s.format]).values) < 2:
            notes.append(f"{s.format}: one run, no confidence interval; run several seeds (seed=0,1,2,3,4)")
    for r in runs:
        if r.status == Status.FAILED:
            notes.append(f"failed run {r.path} (format {r.format}, seed {r.seed}): {r.error or 'no message'}")
    ests = sorted({r.estimator or ("first" if r.iterations_estimate is None else "unnamed") for r in runs
                   if r.status == Status.REACHED})
    if len(ests) > 1:
        notes.append(f"reached runs measured iterations to accuracy with different estimators ({', '.join(ests)}): "
                     "iterations are not comparable")
    elif ests and ests != ["first"]:
        notes.append(f"iterations to accuracy: the {ests[0]} crossing of the validation curve "
                     "(results.json iterations_estimate; emunum/analysis/crossing.py)")
    targets = sorted({r.target_accuracy for r in runs if r.target_accuracy is not None})
    if len(targets) > 1:
        notes.append(f"runs have different target accuracies {targets}: iterations are not comparable")
    return Report(tuple(out), baseline, tuple(notes))


def _median(xs):
    if not xs:
        return None
    v = sorted(xs)
    k = len(v) // 2
    return float(v[k]) if len(v) % 2 else (v[k - 1] + v[k]) / 2.0


# ---------------------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------------------
def fmt_num(v, spec: str = ".4g") -> str:
    return "n/a" if v is None else format(v, spec)


def render_table(header: list[str], rows: list[list[str]], how: OutputFormat, notes=(), align=None) -> str:
    """A table as aligned text, a Markdown pipe table, or CSV. Notes follow text and Markdown tables
    (CSV stays machine-readable: callers print notes elsewhere). ``align``: per column "<" or ">"."""
    how = OutputFormat.parse(how)
    align = align or ["<"] + [">"] * (len(header) - 1)
    if how == OutputFormat.CSV:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
        return buf.getvalue()
    # a cell never breaks its row: control characters become spaces (text, Markdown), and '|' is escaped
    # in Markdown; CSV quotes what it needs
    clean = lambda c: "".join(" " if ch in "\n\r\t\v\f" or ord(ch) < 32 else ch for ch in str(c))  # noqa: E731
    header, rows = [clean(h) for h in header], [[clean(c) for c in r] for r in rows]
    if how == OutputFormat.MD:
        header, rows = [h.replace("|", "\\|") for h in header], [[c.replace("|", "\\|") for c in r] for r in rows]
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join(":---" if a == "<" else "---:" for a in align) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        text = "\n".join(lines) + "\n"
        if notes:
            text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
        return text
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt_row = lambda r: "  ".join(format(c, f"{a}{w}") for c, a, w in zip(r, align, widths)).rstrip()  # noqa: E731
    lines = [fmt_row(header), "  ".join("-" * w for w in widths)] + [fmt_row(r) for r in rows]
    text = "\n".join(lines) + "\n"
    if notes:
        text += "\n" + "\n".join(f"note: {n}" for n in notes) + "\n"
    return text


def _ci(lo, hi, spec: str) -> str:
    if lo is None or hi is None:
        return "n/a"
    return f"[{format(lo, spec)}, {'inf' if math.isinf(hi) else format(hi, spec)}]"


def _iv(iv: stats.Interval | None, spec: str = ".4f") -> str:
    if iv is None:
        return "n/a"
    return f"{format(iv.estimate, spec)} {_ci(iv.low, iv.high, spec)}"


CSV_HEADER = ["format", "runs", "reached", "diverged", "failed", "censored", "iters_mean", "iters_ci_low",
              "iters_ci_high", "iters_median", "iters_std", "iters_min", "iters_max", "ratio", "ratio_ci_low",
              "ratio_ci_high", "ratio_paired", "verdict", "best_acc_mean", "best_acc_max", "budget_runs",
              "final_acc_mean", "final_acc_ci_low", "final_acc_ci_high", "budget_best_acc_mean",
              "budget_best_acc_ci_low", "budget_best_acc_ci_high", "emulation_seconds_per_iteration"]


def _csv_row(s: FormatSummary) -> list[str]:
    f, b = s.final_acc, s.best_acc
    vals = [s.iters_mean, s.iters_ci_low, s.iters_ci_high, s.iters_median, s.iters_std, s.iters_min, s.iters_max,
            s.ratio, s.ratio_ci_low, s.ratio_ci_high]
    tail = [s.best_acc_mean, s.best_acc_max, s.budget_runs, f and f.estimate, f and f.low, f and f.high,
            b and b.estimate, b and b.low, b and b.high, s.seconds_per_iteration]
    r = lambda v: "" if v is None else repr(v)  # noqa: E731
    return ([s.format, str(s.runs), str(s.reached), str(s.diverged), str(s.failed), str(s.iters_censored)]
            + [r(v) for v in vals] + [str(s.ratio_paired).lower(), s.verdict] + [r(v) for v in tail])


def render(report: Report, how="text") -> str:
    """The report table (text: human-readable; md: Markdown; csv: every field, full precision; an interval's
    open end is ``inf``)."""
    how = OutputFormat.parse(how)
    if how == OutputFormat.CSV:
        # ratio_to_<baseline>: the column name of earlier versions, kept (same value as ratio)
        header = CSV_HEADER + [f"ratio_to_{report.baseline}"]
        rows = [_csv_row(s) + ["" if s.ratio is None else repr(s.ratio)] for s in report.summaries]
        return render_table(header, rows, how)
    b = report.baseline
    header = ["format", "runs", "reached", "diverged", "failed", "iters mean [95% CI]", "median",
              f"ratio to {b} [95% CI]", "verdict", "best acc (mean / max)"]
    budget = any(s.budget_runs for s in report.summaries)
    if budget:
        header += ["fixed budget: final acc [95% CI]", "best acc [95% CI]"]
    rows = []
    for s in report.summaries:
        ge = ">= " if s.iters_censored else ""
        it = "n/a" if s.iters_mean is None else f"{ge}{s.iters_mean:.1f} {_ci(s.iters_ci_low, s.iters_ci_high, '.0f')}"
        ratio = "n/a" if s.ratio is None else f"{ge}{s.ratio:.3f} {_ci(s.ratio_ci_low, s.ratio_ci_high, '.3f')}"
        if s.ratio is not None and s.ratio_paired:
            ratio += " paired"
        acc = "n/a" if s.best_acc_mean is None else f"{s.best_acc_mean:.4f} / {s.best_acc_max:.4f}"
        row = [s.format, str(s.runs), f"{s.reached}/{s.runs}", str(s.diverged), str(s.failed), it, fmt_num(s.iters_median, ".1f"),
               ratio, s.verdict, acc]
        if budget:
            row += [_iv(s.final_acc) + f" n={s.budget_runs}" if s.final_acc else "n/a", _iv(s.best_acc)]
        rows.append(row)
    notes = [f"95% CI: expanded percentile bootstrap over seeds ({stats.RESAMPLES} resamples); ratio = mean "
             f"iterations / mean iterations of {b}; verdict: slower/faster when the ratio's CI excludes 1",
             *report.notes]
    return render_table(header, rows, how, notes)
