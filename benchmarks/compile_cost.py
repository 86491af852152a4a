"""Cold compile cost of the kernels that dominate a cold ``make test``: each figure is the CPU seconds (user + sys of
one fresh process with an empty numba cache, ``time.process_time``) of a first call, which compiles.

Rows: a first ``gemm_vec`` variant (round-to-odd products and accumulator, chunk 3; it also compiles the shared
lane-reduction and bias cores), a second variant (round-up), and the NVFP4-family scalar-core loop on three 4/6
presets (``quantize_nvfp4(fast=False)``, serial), then the same calls again from the warm cache. Set
``EMUNUM_NUMBA_INLINE_COPY`` as the test suite does (tests/conftest.py sets 1).

To compare two trees, run it once with each on the path (``PYTHONPATH=<tree>``), alternating.

    python benchmarks/compile_cost.py [--rounds 1]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import time
import numpy as np, torch, emunum
from emunum import MADUnit
from emunum.formats import BLOCK_PRESETS
from emunum.block_quantize import block_args
from emunum.kernels import gemm_cpu, nvfp4_cpu
from emunum.mad.unit import stream_keys
from emunum.nvfp4_quantize import line_arrays
g = torch.Generator().manual_seed(0)
A = emunum.quantize(torch.randn(2, 17, 70, generator=g) * 4, "fp8_152").double().numpy()
B = emunum.quantize(torch.randn(1, 70, 130, generator=g), "fp8_152").double().numpy()
out = np.empty((2, 17, 130))
x = (torch.randn(1, 48, 192, generator=g) * 3).numpy()
def gemm(mode):
    u = MADUnit("fp8_143", "fp16", mul_rounding=mode, acc_rounding=mode, chunk=3)
    mulp, accp = u.kernel_params()
    gemm_cpu.gemm(A, B, None, out, 0, mulp, accp, u.lanes, 3, stream_keys(1), u.sr_bits, fast="vec")
def nvfp4():
    for name in ("nvfp4_4over6", "nvfp4_4over6_mse", "nvfp4_4over6_2d"):
        fmt = BLOCK_PRESETS[name]
        tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
        scales = np.zeros((1, -(-48 // tile[0]), -(-192 // tile[1])))
        lines = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in line_arrays(torch.from_numpy(x), fmt))
        nvfp4_cpu.quantize_nvfp4(x, np.empty_like(x), scales, tile, lines, block_args(fmt, 1.0)[:-1], 0, 1, 32,
                                 parallel=False, fast=False)
row = []
for f in (lambda: gemm("odd"), lambda: gemm("up"), nvfp4):
    t = time.process_time(); f(); row.append(time.process_time() - t)
print(" ".join(f"{v:.2f}" for v in row))
"""


def _run(cache: str) -> list[float]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    env.setdefault("EMUNUM_NUMBA_INLINE_COPY", "1")
    r = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    return [float(v) for v in r.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    import emunum.kernels
    print(f"# kernels from {os.path.dirname(emunum.kernels.__file__)}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':6} {'gemm_vec first':>15} {'gemm_vec second':>16} {'nvfp4 scalar core':>18}   (CPU-s)")
    for r in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="emunum-compile-") as cache:
            cold, warm = _run(cache), _run(cache)
        print(f"cold   {cold[0]:15.2f} {cold[1]:16.2f} {cold[2]:18.2f}")
        print(f"warm   {warm[0]:15.2f} {warm[1]:16.2f} {warm[2]:18.2f}")


if __name__ == "__main__":
    main()
