"""Sweep reports: ``emunum report <sweep dir>``.

A sweep directory is any tree holding run directories (Hydra's ``multirun/<date>/<time>/<job>/``, or
several single runs). A run directory is one with a ``results.json`` (written by ``experiments/train.py``)
or a Hydra ``.hydra/config.yaml`` without one (a job that died before writing its results: counted as
failed, its format read from the config); a results.json with status "failed" is a job whose exception
was recorded (its ``error`` or ``reason`` is shown). The seed is the results' ``seed`` key, else the
config's.

Per format (``summarize``): runs, reached (status "reached"), diverged, failed; iterations to accuracy over
the runs that reached the target: mean, sample standard deviation (ddof=1; None for fewer than two runs), min, max;
their mean's ratio to the baseline format's mean (``baseline``, default ``fp32``); best accuracy (mean and
max over runs of each run's best validation accuracy). The mean is over reached runs only, so read it with
the reached/total column. ``render`` writes text, Markdown or CSV. ``plot_convergence`` draws validation
accuracy against iterations for every format: the mean over seeds at each evaluation step, with a band from
the lowest to the highest seed; a run that stopped early (target reached, or diverged) stops contributing
after its last evaluation, so the mean at a step is over the runs still evaluated there.
"""
from __future__ import annotations

import csv
import enum
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path


class Status(enum.Enum):
    """A run's outcome (results.json ``status``); FAILED also covers a job without results.json."""

    REACHED = "reached"
    NOT_REACHED = "not_reached"
    DIVERGED = "diverged"
    FAILED = "failed"


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
class Run:
    """One run directory's results (None where results.json has no value)."""

    path: Path
    format: str
    status: Status
    seed: int | None = None
    iterations_to_accuracy: int | None = None
    target_accuracy: float | None = None
    best_accuracy: float | None = None
    final_accuracy: float | None = None
    iterations_run: int | None = None
    seconds_per_iteration: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class FormatSummary:
    """Per-format aggregate over runs (see module docstring). ``iters_*`` are None when no run reached."""

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


@dataclass(frozen=True)
class Report:
    summaries: tuple[FormatSummary, ...]
    baseline: str
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------
def _opt_int(d: dict, key: str, where: Path) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise ValueError(f"{where}: {key}={v!r} is not an integer")
    return int(v)


def _opt_float(d: dict, key: str, where: Path) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: {key}={v!r} is not a number")
    return float(v)


def hydra_config(run_dir: Path) -> dict | None:
    """A run's composed Hydra config (``.hydra/config.yaml``) as plain data, or None without one."""
    p = run_dir / ".hydra" / "config.yaml"
    if not p.is_file():
        return None
    import yaml

    with open(p) as f:
        return yaml.safe_load(f) or {}


def _config_format(cfg: dict | None) -> str | None:
    fmt = (cfg or {}).get("format")
    if isinstance(fmt, dict):
        return fmt.get("name")
    return fmt if isinstance(fmt, str) else None


def load_run(run_dir: Path) -> Run:
    """The ``Run`` of one run directory (results.json, else a failed run from .hydra/config.yaml)."""
    run_dir = Path(run_dir)
    cfg = hydra_config(run_dir)
    cfg_seed = (cfg or {}).get("seed")
    cfg_seed = cfg_seed if isinstance(cfg_seed, int) and not isinstance(cfg_seed, bool) else None
    res = run_dir / "results.json"
    if not res.is_file():
        fmt = _config_format(cfg)
        if fmt is None:
            raise ValueError(f"{run_dir}: no results.json, and no format name in .hydra/config.yaml")
        return Run(run_dir, fmt, Status.FAILED, seed=cfg_seed, error="no results.json (the job did not finish)")
    try:
        with open(res) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{res} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{res}: expected a JSON object, got {type(d).__name__}")
    fmt = d.get("format")
    if not isinstance(fmt, str) or not fmt:
        raise ValueError(f"{res}: format={fmt!r} must be a non-empty string")
    try:
        status = Status(d.get("status"))
    except ValueError:
        raise ValueError(f"{res}: status={d.get('status')!r} is not a status; allowed: "
                         f"{', '.join(s.value for s in Status)}") from None
    iters = _opt_int(d, "iterations_to_accuracy", res)
    if status == Status.REACHED and iters is None:
        raise ValueError(f"{res}: status 'reached' needs an integer iterations_to_accuracy, got null")
    seed = _opt_int(d, "seed", res)
    err = d.get("error") or d.get("reason") or None  # train.py's "reason" says why a run stopped
    return Run(
        path=run_dir, format=fmt, status=status, seed=seed if seed is not None else cfg_seed,
        iterations_to_accuracy=iters if status == Status.REACHED else None,
        target_accuracy=_opt_float(d, "target_accuracy", res), best_accuracy=_opt_float(d, "best_accuracy", res),
        final_accuracy=_opt_float(d, "final_accuracy", res), iterations_run=_opt_int(d, "iterations_run", res),
        seconds_per_iteration=_opt_float(d, "seconds_per_iteration", res),
        error=str(err) if err is not None else None,
    )


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """Directories under ``sweep_dir`` (itself included) holding results.json or .hydra/config.yaml,
    sorted by path with numeric job numbers in numeric order."""
    sweep_dir = Path(sweep_dir)
    found = {p.parent for p in sweep_dir.rglob("results.json")}
    found |= {p.parent.parent for p in sweep_dir.rglob(".hydra/config.yaml")}
    # a sweep dir's own .hydra (hydra writes multirun.yaml there, not config.yaml) is not a run

    def key(p: Path):
        return [(0, int(s), "") if s.isdigit() else (1, 0, s) for s in p.relative_to(sweep_dir).parts]

    return sorted(found, key=key)


