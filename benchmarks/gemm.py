"""GEMM throughput of emulated MAD units (emunum.matmul) next to torch.matmul, in GMAC/s.

Default: 512x512x512, operands in e5m2 (1-5-2), MADUnit(mul_fmt="fp8_152", acc_fmt="fp16_169", chunk=64)
(Wang et al. 2018's 1-5-2 products and 1-6-9 accumulator), on the CPU kernels; then the fp8 recipe's unit,
MADUnit("fp16_169", "fp16_169", chunk=64) (experiments/conf/format/fp8.yaml: 1-6-9 products, exact for e5m2
operands, so ``gemm_fast`` skips their rounding and fuses each product into its sum). Each figure is the best of
--repeat timed calls after one warm-up call (which compiles, or loads numba's cache). Also printed: the
median, the CPU time per call (all threads; contention on a shared machine shows as wall >> cpu / threads),
the fast-kernel plan the dispatcher took.

General rows (target >= 1 GMAC/s): units the round-to-nearest fast kernel cannot run
(stochastic, directed, odd and nearest-away modes, fused, lanes, fixed-point accumulators) at --general-size,
through emunum.matmul (the dispatcher picks kernels/gemm_vec.py), each next to the reference per-element kernel
``gemm_general`` on the same operands in the same run (--baseline-repeat timed calls after a warm-up; 0: skip).

Matrix-instruction rows: ``emunum.mad.scaled_mm`` on the block-scaled presets at --mma-size (0: skip), each
beside torch.matmul on the same element values (benchmarks/gemm_mma.py).

Multi-term rows: tensor-core presets h100_fp8_e4m3 (e4m3 operands) and a100_bf16 (bf16
operands), and exact (Kulisch) accumulation, at --mt-size, on the multi-term kernels (0: skip); the kernel
``gemm_auto`` chose is named in the row; --mt-old adds each unit's pre-float64 kernel as a same-run baseline.

    python benchmarks/gemm.py [--size 512] [--repeat 5] [--general-size 512] [--baseline-repeat 1]
                              [--mt-size 512] [--mt-old] [--mma-size 512] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numba
import numpy as np
import torch

import emunum
from emunum import MADUnit, torch_cpu
from emunum.kernels import gemm_cpu


def timed(fn, repeat: int) -> tuple[float, float, float]:
    """(best wall s, median wall s, mean cpu s) over ``repeat`` calls after one warm-up call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return min(walls), statistics.median(walls), statistics.mean(cpus)


