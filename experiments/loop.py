"""The training loop behind ``experiments/train.py``: ``train(cfg, run_dir) -> Results``.

Measurement. Iterations are counted from 1 (``iteration`` = optimizer steps taken). Every ``eval_every``
iterations (and at ``max_iters``) the whole validation set is evaluated; iterations-to-accuracy is the first
such iteration whose validation accuracy is >= ``target_accuracy`` (regression and language-model data:
whose validation loss is <= ``target_loss``; see ``experiments/tasks.py``). ``iterations_estimate`` is
``TTA_ESTIMATOR``'s reading of the same evaluations (``emunum.analysis.crossing``), named in ``estimator``; it
is what ``emunum report`` averages. The estimators measured against each other (benchmarks/RESULTS.md,
"estimator chosen by measurement") left "first": the same figure. With ``stop_at_target`` the run ends once
that estimate is settled (for "first", at the first evaluation at the target; a smoothed estimator needs a few
evaluations more).

Outcomes (``status``): "reached"; "not_reached" (max_iters without reaching the target); "diverged" (a
NaN/inf training loss; a training loss above ``DIVERGENCE_FACTOR`` (1e3) times the first iteration's at
``DIVERGENCE_EVALS`` (3) evaluations in a row; or a dynamic loss scaler that still sees non-finite gradients at
its minimum scale; a diverged model is not evaluated again, and evaluations of a NaN/inf-loss model never count
as the best accuracy):
the run stops, and its logs, TensorBoard events and results.json are kept. ``stop_after`` ends the process
after that iteration as a kill would (no results.json; resume from the last checkpoint).

Determinism. Everything random is a function of (cfg.seed, purpose, iteration): the initial weights, each
epoch's batch order, the OptimLP stochastic-rounding seeds (from its step counter) and, because torch's
default generator is reseeded with ``derive_seed(seed, STREAM_STEP, iteration)`` before every step, every
seed an emulated layer draws. A checkpoint (model, optimizer, scaler, loop state, RNG states) therefore lets
``resume=true`` reproduce an uninterrupted run bit for bit.

Under torchrun (``experiments/ddp.py``) the model is a DDP replica per rank; the step seed also takes the rank,
each rank trains on its slice of a global batch, rank 0 evaluates and alone writes files.

``seconds_per_iteration`` is the wall time of the training steps (batch, forward, backward, optimizer)
divided by the iterations run; evaluation, logging and checkpoints are excluded.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from emunum import buffers
from emunum.analysis import crossing
from emunum.optim import derive_seed

from . import data as data_mod
from . import ddp
from . import models
from . import tasks
from .progress import Progress, resolve_log_mode  # noqa: F401  (resolve_log_mode: re-exported)
from .recipe import STREAM_INIT, STREAM_STEP, apply_format, make_optimizer, make_scaler
from .run_files import (CHECKPOINT, CHECKPOINT_VERSION, LOCK_FILE, RUN_CONTROL_KEYS, LoopState,  # noqa: F401
                        RunDirBusy, atomic_target, format_label, hydra_run_dir, identity, load_checkpoint,
                        run_dir_lock, save_checkpoint, write_json_atomic)
from .schema import LogMode, Schedule, check_keys

log = logging.getLogger("experiments.train")

RESULT_KEYS = ("format", "status", "iterations_to_accuracy", "target_accuracy", "best_accuracy",
               "final_accuracy", "iterations_run", "seconds_per_iteration")
# Divergence: a non-finite training loss, or a training loss above DIVERGENCE_FACTOR times the first iteration's
# at DIVERGENCE_EVALS evaluations in a row.
DIVERGENCE_FACTOR = 1e3
DIVERGENCE_EVALS = 3
# The iterations-to-accuracy estimator behind results.json's iterations_estimate, chosen by measurement
# (benchmarks/RESULTS.md, "estimator chosen by measurement"): interpolated and smoothed crossings gave no
# narrower ratio interval without moving the ratio away from the first crossing's.
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

    def to_json(self) -> dict:
        def clean(v):
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {k: clean(v) for k, v in asdict(self).items() if not (k == "world_size" and v is None)}


# ---- small helpers -------------------------------------------------------------------------------------
def _check_positive(cfg, key: str, minimum: int | float) -> None:
    v = cfg[key]
    if v is None or v < minimum:
        raise ValueError(f"{key}={v} is out of range; allowed: >= {minimum}")


def validate(cfg) -> None:
    check_keys(cfg)
    for key, lo in (("max_iters", 1), ("eval_every", 1), ("batch_size", 1), ("checkpoint_every", 0)):
        _check_positive(cfg, key, lo)
    if not cfg.lr > 0:
        raise ValueError(f"lr={cfg.lr} is out of range; allowed: > 0")
    if not 0.0 < cfg.target_accuracy <= 1.0:
        raise ValueError(f"target_accuracy={cfg.target_accuracy} is out of range; allowed: 0 < x <= 1")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads={cfg.threads} is out of range; allowed: >= 1 or null")
    if cfg.stop_after is not None and cfg.stop_after < 1:
        raise ValueError(f"stop_after={cfg.stop_after} is out of range; allowed: >= 1 or null")
    _check_device(str(cfg.device))
    ddp.validate(cfg)


def seed_step(seed: int, device: torch.device) -> None:
    """``torch.manual_seed(seed)`` for a step on ``device``: the CPU generator, plus CUDA's on a CUDA run. The
    same generator states as torch.manual_seed for what the step uses, without its lazy seeding of every other
    backend (cuda, xpu, mtia each format a stack trace: about 0.23 ms per call, a tenth of an fp32 step here)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    elif device.type != "cpu":
        torch.manual_seed(seed)


