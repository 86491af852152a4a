"""Curves of a sweep read from each run's TensorBoard events (validation accuracy, training and validation
loss), aggregated over seeds per format, and plotted (``emunum report`` writes convergence.png and loss.png).

Aggregation without survivor bias: a run that stopped early (it reached the target with
``stop_at_target``, or diverged) keeps its last value at every later step of its format's curve, so the runs
that finished first do not leave the mean to the slow ones. At each step the line is the mean over the
format's runs and the band its 95% Student-t confidence interval (``stats.t_band``); a step before a
run's first value does not count that run. Non-finite values (a diverged loss) are skipped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import files, stats
from .report import Run, formats_in_order

ACCURACY_TAG = "val/accuracy"
TRAIN_LOSS_TAG = "train/loss"
VAL_LOSS_TAG = "val/loss"


def load_curve(run_dir: Path, tag: str = ACCURACY_TAG, notes: list | None = None) -> list[tuple[int, float]]:
    """(iteration, value) pairs of a TensorBoard scalar from ``<run_dir>/tensorboard``, sorted by
    iteration; the last event wins where a step was logged twice (a resumed run). [] when absent. Only
    regular event files are read (``files``): a FIFO, socket or device is skipped with a note in ``notes``,
    and a file TensorBoard cannot parse is skipped with a note too."""
    tb = Path(run_dir) / "tensorboard"
    if not tb.is_dir() or tb.is_symlink():
        return []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[int, float] = {}
    found = sorted(tb.rglob("events.out.tfevents.*"), key=lambda p: (str(p.parent), p.name))
    for path in found:
        if not files.is_regular(path) or path.is_symlink():
            if notes is not None:
                what = "a symbolic link" if path.is_symlink() else "not a regular file"
                notes.append(f"skipped {path}: {what} (only regular event files are read)")
            continue
        try:
            acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
            acc.Reload()
            scalars = acc.Scalars(tag) if tag in acc.Tags().get("scalars", []) else []
            got = [(int(e.step), float(e.value)) for e in scalars]
        except Exception as e:  # a corrupt or truncated file: TensorBoard's own errors
            if notes is not None:
                notes.append(f"skipped {path}: not a readable event file ({type(e).__name__})")
            continue
        for step, value in got:
            points[step] = value
    return sorted(points.items())


@dataclass(frozen=True)
class Band:
    """Per-format curve over seeds: at each step the mean and its 95% t-interval (low, high) over the runs
    with a value at or before that step (see the module docstring)."""

    format: str
    steps: tuple[int, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    runs: int


def curve_bands(runs: list[Run], curves: dict[Path, list[tuple[int, float]]], baseline: str | None = None
                ) -> list[Band]:
    """Aggregate the curves of each format's runs, carrying a stopped run's last value forward."""
    out = []
    for name in formats_in_order(runs, baseline):
        series = [[(s, v) for s, v in curves.get(r.path) or [] if math.isfinite(v)]
                  for r in runs if r.format == name]
        series = [c for c in series if c]
        if not series:
            continue
        steps = sorted({s for c in series for s, _ in c})
        last = [None] * len(series)  # each run's latest value at or before the current step
        pos = [0] * len(series)
        mean, low, high = [], [], []
        for step in steps:
            for k, c in enumerate(series):
                while pos[k] < len(c) and c[pos[k]][0] <= step:
                    last[k] = c[pos[k]][1]
                    pos[k] += 1
            m, lo, hi = stats.t_band([v for v in last if v is not None])
            mean.append(m)
            low.append(lo)
            high.append(hi)
        out.append(Band(name, tuple(steps), tuple(mean), tuple(low), tuple(high), len(series)))
    return out


def _figure(panels: int):
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7 * panels, 4.5), dpi=120)
    return fig, [fig.add_subplot(1, panels, k + 1) for k in range(panels)]


def _draw(ax, bands: list[Band]) -> None:
    for b in bands:
        (line,) = ax.plot(b.steps, b.mean, label=f"{b.format} ({b.runs} run{'s' if b.runs != 1 else ''})")
        ax.fill_between(b.steps, b.low, b.high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("iteration")
    ax.grid(True, alpha=0.3)


def _save(fig, path) -> Path:
    """The figure as PNG bytes, written by ``files.write_bytes`` (a new regular file; RefusedWrite where a
    link or special file is in its place)."""
    import io

    files.check_writable(path)  # before drawing: a refusal costs nothing
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return files.write_bytes(path, buf.getvalue())


def plot_convergence(bands: list[Band], path, target: float | None = None, title: str | None = None) -> Path:
    """Write validation accuracy vs iterations (mean line, 95% CI band over seeds) as a PNG (Agg)."""
    if not bands:
        raise ValueError("no validation-accuracy curves to plot (no run has tensorboard/ events with "
                         f"tag {ACCURACY_TAG!r})")
    fig, (ax,) = _figure(1)
    _draw(ax, bands)
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_ylabel("validation accuracy")
    ax.set_title(title or "Validation accuracy: mean over seeds, band = 95% CI")
    ax.legend(loc="lower right")
    return _save(fig, path)


def convergence_plot(runs: list[Run], path, baseline: str | None = None, notes: list | None = None) -> Path:
    """Load every run's validation-accuracy curve and write the convergence plot to ``path``."""
    files.check_writable(path)
    curves = {r.path: load_curve(r.path, notes=notes) for r in runs}
    targets = {r.target_accuracy for r in runs if r.target_accuracy is not None}
    return plot_convergence(curve_bands(runs, curves, baseline), path,
                            target=targets.pop() if len(targets) == 1 else None)


def loss_plot(runs: list[Run], path, baseline: str | None = None, notes: list | None = None) -> Path:
    """Training loss (left) and validation loss (right) vs iterations, log scale, mean and 95% CI band over
    seeds per format, as one PNG. ValueError when no run logged either."""
    files.check_writable(path)
    panels = []
    for tag, label in ((TRAIN_LOSS_TAG, "training loss"), (VAL_LOSS_TAG, "validation loss")):
        bands = curve_bands(runs, {r.path: load_curve(r.path, tag, notes) for r in runs}, baseline)
        if bands:
            panels.append((label, bands))
    if not panels:
        raise ValueError(f"no loss curves to plot (no run has tensorboard/ events with tag {TRAIN_LOSS_TAG!r} "
                         f"or {VAL_LOSS_TAG!r})")
    fig, axes = _figure(len(panels))
    for ax, (label, bands) in zip(axes, panels):
        _draw(ax, bands)
        if all(v > 0 for b in bands for v in b.mean):
            ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.set_title(f"{label}: mean over seeds, band = 95% CI")
        ax.legend(loc="upper right")
    return _save(fig, path)
