"""What a dataset's ``task`` means to the training loop: its loss, and the metric its target is set on.

- classification: cross-entropy on (N, classes) logits; the target is a validation accuracy
  (``target_accuracy``).
- regression: mean squared error; the target is a validation loss (``target_loss``).
- language_model: next-token cross-entropy in nats, averaged over every position of (N, T, vocab) logits;
  the target is a validation loss (``target_loss``, nats per token). With byte tokens the loss is also
  reported in bits per byte, ``loss / ln 2``.
"""
from __future__ import annotations

import math

import torch.nn.functional as F

TASKS = ("classification", "regression", "language_model")


def _check(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a task; allowed: {', '.join(TASKS)}")
    return task


def next_token_cross_entropy(logits, targets, reduction: str = "mean"):
    """Cross-entropy of (..., vocab) logits against (...) int64 targets, over every position."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


def loss_fn(task: str):
    """``fn(output, target, reduction="mean")`` for ``task``."""
    return {"classification": F.cross_entropy, "regression": F.mse_loss,
            "language_model": next_token_cross_entropy}[_check(task)]


def target_is_accuracy(task: str) -> bool:
    """True when the target is ``target_accuracy``; else it is ``target_loss``."""
    return _check(task) == "classification"


def bits_per_byte(task: str, loss: float | None) -> float | None:
    """A language model's loss (nats per byte) in bits per byte; None for other tasks or no loss."""
    if _check(task) != "language_model" or loss is None or not math.isfinite(loss):
        return None
    return loss / math.log(2.0)


def target_curve(task: str, evals: list[dict], target_accuracy: float | None, target_loss: float | None):
    """The (iteration, value) points the target is set on, the target, and whether values cross it from below
    (accuracy) or above (a loss): what ``emunum.analysis.crossing`` estimators read. Evaluations with a
    non-finite validation loss (a model that outputs NaN/inf) are left out, as the loop's own rule does."""
    ok = [e for e in evals if e["loss"] is not None and math.isfinite(e["loss"])]
    if target_is_accuracy(task):
        return [(e["iteration"], e["accuracy"]) for e in ok], target_accuracy, True
    return [(e["iteration"], e["loss"]) for e in ok], target_loss, False
