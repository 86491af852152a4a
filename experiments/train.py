"""Hydra entry point: ``python experiments/train.py format=fp8`` (from the repo root) or
``python train.py format=fp8`` (from experiments/).

``main(cfg)`` returns iterations-to-accuracy so that sweepers can minimise it: the first evaluation
iteration at which validation accuracy >= target_accuracy (regression: validation loss <= target_loss), or
``max_iters + 1`` when the target was not reached (status not_reached or diverged) or the run was stopped by
``stop_after``. The work is done by the importable ``experiments.loop.train(cfg, run_dir)``.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: sys.path[0] is experiments/, whose module names (data, models, ...) would shadow
    # other packages. Import this folder as the package `experiments` from the repository root instead.
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from experiments.loop import objective, train  # noqa: E402
from experiments.schema import register  # noqa: E402

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> int:
    return objective(train(cfg), cfg.max_iters)


if __name__ == "__main__":
    main()
