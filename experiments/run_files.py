"""The files of a run directory: atomic writes, the checkpoint (save, load and its identity check), the
run-directory lock, and the label results.json gives a run's format."""
from __future__ import annotations

import contextlib
import json
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from . import ddp
from .schema import DistConfig

LOCK_FILE = ".lock"
CHECKPOINT = "checkpoint.pt"
CHECKPOINT_VERSION = 1
# keys that may differ between a killed run and its resumption
RUN_CONTROL_KEYS = ("max_iters", "eval_every", "stop_at_target", "threads", "trace", "checkpoint_every",
                    "resume", "stop_after", "log", "device")


@dataclass
class LoopState:
    """What a checkpoint must carry besides model/optimizer/scaler."""

    iteration: int = 0
    evals: list = field(default_factory=list)  # [{"iteration", "loss", "accuracy"}]
    reached_at: int | None = None
    train_seconds: float = 0.0
    first_loss: float | None = None  # the training loss of iteration 1 (the divergence rule's reference)
    above: int = 0  # consecutive evaluations with the training loss beyond DIVERGENCE_FACTOR * first_loss


@contextlib.contextmanager
def atomic_target(path: Path):
    """Yields a temporary path beside ``path``; on success it replaces ``path``, on any failure (a full disk,
    say) it is removed, so no stray ``*.tmp`` file is left behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj) -> None:
    with atomic_target(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, allow_nan=False)
            f.write("\n")


def identity(cfg) -> dict:
    """The config entries that define the computation (a resumed run must match them)."""
    c = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    if c.get("dist") == _DIST_DEFAULT:  # a checkpoint written before the dist group existed still matches
        del c["dist"]
    return {k: v for k, v in c.items() if k not in RUN_CONTROL_KEYS}


_DIST_DEFAULT = OmegaConf.to_container(OmegaConf.structured(DistConfig), enum_to_str=True)


def hydra_run_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise ValueError("run_dir is required when train() is called outside a Hydra run")
    return Path(HydraConfig.get().runtime.output_dir)


def save_checkpoint(path: Path, model, opt, scaler, state: LoopState, cfg, hook=None) -> None:
    """Rank 0 writes the checkpoint; under torchrun every rank must call this (it gathers the comm hooks'
    states, one per rank)."""
    comm = ddp.gather(hook.state_dict() if hook is not None else None)
    if not ddp.current().main:
        return
    np_state = np.random.get_state()
    ckpt = {
        "world_size": ddp.current().world_size,
        "comm": comm,
        "version": CHECKPOINT_VERSION,
        "identity": json.dumps(identity(cfg), sort_keys=True),
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "loop": asdict(state),
        "rng": {"torch": torch.get_rng_state(), "python": list(_py_state_to_list(random.getstate())),
                "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]},
    }
    with atomic_target(path) as tmp:
        try:
            torch.save(ckpt, tmp)
        except (RuntimeError, OSError) as e:
            raise OSError(f"could not write the checkpoint {path}: {_write_cause(tmp, e)}") from e


def _write_cause(tmp: Path, e: BaseException) -> str:
    """Why writing ``tmp`` failed, in words: the file-size limit or a full disk where that is what happened,
    else the error's first line without torch's internal ``[enforce fail at ...]`` prefix."""
    import re
    import resource
    import shutil

    try:
        size = tmp.stat().st_size
    except OSError:
        size = None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and size is not None and size >= soft:
        return f"the process's file-size limit (RLIMIT_FSIZE, `ulimit -f`) of {soft} bytes was reached"
    if getattr(e, "errno", None) == 28 or shutil.disk_usage(tmp.parent).free < (1 << 20):
        return f"the disk holding {tmp.parent} is full"
    line = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    return re.sub(r"\[enforce fail at [^\]]*\]\s*\.?\s*", "", line).strip() or type(e).__name__


def _py_state_to_list(st):
    return [st[0], list(st[1]), st[2]]


def load_checkpoint(path: Path, model, opt, scaler, cfg, hook=None) -> LoopState:
    if not path.exists():
        raise ValueError(f"resume=true but {path} does not exist; allowed: a run directory with a checkpoint "
                         f"(pass hydra.run.dir=<that directory>)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, garbled, empty or foreign: name the file and the cause, nothing else
        cause = next((ln for ln in str(e).splitlines() if ln.strip() and "weights_only" not in ln), "")
        raise ValueError(f"resume=true: cannot read the checkpoint {path}: it is truncated, empty or not an "
                         f"emunum checkpoint ({type(e).__name__}{': ' + cause[:200] if cause else ''})") from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"resume=true: {path} is not an emunum checkpoint (a {type(ckpt).__name__})")
    if ckpt.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path}: checkpoint version {ckpt.get('version')} is not {CHECKPOINT_VERSION}")
    world, now_world = ckpt.get("world_size", 1), ddp.current().world_size
    if world != now_world:
        raise ValueError(f"resume=true: {path} was written by a run of world size {world} and this run has world "
                         f"size {now_world}; resume with the same number of processes "
                         f"({'torchrun --nproc-per-node=' + str(world) if world > 1 else 'a single process'})")
    saved, now = json.loads(ckpt["identity"]), identity(cfg)
    if saved != now:
        diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        raise ValueError(f"resume=true: {path} was written with a different config in {diff}; "
                         f"allowed changes: {', '.join(RUN_CONTROL_KEYS)}")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    if (scaler is None) != (ckpt["scaler"] is None):
        raise ValueError(f"{path}: loss-scaler state does not match format.loss_scale")
    if scaler is not None:
        scaler.load_state_dict(ckpt["scaler"])
    rng = ckpt["rng"]
    torch.set_rng_state(rng["torch"])
    py = rng["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = rng["numpy"]
    np.random.set_state((npst[0], np.asarray(npst[1], dtype=np.uint32), *npst[2:]))
    comm = ckpt.get("comm")
    if hook is not None and comm is not None and comm[ddp.current().rank] is not None:
        hook.load_state_dict(comm[ddp.current().rank])
    return LoopState(**ckpt["loop"])


def format_label(fmt_cfg) -> str:
    """The label a run's results carry: the format group's name, plus ``[key=value, ...]`` for every key of that
    group's YAML (``experiments/conf/format/<name>.yaml``) that the run overrode, so that ``format=fp32
    format.fmt=e5m2`` is labelled by what it emulated (``fp32 [fmt=e5m2]``), not as plain fp32."""
    import yaml
    from omegaconf import OmegaConf

    name = str(fmt_cfg.name)
    path = Path(__file__).resolve().parent / "conf" / "format" / f"{name}.yaml"
    try:
        base = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return name
    now = OmegaConf.to_container(fmt_cfg, resolve=True, enum_to_str=True)

    def leaves(d, prefix=""):  # the YAML's own settings (the schema fills in the rest)
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            elif f"{prefix}{k}" not in ("defaults", "name"):
                yield f"{prefix}{k}", v

    def at(d, dotted):
        for part in dotted.split("."):
            d = d.get(part) if isinstance(d, dict) else None
        return d

    changed = [(k, at(now, k)) for k, v in leaves(base) if at(now, k) != v]
    if not changed:
        return name
    return f"{name} [" + ", ".join(f"{k}={v}" for k, v in changed) + "]"


class RunDirBusy(RuntimeError):
    """Another run holds the run directory's lock."""


@contextlib.contextmanager
def run_dir_lock(run_dir: Path):
    """An exclusive ``fcntl.flock`` on ``<run_dir>/.lock`` for the whole run: a second run started in the same
    directory refuses (``RunDirBusy`` naming the directory and the holder's pid) instead of interleaving logs,
    TensorBoard events, checkpoints and results.json. Released when the run ends or its process dies."""
    import fcntl

    path = run_dir / LOCK_FILE
    try:
        f = open(path, "a+")
    except OSError as e:
        raise ValueError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise RunDirBusy(f"run directory {run_dir} is in use by another run (pid {holder}); "
                               "wait for it, or give this run another hydra.run.dir") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        f.close()
