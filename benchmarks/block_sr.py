"""Float32 stochastic rounding of block formats: the kernels/block_sr.py path beside the float64 loop it replaced
for power-of-two scales (``block_cpu.block_range``: MX, every rule; ``mxplus_cpu.mxplus_range``: MX+), same
tensor, same random bits, same run; the bits are checked equal before timing. ``--mode nearest``: the fixed
elements that block_sr rounds to nearest (``nearest_range``: MXINT8, MXINT4) beside the same float64 loop.

    python benchmarks/block_sr.py                 # 4M float32 elements (1024 x 4096), sr_bits 32, best of 7
    python benchmarks/block_sr.py --n 1048576 --repeats 11
    python benchmarks/block_sr.py --mode nearest

Both run on ``threads.launch`` over blocks (numba's thread count); rounds alternate between the two paths and
each keeps its best, so load drift on a shared machine hits them alike.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # run from a checkout without installing

from emunum.block_quantize import block_args  # noqa: E402
from emunum.formats import MXPLUS_PRESETS, RoundMode, get_format  # noqa: E402
from emunum.kernels import block_cpu, block_sr, mxplus_cpu, threads  # noqa: E402
from emunum.mxplus_quantize import mxplus_args  # noqa: E402

SR = int(RoundMode.STOCHASTIC)
NEAREST_FORMATS = ("mxint8", "mxint8_even", "mxint8_rceil", "mxint4", "mxint4_rceil")
KEY = 12345
FORMATS = ("mxfp8_e4m3", "mxfp8_e4m3_rceil", "mxfp8_e5m2_ceil", "mxfp6_e2m3_even", "mxfp4_e2m1", "mxint8",
           "mxint4_rceil", "mxfp8_e4m3_plus", "mxfp4_e2m1_plus")


def paths(name: str, x: np.ndarray, mode: int = SR):
    """(new, old) callables writing (dst, scales) for format ``name`` on (1, R, C) float32 x."""
    if name in MXPLUS_PRESETS:
        fmt = MXPLUS_PRESETS[name]
        args = mxplus_args(fmt)
        tile = (1, 32)  # the MX+ presets: 1-D blocks of 32
        assert fmt.block_size == 32, name

        def new(dst, sc):
            mxplus_cpu.quantize_mxplus(x, dst, sc, tile, args, SR, KEY, 32, parallel=True)

        def old(dst, sc):
            threads.launch(mxplus_cpu.mxplus_range, sc.size, x, dst, sc, *tile, *args, SR, np.uint64(KEY), 32)
    else:
        fmt = get_format(name)
        args = block_args(fmt, 1.0)
        tile = (1, fmt.tile[1]) if fmt.tile[0] == 0 else fmt.tile  # (0, n): 1-D blocks
        assert block_sr.sr_ok(args), name

        def new(dst, sc):
            block_cpu.quantize_blocks(x, dst, sc, tile, args, mode, KEY, 32, parallel=True)

        def old(dst, sc):
            threads.launch(block_cpu.block_range, sc.size, x, dst, sc, *tile, *args, mode, np.uint64(KEY), 32)
    return new, old, tile


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 22, help="elements, a multiple of 4096 (default 2**22)")
    p.add_argument("--repeats", type=int, default=7, help="alternating rounds; the best of each path is reported")
    p.add_argument("--mode", choices=("stochastic", "nearest"), default="stochastic")
    a = p.parse_args(argv)
    if a.n < 4096 or a.n % 4096:
        p.error(f"--n={a.n} must be a positive multiple of 4096")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1, a.n // 4096, 4096)) * np.logspace(-8, 8, 4096)).astype(np.float32)
    print(f"# numba {numba.__version__}, {numba.get_num_threads()} threads; load average {os.getloadavg()}")
    mode = SR if a.mode == "stochastic" else int(RoundMode.NEAREST)
    what = "stochastic rounding (sr_bits 32)" if mode == SR else "rounding to nearest"
    print(f"float32 {what}, x {x.shape[1:]} float32, best of {a.repeats} alternating rounds")
    print(f"{'format':<20} {'block_sr ms':>12} {'float64 loop ms':>16} {'speed-up':>9}")
    for name in FORMATS if mode == SR else NEAREST_FORMATS:
        new, old, tile = paths(name, x, mode)
        nb = (1, -(-x.shape[1] // tile[0]), -(-x.shape[2] // tile[1]))
        outs = [(np.empty_like(x), np.empty(nb)) for _ in range(2)]
        new(*outs[0])
        old(*outs[1])
        if not (np.array_equal(outs[0][0].view(np.uint32), outs[1][0].view(np.uint32))
                and np.array_equal(outs[0][1], outs[1][1], equal_nan=True)):
            print(f"{name}: the two paths differ", file=sys.stderr)
            return 1
        best = [float("inf"), float("inf")]
        for _ in range(a.repeats):
            for k, fn in enumerate((new, old)):
                t = time.perf_counter()
                fn(*outs[k])
                best[k] = min(best[k], time.perf_counter() - t)
        print(f"{name:<20} {best[0] * 1e3:>12.2f} {best[1] * 1e3:>16.2f} {best[1] / best[0]:>8.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
