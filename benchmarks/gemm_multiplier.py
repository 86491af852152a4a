"""GEMM throughput of MAD units with approximate multipliers (``emunum.mad.Multiplier``), in GMAC/s, on the CPU.

Operands: e4m3fn values, unit MADUnit("fp16", "fp32") (fp16 products, fp32 accumulator) with each multiplier:
a 256 x 256 e4m3fn lookup table (EvoApproxLib style; here the exact products), Mitchell, DRUM(4) and a user
njit function, next to the same unit without a multiplier on the general (bit-exact core) kernel and on the
fast kernel the dispatcher picks. Best of --repeat calls after one warm-up call (compiles, or loads the cache).

    python benchmarks/gemm_multiplier.py [--size 256] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from numba import njit

import emunum
from emunum.kernels import gemm_cpu
from emunum.mad import MADUnit, Multiplier
from emunum.mad.unit import stream_keys


@njit
def _product(a, b):
    return a * b


def best(fn, repeat):
    fn()
    walls = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return min(walls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.size
    g = torch.Generator().manual_seed(0)
    A = emunum.quantize(torch.randn(n, n, generator=g), "e4m3fn")
    B = emunum.quantize(torch.randn(n, n, generator=g), "e4m3fn")
    fmt = emunum.get_format("e4m3fn")
    v = fmt.decode(np.arange(256))
    lut = np.outer(v, v)
    macs = n**3
    rows = {"table (e4m3fn, 256 x 256)": Multiplier.table(lut, fmt), "mitchell": Multiplier.mitchell(),
            "drum(k=4, e4m3fn)": Multiplier.drum(4, fmt), "function (njit a*b)": Multiplier.function(_product)}
    for name, m in rows.items():
        unit = MADUnit("fp16", "fp32", multiplier=m)
        t = best(lambda: emunum.mad.matmul(A, B, unit), args.repeat)
        print(f"{name:28s} {macs / t / 1e9:7.3f} GMAC/s  ({t * 1e3:8.1f} ms, {n}^3)")
    unit = MADUnit("fp16", "fp32")
    mulp, accp = unit.kernel_params()
    a3, b3, out = A.numpy()[None], B.numpy()[None], np.empty((1, n, n))
    t = best(lambda: gemm_cpu.gemm(a3, b3, None, out, 0, mulp, accp, 1, 0, stream_keys(0), 32, fast=False),
             args.repeat)
    print(f"{'exact, general kernel':28s} {macs / t / 1e9:7.3f} GMAC/s  ({t * 1e3:8.1f} ms)")
    t = best(lambda: emunum.mad.matmul(A, B, unit), args.repeat)
    print(f"{'exact, fast kernel':28s} {macs / t / 1e9:7.3f} GMAC/s  ({t * 1e3:8.1f} ms)")


if __name__ == "__main__":
    main()
