"""The float32 stochastic loop (kernels/elementwise_f32.py: each chunk's random words into a stack buffer, then the
rounding on 32-bit lanes) beside the loop it replaced and beside that loop's parts, in one process.

    python benchmarks/sr_words.py                  # 2**16 and 2**21 float32, e5m2, one thread, 32 random bits
    python benchmarks/sr_words.py --rounds 7 --nbits 8

Rows (serial loops, chunks of 256 with the same prefetch hints; ns/element, thread CPU time):
  stochastic, words buffered    ew.sr_serial as it is
  stochastic, one pass          the loop before (random word and rounding in one pass, its shifts as numba
                                types them, the remainder rounded by the 2**23 magic), defined here: the baseline
  parts of the one-pass loop:
    random words only           the generator, its word xor-ed into the source (so that the source is read)
    rounding, free bits         the rounding core with bits that cost one multiply (i * odd constant)
    words + normal range only   the generator and the rounding of |x| >= 2**emin alone (no subnormal-range path)
  nearest                       ew.nearest_serial (e4m3fn-like parameters of --format)
  copy                          dst[i] = src[i]
"In cache" rounds one source again and again; "not in cache" the sources of a 128 MiB pool in turn (as a training
step meets its fresh gradients). Each figure is the best over --rounds of the mean. The two stochastic loops are
checked to give the same bits before timing.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from numba import njit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import emunum  # noqa: E402
from loop_rows import time_rows  # noqa: E402
from emunum.kernels import cpu, elementwise_f32 as ew  # noqa: E402
from emunum.kernels.scalar import GOLDEN, ONE, mix64  # noqa: E402

U32, U64, F32 = np.uint32, np.uint64, np.float32
CHUNK = ew.CHUNK


@njit(inline="always")
def previous_core(u, rnd, d, hm1_d, lsb_d, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n, max_bits, big,
                  ovf_nan, negzero):
    """``ew.sr_f32`` as it was: numba's shifts, the remainder rounded by adding and subtracting 2**23."""
    a = U32(u & ew.ABS)
    a1 = U32(U32(U32(a + hm1_d) + U32(U32(a >> (d & U32(31))) & lsb_d)) & mask_d)
    rn = U32(U32(a1 + U32(U32(rnd >> (k & U32(31))) << (d & U32(31)))) & mask_s)
    t = (a.view(F32) * p1) * p2
    kf = F32(U32(t))
    big_f = F32(8388608.0)
    f = (t - kf) * pn
    dr = U32(f if f >= big_f else F32((f + big_f) - big_f))
    up = (dr != U32(0)) & (rnd >= U32(two_n - dr))
    lo = F32(F32(kf + F32(1.0 if up else 0.0)) * pq).view(U32)
    return ew._finish(u, a, lo if a < mn_bits else rn, max_bits, big, ovf_nan, negzero)


@njit(cache=True)
def one_pass(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, part):
    """part 0: the previous loop; 1: random words only; 2: rounding with free bits; 3: words + normal range."""
    d, hm1, lsb, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n, big, ovf_nan = ew.sr_params(man, emin, sub,
                                                                                              max_bits, ovf, nbits)
    mb = U32(max_bits)
    n = U64(src.size)
    drop = U64(64 - nbits)
    for c in range((src.size + CHUNK - 1) // CHUNK):
        ew.prefer_wide_vectors()
        c0 = U64(c) * U64(CHUNK)
        ew.hint(src, c0, n)
        ctr = U64(key) + (c0 + ONE) * GOLDEN
        end = min(c0 + U64(CHUNK), n)
        if part == 0:
            for i in range(c0, end):
                rnd = U32(mix64(ctr) >> drop)
                ctr += GOLDEN
                dst[i] = previous_core(src[i], rnd, d, hm1, lsb, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n,
                                       mb, big, ovf_nan, negzero)
        elif part == 1:
            for i in range(c0, end):
                dst[i] = U32(mix64(ctr) >> drop) ^ src[i]
                ctr += GOLDEN
        elif part == 2:
            for i in range(c0, end):
                dst[i] = previous_core(src[i], U32(i) * U32(2654435761), d, hm1, lsb, mask_d, k, mask_s, mn_bits,
                                       p1, p2, pq, pn, two_n, mb, big, ovf_nan, negzero)
        else:
            for i in range(c0, end):
                rnd = U32(mix64(ctr) >> drop)
                ctr += GOLDEN
                u = src[i]
                a = U32(u & ew.ABS)
                dst[i] = ew._finish(u, a, U32(U32(a + U32(rnd >> (k & U32(31)))) & mask_s), mb, big, ovf_nan,
                                    negzero)


@njit(cache=True)
def copy(src, dst):
    for i in range(src.size):
        dst[i] = src[i]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--format", default="fp8_152")
    ap.add_argument("--nbits", type=int, default=32)
    ap.add_argument("--sizes", default="16,21", help="log2 of the element counts")
    a = ap.parse_args()
    torch.set_num_threads(1)
    k = emunum.get_format(a.format).to_kernel_args()
    fa = (k.man, k.emin, k.subnormals, np.int64(cpu.max_bits(float(k.max), np.float32)), k.overflow, k.negzero)
    if not ew.sr_ok(k.man, k.emin, k.subnormals, float(k.max)):
        raise SystemExit(f"--format={a.format}: the uint32-lane loops do not apply to it")
    key, nb = U64(0x1234_5678_9ABC_DEF0), a.nbits
    rows = {
        "stochastic, words buffered": lambda s, d: ew.sr_serial(s, d, *fa, key, nb, np.int64(0)),
        "stochastic, one pass": lambda s, d: one_pass(s, d, *fa, key, nb, 0),
        "  random words only": lambda s, d: one_pass(s, d, *fa, key, nb, 1),
        "  rounding, free bits": lambda s, d: one_pass(s, d, *fa, key, nb, 2),
        "  words + normal range only": lambda s, d: one_pass(s, d, *fa, key, nb, 3),
        "nearest": lambda s, d: ew.nearest_serial(s, d, *fa),
        "copy": lambda s, d: copy(s, d),
    }
    print(f"# {a.format}, {nb} random bits, one thread, load average "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    sizes = [int(x) for x in a.sizes.split(",")]
    time_rows(rows, sizes, a.rounds, same=("stochastic, one pass", "stochastic, words buffered"))


if __name__ == "__main__":
    main()
