"""Per-call cost of emunum's rounding entry points on small CPU tensors (where Python overhead dominates).

    python benchmarks/call_overhead.py [--numel 1000] [--calls 20000] [--rounds 5] [--threads 1]
    python benchmarks/call_overhead.py --parallel-sweep --threads 2   # serial vs prange loop between torch ops

Rows: ``emunum.quantize`` (nearest, stochastic, fixed point), the custom op ``torch.ops.emunum.quantize``,
a forward ``Quantizer`` on a tensor that needs no gradient, and a forward ``Quantizer`` plus a gradient
``Quantizer`` (both directions rounded) with forward and backward, against ``x.clone()`` as the floor of
one torch call. Each figure is the median over rounds of the mean time per call, in microseconds.

``--parallel-sweep``: the CPU float32 kernel (e5m2, nearest) at 2**10..2**20 elements, serial against the
prange loop, each call preceded by a torch conv1d as in a training step (unlike
``benchmarks/quantize.py --crossover``, which times calls back to back); best of 5 means of 20 calls.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=1000)
    p.add_argument("--calls", type=int, default=20000, help="calls per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch and numba threads")
    p.add_argument("--parallel-sweep", action="store_true", help="serial vs parallel kernel between torch ops")
    a = p.parse_args(argv)
    for k in ("numel", "calls", "rounds", "threads"):
        if getattr(a, k) < 1:
            p.error(f"--{k}={getattr(a, k)} must be >= 1")

    import torch

    import emunum
    from emunum.kernels import cpu  # first: it picks numba's threading layer before any thread starts
    from emunum import torch_cpu
    from emunum.ops import format_to_args

    torch_cpu.set_threads(a.threads)
    torch.manual_seed(0)
    if a.parallel_sweep:
        parallel_sweep(a.threads)
        return
    x = torch.randn(a.numel)
    xg = x.clone().requires_grad_(True)
    e5m2, fixed = emunum.get_format("e5m2"), emunum.get_format("fixed16_12")
    e5m2_args = format_to_args(e5m2)
    fq = emunum.Quantizer(forward=e5m2, backward=None)
    bq = emunum.Quantizer(forward=None, backward=e5m2, backward_rounding="stochastic")
    grad = torch.ones(a.numel)

    def fwd_bwd():
        bq(fq(xg)).backward(grad)

    cases = {
        "x.clone() (floor)": lambda: x.clone(),
        "quantize e5m2 nearest": lambda: emunum.quantize(x, e5m2),
        "quantize 'e5m2' nearest (name)": lambda: emunum.quantize(x, "e5m2", "nearest"),
        "quantize e5m2 stochastic": lambda: emunum.quantize(x, e5m2, "stochastic"),
        "quantize fixed16_12 nearest": lambda: emunum.quantize(x, fixed),
        "torch.ops.emunum.quantize": lambda: torch.ops.emunum.quantize(x, e5m2_args, 0, None, 32),
        "Quantizer fwd (no grad)": lambda: fq(x),
        "Quantizer fwd+grad, fwd+bwd": fwd_bwd,
    }
    per = {n: [] for n in cases}
    for fn in cases.values():  # warm-up: compile
        for _ in range(3):
            fn()
    for _ in range(a.rounds):
        for n, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
            per[n].append((time.perf_counter() - t0) / a.calls)
    print(f"CPU float32 tensor of {a.numel} elements, threads={a.threads}, {a.calls} calls x {a.rounds} rounds")
    print(f"{'case':<34} {'us/call (median)':>17} {'min':>8} {'max':>8}")
    for n, v in per.items():
        print(f"{n:<34} {1e6 * statistics.median(v):17.2f} {1e6 * min(v):8.2f} {1e6 * max(v):8.2f}")


def parallel_sweep(threads: int) -> None:
    import numpy as np
    import torch

    import emunum
    from emunum.kernels import cpu

    run = cpu.float_runner(np.float32, *emunum.get_format("e5m2").to_kernel_args()[1:])
    other, weight = torch.randn(100, 32, 40), torch.randn(32, 32, 5)
    import numba

    print(f"e5m2 nearest, float32, threads={threads} (numba layer: {numba.threading_layer()}), a torch conv1d "
          "before every call; best of 5 x 20 calls")
    print(f"{'n':>9} {'serial us':>10} {'parallel us':>12}  faster")
    for p in range(10, 21):
        x = torch.randn(1 << p)
        y = torch.empty_like(x)
        best: dict = {}
        for par in (False, True):
            run(x.data_ptr(), y.data_ptr(), x.numel(), 0, 0, 32, par)
            best[par] = float("inf")
            for _ in range(5):
                total = 0.0
                for _ in range(20):
                    torch.conv1d(other, weight, padding=2)
                    t0 = time.perf_counter()
                    run(x.data_ptr(), y.data_ptr(), x.numel(), 0, 0, 32, par)
                    total += time.perf_counter() - t0
                best[par] = min(best[par], total / 20)
        faster = "parallel" if best[True] < best[False] else "serial"
        print(f"{1 << p:>9} {best[False] * 1e6:>10.1f} {best[True] * 1e6:>12.1f}  {faster}")


if __name__ == "__main__":
    main()
