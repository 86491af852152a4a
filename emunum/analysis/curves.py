"""Convergence curves of a sweep: validation accuracy read from each run's TensorBoard events, the mean and
band over seeds per format, and the plot (``emunum report`` writes it as convergence.png)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .report import Run, formats_in_order, mean_or_none

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
        out.append(Band(name, tuple(steps), tuple(mean_or_none(per_step[s]) for s in steps),
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
