"""Where the time of stochastic rounding goes: the float32 CPU loop split into its parts.

    python benchmarks/sr_profile.py                 # one thread, 2**13 float32 (cache resident), e5m2
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx,+avx2,+fma,+bmi2,... python benchmarks/sr_profile.py   # as on AVX2

Serial loops over ``kernels.scalar.round_f32_fast`` (the kernel's own core), best of --repeats timings in
ns per element, so that other processes on the machine matter little:
  copy                 dst[i] = src[i]
  toward_zero          the rounding without the stochastic decision
  nearest, bit-level   round_f32_fast's nearest-even (the kernel itself takes Veltkamp's split for nearest)
  SR, free bits        the stochastic decision with bits that cost one multiply (i * odd constant)
  SR, splitmix64       the kernel's loop (kernels.scalar.random_bits)
  SR, lowbias32 x2     a candidate 32-bit generator: two keyed rounds of Wellons' lowbias32 on the halves of
                       key and index (32-bit multiplies only)
  generator alone      each generator writing its 32-bit words
and, per loop, the vector multiplies in its machine code (vpmullq: AVX-512DQ 64-bit; vpmuludq: 32x32->64).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np
from numba import njit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import emunum  # noqa: E402
from emunum.kernels.scalar import NEAREST, STOCHASTIC, TOWARD_ZERO, random_bits, round_f32_fast  # noqa: E402

U64 = np.uint64
M32 = U64(0xFFFFFFFF)


@njit(inline="always")
def lowbias32(x):
    x ^= x >> U64(16)
    x = (x * U64(0x7FEB352D)) & M32
    x ^= x >> U64(15)
    x = (x * U64(0x846CA68B)) & M32
    return x ^ (x >> U64(16))


@njit(inline="always")
def lowbias32x2_bits(key, index, nbits):
    k, i = U64(key), U64(index)
    h = lowbias32((i ^ k) & M32)
    h = lowbias32(h ^ (k >> U64(32)) ^ (i >> U64(32)))
    return h >> U64(32 - nbits)


@njit(inline="always")
def free_bits(key, index, nbits):
    return ((U64(index) * U64(0x9E3779B1)) & M32) >> U64(32 - nbits)


def _sr_loop(gen):
    @njit
    def loop(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
        for i in range(src.size):
            dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, STOCHASTIC,
                                    gen(key, i, nbits), nbits)
    return loop


def _gen_loop(gen):
    @njit
    def loop(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
        for i in range(dst.size):
            dst[i] = np.uint32(gen(key, i, nbits))
    return loop


@njit
def _copy(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
    for i in range(src.size):
        dst[i] = src[i]


@njit
def _toward_zero(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
    for i in range(src.size):
        dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, TOWARD_ZERO, 0, nbits)


@njit
def _nearest_bits(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
    for i in range(src.size):
        dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, NEAREST, 0, nbits)


def _multiplies(fn) -> str:
    asm = "\n".join(fn.inspect_asm().values())
    c = collections.Counter(line.split()[0] for line in asm.splitlines()
                            if line.startswith("\t") and "mul" in line.split()[0])
    vec = "zmm" if "zmm" in asm else ("ymm" if "ymm" in asm else "none")
    return f"widest vector {vec}; " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log2-n", type=int, default=13)
    p.add_argument("--repeats", type=int, default=2000)
    p.add_argument("--format", default="fp8_152")
    args = p.parse_args()
    n = 1 << args.log2_n
    src = (np.random.default_rng(0).standard_normal(n) * 100).astype(np.float32).view(np.uint32)
    dst = np.empty(n, np.uint32)
    _, man, emin, sub, max_value, ovf, negzero = emunum.get_format(args.format).to_kernel_args()
    max_bits = np.int64(np.array(max_value, dtype=np.float32).view(np.uint32))
    call = (src, dst, man, emin, sub, max_bits, ovf, negzero, U64(0x0123456789ABCDEF), 32)

    rows = [("copy", _copy), ("toward_zero", _toward_zero),
            ("nearest, bit-level core", _nearest_bits), ("SR, free bits", _sr_loop(free_bits)),
            ("SR, splitmix64 (kernel)", _sr_loop(random_bits)), ("SR, lowbias32 x2", _sr_loop(lowbias32x2_bits)),
            ("generator alone: splitmix64", _gen_loop(random_bits)),
            ("generator alone: lowbias32 x2", _gen_loop(lowbias32x2_bits))]

    def best(fn) -> float:
        fn(*call)
        b = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn(*call)
            b = min(b, time.perf_counter() - t)
        return b / n * 1e9

    print(f"# {args.format}, {n} float32, one thread, best of {args.repeats}; load {os.getloadavg()[0]:.2f}")
    times = {name: [] for name, _ in rows}
    for _ in range(2):  # interleaved, twice
        for name, fn in rows:
            times[name].append(best(fn))
    for name, fn in rows:
        print(f"{name:<32} {min(times[name]):7.3f} ns/elem   {_multiplies(fn)}")


if __name__ == "__main__":
    main()
