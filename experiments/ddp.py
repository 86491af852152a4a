"""Several processes: ``torchrun --nproc-per-node=N experiments/train.py ... dist.comm=e5m2``.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; ``session`` then starts the process group (gloo on CPU, NCCL on
CUDA, each rank on ``cuda:<LOCAL_RANK>``) and the loop trains a ``DistributedDataParallel`` model. Without those
variables (plain ``python experiments/train.py``) nothing here is active and the run is the single-process one.

- Data: iteration ``it`` takes a global batch of ``N * batch_size`` examples from the epoch's permutation (drawn
  from ``(seed, epoch)`` as in one process); rank r trains on its r-th slice, so the shards are disjoint, as
  with ``DistributedSampler``. What is random per rank (the stochastic-rounding seeds of the emulated layers,
  drawn from torch's generator) comes from ``derive_seed(seed, STREAM_STEP, it, rank)``.
- Gradients: DDP's all-reduce (fp32), or ``emunum.distributed.quantized_allreduce_hook`` when ``dist.comm``,
  ``dist.ring`` or ``dist.result`` is set; its stochastic seed is ``derive_seed(seed, STREAM_COMM)``.
- ``iteration`` counts global optimizer steps. The training loss logged and tested for divergence is the mean
  of the ranks' losses, the same on every rank. Evaluation runs on rank 0 alone (the replicas are identical)
  and its result is broadcast, so every rank takes the same decisions (stop at target, divergence).
- Rank 0 alone writes results.json (with ``world_size``), TensorBoard events and checkpoints; a checkpoint holds
  every rank's hook state (error-feedback residuals) and the world size, and resuming with another world size
  is refused. Every rank uses rank 0's run directory.
- ``emunum.patch`` is applied before the DDP wrap: DDP registers its gradient hooks on the parameters and
  builds its buckets from the module it is given, and patching swaps modules (keeping their Parameters); a
  patch after the wrap would change the module under DDP's feet, and DDP's own ``module.`` prefix would
  change the names that the policy matches.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

import torch

from emunum.optim import derive_seed

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
STREAM_COMM = 4  # a derive_seed stream after recipe.py's STREAM_STEP


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    active: bool = False  # started by torchrun: a process group and DDP

    @property
    def main(self) -> bool:
        return self.rank == 0


_current = Dist()


def current() -> Dist:
    """The running session's ranks (``Dist()``, one inactive process, outside ``session``)."""
    return _current


def from_env(env=None) -> Dist:
    """The ranks that torchrun's environment variables give; ``Dist()`` when they are absent."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return Dist()
    vals = {}
    for k in ENV_KEYS:
        try:
            vals[k] = int(env.get(k, "0"))
        except ValueError:
            raise ValueError(f"environment variable {k}={env.get(k)!r} is not an integer (set by torchrun)") from None
    if vals["WORLD_SIZE"] < 1 or not 0 <= vals["RANK"] < vals["WORLD_SIZE"]:
        raise ValueError(f"RANK={vals['RANK']}, WORLD_SIZE={vals['WORLD_SIZE']}: allowed 0 <= RANK < WORLD_SIZE")
    return Dist(vals["RANK"], vals["WORLD_SIZE"], vals["LOCAL_RANK"], True)


def comm_spec(dcfg):
    """The ``emunum.distributed.CommSpec`` of ``cfg.dist`` (ValueError/TypeError naming the ``dist.*`` key), or
    None for DDP's own fp32 all-reduce."""
    from emunum import RoundMode
    from emunum.distributed import CommSpec

    RoundMode.parse(dcfg.comm_rounding, field="dist.comm_rounding")
    if dcfg.comm is None and not dcfg.ring and dcfg.result is None:
        if dcfg.error_feedback or str(_value(dcfg.scaling)) != "none":
            raise ValueError("dist.error_feedback and dist.scaling need dist.comm (a wire format)")
        return None
    try:
        return CommSpec.make(dcfg.comm, rounding=dcfg.comm_rounding, seed=0, scaling=_value(dcfg.scaling),
                             result_fmt=dcfg.result, ring=bool(dcfg.ring), error_feedback=bool(dcfg.error_feedback))
    except (TypeError, ValueError) as e:
        msg = str(e)
        for key, field in (("fmt", "comm"), ("rounding", "comm_rounding"), ("result_fmt", "result")):
            if msg.startswith(key):
                msg = f"dist.{field}{msg[len(key):]}"
                break
        else:
            msg = f"dist: {msg}"
        raise type(e)(msg) from None


