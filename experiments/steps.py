"""The training loop's steps: a ``Session`` (what one run works with) and the named steps that ``run`` takes
each iteration: ``next_batch``, ``train_step``, ``log_step``, ``evaluate_if_due``, ``checkpoint_if_due``,
``interrupt_if_due``; then ``finish``. The measurement rules are in ``experiments/loop.py``."""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from . import ddp, tasks
from .progress import Progress, resolve_log_mode
from .recipe import STREAM_STEP
from .results import Results, build_results, evaluate, objective, reached, settled
from .run_files import LoopState, save_checkpoint, write_json_atomic
from .schema import LogMode, Schedule

log = logging.getLogger("experiments.train")

# Divergence: a non-finite training loss, or a training loss above DIVERGENCE_FACTOR times the first iteration's
# at DIVERGENCE_EVALS evaluations in a row.
DIVERGENCE_FACTOR = 1e3
DIVERGENCE_EVALS = 3


def seed_step(seed: int, device: torch.device) -> None:
    """``torch.manual_seed(seed)`` for a step on ``device``: the CPU generator, plus CUDA's on a CUDA run. The
    same generator states as torch.manual_seed for what the step uses, without its lazy seeding of every other
    backend (cuda, xpu, mtia each format a stack trace: about 0.23 ms per call, a tenth of an fp32 step here)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    elif device.type != "cpu":
        torch.manual_seed(seed)


def lr_at(cfg, iteration: int) -> float:
    """Learning rate of the step that starts at ``iteration`` (0-based)."""
    base, warm = float(cfg.lr), int(cfg.optim.warmup_iters)
    if warm and iteration < warm:
        return base * (iteration + 1) / warm
    if Schedule(cfg.optim.schedule) == Schedule.cosine:
        progress = (iteration - warm) / max(1, int(cfg.max_iters) - warm)
        return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return base


@dataclass
class Session:
    """What one training run works with, built by ``loop.train``. ``model`` is what the steps call (a DDP
    replica under torchrun); ``tensors`` are (x_train, y_train, x_val, y_val) on the run's device."""

    cfg: Any
    run_dir: Path
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    scaler: Any
    criterion: Any
    sampler: Any
    ds: Any
    tensors: tuple
    state: LoopState
    ckpt_path: Path
    writer: Any
    tracer: Any = None
    hook: Any = None
    iteration_cost: Optional[dict] = None
    progress: Optional[Progress] = field(default=None, init=False)


@dataclass
class Stop:
    """Why the loop ended early: a status ("diverged" or "interrupted"), the reason, and a diverged step's first
    non-finite event (``emunum.nan_origin``), if replayed."""

    status: str
    reason: str
    origin: Any = None


def run(s: Session) -> Results:
    """Train until max_iters, a settled target (``stop_at_target``), divergence or ``stop_after``; then
    ``finish``."""
    d = ddp.current()
    mode = resolve_log_mode(s.cfg.log) if d.main else LogMode.quiet
    s.progress = Progress(mode, int(s.cfg.max_iters), s.state.iteration, s.cfg.format.name)
    stop, last_loss = None, float("nan")
    with contextlib.ExitStack() as stack:
        if s.progress.bar is not None:  # console log lines go through the bar instead of breaking it
            from tqdm.contrib.logging import logging_redirect_tqdm

            stack.enter_context(logging_redirect_tqdm())
        stack.callback(s.progress.close)
        it = s.state.iteration
        s.model.train()
        while it < s.cfg.max_iters and not (s.cfg.stop_at_target and settled(s.cfg, s.ds.task, s.state)):
            t0 = time.perf_counter()
            xb, yb = next_batch(s, it)
            lr = lr_at(s.cfg, it)
            last_loss, stop = train_step(s, it, xb, yb, lr)
            if stop is not None:
                break
            it += 1
            s.state.iteration = it
            s.state.train_seconds += time.perf_counter() - t0
            if s.state.first_loss is None:
                s.state.first_loss = last_loss
            log_step(s, it, last_loss, lr)
            stop = evaluate_if_due(s, it, last_loss)
            if stop is not None:
                break
            checkpoint_if_due(s, it)
            stop = interrupt_if_due(s, it)
            if stop is not None:
                break
    return finish(s, stop, last_loss)


