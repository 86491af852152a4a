"""Matrix-instruction rows of benchmarks/gemm.py: ``emunum.mad.scaled_mm`` on the block-scaled presets at
n x n x n, each beside torch.matmul float32 on the same element values in the same run (GMAC/s).

Operands: standard normal values quantised to the preset's block format along K (nvfp4, mxfp4_e2m1,
mxfp8_e4m3), handed to ``scaled_mm`` as elements and block scales (``emunum.mad.block_mma``'s split), c = 0.
The timed call includes ``scaled_mm``'s input checks (grid and scale validation).

    python benchmarks/gemm_mma.py [--size 512] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os

import torch

from emunum.formats import RoundMode, get_format
from emunum.mad import scaled_mm
from emunum.mad.block import _split
from emunum.rng import seed_key

ROWS = [("b200_mxf4nvf4_ue4m3", "nvfp4", 16), ("b200_mxf4nvf4_ue8m0", "mxfp4_e2m1", 32),
        ("b200_mxf8f6f4_e4m3", "mxfp8_e4m3", 32)]


def operands(n: int, fmt: str, block: int):
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    f = get_format(fmt)
    ea, sa, _ = _split(A, f, -1, RoundMode.NEAREST, seed_key(0), 32)
    eb, sb, _ = _split(B, f, -2, RoundMode.NEAREST, seed_key(0), 32)
    return ea.float(), sa[:, ::block].float(), eb.float(), sb[::block, :].float()


def mma_rows(n: int, repeat: int, timed, line, names=None) -> None:
    for name, fmt, block in ROWS:
        if names and name not in names:
            continue
        a, sa, b, sb = operands(n, fmt, block)
        print(line(f"scaled_mm {name} ({fmt} operands)", n**3, *timed(lambda: scaled_mm(a, sa, b, sb, None, name),
                                                                      repeat)))
        print(line("torch.matmul float32 (same element values)", n**3, *timed(lambda: a @ b, repeat)))


if __name__ == "__main__":
    import gemm  # benchmarks/gemm.py: the same timer and line format

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="preset names (default: all block-scaled presets)")
    args = ap.parse_args()
    print(f"# {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}")
    mma_rows(args.size, args.repeat, gemm.timed, gemm.line, args.only)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")