def _value(v):
    return getattr(v, "value", v)


def validate(cfg) -> None:
    """Check ``cfg.dist`` before any process group starts; a non-default ``dist`` needs torchrun."""
    spec = comm_spec(cfg.dist)
    d = from_env()
    if spec is not None and not d.active:
        raise ValueError(f"dist.comm={cfg.dist.comm}, dist.ring={cfg.dist.ring}, dist.result={cfg.dist.result} need "
                         "several processes: run torchrun --nproc-per-node=N experiments/train.py ...")


@contextlib.contextmanager
def session(device: torch.device):
    """Start the process group for torchrun's environment (nothing in a plain process); yields (Dist, device),
    the device being ``cuda:<LOCAL_RANK>`` for CUDA runs."""
    global _current
    d = from_env()
    if not d.active:
        yield d, device
        return
    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=d.rank, world_size=d.world_size,
                            device_id=device if device.type == "cuda" else None)
    _current = d
    try:
        yield d, device
    finally:
        _current = Dist()
        dist.destroy_process_group()


def broadcast(obj):
    """Rank 0's ``obj`` on every rank (``obj`` itself in a single process)."""
    if not _current.active:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj) -> list | None:
    """Every rank's ``obj`` on rank 0 (rank order), None elsewhere; ``[obj]`` in a single process."""
    if not _current.active:
        return [obj]
    import torch.distributed as dist

    out = [None] * _current.world_size if _current.main else None
    dist.gather_object(obj, out, dst=0)
    return out


def mean(value: float, device) -> float:
    """The mean of the ranks' ``value``s (summed in float64, rank order irrelevant for two ranks), the same on
    every rank; ``value`` itself in a single process."""
    if not _current.active:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / _current.world_size


def step_seed(seed: int, stream: int, it: int) -> int:
    """The seed of torch's generator for iteration ``it``: (seed, stream, it) in one process, plus the rank."""
    if not _current.active:
        return derive_seed(seed, stream, it)
    return derive_seed(seed, stream, it, _current.rank)


def wrap(model: torch.nn.Module, cfg, device):
    """``(DDP(model), hook or None)`` under torchrun; ``(model, None)`` in one process. ``model`` must already
    be patched (see the module docstring)."""
    if not _current.active:
        return model, None
    from emunum.distributed import QuantizedAllreduce
    from torch.nn.parallel import DistributedDataParallel

    spec = comm_spec(cfg.dist)
    # With a hook, find_unused_parameters=True keeps DDP's first bucket layout for the whole run (DDP otherwise
    # rebuilds its buckets once, after the first iteration, and a resumed process would run one iteration on
    # the first layout): the hook's stochastic bits and ring chunks follow the flat bucket's element order.
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                  find_unused_parameters=spec is not None)
    hook = None
    if spec is not None:
        hook = QuantizedAllreduce(dataclasses.replace(spec, seed=derive_seed(int(cfg.seed), STREAM_COMM)))
        ddp.register_comm_hook(None, hook)
    return ddp, hook


def rank_argv(argv: list[str], env=None) -> list[str]:
    """Hydra overrides for a rank other than 0: no output directory of its own (rank 0's is broadcast), logs
    to stdout only. Rank 0 and single processes keep ``argv``."""
    d = from_env(env)
    if not d.active or d.main:
        return argv
    drop = ("hydra.run.dir=", "hydra.output_subdir=", "hydra/job_logging=")
    kept = [a for a in argv if not a.lstrip("+~").startswith(drop)]
    return kept + ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]