def next_batch(s: Session, it: int):
    """Seed step ``it`` (0-based) and return this rank's slice of its global batch."""
    d = ddp.current()
    xtr, ytr = s.tensors[0], s.tensors[1]
    seed_step(ddp.step_seed(int(s.cfg.seed), STREAM_STEP, it), xtr.device)
    idx = s.sampler.indices(it)
    if d.active:  # this rank's slice of the global batch
        idx = idx.tensor_split(d.world_size)[d.rank]
    idx = idx.to(xtr.device)
    return xtr[idx], ytr[idx]


def train_step(s: Session, it: int, xb, yb, lr: float):
    """One optimizer step at learning rate ``lr``: (the ranks' mean training loss, a ``Stop`` if the step
    diverged: a non-finite loss, or non-finite gradients at the loss scaler's minimum scale)."""
    for g in s.opt.param_groups:
        g["lr"] = lr
    s.opt.zero_grad(set_to_none=True)
    loss = s.criterion(s.model(xb).float(), yb)
    device = xb.device
    last_loss = ddp.mean(loss.detach().item(), device)  # the ranks' mean: the same on every rank
    if not math.isfinite(last_loss):
        s.writer.add_scalar("train/loss", last_loss, it + 1)
        origin = _replay_for_origin(s, lambda: s.criterion(s.model(xb).float(), yb), it, device, False)
        return last_loss, Stop("diverged", f"training loss {last_loss} at iteration {it + 1}", origin)
    scaler = s.scaler
    if scaler is None:
        loss.backward()
        s.opt.step()
        return last_loss, None
    scale = scaler.scale
    scaler.scale_loss(loss).backward()
    stepped = scaler.step(s.opt)
    at_floor = scaler.scale <= scaler.min_scale
    scaler.update()
    if not stepped and at_floor:
        origin = _replay_for_origin(s, lambda: s.criterion(s.model(xb).float(), yb) * scale, it, device, True)
        return last_loss, Stop("diverged", f"non-finite gradients at the minimum loss scale (iteration {it + 1})",
                               origin)
    return last_loss, None


def _replay_for_origin(s: Session, forward, it: int, device, backward: bool):
    """Replay step ``it`` (0-based; the weights are still those it started from: the step was not taken) with
    its own seeds under ``emunum.nan_origin``'s detector; the first non-finite event, or None."""
    from emunum.nan_origin import find_nan_origin

    seed_step(ddp.step_seed(int(s.cfg.seed), STREAM_STEP, it), device)
    return find_nan_origin(getattr(s.model, "module", s.model), forward, backward=backward)


def log_step(s: Session, it: int, loss: float, lr: float) -> None:
    """TensorBoard scalars and the progress line of iteration ``it`` (1-based)."""
    s.writer.add_scalar("train/loss", loss, it)
    bpb = tasks.bits_per_byte(s.ds.task, loss)
    if bpb is not None:
        s.writer.add_scalar("train/bits_per_byte", bpb, it)
    s.writer.add_scalar("train/lr", lr, it)
    if s.scaler is not None:
        s.writer.add_scalar("train/loss_scale", s.scaler.scale, it)
    s.progress.step(it, loss)


def evaluate_if_due(s: Session, it: int, loss: float) -> Optional[Stop]:
    """Every ``eval_every`` iterations and at ``max_iters``: evaluate, and stop a run whose training loss stays
    above ``DIVERGENCE_FACTOR`` x the first iteration's for ``DIVERGENCE_EVALS`` evaluations."""
    cfg, state = s.cfg, s.state
    if not (it % cfg.eval_every == 0 or it == cfg.max_iters):
        return None
    evaluate_and_log(s, it, loss)
    far = state.first_loss is not None and state.first_loss > 0 and loss > DIVERGENCE_FACTOR * state.first_loss
    state.above = state.above + 1 if far else 0
    if state.above < DIVERGENCE_EVALS:
        return None
    return Stop("diverged", f"training loss {loss:.4g} above {DIVERGENCE_FACTOR:g} x the first iteration's "
                            f"{state.first_loss:.4g} at {DIVERGENCE_EVALS} evaluations in a row (iteration {it})")


