"""Hydra entry point: ``python experiments/train.py format=fp8`` (from the repo root) or
``python train.py format=fp8`` (from experiments/).

``main(cfg)`` returns iterations-to-accuracy so that sweepers can minimise it: the first evaluation
iteration at which validation accuracy >= target_accuracy (regression: validation loss <= target_loss), or
``max_iters + 1`` when the target was not reached (status not_reached or diverged) or the run was stopped by
``stop_after``. The work is done by the importable ``experiments.loop.train(cfg, run_dir)``.

Several processes: ``torchrun --nproc-per-node=2 experiments/train.py model=mlp dist.comm=e5m2`` trains with
DDP; see ``experiments/ddp.py``.

A run that fails with an exception still leaves ``results.json`` (``write_failure``): every contract key
(null where unknown), ``status`` "failed", ``reason`` "<ExceptionType>: <message>", ``iterations_run`` 0,
written atomically before the exception propagates (Hydra then reports it and exits non-zero).
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

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from experiments import ddp  # noqa: E402
from experiments.loop import Results, RunDirBusy, hydra_run_dir, objective, train, write_json_atomic  # noqa: E402
from experiments.schema import register  # noqa: E402

register()
log = logging.getLogger("experiments.train")


def failure_results(cfg, exc: BaseException) -> Results:
    """The record of a failed run: the configured format, seed, target and model/data/optim names (None
    where the config lacks them), no measurements, ``status="failed"``, ``iterations_run=0`` and
    ``reason=f"{type(exc).__name__}: {exc}"``."""

    def get(key, default=None):
        try:
            v = OmegaConf.select(cfg, key, default=default)
        except Exception:  # a config too broken to read: leave the entry unknown
            return default
        return default if v is None else v

    def number(key):
        v = get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    seed = get("seed", 0)
    return Results(
        format=str(get("format.name", "")), status="failed", iterations_to_accuracy=None,
        target_accuracy=number("target_accuracy"), best_accuracy=None, final_accuracy=None, iterations_run=0,
        seconds_per_iteration=None, target_loss=number("target_loss"), model=str(get("model.name", "")),
        data=str(get("data.name", "")), optim=str(get("optim.name", "")),
        seed=int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else 0,
        reason=f"{type(exc).__name__}: {exc}")


def _finished(path: Path) -> bool:
    """Whether ``path`` holds the results of a run that ended (reached, not_reached or diverged)."""
    try:
        return json.loads(path.read_text()).get("status") in ("reached", "not_reached", "diverged")
    except (OSError, ValueError, AttributeError):
        return False


def write_failure(cfg, run_dir, exc: BaseException) -> None:
    """Write ``failure_results(cfg, exc)`` to ``<run_dir>/results.json`` atomically (run_dir None: the Hydra
    run directory), or beside it as ``results.failed.json`` when results.json already holds a finished run's
    results (a failed resume never overwrites them). Never raises: a record that cannot be written is logged,
    so that ``exc`` stays the error. Nothing is written when the directory is locked by another run."""
    if isinstance(exc, RunDirBusy):  # the directory belongs to the other run
        return
    if not ddp.from_env().main:  # under torchrun rank 0 alone writes (and its record covers the run)
        return
    try:
        path = Path(run_dir) if run_dir is not None else hydra_run_dir()
        path.mkdir(parents=True, exist_ok=True)
        target = path / ("results.failed.json" if _finished(path / "results.json") else "results.json")
        write_json_atomic(target, failure_results(cfg, exc).to_json())
    except Exception as e:  # noqa: BLE001
        log.error("could not write the failure record of this run: %s: %s", type(e).__name__, e)


def run(cfg, run_dir: str | os.PathLike | None = None) -> int:
    """``train(cfg, run_dir)`` and the objective that ``main`` returns; an exception leaves a "failed"
    results.json (``write_failure``) and then propagates."""
    try:
        results = train(cfg, run_dir)
    except Exception as e:
        write_failure(cfg, run_dir, e)
        raise
    return objective(results, cfg.max_iters)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> int:
    return run(cfg)


if __name__ == "__main__":
    sys.argv[1:] = ddp.rank_argv(sys.argv[1:])  # torchrun ranks > 0: no Hydra output directory of their own
    main()
