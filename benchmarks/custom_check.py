"""Cost of checking every CustomFormat code (and catching user exceptions) in the nearest kernels.

    python benchmarks/custom_check.py                # 4M float32 elements, serial and parallel loops

Rows: ``checked`` is emunum's kernel (``emunum.kernels.custom_cpu.custom_runner``: every code checked before from_code
sees it, and each parallel run records that it finished); ``unchecked`` is the loop it replaced,
``from_code(to_code(x))`` with neither, copied below and called the same way (raw addresses), on the same inputs
in the same process, in interleaved rounds. The type is a user e5m2 (docs/number_systems.md's
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
from numba import carray, njit, prange

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import emunum  # noqa: E402
from emunum.kernels import custom_cpu  # noqa: E402
from emunum.kernels.cpu import _VALUE_WITNESS, _voidptr  # noqa: E402

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


# the loops as they were before the check (kernels/custom_cpu.py at 2e027ff), called the same way
@njit
def unchecked_serial(to_code, from_code, src, dst):
    for i in range(src.size):
        dst[i] = from_code(to_code(np.float64(src[i])))


@njit(parallel=True)
def unchecked_parallel(to_code, from_code, src, dst):
    for i in prange(src.size):
        dst[i] = from_code(to_code(np.float64(src[i])))


@njit
def unchecked_serial_at(to_code, from_code, src, dst, size, w):
    unchecked_serial(to_code, from_code, carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype))


@njit
def unchecked_parallel_at(to_code, from_code, src, dst, size, w):
    unchecked_parallel(to_code, from_code, carray(_voidptr(src), size, w.dtype),
                       carray(_voidptr(dst), size, w.dtype))


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
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args(argv)
    fmt = emunum.CustomFormat(to_code, from_code, 8, name="user_e5m2")
    x = torch.randn(a.n, generator=torch.Generator().manual_seed(0)) * 100
    y = torch.empty_like(x)
    run = custom_cpu.custom_runner(np.float32, fmt.to_kernel_args())
    w = _VALUE_WITNESS[np.dtype(np.float32)]
    tc, fc = fmt.to_code_jit, fmt.from_code_jit
    for par, name in ((False, "serial"), (True, "parallel")):
        base = unchecked_parallel_at if par else unchecked_serial_at
        old = lambda: base(tc, fc, x.data_ptr(), y.data_ptr(), a.n, w)  # noqa: E731
        new = lambda: run(x.data_ptr(), y.data_ptr(), a.n, 0, 0, 32, par)  # noqa: E731
        old()
        want = y.clone()
        new()
        assert torch.equal(want, y), "checked and unchecked loops disagree"
        # interleaved rounds: load from other jobs on a shared machine hits both loops alike
        t_old, t_new = [], []
        for _ in range(a.rounds):
            t_old.append(best(old, a.repeats))
            t_new.append(best(new, a.repeats))
        t0, t1 = min(t_old), min(t_new)
        print(f"{name:<8}  unchecked {a.n / t0 / 1e6:8.1f} M/s   checked {a.n / t1 / 1e6:8.1f} M/s   "
              f"checked/unchecked time {t1 / t0:.3f}   (best of {a.rounds} interleaved rounds x {a.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
