"""The uint32-lane float32 loops (kernels/elementwise_f32.py) beside the cores they replaced, in one process.

    python benchmarks/elementwise_f32.py              # 16M float32 (randn * 100), e5m2, 2 numba threads
    python benchmarks/elementwise_f32.py --rounds 5   # more interleaved rounds

Rows, each the best of --repeats timings per round, the rounds interleaved (so that a change of the machine's
load or of its memory regime hits every row alike); "% copy" against out.copy_(x) of the same round:
  out.copy_(x)                        the memory-copy ceiling (torch)
  x.to(torch.float8_e5m2).float()     torch's own cast
  nearest out= / stochastic out=      emunum.quantize(x, fmt[, 'stochastic'], out=out): the new loops
  nearest, previous core              the previous f32 nearest loop (float64 Veltkamp, round_nearest_value)
  stochastic, previous core           the previous f32 stochastic loop (round_f32_fast, 64-bit lanes)
  nearest / stochastic in place       emunum.quantize(y, fmt, out=y)
  nearest, new output                 emunum.quantize(x, fmt): a fresh (huge-page backed) output
  fault a new output                  buffers.empty_like(x) with its pages written by madvise(MADV_POPULATE_WRITE)
                                      from 2 threads: the kernel's zeroing of 64 MB, the floor under a new output
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numba import njit, prange

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import emunum  # noqa: E402
from emunum import buffers  # noqa: E402
from emunum.kernels import cpu  # noqa: E402
from emunum.kernels.scalar import random_bits, round_f32_fast, round_nearest_value  # noqa: E402


@njit(parallel=True)
def previous_nearest(sf, df, man, emin, sub, max_value, ovf, negzero):
    split, magic, mn, ovfv = cpu._nearest_params(man, emin, sub, max_value, ovf)
    for i in prange(sf.size):
        df[i] = round_nearest_value(np.float64(sf[i]), split, magic, mn, max_value, ovfv, negzero)


@njit(parallel=True)
def previous_sr(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
    for i in prange(src.size):
        dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, 6, random_bits(key, i, nbits), nbits)


def _populate(pool, t: torch.Tensor) -> None:
    madvise = buffers._resolve_madvise()
    p, nb = t.data_ptr(), t.numel() * t.element_size()
    lo, hi = (p + 4095) & ~4095, (p + nb) & ~4095
    half = ((hi - lo) // 2 + 4095) & ~4095
    for f in [pool.submit(madvise, lo, half, 23), pool.submit(madvise, lo + half, hi - lo - half, 23)]:
        f.result()  # MADV_POPULATE_WRITE (Linux 5.14+); a failure leaves the faults to the first writes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2-n", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--format", default="fp8_152")
    args = ap.parse_args()
    n, fmt = 1 << args.log2_n, args.format
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 100
    out, y = torch.empty_like(x), x.clone()
    xs, os_ = x.numpy(), out.numpy()
    man, emin, sub, mx, ovf, negzero = emunum.get_format(fmt).to_kernel_args()
    mb, key = np.int64(cpu.max_bits(mx, np.float32)), np.uint64(emunum.rng.seed_key(1))
    pool = ThreadPoolExecutor(2)

    def fault():
        _populate(pool, buffers.empty_like(x))

    rows = [
        ("out.copy_(x)", lambda: out.copy_(x)),
        ("x.to(torch.float8_e5m2).float()", lambda: x.to(torch.float8_e5m2).float()),
        (f"quantize(x, {fmt!r}, out=out)", lambda: emunum.quantize(x, fmt, out=out)),
        ("nearest, previous core", lambda: previous_nearest(xs, os_, man, emin, sub, float(mx), ovf, negzero)),
        (f"quantize(x, {fmt!r}, 'stochastic', out=out)",
         lambda: emunum.quantize(x, fmt, "stochastic", seed=1, out=out)),
        ("stochastic, previous core", lambda: previous_sr(xs.view(np.uint32), os_.view(np.uint32), man, emin, sub, mb,
                                                          ovf, negzero, key, 32)),
        (f"quantize(y, {fmt!r}, out=y)", lambda: emunum.quantize(y, fmt, out=y)),
        (f"quantize(y, {fmt!r}, 'stochastic', out=y)", lambda: emunum.quantize(y, fmt, "stochastic", seed=1, out=y)),
        (f"quantize(x, {fmt!r})", lambda: emunum.quantize(x, fmt)),
        ("fault a new output (64 MB, 2 threads)", fault),
    ]
    best = {name: [] for name, _ in rows}
    print(f"# n = {n} float32, {fmt}; best of {args.repeats} per round, {args.rounds} interleaved rounds; "
          f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for _ in range(args.rounds):
        for name, fn in rows:
            fn()
            b = float("inf")
            for _ in range(args.repeats):
                t = time.perf_counter()
                fn()
                b = min(b, time.perf_counter() - t)
            best[name].append(b * 1e3)
    copy = best["out.copy_(x)"]
    print(f"{'operation':<48} " + " ".join(f"{'ms r' + str(r + 1):>8} {'%copy':>6}" for r in range(args.rounds)))
    for name, _ in rows:
        print(f"{name:<48} " + " ".join(f"{t:8.2f} {100 * c / t:5.0f}%" for t, c in zip(best[name], copy)))
    print(f"# load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
