"""Progress reporting of a training run: a tqdm bar (``log=progress``) or log lines (``quiet``)."""
from __future__ import annotations

import logging
import os
import sys

from .schema import LogMode

log = logging.getLogger("experiments.train")


def resolve_log_mode(mode) -> LogMode:
    mode = LogMode(mode) if not isinstance(mode, LogMode) else mode
    if mode != LogMode.auto:
        return mode
    ci = os.environ.get("CI", "").lower() not in ("", "0", "false")
    return LogMode.progress if sys.stderr.isatty() and not ci else LogMode.quiet



class Progress:
    """A tqdm bar with live loss/accuracy (``log=progress``), or log lines at evaluations (``quiet``)."""

    def __init__(self, mode: LogMode, total: int, initial: int, name: str):
        self.bar = None
        if mode == LogMode.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=name, dynamic_ncols=True, leave=True)
        self.postfix: dict = {}

    def step(self, iteration: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if iteration % 10 == 0:
                self.postfix["loss"] = f"{loss:.4f}"
                self.bar.set_postfix(self.postfix, refresh=False)

    def evaluated(self, iteration: int, train_loss: float, ev: dict) -> None:
        acc = ev["accuracy"]
        if self.bar is not None:
            self.postfix["val_loss"] = f"{ev['loss']:.4f}"
            if acc is not None:
                self.postfix["val_acc"] = f"{acc:.4f}"
            self.bar.set_postfix(self.postfix)
        log.info("iter %d  train_loss %.4f  val_loss %.4f%s", iteration, train_loss, ev["loss"],
                 f"  val_acc {acc:.4f}" if acc is not None else "")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