def _check_device(name: str) -> None:
    """``device`` must parse and exist on this machine: a config error, not torch's AssertionError later."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device={name!r} is not a torch device; allowed: cpu, cuda, cuda:<index>") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (dev.index is not None and dev.index >= n):
            raise ValueError(f"device={name!r}: this machine has {n} CUDA device(s); use device=cpu")
    elif dev.type != "cpu":
        raise ValueError(f"device={name!r} is not supported; allowed: cpu, cuda, cuda:<index>")


def set_threads(n: int | None) -> None:
    if n is None:
        return
    torch.set_num_threads(n)
    import numba

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def lr_at(cfg, iteration: int) -> float:
    """Learning rate of the step that starts at ``iteration`` (0-based)."""
    base, warm = float(cfg.lr), int(cfg.optim.warmup_iters)
    if warm and iteration < warm:
        return base * (iteration + 1) / warm
    if Schedule(cfg.optim.schedule) == Schedule.cosine:
        progress = (iteration - warm) / max(1, int(cfg.max_iters) - warm)
        return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return base


# ---- the loop ------------------------------------------------------------------------------------------
def loss_fn(task: str):
    return tasks.loss_fn(task)


@torch.no_grad()
def evaluate(model, x, y, task: str, batch_size: int) -> dict:
    was_training = model.training
    model.eval()
    total, correct = 0.0, 0
    fn = loss_fn(task)
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


def _reached(ev: dict, cfg, task: str) -> bool:
    if tasks.target_is_accuracy(task):
        return ev["accuracy"] >= cfg.target_accuracy
    return ev["loss"] <= cfg.target_loss


def train(cfg, run_dir: str | os.PathLike | None = None) -> Results:
    """Train as configured; write results.json, TensorBoard events and checkpoints into ``run_dir``
    (default: the Hydra run directory). Returns the Results (status "interrupted" after ``stop_after``)."""
    validate(cfg)
    with ddp.session(torch.device(cfg.device)) as (d, device):
        # every rank works in rank 0's directory (Hydra gives the others none: see experiments/train.py)
        run_dir = Path(ddp.broadcast(str(run_dir if run_dir is not None else hydra_run_dir())))
        if not d.main:
            log.setLevel(logging.WARNING)  # rank 0 reports
            return _train_locked(cfg, run_dir, device)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"run directory {run_dir} cannot be created: {e.strerror or e}") from None
        with run_dir_lock(run_dir):
            return _train_locked(cfg, run_dir, device)


def _train_locked(cfg, run_dir: Path, device: torch.device) -> Results:
    set_threads(cfg.threads)
    buffers.retain_freed_memory()  # each step's tensors reuse mapped pages (emunum/buffers.py)
    seed = int(cfg.seed)
    world = ddp.current().world_size

    ds = data_mod.load(cfg.data)
    task = ds.task
    if not tasks.target_is_accuracy(task) and cfg.target_loss is None:
        what = "a validation MSE" if task == "regression" else "a validation loss in nats per byte"
        raise ValueError(f"data={ds.name} is a {task} task; set target_loss ({what})")
    xtr, ytr = ds.x_train.to(device), ds.y_train.to(device)
    xva, yva = ds.x_val.to(device), ds.y_val.to(device)
    sampler = data_mod.BatchSampler(len(xtr), int(cfg.batch_size) * world, seed)  # the global batch

    torch.manual_seed(derive_seed(seed, STREAM_INIT))
    model = models.build(cfg.model, ds.input_shape, ds.num_outputs).to(device)
    model = apply_format(model, cfg.format, mad=cfg.get("mad"))
    opt = make_optimizer(model, cfg)
    scaler = make_scaler(cfg.format.loss_scale)
    criterion = loss_fn(task)
    net = model
    model, hook = ddp.wrap(net, cfg, device)  # after emunum.patch: see experiments/ddp.py

    ckpt_path = run_dir / CHECKPOINT
    state = load_checkpoint(ckpt_path, net, opt, scaler, cfg, hook) if cfg.resume else LoopState()
    if cfg.resume:
        log.info("resumed from %s at iteration %d", ckpt_path, state.iteration)

    from torch.utils.tensorboard import SummaryWriter

    tracer = _make_tracer(net, cfg)
    writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=state.iteration + 1 if cfg.resume else None) \
        if ddp.current().main else _NullWriter()
    try:
        return _run(cfg, run_dir, model, opt, scaler, criterion, sampler, ds, (xtr, ytr, xva, yva), state,
                    ckpt_path, writer, tracer, hook)
    finally:
        writer.close()
        if tracer is not None:
            tracer.close()


class _NullWriter:
    """The SummaryWriter of ranks other than 0: they write nothing."""

    def __getattr__(self, name):
        return lambda *a, **k: None


def _run(cfg, run_dir, model, opt, scaler, criterion, sampler, ds, tensors, state, ckpt_path, writer, tracer,
         hook=None):
    xtr, ytr, xva, yva = tensors
    seed = int(cfg.seed)
    device = xtr.device
    d = ddp.current()
    mode = resolve_log_mode(cfg.log) if d.main else LogMode.quiet
    progress = Progress(mode, int(cfg.max_iters), state.iteration, cfg.format.name)
    status, reason, origin = None, "", None
    last_loss = float("nan")
    with contextlib.ExitStack() as stack:
        if progress.bar is not None:  # console log lines go through the bar instead of breaking it
            from tqdm.contrib.logging import logging_redirect_tqdm

            stack.enter_context(logging_redirect_tqdm())
        stack.callback(progress.close)
        it = state.iteration
        model.train()
        while it < cfg.max_iters and not (cfg.stop_at_target and _settled(cfg, ds.task, state)):
            t0 = time.perf_counter()
            seed_step(ddp.step_seed(seed, STREAM_STEP, it), device)
            idx = sampler.indices(it)
            if d.active:  # this rank's slice of the global batch
                idx = idx.tensor_split(d.world_size)[d.rank]
            idx = idx.to(device)
            xb, yb = xtr[idx], ytr[idx]
            lr = lr_at(cfg, it)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss = criterion(model(xb).float(), yb)
            last_loss = ddp.mean(loss.detach().item(), device)  # the ranks' mean: the same on every rank
            if not math.isfinite(last_loss):
                status, reason = "diverged", f"training loss {last_loss} at iteration {it + 1}"
                writer.add_scalar("train/loss", last_loss, it + 1)
                origin = _replay_for_origin(model, lambda: criterion(model(xb).float(), yb), seed, it, device, False)
                break
            if scaler is not None:
                scale = scaler.scale
                scaler.scale_loss(loss).backward()
                stepped = scaler.step(opt)
                at_floor = scaler.scale <= scaler.min_scale
                scaler.update()
                if not stepped and at_floor:
                    status, reason = "diverged", f"non-finite gradients at the minimum loss scale (iteration {it + 1})"
                    origin = _replay_for_origin(model, lambda: criterion(model(xb).float(), yb) * scale, seed, it,
                                                device, True)
                    break
            else:
                loss.backward()
                opt.step()
            it += 1
            state.iteration = it
            state.train_seconds += time.perf_counter() - t0
            if state.first_loss is None:
                state.first_loss = last_loss

            writer.add_scalar("train/loss", last_loss, it)
            bpb = tasks.bits_per_byte(ds.task, last_loss)
            if bpb is not None:
                writer.add_scalar("train/bits_per_byte", bpb, it)
            writer.add_scalar("train/lr", lr, it)
            if scaler is not None:
                writer.add_scalar("train/loss_scale", scaler.scale, it)
            progress.step(it, last_loss)
            if it % cfg.eval_every == 0 or it == cfg.max_iters:
                _evaluate_and_log(model, xva, yva, ds, cfg, state, writer, progress, it, last_loss, tracer)
                far = state.first_loss is not None and state.first_loss > 0 and \
                    last_loss > DIVERGENCE_FACTOR * state.first_loss
                state.above = state.above + 1 if far else 0
                if state.above >= DIVERGENCE_EVALS:
                    status, reason = "diverged", (f"training loss {last_loss:.4g} above {DIVERGENCE_FACTOR:g} x the "
                                                  f"first iteration's {state.first_loss:.4g} at {DIVERGENCE_EVALS} "
                                                  f"evaluations in a row (iteration {it})")
                    break
            if cfg.checkpoint_every and it % cfg.checkpoint_every == 0:
                save_checkpoint(ckpt_path, getattr(model, "module", model), opt, scaler, state, cfg, hook)
            if cfg.stop_after is not None and it >= cfg.stop_after and it < cfg.max_iters:
                status, reason = "interrupted", f"stop_after={cfg.stop_after}"
                break

    if status not in ("interrupted", "diverged"):  # a diverged model is not evaluated again
        if not state.evals or state.evals[-1]["iteration"] != state.iteration:
            _evaluate_and_log(model, xva, yva, ds, cfg, state, writer, progress, state.iteration, last_loss, tracer)
        if status is None:
            status = "reached" if state.reached_at is not None else "not_reached"
    if origin is not None:
        reason = f"{reason}; first non-finite: {origin.describe()}"
        log.warning("%s diverged; first non-finite: %s", cfg.format.name, origin.describe())
    results = _results(cfg, ds, state, status, reason, scaler)
    results.nan_origin = origin.to_json() if origin is not None else None
    if d.active:
        results.world_size = d.world_size
    if status != "interrupted" and d.main:
        metric = objective(results, cfg.max_iters)
        hparams = {"format": cfg.format.name, "model": cfg.model.name, "data": cfg.data.name,
                   "optim": cfg.optim.name, "lr": float(cfg.lr), "batch_size": int(cfg.batch_size), "seed": seed}
        writer.add_hparams(hparams, {"hparam/iterations_to_accuracy": float(metric),
                                     "hparam/best_accuracy": _nan_if_none(results.best_accuracy),
                                     "hparam/best_loss": _nan_if_none(results.best_loss)}, run_name=".")
        write_json_atomic(run_dir / "results.json", results.to_json())
        best = (f"best_accuracy={results.best_accuracy}" if results.best_accuracy is not None
                else f"best_loss={results.best_loss}")
        log.info("%s: %s, iterations_to_accuracy=%s, %s, %.3g ms/iteration", cfg.format.name, status,
                 results.iterations_to_accuracy, best, 1e3 * (results.seconds_per_iteration or float("nan")))
    return results


def _replay_for_origin(model, forward, seed: int, it: int, device, backward: bool):
    """Replay step ``it`` (0-based; the weights are still those it started from: the step was not taken) with
    its own seeds under ``emunum.nan_origin``'s detector; the first non-finite event, or None."""
    from emunum.nan_origin import find_nan_origin

    seed_step(ddp.step_seed(seed, STREAM_STEP, it), device)
    return find_nan_origin(getattr(model, "module", model), forward, backward=backward)


