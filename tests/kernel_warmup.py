"""Compile the kernels that every pytest-xdist worker needs once, before the workers start their tests.

Without this, at the start of ``make test`` both workers run files that round float32, float64, fixed-point and
block-format tensors, and each compiles the same kernels at the same moment (measured with an empty cache: about
90 CPU-seconds compiled twice). The controller starts two processes while the workers collect: one rounds
float32 tensors to a float format, the other float64 tensors to float and fixed-point formats and float32 tensors
to fixed point, in every rounding mode, each at a small size (serial and pointer kernels) and a large one (parallel
kernels), and one block format each. The first test is held back until both have written
numba's disk cache; the workers then load the kernels from it.
A warm-up that fails only costs its time: the tests compile what they need, as without it.
"""
from __future__ import annotations

import os
import subprocess
import sys

_CODE = """
import sys, torch, emunum
from emunum.kernels import cpu
part = sys.argv[1]
modes = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd", "stochastic"]
# (dtype, format): float32 has a loop per mode for float formats and for fixed point (float64 takes the mode
# as an argument for float formats, a loop per mode for fixed point); every mode, since the test files of
# both workers use them all
# (float32 fixed point in the second process: the two then take 21 and 22 CPU-s with empty caches, where float32
# alone took 27 against 16 and a core stood idle at the end)
cases = {"f32": [(torch.float32, "e5m2")],
         "other": [(torch.float64, "e5m2"), (torch.float64, "int8"), (torch.float32, "int8")]}[part]
for n in (100, cpu.PARALLEL_MIN * 2):
    for dtype, fmt in cases:
        for mode in modes:
            emunum.quantize(torch.randn(n, dtype=dtype), fmt, mode, seed=1)
block = {"f32": "nvfp4", "other": "mxfp8_e4m3"}[part]  # the block formats' serial loops
emunum.quantize(torch.randn(64, 64), block, axis=-1)
"""

_procs: list[subprocess.Popen] = []


def start(rootdir: str) -> None:
    """Start the two warm-up processes (the controller's pytest_configure)."""
    for part in ("f32", "other"):
        _procs.append(subprocess.Popen([sys.executable, "-c", _CODE, part], cwd=rootdir, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, env={**os.environ, "NUMBA_NUM_THREADS": "2"}))


def wait(timeout: float = 900) -> None:
    """Wait for the warm-up (before the first test is scheduled); a stuck one is ended, not waited for."""
    while _procs:
        p = _procs.pop()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
