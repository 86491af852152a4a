"""Plot training curves from run directories' TensorBoard events into one PNG.

    python experiments/plot.py outputs/fp32/<run> outputs/fp8/<run> -o docs/curves.png

Left: training loss (exponential moving average, ``--smooth``) per iteration. Right: validation accuracy
per evaluation, with the target as a dashed line and each run's iterations-to-accuracy marked. Runs are
labelled by results.json's ``format`` (or the directory name).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = run_dir / "tensorboard"
    if not tb.is_dir():
        raise ValueError(f"{run_dir} has no tensorboard/ directory; allowed: a run directory of experiments/train.py")
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def ema(values: list[float], alpha: float) -> list[float]:
    out, m = [], None
    for v in values:
        m = v if m is None else alpha * m + (1 - alpha) * v
        out.append(m)
    return out


def plot(run_dirs: list[Path], out: Path, smooth: float = 0.9, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    target = None
    for run in run_dirs:
        run = Path(run)
        s = read_scalars(run)
        res_path = run / "results.json"
        res = json.loads(res_path.read_text()) if res_path.exists() else {}
        label = res.get("format", run.name)
        if res.get("status"):
            ita = res.get("iterations_to_accuracy")
            label += f" ({res['status']}" + (f" at {ita})" if ita is not None else ")")
        target = res.get("target_accuracy", target)
        if "train/loss" in s:
            steps, vals = zip(*s["train/loss"])
            (line,) = ax_loss.plot(steps, ema(list(vals), smooth), label=label, lw=1.2)
            color = line.get_color()
        else:
            color = None
        if "val/accuracy" in s:
            steps, vals = zip(*s["val/accuracy"])
            ax_acc.plot(steps, vals, marker=".", label=label, color=color, lw=1.2)
            if res.get("iterations_to_accuracy") is not None:
                ax_acc.axvline(res["iterations_to_accuracy"], color=color, ls=":", lw=1)
    if target is not None:
        ax_acc.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
    ax_loss.set(xlabel="iteration", ylabel=f"training loss (EMA {smooth:g})", yscale="log")
    ax_acc.set(xlabel="iteration", ylabel="validation accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (each with tensorboard/ and results.json)")
    p.add_argument("-o", "--out", type=Path, default=Path("docs/curves.png"))
    p.add_argument("--smooth", type=float, default=0.9, help="EMA factor for the training loss (0: none)")
    p.add_argument("--title", default=None)
    a = p.parse_args(argv)
    if not 0.0 <= a.smooth < 1.0:
        p.error(f"--smooth={a.smooth} is out of range; allowed: 0 <= smooth < 1")
    print(plot(a.runs, a.out, a.smooth, a.title))


if __name__ == "__main__":
    main()
