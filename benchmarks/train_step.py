"""Training-step time of a CNN: fp32 against emulated recipes, in one process.

    python benchmarks/train_step.py [--steps 20] [--rounds 5] [--threads 2]
    python benchmarks/train_step.py --model cnn2d --recipes elementwise,nvfp4 --compare-elide
    python benchmarks/train_step.py --model cnn2d --recipes nvfp4 --compare-old --clock cpu

Models: ``cnn1d`` (default) = the experiments' default CNN on MNIST-1D, batch 100; ``cnn2d`` = a small 2-D CNN
written here and not tuned by any benchmark (conv3x3(3->16)-ReLU-conv3x3(16->32)-ReLU-maxpool2-Linear(8192->64)-
ReLU-Linear(64->10)), on fixed random 32x32 RGB images with 10 classes, batch 64 (the config's optimizer and
loss scaling, as for cnn1d).

Recipes (experiments/conf/format): ``fp32``; ``elementwise`` = the fp8 recipe without its MAD unit (every
rounding is elementwise: 1-5-2 weights/activations/errors, stochastic weight gradients, OptimLP with 1-6-9
stochastic weight updates, dynamic loss scaling; the GEMMs run in torch fp32 on rounded operands);
``fp8`` = the full Wang et al. recipe, whose GEMMs run on the emulated 1-6-9 chunk-64 MAD unit;
``mxfp8`` / ``nvfp4`` = the block-format recipes (6 block quantisations per GEMM layer per step).
One step = batch gather, forward, loss, backward, optimizer step (as in experiments/loop.py). Each round
times ``--steps`` steps of every recipe in turn (after one warm-up round that compiles the kernels); the
figure is the median over rounds of the mean step time, and the ratio is against fp32's median.
``--compare-elide`` adds, for every emulated recipe, the same recipe with rounding elision off
(``emunum.grid.set_elision(False)`` around its steps; ``docs/elision.md``), timed in the same rounds.
``--compare-rht`` adds, for recipes with a Hadamard transform (nvfp4), the recipe with the transform taken by
its float64 matrix product instead of the butterfly kernel (``emunum.hadamard``; same bits), in the same rounds.
``--compare-old`` adds nvfp4 with the general stochastic block loop, F.unfold's im2col and per-GEMM weight
quantisation (``_old_paths``; same bits), in the same rounds.
``--kernels`` then runs ``--steps`` more steps of each block recipe (mxfp8, nvfp4) with the block path's CPU
kernel entry points timed (``KERNELS``: amax, table, power-of-two and stochastic block loops, the Hadamard
butterfly, im2col and col2im; wall time around each call, summed over the calls a thread launcher makes) and
prints, per kernel and first array shapes, calls and ms per step beside the step's own time. The GEMMs,
torch's ops and the Python between them are the rest.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPES = {
    "fp32": ["format=fp32"],
    "elementwise": ["format=fp8", "format.mad=null"],
    "fp8": ["format=fp8"],
    "mxfp8": ["format=mxfp8"],  # block formats: every GEMM re-quantises its operands along K
    "nvfp4": ["format=nvfp4"],
}


def cnn2d():
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))


class _Images:
    """Fixed random 32x32 RGB images and labels (the cnn2d workload)."""

    def __init__(self, n: int = 1280):
        import torch

        g = torch.Generator().manual_seed(0)
        self.x_train = torch.randn(n, 3, 32, 32, generator=g)
        self.y_train = torch.randint(0, 10, (n,), generator=g)
        self.task = "classification"


def _matrix_rht(step):
    """step, run with ``emunum.hadamard.rht`` on its float64 matrix product (the butterfly switched off)."""
    from emunum import hadamard

    def run():
        fast, hadamard._butterfly = hadamard._butterfly, lambda *a: None
        try:
            return step()
        finally:
            hadamard._butterfly = fast

    return run


def _old_paths(step):
    """step, run with the NVFP4 step's switchable paths off (same bits): the general loop for stochastic block
    rounding (kernels/block_sr.py), F.unfold + a transposing copy for the block convolutions' im2col (and so no
    block maxima from it; emunum/nn/im2col.py), W quantised again for the grad-input GEMM, and the transformed
    Wgrad operand made from the whole im2col matrix (emunum/nn/rht_columns.py)."""
    from emunum.kernels import block_sr
    from emunum.nn import block_gemm, rht_columns

    def run():
        saved = (block_sr.sr_ok, block_gemm.im2col_rows_scanned, block_gemm.BlockPlan.reuses_weight,
                 rht_columns.applies)
        block_sr.sr_ok, block_gemm.im2col_rows_scanned = (lambda args: False), (lambda *a: (None, None))
        block_gemm.BlockPlan.reuses_weight = lambda self, trace=None: False
        rht_columns.applies = lambda *a: False
        try:
            return step()
        finally:
            (block_sr.sr_ok, block_gemm.im2col_rows_scanned, block_gemm.BlockPlan.reuses_weight,
             rht_columns.applies) = saved

    return run


KERNELS = (("block_fast", "amax_range"), ("block_fast", "table_range"), ("block_fast", "pow2_range"),
           ("block_sr", "sr_range"), ("block_sr", "nearest_range"), ("hadamard_cpu", "rht_f32"),
           ("im2col_cpu", "im2col"), ("im2col_cpu", "im2col_scan"), ("im2col_cpu", "col2im"))


def kernel_times(step, steps: int) -> tuple[float, dict]:
    """(ms per step, {(kernel, shapes): [calls, seconds]}) over ``steps`` runs of ``step`` with each ``KERNELS``
    entry point wrapped in a timer (its module attribute, which the callers look up at each call)."""
    import importlib
    import threading

    times: dict = {}
    saved = []
    lock = threading.Lock()  # a launcher's threads record at once

    def timed(name, fn):
        def run(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                dt = time.perf_counter() - t0
                shapes = tuple(tuple(v.shape) for v in args if hasattr(v, "shape"))[:2]
                with lock:
                    entry = times.setdefault((name, shapes), [0, 0.0])
                    entry[0] += 1
                    entry[1] += dt
        return run

    for mod_name, fn_name in KERNELS:
        mod = importlib.import_module(f"emunum.kernels.{mod_name}")
        saved.append((mod, fn_name, getattr(mod, fn_name)))
        setattr(mod, fn_name, timed(fn_name, saved[-1][2]))
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return 1e3 * (time.perf_counter() - t0) / steps, times
    finally:
        for mod, fn_name, fn in saved:
            setattr(mod, fn_name, fn)


def build(overrides: list[str], threads: int, model: str = "cnn1d", elide: bool = True):
    import torch
    from hydra import compose, initialize_config_dir

    from emunum.optim import derive_seed
    from experiments import data as data_mod
    from experiments import models
    from experiments.loop import loss_fn, seed_step, set_threads
    from experiments.recipe import apply_format, make_optimizer, make_scaler
    from experiments.schema import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "experiments" / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides + [f"threads={threads}"])
    set_threads(threads)
    torch.manual_seed(derive_seed(int(cfg.seed), 0))
    if model == "cnn2d":
        ds, batch = _Images(), 64
        net = cnn2d()
    else:
        ds, batch = data_mod.load(cfg.data), int(cfg.batch_size)
        net = models.build(cfg.model, ds.input_shape, ds.num_outputs)
    model = apply_format(net, cfg.format)
    opt, scaler = make_optimizer(model, cfg), make_scaler(cfg.format.loss_scale)
    sampler = data_mod.BatchSampler(len(ds.x_train), batch, int(cfg.seed))
    from emunum import grid
    crit = loss_fn(ds.task)
    state = {"it": 0}

    def step():
        prev = grid.set_elision(elide)
        try:
            return _step()
        finally:
            grid.set_elision(prev)

    def _step():
        it = state["it"]
        state["it"] += 1
        seed_step(derive_seed(int(cfg.seed), 3, it), torch.device("cpu"))  # as experiments/loop.py
        idx = sampler.indices(it)
        opt.zero_grad(set_to_none=True)
        loss = crit(model(ds.x_train[idx]).float(), ds.y_train[idx])
        if scaler is not None:
            scaler.scale_loss(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.detach().item()

    return step, cfg


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="steps per recipe per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch and numba threads (train.py default: 1)")
    p.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated subset of {list(RECIPES)}")
    p.add_argument("--model", default="cnn1d", choices=("cnn1d", "cnn2d"))
    p.add_argument("--compare-elide", action="store_true",
                   help="also time every emulated recipe with rounding elision off, in the same rounds")
    p.add_argument("--compare-rht", action="store_true",
                   help="also time recipes with a Hadamard transform on its float64 matrix product (same bits)")
    p.add_argument("--compare-old", action="store_true",
                   help="also time nvfp4 with the stochastic block path, one-pass im2col and weight reuse off")
    p.add_argument("--kernels", action="store_true",
                   help="then time the block path's CPU kernels inside --steps steps of each block recipe")
    p.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                   help="wall: time.perf_counter; cpu: time.process_time, the process's CPU time (steadier on a "
                        "loaded machine; with --threads 1 a step's work is one thread's)")
    p.add_argument("--default-malloc", action="store_true", help="keep glibc's default (the training loop "
                    "calls emunum.buffers.retain_freed_memory(), and so does this benchmark unless this is given)")
    a = p.parse_args(argv)
    from emunum import buffers

    retained = not a.default_malloc and buffers.retain_freed_memory()
    print(f"# malloc: {'retain_freed_memory()' if retained else 'glibc default'}")
    names = [n.strip() for n in a.recipes.split(",") if n.strip()]
    bad = [n for n in names if n not in RECIPES]
    if bad or not names:
        p.error(f"--recipes: unknown {bad}; allowed: {', '.join(RECIPES)}")
    if "fp32" not in names:
        names.insert(0, "fp32")
    for k in ("steps", "rounds", "threads"):
        if getattr(a, k) < 1:
            p.error(f"--{k}={getattr(a, k)} must be >= 1")

    steps = {n: build(RECIPES[n], a.threads, a.model)[0] for n in names}
    if a.compare_elide:
        for n in [n for n in names if n != "fp32"]:
            steps[f"{n}-noelide"] = build(RECIPES[n], a.threads, a.model, elide=False)[0]
    if a.compare_rht:
        for n in [n for n in names if n == "nvfp4"]:
            steps[f"{n}-matrix-rht"] = _matrix_rht(build(RECIPES[n], a.threads, a.model)[0])
    if a.compare_old:
        for n in [n for n in names if n == "nvfp4"]:
            steps[f"{n}-old-paths"] = _old_paths(build(RECIPES[n], a.threads, a.model)[0])
    names = list(steps)
    for n in names:  # warm-up: compile every kernel the recipe uses
        for _ in range(3):
            steps[n]()
    clock = time.perf_counter if a.clock == "wall" else time.process_time
    per_round = {n: [] for n in names}
    for _ in range(a.rounds):
        for n in names:
            t0 = clock()
            for _ in range(a.steps):
                steps[n]()
            per_round[n].append((clock() - t0) / a.steps)
    base = statistics.median(per_round["fp32"])
    what = ("default CNN (cnn1d) on MNIST-1D, batch 100" if a.model == "cnn1d" else
            "2-D CNN (cnn2d) on random 32x32 images, batch 64")
    print(f"{what}, threads={a.threads}, {a.steps} steps x {a.rounds} rounds, {a.clock} clock; load average "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"{'recipe':<20} {'ms/step (median)':>17} {'min':>8} {'max':>8} {'x fp32':>8}")
    for n in names:
        v = per_round[n]
        med = statistics.median(v)
        print(f"{n:<20} {1e3 * med:17.2f} {1e3 * min(v):8.2f} {1e3 * max(v):8.2f} {med / base:8.2f}")
    for n in [n for n in names if n in ("mxfp8", "nvfp4")] if a.kernels else ():
        ms, times = kernel_times(steps[n], a.steps)
        print(f"# {n}: block kernels inside {a.steps} steps ({ms:.2f} ms/step, wall, timers included)")
        print(f"{'kernel':<14} {'arrays (first two)':<44} {'calls/step':>10} {'ms/step':>8}")
        for (name, shapes), (calls, sec) in sorted(times.items(), key=lambda kv: -kv[1][1]):
            print(f"{name:<14} {' '.join('x'.join(map(str, sh)) for sh in shapes):<44} {calls / a.steps:10.1f} "
                  f"{1e3 * sec / a.steps:8.2f}")
        total = sum(sec for _, sec in times.values())
        print(f"{'(all)':<14} {'':<44} {'':>10} {1e3 * total / a.steps:8.2f}")


if __name__ == "__main__":
    main()
