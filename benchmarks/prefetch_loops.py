"""The float32 nearest and stochastic loops (kernels/elementwise_f32.py, chunks with prefetch hints) beside the
same loops without chunks and hints (the previous loops, defined here on the same cores), in one process.

    python benchmarks/prefetch_loops.py                 # 2**14, 2**16, 2**21 float32, e5m2, one thread
    python benchmarks/prefetch_loops.py --rounds 5

For each size two sources: "in cache" rounds one tensor again and again; "not in cache" rounds, in turn, the
tensors of a 128 MiB pool (as a training step meets its weights and fresh gradients). Output into one tensor.
Rows interleaved per round; each figure is the best over rounds of the mean ns/element (thread CPU time).
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

U32, U64 = np.uint32, np.uint64


@njit(cache=True)
def previous_sr(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
    """The serial stochastic loop before chunks and hints: one pass, the counter advanced by one add."""
    d, hm1, lsb, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n, big, ovf_nan = ew.sr_params(man, emin, sub,
                                                                                              max_bits, ovf, nbits)
    mb = U32(max_bits)
    ctr = U64(key) + ONE * GOLDEN
    drop = U64(64 - nbits)
    for i in range(src.size):
        rnd = U32(mix64(ctr) >> drop)
        ctr += GOLDEN
        dst[U64(i)] = ew.sr_f32(src[U64(i)], rnd, d, hm1, lsb, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n, mb,
                                big, ovf_nan, negzero)


@njit(cache=True)
def previous_nearest(src, dst, man, emin, sub, max_bits, ovf, negzero):
    """The serial nearest loop before chunks and hints."""
    s, hm1, mask, magic, mn_bits, big, ovf_nan = ew.nearest_params(man, emin, sub, max_bits, ovf)
    mb = U32(max_bits)
    for i in range(src.size):
        dst[U64(i)] = ew.nearest_f32(src[U64(i)], s, hm1, mask, magic, mn_bits, mb, big, ovf_nan, negzero)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--format", default="fp8_152")
    ap.add_argument("--sizes", default="14,16,21", help="log2 of the element counts")
    a = ap.parse_args()
    torch.set_num_threads(1)
    k = emunum.get_format(a.format).to_kernel_args()
    fa = (k.man, k.emin, k.subnormals, np.int64(cpu.max_bits(float(k.max), np.float32)), k.overflow, k.negzero)
    if not (ew.sr_ok(k.man, k.emin, k.subnormals, float(k.max)) and ew.nearest_ok(k.man, k.emin, k.subnormals,
                                                                                   float(k.max))):
        raise SystemExit(f"--format={a.format}: the uint32-lane loops do not apply to it")
    key = U64(0x1234_5678_9ABC_DEF0)
    rows = {
        "stochastic, chunks + hints": lambda s, d: ew.sr_serial(s, d, *fa, key, 32, np.int64(0)),
        "stochastic, previous loop": lambda s, d: previous_sr(s, d, *fa, key, 32),
        "nearest, chunks + hints": lambda s, d: ew.nearest_serial(s, d, *fa),
        "nearest, previous loop": lambda s, d: previous_nearest(s, d, *fa),
    }
    print(f"# {a.format}, one thread, load average " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    sizes = [int(x) for x in a.sizes.split(",")]
    time_rows(rows, sizes, a.rounds, same=("stochastic, previous loop", "stochastic, chunks + hints"))


if __name__ == "__main__":
    main()
