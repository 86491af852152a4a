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
def _opt_int(d: dict, key: str, where: Path, signed: bool = False) -> int | None:
    """d[key] as an int (None when absent or null): a finite whole number, not negative unless ``signed``."""
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise ValueError(f"{where}: {key}={v!r} is not an integer")
    if v < 0 and not signed:
        raise ValueError(f"{where}: {key}={v!r} is negative")
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

    try:
        with open(p, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{p} is not a readable YAML config ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: expected a mapping, got {type(cfg).__name__}")
    return cfg


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
        with open(res, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{res} is not valid JSON ({type(e).__name__}: {e})") from None
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
    seed = _opt_int(d, "seed", res, signed=True)
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
    return label_by_config([load_run(d) for d in dirs])


# config keys that never split a format's runs: the seed (pooled on purpose) and keys that change no numbers
POOLED_KEYS = ("seed", "threads", "trace", "checkpoint_every", "resume", "stop_after", "log", "device",
               "data.cache_dir")


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = json.dumps(v, sort_keys=True, default=str)
    return out


def label_by_config(runs: list[Run]) -> list[Run]:
    """Runs of one format whose Hydra configs differ in any key besides ``POOLED_KEYS`` are not pooled: each
    gets the label ``<format> [key=value, ...]`` naming the keys that differ within its format."""
    import dataclasses

    flat = {r.path: _flat(hydra_config(r.path)) for r in runs}
    out = []
    for fmt in dict.fromkeys(r.format for r in runs):
        group = [r for r in runs if r.format == fmt]
        keys = sorted({k for r in group for k in flat[r.path]} - {k for k in POOLED_KEYS})
        differ = [k for k in keys if len({flat[r.path].get(k) for r in group}) > 1]
        for r in group:
            if differ:
                tag = ", ".join(f"{k}={json.loads(flat[r.path][k]) if k in flat[r.path] else None}" for k in differ)
                r = dataclasses.replace(r, format=f"{fmt} [{tag}]")
            out.append(r)
    order = {r.path: i for i, r in enumerate(runs)}
    return sorted(out, key=lambda r: order[r.path])


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
        base_mean = mean_or_none(iters(by[baseline]))
        if base_mean is None:
            notes.append(f"baseline {baseline!r} never reached the target in {len(by[baseline])} run(s): no ratios")
    out = []
    for n in names:
        rs = by[n]
        it = iters(rs)
        best = [r.best_accuracy for r in rs if r.best_accuracy is not None and math.isfinite(r.best_accuracy)]
        spi = [r.seconds_per_iteration for r in rs if r.seconds_per_iteration is not None]
        mean = mean_or_none(it)
        out.append(FormatSummary(
            format=n, runs=len(rs), reached=len(it),
            diverged=sum(r.status == Status.DIVERGED for r in rs), failed=sum(r.status == Status.FAILED for r in rs),
            iters_mean=mean, iters_std=_std(it), iters_min=min(it) if it else None, iters_max=max(it) if it else None,
            ratio=mean / base_mean if mean is not None and base_mean else None,
            best_acc_mean=mean_or_none(best), best_acc_max=max(best) if best else None, seconds_per_iteration=mean_or_none(spi),
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
