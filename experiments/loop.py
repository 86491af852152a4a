"""The training loop behind ``experiments/train.py``: ``train(cfg, run_dir) -> Results``.

Measurement. Iterations are counted from 1 (``iteration`` = optimizer steps taken). Every ``eval_every``
iterations (and at ``max_iters``) the whole validation set is evaluated; iterations-to-accuracy is the first
such iteration whose validation accuracy is >= ``target_accuracy`` (regression and language-model data:
whose validation loss is <= ``target_loss``; see ``experiments/tasks.py``). ``iterations_estimate`` is
``TTA_ESTIMATOR``'s reading of the same evaluations (``emunum.analysis.crossing``), named in ``estimator``; it
is what ``emunum report`` averages. The estimators measured against each other (benchmarks/RESULTS.md,
"estimator chosen by measurement") left "first": the same figure. With ``stop_at_target`` the run ends once that estimate is settled (for
"first", at the first evaluation at the target; a smoothed estimator needs a few evaluations more).

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

import logging
import os
import re
import time
from pathlib import Path

import torch

from emunum import buffers, torch_cpu
from emunum.optim import derive_seed

from . import data as data_mod
from . import ddp, iteration_cost, models, steps, tasks
from .progress import resolve_log_mode  # noqa: F401  (re-exported)
from .recipe import STREAM_INIT, apply_format, make_optimizer, make_scaler
from .results import RESULT_KEYS, TTA_ESTIMATOR, Results, evaluate, objective  # noqa: F401  (re-exported)
from .run_files import (CHECKPOINT, CHECKPOINT_VERSION, LOCK_FILE, RUN_CONTROL_KEYS, LoopState,  # noqa: F401
                        RunDirBusy, atomic_target, hydra_run_dir, identity, load_checkpoint, run_dir_lock,
                        write_json_atomic)
from .schema import check_keys
from .steps import DIVERGENCE_EVALS, DIVERGENCE_FACTOR, lr_at, seed_step  # noqa: F401  (re-exported)

log = logging.getLogger("experiments.train")

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
    """torch's and numba's thread counts (``emunum.torch_cpu.set_threads``); None leaves both at their defaults."""
    if n is not None:
        torch_cpu.set_threads(n)


def loss_fn(task: str):
    """``fn(output, target, reduction="mean")`` for ``task`` (``experiments.tasks.loss_fn``)."""
    return tasks.loss_fn(task)


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
    bs = min(int(cfg.batch_size), len(xtr))
    cost = iteration_cost.measure(model, xtr[:bs], ytr[:bs], task) if ddp.current().main else None
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
    if cfg.resume and ddp.current().main:
        _wait_past_event_files(run_dir / "tensorboard")
    writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=state.iteration + 1 if cfg.resume else None) \
        if ddp.current().main else _NullWriter()
    session = steps.Session(cfg, run_dir, model, opt, scaler, criterion, sampler, ds, (xtr, ytr, xva, yva), state,
                            ckpt_path, writer, tracer, hook, iteration_cost=cost)
    try:
        return steps.run(session)
    finally:
        writer.close()
        if tracer is not None:
            tracer.close()


_EVENT_FILE = re.compile(r"events\.out\.tfevents\.(\d+)\.")
_MAX_EVENT_WAIT_S = 2.0


def _wait_past_event_files(logdir: Path) -> None:
    """Sleep until the wall-clock second is past that of every event file in ``logdir``. TensorBoard reads a run's
    event files in name order and applies a resumed writer's purge_step in that order; a name starts with the
    second its file was opened, then host, pid and a per-process counter, which do not sort by time (".10" before
    ".9"), so a resumed run's file opened in the second of the file it continues could be read first and purge
    nothing. A file stamped more than a second ahead (another machine's clock) is not waited for."""
    seconds = [int(m.group(1)) for p in logdir.glob("events.out.tfevents.*") if (m := _EVENT_FILE.match(p.name))]
    if seconds:
        delay = max(seconds) + 1 - time.time()
        if 0 < delay <= _MAX_EVENT_WAIT_S:
            time.sleep(delay)


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


class _NullWriter:
    """The SummaryWriter of ranks other than 0: they write nothing."""

    def __getattr__(self, name):
        return lambda *a, **k: None
