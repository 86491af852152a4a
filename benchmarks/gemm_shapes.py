"""Where a training step's MAD GEMM time goes: each `gemm_cpu.gemm` call of the fp8 recipe's step, by shape.

    python benchmarks/gemm_shapes.py [--recipe fp8] [--steps 10] [--model cnn2d]

Wraps ``emunum.kernels.gemm_cpu.gemm`` to time every call (and, separately, its ``fast_plan``) over --steps
steps of benchmarks/train_step.py's model (``--model``: the default CNN on MNIST-1D, or its small 2-D CNN; one
thread), then prints per (A shape, B shape): calls per step, ms per call of the planner and of the whole GEMM,
GMAC/s and the plan (work dtype, mul_sub, acc_sub, checks, mul_exact; "general/vec" where gemm_fast does not
apply). A convolution's per-sample GEMMs (``gemm_cpu.conv``, kernels/conv_fast.py: its columns made in the kernel)
are timed as one row, shaped as the GEMM on the batch's columns, marked "conv_fast".
The planner is called twice per GEMM here (once by the wrapper), so the step time printed is inflated by it.
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_step  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="fp8", choices=sorted(train_step.RECIPES))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", default="cnn1d", choices=("cnn1d", "cnn2d"))
    a = p.parse_args()
    from emunum.kernels import gemm_cpu

    rec = collections.defaultdict(lambda: [0, 0.0, 0.0, None])
    orig = gemm_cpu.gemm

    def timed(A, B, bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, fast=None, scans=None):
        t0 = time.perf_counter()
        plan = gemm_cpu.fast_plan(A, B, fused, mulp, accp, scans, lanes, chunk)
        t1 = time.perf_counter()
        orig(A, B, bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, fast, scans)
        r = rec[(A.shape, B.shape)]
        r[0] += 1
        r[1] += t1 - t0
        r[2] += time.perf_counter() - t1
        r[3] = plan

    orig_conv = gemm_cpu.conv

    def timed_conv(x, A, bias, out, fused, mulp, accp, lanes, chunk, geometry, scans):
        # a convolution's per-sample GEMMs (kernels/conv_fast.py), keyed as the GEMM on the batch's columns
        t0 = time.perf_counter()
        ran = orig_conv(x, A, bias, out, fused, mulp, accp, lanes, chunk, geometry, scans)
        if ran:
            G, K, L = A.shape[0], A.shape[2], geometry[6] * geometry[7]
            r = rec[(A.shape, (x.shape[0] * G, K, L), "conv_fast")]
            r[0] += 1
            r[2] += time.perf_counter() - t0
            r[3] = "conv_fast (plan inside)"
        return ran

    gemm_cpu.gemm = timed
    gemm_cpu.conv = timed_conv
    step, _ = train_step.build(train_step.RECIPES[a.recipe], 1, a.model)
    for _ in range(3):
        step()
    rec.clear()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    print(f"{a.recipe}: {(time.perf_counter() - t) / a.steps * 1e3:.2f} ms per step (planner timed twice)")
    for (sa, sb, *_), (n, tp, tg, plan) in sorted(rec.items(), key=lambda kv: -kv[1][2]):
        macs = max(sa[0], sb[0]) * sa[1] * sa[2] * sb[2]
        kind = plan if isinstance(plan, str) else "general/vec" if plan is None else (plan[0].__name__, *plan[1:])
        print(f"A{sa} B{sb}  {n / a.steps:4.1f}/step  plan {tp / n * 1e3:7.3f} ms  gemm {tg / n * 1e3:7.3f} ms  "
              f"{macs / (tg / n) / 1e9:6.2f} GMAC/s  {kind}")


if __name__ == "__main__":
    main()
