"""Cost of checking every CustomFormat code (and catching user exceptions) in the nearest kernels.

    python benchmarks/custom_check.py                # 4M float32 elements, serial and parallel loops

Rows: ``checked`` is emunum's kernel (``emunum.kernels.custom_cpu.custom_runner``: every code checked before from_code
sees it, exceptions caught per element); ``unchecked`` is the loop it replaced, ``from_code(to_code(x))`` with
neither, defined below and run on the same inputs in the same process. The type is a user e5m2 (the README's
example style: to_code does the rounding arithmetic, from_code reads a 256-entry table). Figures: best of
--repeats timings after a warm-up, in millions of elements per second, and the checked/unchecked time ratio.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
from numba import njit, prange

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import emunum  # noqa: E402
from emunum.kernels import custom_cpu  # noqa: E402

TABLE = np.array([float(v) for v in emunum.get_format("fp8_152").decode(np.arange(256))], np.float64)


@njit
def to_code(x):
    if x != x:
        return 0x7E
    s = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a == math.inf:
        return s | 0x7C
    e = math.frexp(a)[1] - 1
    q = e - 2 if e >= -14 else -16
    r = a * 2.0 ** -q
    n = math.floor(r)
    f = r - n
    if f > 0.5 or (f == 0.5 and n % 2 == 1):
        n += 1
    v = n * 2.0 ** q
    if v >= 65536.0:
        return s | 0x7C
    if v < 2.0 ** -14:
        return s | int(v * 2.0 ** 16)
    e2 = math.frexp(v)[1] - 1
    return s | ((e2 + 15) << 2) | int(v * 2.0 ** (2 - e2) - 4)


@njit
def from_code(c):
    return TABLE[c]


@njit
def unchecked_serial(src, dst):
    for i in range(src.size):
        dst[i] = from_code(to_code(np.float64(src[i])))


@njit(parallel=True)
def unchecked_parallel(src, dst):
    for i in prange(src.size):
        dst[i] = from_code(to_code(np.float64(src[i])))


def best(fn, repeats):
    fn()
    t = math.inf
    for _ in range(repeats):
        s = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - s)
    return t


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1 << 22)
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args(argv)
    fmt = emunum.CustomFormat(to_code, from_code, 8, name="user_e5m2")
    x = torch.randn(a.n, generator=torch.Generator().manual_seed(0)) * 100
    y = torch.empty_like(x)
    xs, ys = x.numpy(), y.numpy()
    run = custom_cpu.custom_runner(np.float32, fmt)
    for par, name in ((False, "serial"), (True, "parallel")):
        base = unchecked_parallel if par else unchecked_serial
        t0 = best(lambda: base(xs, ys), a.repeats)
        want = y.clone()
        t1 = best(lambda: run(x.data_ptr(), y.data_ptr(), a.n, 0, 0, 32, par), a.repeats)
        assert torch.equal(want, y), "checked and unchecked loops disagree"
        t0b = best(lambda: base(xs, ys), a.repeats)  # again, after: drift on a shared machine shows here
        print(f"{name:<8}  unchecked {a.n / min(t0, t0b) / 1e6:8.1f} M/s   checked {a.n / t1 / 1e6:8.1f} M/s   "
              f"checked/unchecked time {t1 / min(t0, t0b):.3f} (unchecked before/after {t0 * 1e3:.2f}/"
              f"{t0b * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
