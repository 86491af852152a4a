"""Divide-and-conquer time-to-accuracy: ``emunum tta``.

Emulation measures the iterations a format needs to reach the target (``emunum.report``); a simulator (or
the first-order roofline of ``emunum.flops``) gives the time of one iteration on the target hardware. Per
format, with the baseline format b (default fp32):

- ``TTA = iters * t_iter`` (iters: mean iterations to accuracy over the runs that reached the target);
- throughput gain ``t_iter(b) / t_iter(fmt)`` (> 1: faster iterations);
- statistical-efficiency loss ``iters(fmt) / iters(b)`` (> 1: more iterations needed);
- speed-up ``TTA(b) / TTA(fmt)`` = throughput gain / statistical-efficiency loss.

Per-iteration times come from ``--seconds-per-iteration NAME=SECONDS ...``, a simulator file (``--sim``:
YAML or CSV, see ``load_sim``), or ``--hardware`` (roofline from FLOP counts, see ``emunum.flops``).
A format without a time, or that never reached the target, gets n/a and a note; so do the ratios when the
baseline has neither.

Confidence intervals carry through from the report (``emunum.analysis.stats``): the seconds per iteration
are taken as exact (a simulator's or roofline's figure, not a sample), so TTA's 95% interval is the
iterations' interval times ``t_iter``, the statistical-efficiency loss's is the ratio's (paired by seed), and
the speed-up's is ``throughput gain / loss`` at the loss interval's two ends. Censored runs (never reached)
make TTA a lower bound and its interval open above, as for the iterations.
"""
from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import files
from .report import FormatSummary, OutputFormat, Run, fmt_num, render_table


@dataclass(frozen=True)
class TTARow:
    format: str
    runs: int
    reached: int
    iterations: float | None  # mean iterations to accuracy over reached runs
    seconds_per_iteration: float | None
    tta_seconds: float | None
    throughput_gain: float | None  # t_iter(baseline) / t_iter(format)
    stat_efficiency_loss: float | None  # iters(format) / iters(baseline)
    speedup: float | None  # TTA(baseline) / TTA(format)
    source: str = ""  # where t_iter came from (e.g. "sim", "roofline: memory-bound, 8-bit")
    tta_ci_low: float | None = None
    tta_ci_high: float | None = None
    loss_ci_low: float | None = None  # the stat. eff. loss's (the iteration ratio's) 95% interval
    loss_ci_high: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    verdict: str = ""  # the report's iteration verdict (slower / faster / not distinguishable)
    censored: int = 0  # runs that never reached: iterations and TTA are lower bounds


