"""Every CUDA kernel types and lowers to NVVM IR as on a GPU (no GPU or CUDA toolkit needed): what numba's
simulator cannot check, since it runs the kernels as Python. All of them lower in one subprocess without the
simulator (one import of numba-cuda and torch), which prints one line per kernel, ``LOWERED <name>`` or ``FAILED
<name> <error>``; each test reads its kernel's line. The kernels that round to fixed point call np.floor
(``kernels/scalar/fixed.py``'s ``round_fixed_value``), which numba-cuda before the pinned version could not lower
(no floor in its CUDA ufunc table): with such a numba-cuda their tests are expected failures that say so."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                                reason="needs numba-cuda (pip install 'emunum[cuda]')")

_LOWER = textwrap.dedent('''
    import sys, traceback, types as pytypes
    from numba import cuda, njit, types
    import numba.cuda.dispatcher as disp
    from numba.cuda.compiler import compile_cuda
    if not hasattr(disp, "get_current_device"):
        print("SKIP numba-cuda internals changed: no dispatcher.get_current_device"); sys.exit(0)
    # device functions ask the current GPU for its compute capability: answer without a GPU
    disp.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(8, 0))
    i64, u64, u16, f32, f64 = types.int64, types.uint64, types.uint16[::1], types.float32, types.float64
    P, KEYS = types.UniTuple(i64, 12), types.UniTuple(u64, 5)
    from emunum.kernels import cuda as kc, gemm_approx_cuda as ga, gemm_cuda as g, gemm_multiterm_cuda as gm
    from emunum.kernels import hifloat8_cuda as h, mma_cuda as mm

    def helpers16(src, dst):  # the 16-bit conversions on their own (fixed16 also needs kernels/scalar/'s)
        i = cuda.grid(1)
        if i < src.size:
            h16 = kc.narrow16(kc.f64_to_binary32(kc.value16(src[i], 10, 15)), 10, 15)
            dst[i] = h16 | kc.narrow16(kc.widen16(src[i], 7, 127), 7, 127)

    @njit
    def user(a, b):  # a multiplier function of the user's
        return a * b + 1.0

    kernels = {}
    tail = (u64, i64, i64, i64, u64, i64)
    kernels["quantize.float32"] = (kc.float_kernel, (types.uint32[::1],) * 2 + (i64,) * 6 + tail)
    kernels["quantize.float64"] = (kc.float_kernel, (types.uint64[::1],) * 2 + (i64,) * 6 + tail)
    kernels["quantize.float16"] = (kc.float16_kernel, (u16, u16) + (i64,) * 5 + tail)
    kernels["quantize.helpers16"] = (helpers16, (u16, u16))
    fixed_tail = (u64,) + (i64,) * 5 + (u64, i64)
    kernels["quantize.fixed32"] = (kc.fixed_kernel, (f32[::1], types.uint32[::1]) * 2 + fixed_tail)
    kernels["quantize.fixed64"] = (kc.fixed_kernel, (f64[::1], types.uint64[::1]) * 2 + fixed_tail)
    kernels["quantize.fixed16"] = (kc.fixed16_kernel, (u16, u16) + (i64,) * 7 + (u64, i64))
    for name, arr in (("binary32", types.uint32[::1]), ("binary64", types.uint64[::1])):
        kernels[f"hifloat8.{name}"] = (h.hif8_kernel, (arr, arr, i64, i64, i64, u64, i64, i64, u64, i64))
    a3, c3 = f32[:, :, ::1], f64[:, :, ::1]
    kernels["gemm.gemm"] = (g.gemm_kernel, (a3, a3, c3, types.boolean, c3, i64, P, P, i64, i64, KEYS, i64))
    kernels["gemm.mad"] = (g.mad_kernel, (f32[::1], f32[::1], f64[::1], f64[::1], i64, P, P, KEYS, i64))
    T = (types.UniTuple(i64, 8), f64[::1])
    for label, prm, fn in (("builtin", (2,) + (0,) * 7, None), ("function", (5,) + (0,) * 7, user)):
        gk, mk = ga.kernels_for(prm, fn)
        kernels[f"multiplier.{label}.gemm"] = (gk, (a3, a3, c3, types.boolean, c3, types.boolean, c3, i64, P, P, i64,
                                                    i64, KEYS, i64) + T)
        kernels[f"multiplier.{label}.mad"] = (mk, (f32[::1], f32[::1], f64[::1], f64[::1], i64, P, P, KEYS, i64) + T)
    kernels["multiterm.gemm"] = (gm.gemm_kernel, (a3, a3, c3, c3, types.boolean, c3, types.UniTuple(i64, 11), P, P, P,
                                                  KEYS, i64))
    m2 = f32[:, ::1]
    kernels["mma.gemm"] = (mm.gemm_kernel, (m2, m2, m2, m2, m2, f64[:, ::1], types.UniTuple(i64, 8)))
    for name, (func, sig) in kernels.items():
        try:
            cres = compile_cuda(getattr(func, "py_func", func), types.void, sig, cc=(8, 0))
            assert "define" in cres.library.get_llvm_str()
            print("LOWERED", name, flush=True)
        except Exception:
            print("FAILED", name, traceback.format_exc(limit=1).replace(chr(10), " | ")[-1500:], flush=True)
''')

KERNELS = ["quantize.float32", "quantize.float64", "quantize.float16", "quantize.helpers16", "quantize.fixed32",
           "quantize.fixed64", "quantize.fixed16", "hifloat8.binary32", "hifloat8.binary64", "gemm.gemm", "gemm.mad",
           "multiplier.builtin.gemm", "multiplier.builtin.mad", "multiplier.function.gemm", "multiplier.function.mad",
           "multiterm.gemm", "mma.gemm"]
# the kernels that call round_fixed_value (np.floor; module doc)
FLOOR = {"quantize.fixed32", "quantize.fixed64", "quantize.fixed16", "gemm.gemm", "gemm.mad", "multiplier.builtin.gemm",
         "multiplier.builtin.mad", "multiplier.function.gemm", "multiplier.function.mad"}


@pytest.fixture(scope="module")
def report() -> dict[str, str]:
    """Each kernel's line from the lowering subprocess."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    r = subprocess.run([sys.executable, "-c", _LOWER], capture_output=True, text=True, timeout=900, env=env)
    if r.stdout.startswith("SKIP"):
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stderr[-3000:]
    return {ln.split()[1]: ln for ln in r.stdout.splitlines() if ln.split()[:1] in (["LOWERED"], ["FAILED"])}


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_lowers_for_the_cuda_target(name, report):
    line = report.get(name, f"missing: {name} (the subprocess printed no line for it)")
    if name in FLOOR and "<ufunc 'floor'>" in line:
        pytest.xfail("kernels/scalar/fixed.py round_fixed_value calls np.floor, which this numba-cuda cannot lower (no "
                     "floor in its CUDA ufunc table; math.floor returns int64 on the CPU target, a float on CUDA)")
    assert line.startswith("LOWERED"), line


def test_the_subprocess_lowers_exactly_the_kernels_tested(report):
    assert sorted(report) == sorted(KERNELS)