def line(name: str, macs: int, best: float, median: float, cpu: float) -> str:
    return (f"{name:<58} {macs / best / 1e9:8.3f} GMAC/s (best)  {macs / median / 1e9:8.3f} (median)  "
            f"{best * 1e3:8.2f} ms  cpu {cpu * 1e3:8.2f} ms/call = {macs / cpu / 1e9:7.3f} GMAC per cpu-second")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512, help="M = K = N (default 512)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--general-size", type=int, default=512, help="size for the general rows (0: skip)")
    ap.add_argument("--baseline-repeat", type=int, default=1,
                    help="timed calls of the reference gemm_general per general row (0: skip the baseline)")
    ap.add_argument("--mt-size", type=int, default=512, help="size for the multi-term rows (0: skip)")
    ap.add_argument("--threads", type=int, default=0, help="numba and torch threads (0: leave the defaults)")
    ap.add_argument("--mt-old", action="store_true", help="multi-term rows: also time the old kernels (slow)")
    ap.add_argument("--mma-size", type=int, default=512, help="size for the matrix-instruction rows (0: skip)")
    args = ap.parse_args()
    if args.threads:
        torch_cpu.set_threads(args.threads)
    n = args.size
    g = torch.Generator().manual_seed(0)
    A = emunum.quantize(torch.randn(n, n, generator=g), "fp8_152")
    B = emunum.quantize(torch.randn(n, n, generator=g), "fp8_152")
    macs = n**3
    unit = MADUnit("fp8_152", "fp16_169", chunk=64)
    plan = gemm_cpu.fast_plan(A.numpy()[None], B.numpy()[None], 0, *unit.kernel_params(), lanes=unit.lanes,
                              chunk=unit.chunk or 0)
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("n/a",)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, numba threads "
          f"{numba.get_num_threads()} ({numba.threading_layer() if hasattr(numba, 'threading_layer') else ''}), "
          f"torch threads {torch.get_num_threads()}, load average {load[0]:.2f}")
    print(f"# {n}x{n}x{n}, operands e5m2; fast-kernel plan (work dtype, mul_sub, acc_sub, checks): "
          f"{None if plan is None else (plan[0].__name__, *plan[1:])}")
    print(line(f"emunum.matmul {unit}", macs, *timed(lambda: emunum.matmul(A, B, unit), args.repeat)))
    recipe = MADUnit("fp16_169", "fp16_169", chunk=64)  # exact products: gemm_fast's fused-multiply-add path
    print(line(f"emunum.matmul {recipe}", macs, *timed(lambda: emunum.matmul(A, B, recipe), args.repeat)))
    print(line("torch.matmul float32 (same operands)", macs, *timed(lambda: torch.matmul(A, B), args.repeat)))
    if args.general_size:
        general_rows(A, B, args.general_size, args.repeat, args.baseline_repeat)
    if args.mt_size:
        multiterm_rows(args.mt_size, args.repeat, args.mt_old)
    if args.mma_size:
        from gemm_mma import mma_rows  # benchmarks/gemm_mma.py

        mma_rows(args.mma_size, args.repeat, timed, line)
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("n/a",)
    print(f"# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


GENERAL_UNITS = [
    MADUnit("fp8_152", "fp16_169", acc_rounding="stochastic", chunk=64),
    MADUnit("fp8_152", "fp16_169", mul_rounding="toward_zero", acc_rounding="toward_zero", chunk=64),
    MADUnit("fp8_152", "bf16", mul_rounding="up", acc_rounding="down"),
    MADUnit("fp8_152", "fp16", mul_rounding="odd", acc_rounding="odd"),
    MADUnit("fp8_152", "fp16_169", mul_rounding="nearest_away", acc_rounding="nearest_away", chunk=64),
    MADUnit(None, "bf16", fused=True, lanes=4),
    MADUnit("fp8_152", "bf16", mul_rounding="stochastic", acc_rounding="stochastic", lanes=4, sr_bits=16),
    MADUnit("fp8_152", "fixed24_8", acc_rounding="stochastic", chunk=64),
]


def general_rows(A, B, m: int, repeat: int, baseline_repeat: int) -> None:
    """Each general unit through emunum.matmul, then the reference ``gemm_general`` on the same operands."""
    import numpy as np

    from emunum.mad.unit import stream_keys

    As, Bs = A[:m, :m].contiguous(), B[:m, :m].contiguous()
    a, b = As.numpy()[None], Bs.numpy()[None]
    out = np.empty((1, m, m))
    for unit in GENERAL_UNITS:
        mulp, accp = unit.kernel_params()
        kernel = gemm_cpu.kernel_choice(a, b, int(unit.fused), mulp, accp)
        print(line(f"emunum.matmul {unit} ({m}^3, {kernel})", m**3,
                   *timed(lambda: emunum.matmul(As, Bs, unit, seed=0), repeat)))
        if baseline_repeat:
            def ref():
                gemm_cpu.gemm(a, b, None, out, int(unit.fused), mulp, accp, unit.lanes, unit.chunk or 0,
                              stream_keys(0), unit.sr_bits, fast=False)
            print(line(f"  baseline gemm_general, same unit and operands ({m}^3)", m**3, *timed(ref, baseline_repeat)))


def multiterm_rows(m: int, repeat: int, old: bool) -> None:
    """Each unit through emunum.matmul (the dispatcher's fastest kernel; which one is printed), and with old,
    the kernels from before the float64 ones (``gemm_auto(fast=False)``: integer or general) on the same
    operands, as a same-run baseline."""
    g = torch.Generator().manual_seed(1)
    for label, unit, fmt in (("h100_fp8_e4m3", MADUnit.preset("h100_fp8_e4m3"), "e4m3fn"),
                             ("a100_bf16", MADUnit.preset("a100_bf16"), "bf16"),
                             ("exact (Kulisch), fp32 out", MADUnit(None, "exact", fused=True), "bf16")):
        A = emunum.quantize(torch.randn(m, m, generator=g), fmt)
        B = emunum.quantize(torch.randn(m, m, generator=g), fmt)
        kernel = _multiterm_call(A, B, unit, True)()
        print(line(f"emunum.matmul {label} ({m}^3, {kernel})", m**3,
                   *timed(lambda: emunum.matmul(A, B, unit), repeat)))
        if old:
            call = _multiterm_call(A, B, unit, False)
            print(line(f"  same, old kernel ({call()}, same run)", m**3, *timed(call, repeat)))
    print(line(f"torch.matmul float32 ({m}^3, same run)", m**3, *timed(lambda: torch.matmul(A, B), repeat)))


def _multiterm_call(A, B, unit, fast):
    """A call of ``gemm_multiterm.gemm_auto`` on A @ B as ``emunum.matmul`` makes it; returns the kernel's name."""
    from emunum.kernels import gemm_multiterm
    from emunum.mad.unit import stream_keys

    a, bt = A.float().numpy()[None], B.float().T.contiguous().numpy()[None]
    c = np.zeros((1, A.shape[0], B.shape[1]))
    out = np.empty_like(c)
    prm, mulp, accp, outerp = (tuple(int(v) for v in p) for p in unit.multiterm_params(torch.float32))
    keys = tuple(np.uint64(k) for k in stream_keys(0))
    return lambda: gemm_multiterm.gemm_auto(a, bt, c, np.zeros((1, 1, 1)), False, out, prm, mulp, accp, outerp, keys,
                                            unit.sr_bits, fast=fast)


if __name__ == "__main__":
    main()
