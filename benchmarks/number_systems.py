"""Quantize throughput of the new number systems next to e5m2 and the memory-copy ceiling, and the
GEMM rate of a MAD unit with an approximate (lookup-table) multiplier next to the exact unit.

    PYTHONPATH=. .venv/bin/python benchmarks/number_systems.py [--n 4194304] [--repeats 5] [--gemm 128]

Rows: out.copy_(x) (the ceiling), e5m2 (FloatFormat), posit16 (PositFormat), nf4 (TableFormat: binary search
over 16 values), lns5_10 (LogFormat), and a CustomFormat (a 5-bit cubic companding type whose to_code/from_code
are user njit functions), all with out= on float32 CPU tensors, best of --repeats after a warm-up call.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import emunum  # noqa: E402


def best(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def cube5():
    from numba import njit

    @njit
    def to_code(x):
        if x != x:
            return 0
        k = round(15.0 * (min(abs(x), 4.0) / 4.0) ** (1 / 3))
        return int(k) | (16 if x < 0 and k > 0 else 0)

    @njit
    def from_code(c):
        v = 4.0 * ((c & 15) / 15.0) ** 3
        return -v if c & 16 else v

    return emunum.CustomFormat(to_code, from_code, 5, name="cube5")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 22)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gemm", type=int, default=128, help="M=N=K of the MAD GEMM rows (0: skip)")
    args = ap.parse_args(argv)
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    x = torch.randn(args.n, generator=torch.Generator().manual_seed(0))
    out = torch.empty_like(x)
    t_copy = best(lambda: out.copy_(x), args.repeats)
    print(f"{'what':44s} {'ms':>9s} {'Melem/s':>9s} {'% copy':>7s}")
    print(f"{'out.copy_(x)':44s} {t_copy * 1e3:9.2f} {args.n / t_copy / 1e6:9.1f} {100:6.0f}%")
    for label, fmt in (("e5m2", "fp8_152"), ("posit16", "posit16"), ("posit8", "posit8"), ("nf4 (codebook)", "nf4"),
                       ("lns5_10 (LogFormat)", "lns5_10"), ("cube5 (CustomFormat, user njit)", cube5())):
        for mode in ("nearest", "stochastic"):
            t = best(lambda: emunum.quantize(x, fmt, mode, seed=1, out=out), args.repeats)
            print(f"{'quantize ' + label + ', ' + mode:44s} {t * 1e3:9.2f} {args.n / t / 1e6:9.1f} "
                  f"{100 * t_copy / t:6.0f}%")
    if args.gemm:
        n = args.gemm
        g = torch.Generator().manual_seed(1)
        a = emunum.quantize(torch.randn(n, n, generator=g), "e4m3fn")
        b = emunum.quantize(torch.randn(n, n, generator=g), "e4m3fn")
        units = [("exact products, fp32 accumulation", emunum.MADUnit(None, "fp32", fused=True))]
        try:
            from emunum.mad import Multiplier

            fmt = emunum.get_format("e4m3fn")
            vals = fmt.decode(np.arange(256))
            lut = np.where(np.isfinite(vals[:, None] * vals[None, :]), vals[:, None] * vals[None, :], 0.0)
            units.append(("LUT multiplier (exact e4m3fn products), fp32 acc",
                          emunum.MADUnit(None, "fp32", fused=True, multiplier=Multiplier.table(lut, fmt))))
            units.append(("Mitchell multiplier, fp32 acc", emunum.MADUnit(None, "fp32", fused=True,
                                                                         multiplier=Multiplier.mitchell())))
        except (ImportError, TypeError, AttributeError) as e:
            print(f"# no approximate-multiplier rows: {type(e).__name__}: {e}")
        for label, unit in units:
            t = best(lambda: emunum.matmul(a, b, unit), max(1, args.repeats // 2))
            print(f"{'matmul ' + str(n) + '^3, ' + label:60s} {t * 1e3:9.2f} ms {n ** 3 / t / 1e9:8.4f} GMAC/s")


if __name__ == "__main__":
    main()
