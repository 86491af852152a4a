"""Where gemm_vec's cycles go, per unit of benchmarks/gemm.py's general rows: an ablation of its inner loop.

For each unit, five loops over one 64-column accumulator row (L1-resident) and K = 20000 products per column,
one thread, each adding one part of the datapath to the previous: skeleton (a*b + acc), the stochastic bits
(``gemm_vec._bits``), the product's rounding, the sum (TwoSum + round-to-odd, or plain where ``exact_sums``
holds for the benchmark's operands), the accumulator's rounding. Printed: the cycles per product each part
adds, at the clock given by --ghz (an assumption: the VM exposes no cycle counter). Differences below ~0.1
cycle are noise; a part whose result feeds only a cheap stand-in may be partly hidden in the later ones.

    python benchmarks/gemm_vec_parts.py [--ghz 2.6] [unit indices]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np
from numba import njit

from emunum.kernels import gemm_vec as gv
from emunum.kernels.gemm_scalar import P_KIND, P_MODE, P_SAT
from emunum.kernels.scalar import GOLDEN, STOCHASTIC

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm import GENERAL_UNITS  # noqa: E402


def _loop(FUSED, MMODE, AMODE, AFIX, EXACT, LEVEL):
    @njit
    def loop(acc, B, a, mi, mf, mw, ai, af, aw, colz, kmul, kacc, nbits, K):
        for k in range(K):
            brow = B[k]
            zb = np.uint64(k * 1000 + 7) * GOLDEN
            zm, za = kmul + zb, kacc + zb
            for jj in range(acc.size):
                p = a[k] * brow[jj]
                rm = gv._bits(zm, colz, jj, nbits, MMODE == STOCHASTIC and LEVEL >= 1 and not FUSED)
                ra = gv._bits(za, colz, jj, nbits, AMODE == STOCHASTIC and LEVEL >= 1)
                if LEVEL >= 2 and not FUSED:
                    p = gv._round(p, rm, mi, mf, mw, MMODE, 0, False)
                else:
                    p = p + float(rm & np.uint64(1))
                s = gv._sum(p, acc[jj], EXACT) if LEVEL >= 3 else p + acc[jj]
                if LEVEL >= 4:
                    acc[jj] = gv._round(s, ra, ai, af, aw, AMODE, AFIX, False)
                else:
                    acc[jj] = s + float(ra & np.uint64(1))
    return loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("units", type=int, nargs="*", help="indices into benchmarks/gemm.py GENERAL_UNITS (default all)")
    ap.add_argument("--ghz", type=float, default=2.6)
    args = ap.parse_args()
    numba.set_num_threads(1)
    K = 20000
    rng = np.random.default_rng(0)
    a = np.round(rng.standard_normal(K) * 8) / 8
    B = np.round(rng.standard_normal((K, 64)) * 8) / 8
    colz = (np.arange(64, dtype=np.uint64) * np.uint64(K)) * GOLDEN
    print(f"# load average {os.getloadavg()[0]:.2f}; cycles per product at {args.ghz} GHz, one thread")
    for u in args.units or range(len(GENERAL_UNITS)):
        unit = GENERAL_UNITS[u]
        mulp, accp = unit.kernel_params()
        mi, mf, mw = gv.consts(mulp, unit.sr_bits)
        ai, af, aw = gv.consts(accp, unit.sr_bits)
        afix = 0 if accp[P_KIND] == 0 else (1 if accp[P_SAT] else 2)
        amode = int(accp[P_MODE])
        ops = np.full((1, 512, 512), 4.0)  # the benchmark's operands are below 4 in magnitude
        exact = gv.exact_sums(ops, ops, unit.fused, mulp, accp)
        flags = (bool(unit.fused), -1 if unit.fused else int(mulp[P_MODE]),
                 amode if not afix or amode == STOCHASTIC else -1, afix, exact)
        prev, parts = 0.0, []
        for level in range(5):
            f = _loop(*flags, level)
            acc = np.zeros(64)
            call = (acc, B, a, mi, mf, mw, ai, af, aw, colz, np.uint64(123), np.uint64(456), unit.sr_bits, K)
            f(*call)
            best = np.inf
            for _ in range(5):
                t = time.perf_counter()
                f(*call)
                best = min(best, time.perf_counter() - t)
            cyc = best * args.ghz * 1e9 / (K * 64)
            parts.append(cyc - prev)
            prev = cyc
        names = ("skeleton", "bits", "mul round", "sum", "acc round")
        print(f"{u} {str(unit):<62} exact sums {exact:d}  " + "  ".join(f"{n} {p:+.2f}" for n, p in zip(names, parts))
              + f"  total {prev:.2f}", flush=True)


if __name__ == "__main__":
    main()