def checkpoint_if_due(s: Session, it: int) -> None:
    if s.cfg.checkpoint_every and it % s.cfg.checkpoint_every == 0:
        save_checkpoint(s.ckpt_path, getattr(s.model, "module", s.model), s.opt, s.scaler, s.state, s.cfg, s.hook)


def interrupt_if_due(s: Session, it: int) -> Optional[Stop]:
    """``stop_after``: end the process after that iteration as a kill would."""
    cfg = s.cfg
    if cfg.stop_after is not None and cfg.stop_after <= it < cfg.max_iters:
        return Stop("interrupted", f"stop_after={cfg.stop_after}")
    return None


def evaluate_and_log(s: Session, it: int, train_loss: float) -> None:
    """Evaluate the validation set after iteration ``it``, log it, and note the first iteration at target."""
    model, ds, cfg, state, writer, progress, tracer = s.model, s.ds, s.cfg, s.state, s.writer, s.progress, s.tracer
    xva, yva = s.tensors[2], s.tensors[3]
    if tracer is not None:
        tracer.to_tensorboard(writer, it)  # the training steps since the last evaluation
    # rank 0 evaluates the (identical) replica alone, without DDP's forward; every rank gets its numbers
    ev = evaluate(getattr(model, "module", model), xva, yva, ds.task, int(cfg.data.eval_batch_size)) \
        if ddp.current().main else None
    ev = ddp.broadcast(ev)
    if tracer is not None:
        tracer.reset()  # leave the evaluation's own forward passes out of the next window
    ev["iteration"] = it
    state.evals.append(ev)
    writer.add_scalar("val/loss", ev["loss"], it)
    if ev["accuracy"] is not None:
        writer.add_scalar("val/accuracy", ev["accuracy"], it)
    bpb = tasks.bits_per_byte(ds.task, ev["loss"])
    if bpb is not None:
        writer.add_scalar("val/bits_per_byte", bpb, it)
    progress.evaluated(it, train_loss, ev)
    if state.reached_at is None and math.isfinite(ev["loss"]) and reached(ev, cfg, ds.task):
        state.reached_at = it
    writer.flush()




def finish(s: Session, stop: Optional[Stop], last_loss: float) -> Results:
    """The run's Results: a last evaluation (not of a diverged model), then results.json and the hparams
    (rank 0, unless interrupted)."""
    cfg, state, d = s.cfg, s.state, ddp.current()
    status, reason, origin = (stop.status, stop.reason, stop.origin) if stop is not None else (None, "", None)
    if status not in ("interrupted", "diverged"):  # a diverged model is not evaluated again
        if not state.evals or state.evals[-1]["iteration"] != state.iteration:
            evaluate_and_log(s, state.iteration, last_loss)
        if status is None:
            status = "reached" if state.reached_at is not None else "not_reached"
    if origin is not None:
        reason = f"{reason}; first non-finite: {origin.describe()}"
        log.warning("%s diverged; first non-finite: %s", cfg.format.name, origin.describe())
    results = build_results(cfg, s.ds, state, status, reason, s.scaler)
    results.nan_origin = origin.to_json() if origin is not None else None
    results.iteration_cost = s.iteration_cost
    if d.active:
        results.world_size = d.world_size
    if status != "interrupted" and d.main:
        metric = objective(results, cfg.max_iters)
        hparams = {"format": cfg.format.name, "model": cfg.model.name, "data": cfg.data.name,
                   "optim": cfg.optim.name, "lr": float(cfg.lr), "batch_size": int(cfg.batch_size),
                   "seed": int(cfg.seed)}
        s.writer.add_hparams(hparams, {"hparam/iterations_to_accuracy": float(metric),
                                       "hparam/best_accuracy": _nan_if_none(results.best_accuracy),
                                       "hparam/best_loss": _nan_if_none(results.best_loss)}, run_name=".")
        write_json_atomic(s.run_dir / "results.json", results.to_json())
        best = (f"best_accuracy={results.best_accuracy}" if results.best_accuracy is not None
                else f"best_loss={results.best_loss}")
        log.info("%s: %s, iterations_to_accuracy=%s, %s, %.3g ms/iteration", cfg.format.name, status,
                 results.iterations_to_accuracy, best, 1e3 * (results.seconds_per_iteration or float("nan")))
    return results


def _nan_if_none(v):
    return float("nan") if v is None else float(v)
