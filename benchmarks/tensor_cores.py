"""Tensor-core presets against the full measured data: the GPU x format table of matched vectors.

For every GPU x input-format pair under PATH (the ``model_validation`` directory of
github.com/north-numerical-computing/MATLAB-tensor-core, 5,000 vectors per pair), prints how many vectors
d = a.b + c each datapath reproduces bit for bit: the pair's preset (``MADUnit.preset``), the exact sum
rounded once to fp32 (round to nearest; what fp32 emulators assume; fp16 for fp16-output rows) and per-product rounding (fp32 products
and fp32 sums, sequential, round to nearest). fp16-output rows use the ``*_out_fp16`` presets (c rounded to
fp16 first) against ``d_*_fp16.txt``. Also times one ``baddbmm`` over the 5,000 vectors of H100 fp8 (K = 32).

    python benchmarks/tensor_cores.py PATH/model_validation [--markdown]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import emunum
from emunum import MADUnit
from emunum.mad import hwdata
from emunum.mad.presets import TABLE, UNVALIDATED, canonical


def matched(unit, a, b, c, d) -> int:
    got = emunum.baddbmm(c.reshape(-1, 1, 1), a.unsqueeze(1), b.unsqueeze(2), unit).reshape(-1)
    return int((got.to(torch.float32).numpy().view(np.uint32) == d.view(np.uint32)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="the model_validation directory of MATLAB-tensor-core")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    exact = MADUnit(None, "exact", fused=True, acc_rounding="nearest")
    per_product = MADUnit("fp32", "fp32")
    rows = []
    for p in hwdata.load_all(args.path):
        for out in ("fp32", "fp16"):
            d = p.d32 if out == "fp32" else p.d16
            if d is None:
                continue
            name = p.preset + ("" if out == "fp32" else "_out_fp16")
            c = np.zeros_like(p.c) if p.c_is_zero else p.c
            if out == "fp16":
                c = c.astype(np.float16).astype(np.float32)
            a, b, ct = torch.from_numpy(p.a), torch.from_numpy(p.b), torch.from_numpy(c)
            key = canonical(name)
            if key in TABLE or key in UNVALIDATED:
                preset = str(matched(MADUnit.preset(name), a, b, ct, d))
                if key in UNVALIDATED:
                    preset += " (fitted)"
            else:
                preset = "no preset"
            if out == "fp32":
                ex, pp = str(matched(exact, a, b, ct, d)), str(matched(per_product, a, b, ct, d))
            else:  # the exact sum rounded once to fp16 (float16 tensors in and out)
                ex, pp = str(matched(exact, a.half(), b.half(), ct.half(), d)), "-"
            rows.append((p.gpu, p.fmt, out, a.shape[1], len(d), name, preset, ex, pp))
    head = ("GPU", "format", "out", "K", "vectors", "preset", "preset matched", "exact->out RN", "per-product fp32")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(str(x) for x in r) + " |")
    else:
        print(("{:<5} {:<6} {:<5} {:>3} {:>7} {:<24} {:>16} {:>15} {:>17}").format(*head))
        for r in rows:
            print(("{:<5} {:<6} {:<5} {:>3} {:>7} {:<24} {:>16} {:>15} {:>17}").format(*r))
    p = hwdata.load_pair(args.path, "H100", "E4M3")
    a, b = torch.from_numpy(p.a).unsqueeze(1), torch.from_numpy(p.b).unsqueeze(2)
    c = torch.zeros(a.shape[0], 1, 1)
    unit = MADUnit.preset("h100_fp8_e4m3")
    emunum.baddbmm(c, a, b, unit)
    best = min(_timed(lambda: emunum.baddbmm(c, a, b, unit)) for _ in range(5))
    print(f"\nbaddbmm over {a.shape[0]} vectors, K = {a.shape[2]}, h100_fp8_e4m3: {best * 1e3:.1f} ms (best of 5; "
          "target <= 500 ms)")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