def load_sweep(sweep_dir) -> list[Run]:
    """Every run under ``sweep_dir``; ValueError when the directory is missing or holds no runs."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ValueError(f"sweep directory {str(sweep_dir)!r} does not exist or is not a directory")
    dirs = find_run_dirs(sweep_dir)
    if not dirs:
        raise ValueError(f"sweep directory {str(sweep_dir)!r} holds no runs (no results.json nor .hydra/config.yaml "
                         "below it); pass the directory printed by `python experiments/train.py -m ...`")
    return [load_run(d) for d in dirs]


# ---------------------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------------------
def _mean(xs):
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


def summarize(runs: list[Run], baseline: str = "fp32") -> Report:
    """Per-format summaries and notes (missing baseline, baseline that never reached, failed runs)."""
    if not isinstance(baseline, str) or not baseline:
        raise ValueError(f"baseline={baseline!r} must be a format name")
    notes = []
    names = formats_in_order(runs, baseline)
    by = {n: [r for r in runs if r.format == n] for n in names}

    def iters(rs):
        return [r.iterations_to_accuracy for r in rs if r.status == Status.REACHED]

    base_mean = None
    if baseline not in by:
        notes.append(f"baseline {baseline!r} is not in the sweep (formats: {', '.join(names)}): no ratios; "
                     "pass --baseline NAME, or add the baseline to the sweep")
    else:
        base_mean = _mean(iters(by[baseline]))
        if base_mean is None:
            notes.append(f"baseline {baseline!r} never reached the target in {len(by[baseline])} run(s): no ratios")
    out = []
    for n in names:
        rs = by[n]
        it = iters(rs)
        best = [r.best_accuracy for r in rs if r.best_accuracy is not None and math.isfinite(r.best_accuracy)]
        spi = [r.seconds_per_iteration for r in rs if r.seconds_per_iteration is not None]
        mean = _mean(it)
        out.append(FormatSummary(
            format=n, runs=len(rs), reached=len(it),
            diverged=sum(r.status == Status.DIVERGED for r in rs), failed=sum(r.status == Status.FAILED for r in rs),
            iters_mean=mean, iters_std=_std(it), iters_min=min(it) if it else None, iters_max=max(it) if it else None,
            ratio=mean / base_mean if mean is not None and base_mean else None,
            best_acc_mean=_mean(best), best_acc_max=max(best) if best else None, seconds_per_iteration=_mean(spi),
        ))
    for r in runs:
        if r.status == Status.FAILED:
            notes.append(f"failed run {r.path} (format {r.format}, seed {r.seed}): {r.error or 'no message'}")
    targets = sorted({r.target_accuracy for r in runs if r.target_accuracy is not None})
    if len(targets) > 1:
        notes.append(f"runs have different target accuracies {targets}: iterations are not comparable")
    return Report(tuple(out), baseline, tuple(notes))


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
    if how == OutputFormat.MD:
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


def render(report: Report, how="text") -> str:
    """The report table (text: human-readable; md: Markdown; csv: every field, full precision)."""
    how = OutputFormat.parse(how)
    if how == OutputFormat.CSV:
        header = ["format", "runs", "reached", "diverged", "failed", "iters_mean", "iters_std", "iters_min",
                  "iters_max", f"ratio_to_{report.baseline}", "best_acc_mean", "best_acc_max",
                  "emulation_seconds_per_iteration"]
        rows = [[s.format, s.runs, s.reached, s.diverged, s.failed] + ["" if v is None else repr(v) for v in (
            s.iters_mean, s.iters_std, s.iters_min, s.iters_max, s.ratio, s.best_acc_mean, s.best_acc_max,
            s.seconds_per_iteration)] for s in report.summaries]
        return render_table(header, [[str(c) for c in r] for r in rows], how)
    header = ["format", "runs", "reached", "diverged", "failed", "iters to acc (mean ± std)",
              f"ratio to {report.baseline}", "best acc (mean / max)"]
    rows = []
    for s in report.summaries:
        it = "n/a" if s.iters_mean is None else f"{s.iters_mean:.1f}" + (
            f" ± {s.iters_std:.1f}" if s.iters_std is not None else "")
        ratio = "n/a" if s.ratio is None else f"{s.ratio:.3f}"
        acc = "n/a" if s.best_acc_mean is None else f"{s.best_acc_mean:.4f} / {s.best_acc_max:.4f}"
        rows.append([s.format, str(s.runs), f"{s.reached}/{s.runs}", str(s.diverged), str(s.failed), it, ratio, acc])
    return render_table(header, rows, how, report.notes)


# ---------------------------------------------------------------------------------------------------------
# curves and plot
# ---------------------------------------------------------------------------------------------------------
ACCURACY_TAG = "val/accuracy"


def load_curve(run_dir: Path, tag: str = ACCURACY_TAG) -> list[tuple[int, float]]:
    """(iteration, value) pairs of a TensorBoard scalar from ``<run_dir>/tensorboard``, sorted by
    iteration; the last event wins where a step was logged twice (a resumed run). [] when absent."""
    tb = Path(run_dir) / "tensorboard"
    if not tb.is_dir():
        return []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[int, float] = {}
    for events_dir in sorted({p.parent for p in tb.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            for e in acc.Scalars(tag):
                points[int(e.step)] = float(e.value)
    return sorted(points.items())


@dataclass(frozen=True)
class Band:
    """Per-format curve over seeds: at each step, the mean, min and max over the runs evaluated there."""

    format: str
    steps: tuple[int, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    runs: int


def curve_bands(runs: list[Run], curves: dict[Path, list[tuple[int, float]]], baseline: str | None = None
                ) -> list[Band]:
    """Aggregate the curves of each format's runs (non-finite values are skipped)."""
    out = []
    for name in formats_in_order(runs, baseline):
        per_step: dict[int, list[float]] = {}
        n = 0
        for r in runs:
            if r.format != name or not curves.get(r.path):
                continue
            n += 1
            for step, v in curves[r.path]:
                if math.isfinite(v):
                    per_step.setdefault(step, []).append(v)
        if not per_step:
            continue
        steps = sorted(per_step)
        out.append(Band(name, tuple(steps), tuple(_mean(per_step[s]) for s in steps),
                        tuple(min(per_step[s]) for s in steps), tuple(max(per_step[s]) for s in steps), n))
    return out


def plot_convergence(bands: list[Band], path, target: float | None = None, title: str | None = None) -> Path:
    """Write validation accuracy vs iterations (mean line, min-max band over seeds) as a PNG (Agg)."""
    if not bands:
        raise ValueError("no validation-accuracy curves to plot (no run has tensorboard/ events with "
                         f"tag {ACCURACY_TAG!r})")
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=120)
    ax = fig.add_subplot()
    for b in bands:
        (line,) = ax.plot(b.steps, b.mean, label=f"{b.format} ({b.runs} run{'s' if b.runs != 1 else ''})")
        ax.fill_between(b.steps, b.low, b.high, color=line.get_color(), alpha=0.2, linewidth=0)
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation accuracy")
    ax.set_title(title or "Validation accuracy: mean over seeds, band = min..max")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def convergence_plot(runs: list[Run], path, baseline: str | None = None) -> Path:
    """Load every run's validation-accuracy curve and write the convergence plot to ``path``."""
    curves = {r.path: load_curve(r.path) for r in runs}
    targets = {r.target_accuracy for r in runs if r.target_accuracy is not None}
    return plot_convergence(curve_bands(runs, curves, baseline), path,
                            target=targets.pop() if len(targets) == 1 else None)