@dataclass(frozen=True)
class TTAReport:
    rows: tuple[TTARow, ...]
    baseline: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def _seconds(value, what: str) -> float:
    """A positive finite number of seconds, from a number or a string; ValueError naming ``what``."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not a number of seconds")
    try:
        s = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what}: {str(value)[:60]!r} is not a number of seconds") from None
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"{what}: {value!r} must be a positive finite number of seconds")
    return s


def _add(times: dict, name, seconds, where: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: format name {name!r} must be a non-empty string")
    name = name.strip()
    if name in times:
        raise ValueError(f"{where}: format {name!r} is given twice")
    times[name] = _seconds(seconds, f"{where}: seconds per iteration of {name!r}")


def parse_pairs(pairs: list[str]) -> dict[str, float]:
    """``["fp32=0.031", "fp8=0.012"]`` -> ``{"fp32": 0.031, "fp8": 0.012}``; ValueError naming a bad pair."""
    times: dict[str, float] = {}
    for p in pairs:
        if not isinstance(p, str) or p.count("=") != 1:
            raise ValueError(f"--seconds-per-iteration: {p!r} is not NAME=SECONDS (e.g. fp8=0.012)")
        name, value = p.split("=")
        if not name.strip():
            raise ValueError(f"--seconds-per-iteration: {p!r} has no format name before '='")
        _add(times, name, value.strip(), f"--seconds-per-iteration {p!r}")
    return times


def load_sim(path) -> dict[str, float]:
    """Seconds per iteration per format from a simulator results file (``_load_sim``); every error, absurd
    content included (deep nesting, huge numbers, a FIFO), is a ValueError naming the file."""
    try:
        return _load_sim(path)
    except (ValueError, RecursionError, OverflowError, MemoryError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if str(path) in msg:
            raise ValueError(msg) from None
        raise ValueError(f"--sim {str(path)!r}: {type(e).__name__}: {msg[:200]}") from None


def _load_sim(path) -> dict[str, float]:
    """Seconds per iteration per format from a simulator results file.

    - ``.yaml``/``.yml``: a mapping ``{fp32: 0.031, fp8: 0.012}``, the same under a top-level
      ``seconds_per_iteration:`` key, or a list of ``{format: NAME, seconds_per_iteration: S}`` records;
    - ``.csv``: a header row with ``format`` and ``seconds_per_iteration`` columns (others are ignored).
    """
    path = Path(path)
    if not os.path.lexists(path):
        raise ValueError(f"--sim {str(path)!r}: no such file")
    text = files.read_text(path)
    times: dict[str, float] = {}
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"--sim {str(path)!r} is not valid YAML: {e}") from None
        if isinstance(d, dict) and set(d) == {"seconds_per_iteration"}:
            d = d["seconds_per_iteration"]
        if isinstance(d, dict):
            for k, v in d.items():
                _add(times, k, v, f"--sim {path}")
        elif isinstance(d, list):
            for i, rec in enumerate(d):
                if not isinstance(rec, dict) or "format" not in rec or "seconds_per_iteration" not in rec:
                    raise ValueError(f"--sim {path}: record {i} ({rec!r}) needs keys format and seconds_per_iteration")
                _add(times, rec["format"], rec["seconds_per_iteration"], f"--sim {path} record {i}")
        else:
            raise ValueError(f"--sim {path}: expected a mapping format -> seconds or a list of records, got {d!r}")
    elif suffix == ".csv":
        with io.StringIO(text, newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            for c in ("format", "seconds_per_iteration"):
                if c not in cols:
                    raise ValueError(f"--sim {path}: no {c!r} column (columns: {cols}); allowed header: "
                                     "format,seconds_per_iteration[,...]")
            for i, rec in enumerate(reader, start=2):
                _add(times, rec["format"], rec["seconds_per_iteration"], f"--sim {path} line {i}")
    else:
        raise ValueError(f"--sim {str(path)!r}: unknown file type {suffix!r}; allowed: .yaml, .yml, .csv")
    if not times:
        raise ValueError(f"--sim {path}: no formats in the file")
    return times


def check_known(times: dict[str, float], formats: list[str], where: str) -> None:
    """ValueError naming the first format of ``times`` that is not in the sweep."""
    for name in times:
        if name not in formats:
            raise ValueError(f"{where}: format {name!r} is not in the sweep; the sweep's formats: {', '.join(formats)}")


def combine(summaries: tuple[FormatSummary, ...] | list[FormatSummary], times: dict[str, float],
            baseline: str = "fp32", sources: dict[str, str] | None = None) -> TTAReport:
    """The TTA table from per-format iteration summaries and seconds per iteration (module docstring)."""
    sources = sources or {}
    names = [s.format for s in summaries]
    notes = []
    by = {s.format: s for s in summaries}
    base = by.get(baseline)
    if base is None:
        notes.append(f"baseline {baseline!r} is not in the sweep (formats: {', '.join(names)}): no speed-ups; "
                     "pass --baseline NAME")
    b_iters = base.iters_mean if base else None
    b_t = times.get(baseline)
    if base is not None and b_iters is None:
        notes.append(f"baseline {baseline!r} never reached the target: no statistical-efficiency loss or speed-up")
    if base is not None and b_t is None:
        notes.append(f"no seconds per iteration for the baseline {baseline!r}: no throughput gain or speed-up")
    rows = []
    for s in summaries:
        t = times.get(s.format)
        if t is None and s.format != baseline:
            notes.append(f"no seconds per iteration for {s.format!r}: its TTA is n/a")
        if s.iters_mean is None and s.format != baseline:
            notes.append(f"{s.format!r} never reached the target in {s.runs} run(s): its TTA is n/a")
        tta = s.iters_mean * t if s.iters_mean is not None and t is not None else None
        gain = b_t / t if b_t is not None and t is not None else None
        loss = s.iters_mean / b_iters if s.iters_mean is not None and b_iters else None
        if loss is not None and s.ratio is not None:
            loss = s.ratio  # the report's ratio (paired by seed where it could be)
        b_tta = b_iters * b_t if b_iters is not None and b_t is not None else None
        speedup = b_tta / tta if b_tta is not None and tta else None
        if speedup is not None and loss is not None and gain is not None:
            speedup = gain / loss
        lo, hi = (s.ratio_ci_low, s.ratio_ci_high) if loss is not None else (None, None)
        rows.append(TTARow(
            s.format, s.runs, s.reached, s.iters_mean, t, tta, gain, loss, speedup, sources.get(s.format, ""),
            tta_ci_low=_times(s.iters_ci_low, t), tta_ci_high=_times(s.iters_ci_high, t),
            loss_ci_low=lo, loss_ci_high=hi,
            speedup_ci_low=_div(gain, hi) if speedup is not None else None,
            speedup_ci_high=_div(gain, lo) if speedup is not None else None,
            verdict=s.verdict if s.format != baseline and loss is not None else "",
            censored=s.iters_censored))
    return TTAReport(tuple(rows), baseline, tuple(notes))


def _times(v, t):
    return None if v is None or t is None else v * t


def _div(a, b):
    """a / b for the speed-up's interval ends: b = inf gives 0, b = 0 gives inf."""
    if a is None or b is None:
        return None
    if math.isinf(b):
        return 0.0
    return math.inf if b == 0 else a / b