def objective(results: Results, max_iters: int) -> int:
    """What ``main`` returns for sweepers to minimise: iterations-to-accuracy if the target was reached,
    else ``max_iters + 1`` (not reached, diverged or interrupted)."""
    if results.status == "reached" and results.iterations_to_accuracy is not None:
        return int(results.iterations_to_accuracy)
    return int(max_iters) + 1


def _nan_if_none(v):
    return float("nan") if v is None else float(v)


def _evaluate_and_log(model, xva, yva, ds, cfg, state, writer, progress, it, train_loss, tracer):
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
    if state.reached_at is None and math.isfinite(ev["loss"]) and _reached(ev, cfg, ds.task):
        state.reached_at = it
    writer.flush()


def _settled(cfg, task: str, state: LoopState) -> bool:
    """Reached, and no later evaluation can change TTA_ESTIMATOR's estimate (crossing.settled)."""
    if state.reached_at is None:
        return False
    pts, target, above = _curve(cfg, task, state)
    return crossing.settled(TTA_ESTIMATOR, pts, target, above=above)


def _curve(cfg, task: str, state: LoopState):
    return tasks.target_curve(task, state.evals, cfg.target_accuracy, cfg.target_loss)


def _results(cfg, ds, state: LoopState, status, reason, scaler) -> Results:
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


def _make_tracer(model, cfg):
    """``emunum.trace`` counters of every emulated layer, exported to TensorBoard at each evaluation as
    ``emunum/<layer>/<role>/{overflow,underflow,nan,sqnr_db}``: rates over the training steps since the
    previous evaluation (evaluation passes are left out)."""
    if not cfg.trace:
        return None
    import emunum

    if cfg.format.fmt is None:
        raise ValueError(f"trace=true: format={cfg.format.name} has no emulated layer to trace; allowed: an "
                         "emulated format (fmt not null)")
    return emunum.trace.enable(model)
