"""What a training run measured: its evaluations, whether and when it reached its target, and the
``Results`` written to results.json (the loop's measurement rules are in ``experiments/loop.py``)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from emunum.analysis import crossing

from . import tasks
from .run_files import LoopState, format_label

RESULT_KEYS = ("format", "status", "iterations_to_accuracy", "target_accuracy", "best_accuracy",
               "final_accuracy", "iterations_run", "seconds_per_iteration")
# The iterations-to-accuracy estimator behind results.json's iterations_estimate, chosen by measurement
# (benchmarks/RESULTS.md): interpolated and smoothed crossings gave no narrower ratio interval without moving
# the ratio away from the first crossing's.
TTA_ESTIMATOR = crossing.Estimator.FIRST


@dataclass
class Results:
    format: str
    status: str  # reached | not_reached | diverged (| interrupted: never written)
    iterations_to_accuracy: int | None
    target_accuracy: float | None
    best_accuracy: float | None
    final_accuracy: float | None
    iterations_run: int
    seconds_per_iteration: float | None
    target_loss: float | None = None
    best_loss: float | None = None
    final_loss: float | None = None
    model: str = ""
    data: str = ""
    optim: str = ""
    seed: int = 0
    skipped_steps: int = 0
    reason: str = ""
    # language models: the validation losses in bits per byte, and the corpus' sha256 digest
    best_bits_per_byte: float | None = None
    final_bits_per_byte: float | None = None
    data_sha256: str | None = None
    world_size: int | None = None  # torchrun runs only (experiments/ddp.py); absent from a single process's file
    # a diverged run's first non-finite event (emunum.nan_origin.NanOrigin.to_json), else None
    nan_origin: dict | None = None
    # iterations-to-accuracy by TTA_ESTIMATOR (named in ``estimator``): what emunum report averages
    iterations_estimate: float | None = None
    estimator: str = ""
    # the work of one fp32 iteration (experiments/iteration_cost.py), read by ``emunum tta --hardware``
    iteration_cost: dict | None = None

    def to_json(self) -> dict:
        def clean(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {k: clean(v) for k, v in asdict(self).items() if not (k == "world_size" and v is None)}


@torch.no_grad()
def evaluate(model, x, y, task: str, batch_size: int) -> dict:
    was_training = model.training
    model.eval()
    total, correct = 0.0, 0
    fn = tasks.loss_fn(task)
    for i in range(0, len(x), batch_size):
        out = model(x[i:i + batch_size])
        yb = y[i:i + batch_size]
        total += float(fn(out.float(), yb, reduction="sum"))
        if task == "classification":
            correct += int((out.argmax(dim=1) == yb).sum())
    model.train(was_training)
    n = len(x)
    per = total / (n * (1 if task == "classification" else y.shape[1]))
    return {"loss": per, "accuracy": correct / n if task == "classification" else None}


def reached(ev: dict, cfg, task: str) -> bool:
    if tasks.target_is_accuracy(task):
        return ev["accuracy"] >= cfg.target_accuracy
    return ev["loss"] <= cfg.target_loss


def objective(results: Results, max_iters: int) -> int:
    """What ``main`` returns for sweepers to minimise: iterations-to-accuracy if the target was reached,
    else ``max_iters + 1`` (not reached, diverged or interrupted)."""
    if results.status == "reached" and results.iterations_to_accuracy is not None:
        return int(results.iterations_to_accuracy)
    return int(max_iters) + 1


def _nan_if_none(v):
    return float("nan") if v is None else float(v)


def settled(cfg, task: str, state: LoopState) -> bool:
    """Reached, and no later evaluation can change TTA_ESTIMATOR's estimate (crossing.settled)."""
    if state.reached_at is None:
        return False
    pts, target, above = _curve(cfg, task, state)
    return crossing.settled(TTA_ESTIMATOR, pts, target, above=above)


def _curve(cfg, task: str, state: LoopState):
    return tasks.target_curve(task, state.evals, cfg.target_accuracy, cfg.target_loss)


def build_results(cfg, ds, state: LoopState, status, reason, scaler) -> Results:
    """results.json's record of a finished (or stopped) run."""
    # an evaluation whose validation loss is not finite is of a model that outputs NaN/inf: never the best
    accs = [e["accuracy"] for e in state.evals if e["accuracy"] is not None and math.isfinite(e["loss"])]
    losses = [e["loss"] for e in state.evals if math.isfinite(e["loss"])]
    final = state.evals[-1] if state.evals else {"accuracy": None, "loss": None}
    classification = tasks.target_is_accuracy(ds.task)
    return Results(
        format=format_label(cfg.format), status=status, iterations_to_accuracy=state.reached_at,
        target_accuracy=float(cfg.target_accuracy) if classification else None,
        best_accuracy=max(accs) if accs else None, final_accuracy=final["accuracy"],
        iterations_run=state.iteration,
        seconds_per_iteration=state.train_seconds / state.iteration if state.iteration else None,
        target_loss=None if classification else float(cfg.target_loss),
        best_loss=min(losses) if losses else None, final_loss=final["loss"],
        model=cfg.model.name, data=cfg.data.name, optim=cfg.optim.name, seed=int(cfg.seed),
        skipped_steps=scaler.skipped_steps if scaler is not None else 0, reason=reason,
        best_bits_per_byte=tasks.bits_per_byte(ds.task, min(losses) if losses else None),
        final_bits_per_byte=tasks.bits_per_byte(ds.task, final["loss"]), data_sha256=ds.sha256,
        iterations_estimate=_estimate(cfg, ds.task, state) if state.reached_at is not None else None,
        estimator=TTA_ESTIMATOR.value)


def _estimate(cfg, task: str, state: LoopState) -> float | None:
    pts, target, above = _curve(cfg, task, state)
    return crossing.estimate(TTA_ESTIMATOR, pts, target, above=above)