def _ci(lo, hi, spec=".3g") -> str:
    if lo is None or hi is None:
        return ""
    return f" [{format(lo, spec)}, {'inf' if math.isinf(hi) else format(hi, spec)}]"


def render(report: TTAReport, how="text") -> str:
    """The TTA table as text, Markdown or CSV (CSV: every field at full precision)."""
    how = OutputFormat.parse(how)
    if how == OutputFormat.CSV:
        header = ["format", "runs", "reached", "iterations", "seconds_per_iteration", "tta_seconds",
                  "throughput_gain", "stat_efficiency_loss", "speedup", "source", "censored", "tta_ci_low",
                  "tta_ci_high", "stat_efficiency_loss_ci_low", "stat_efficiency_loss_ci_high", "speedup_ci_low",
                  "speedup_ci_high", "verdict"]
        rows = [[r.format, str(r.runs), str(r.reached)] + ["" if v is None else repr(v) for v in (
            r.iterations, r.seconds_per_iteration, r.tta_seconds, r.throughput_gain, r.stat_efficiency_loss,
            r.speedup)] + [r.source, str(r.censored)] + ["" if v is None else repr(v) for v in (
            r.tta_ci_low, r.tta_ci_high, r.loss_ci_low, r.loss_ci_high, r.speedup_ci_low, r.speedup_ci_high)]
            + [r.verdict] for r in report.rows]
        return render_table(header, rows, how)
    b = report.baseline
    header = ["format", "reached", "iters (mean)", "s/iter", "TTA (s)", "throughput gain", "stat. eff. loss",
              f"speed-up vs {b}"]
    rows = []
    for r in report.rows:
        x = lambda v: "n/a" if v is None else f"{v:.3f}x"  # noqa: E731
        ge = ">= " if r.censored and r.iterations is not None else ""
        le = "<= " if r.censored and r.speedup is not None else ""
        rows.append([r.format, f"{r.reached}/{r.runs}", ge + fmt_num(r.iterations, ".1f"),
                     fmt_num(r.seconds_per_iteration, ".4g"),
                     (ge if r.tta_seconds is not None else "") + fmt_num(r.tta_seconds, ".4g")
                     + _ci(r.tta_ci_low, r.tta_ci_high, ".4g"), x(r.throughput_gain),
                     (ge if r.stat_efficiency_loss is not None else "") + x(r.stat_efficiency_loss)
                     + _ci(r.loss_ci_low, r.loss_ci_high),
                     le + x(r.speedup) + _ci(r.speedup_ci_low, r.speedup_ci_high)])
    align = ["<"] + [">"] * (len(header) - 1)
    if any(r.source for r in report.rows):
        header.append("s/iter source")
        align.append("<")
        for row, r in zip(rows, report.rows):
            row.append(r.source)
    notes = [f"TTA = iters x s/iter; throughput gain = s/iter({b}) / s/iter; stat. eff. loss = iters / iters({b}); "
             f"speed-up = TTA({b}) / TTA = throughput gain / stat. eff. loss; [a, b]: 95% CI over seeds "
             "(s/iter taken as exact)", *report.notes]
    return render_table(header, rows, how, notes, align)


# ---------------------------------------------------------------------------------------------------------
# roofline times for a sweep (first-order; see emunum.flops)
# ---------------------------------------------------------------------------------------------------------
def format_bits(cfg: dict) -> int:
    """Bit width of a run's numerics recipe: ``format.fmt`` (an emunum format name; null means fp32)."""
    from ..formats import get_format

    fmt = (cfg.get("format") or {}).get("fmt") if isinstance(cfg.get("format"), dict) else None
    return 32 if fmt is None else get_format(fmt).bits


def iteration_cost_of_run(run: Run):
    """``emunum.analysis.flops.IterationCost`` of one training iteration of a run's model: the count the training
    harness wrote into results.json (``iteration_cost``: the plain fp32 model, the run's batch size). A result
    folder is data: nothing in it is imported or run. ValueError when the run has no count."""
    from .flops import IterationCost

    if run.iteration_cost is None:
        raise ValueError(f"{run.path}: results.json has no iteration_cost (the training harness writes it; runs "
                         "from before it did need rerunning), so --hardware cannot count its iteration; give "
                         "--seconds-per-iteration or --sim instead")
    return IterationCost(**run.iteration_cost)


def roofline_times(runs: list[Run], hardware) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Roofline seconds per iteration per format, from the ``iteration_cost`` of the format's first run that
    has one (ValueError naming a run when no run of a format has one). Returns (times, sources, notes)."""
    from .report import hydra_config

    times, sources, notes, costs = {}, {}, [], {}
    for run in runs:
        if run.format in times or run.iteration_cost is None:
            continue
        cfg = hydra_config(run.path)
        if cfg is None:
            notes.append(f"{run.path}: no .hydra/config.yaml; no roofline time for {run.format!r}")
            continue
        cost = iteration_cost_of_run(run)
        costs[cost] = None
        bits = format_bits(cfg)
        r = hardware.roofline(cost, bits)
        times[run.format] = r.seconds
        sources[run.format] = f"roofline {hardware.name}: {r.bound}-bound, {r.width}-bit"
    for fmt in dict.fromkeys(r.format for r in runs):
        if fmt not in times and all(r.iteration_cost is None for r in runs if r.format == fmt):
            iteration_cost_of_run(next(r for r in runs if r.format == fmt))  # raises, naming the run
    for cost in costs:
        notes.append(f"per iteration: {cost.flops:.4g} FLOPs (FlopCounterMode), {cost.param_elements} parameters, "
                     f"{cost.activation_elements} activation elements, {cost.input_elements} input elements; "
                     "first-order roofline max(FLOPs/peak, bytes/bandwidth), not a simulator")
    return times, sources, notes
