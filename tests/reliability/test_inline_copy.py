"""kernels/_inline_copy.py: numba's inlining copies the callee's IR with one memo, and the compiled code is the
same bit for bit as with numba's own copy."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
from numba import njit
from numba.core import inline_closurecall as icc

from emunum import MADUnit
from emunum.kernels import _inline_copy, gemm_cpu
from emunum.kernels.scalar import round_nearest_fast


def _kernel():
    """A fresh dispatcher (compiled anew on first call) that inlines branchy, loopy callees at several sites,
    an emunum scalar core among them."""

    @njit(inline="always")
    def clamp_sum(x, n):
        s = 0.0
        for i in range(n):
            if x > i:
                s += x - i
            elif x < -i:
                s -= x + i
            else:
                s = s * 0.5
        return s

    @njit
    def kernel(x, out, f):
        for i in range(x.size):
            a = clamp_sum(x[i], 3)
            b = clamp_sum(-x[i], 5)  # the same callee again: a second, independent copy of its IR
            out[i] = round_nearest_fast(a - b, f[0], f[1], f[2], f[3], f[4], True, True) + a * b

    return kernel


def _asm_and_result(kernel):
    x = np.linspace(-7.3, 7.3, 41)
    out = np.empty_like(x)
    kernel(x, out, gemm_cpu.fast_params(MADUnit("e4m3fn", "e4m3fn").kernel_params()[1], np.float64))
    asm = "\n".join(kernel.inspect_asm().values())
    asm = re.sub(r"_ZN[0-9A-Za-z_$.]+", "<symbol>", asm)  # symbols carry unique ids (a per-process counter)
    # and so do the strings that name one ("missing Environment: <symbol>"): their sizes follow its digits
    return re.sub(r'(\.size\t"[^"]*<symbol>[^"]*"), \d+', r"\1, <size>", asm), out.view(np.int64).copy()


@pytest.mark.skipif(os.environ.get("EMUNUM_NUMBA_INLINE_COPY") != "1", reason="not asked for (tests/conftest.py asks)")
def test_the_one_memo_copy_is_installed_for_the_pinned_numba():
    """Without it every inline="always" kernel compiles about twice as slowly (make test's time)."""
    assert _inline_copy.installed
    assert hasattr(icc.InlineWorker.inline_ir, "__wrapped_numba__")


def test_inlined_kernels_compile_to_the_same_machine_code_as_with_numbas_own_copy(monkeypatch):
    if not _inline_copy.installed:
        pytest.skip("not installed (another numba, or EMUNUM_NUMBA_INLINE_COPY is not 1)")
    ours = icc.InlineWorker.inline_ir
    asm_ours, out_ours = _asm_and_result(_kernel())
    monkeypatch.setattr(icc.InlineWorker, "inline_ir", ours.__wrapped_numba__)
    asm_numba, out_numba = _asm_and_result(_kernel())
    assert np.array_equal(out_ours, out_numba)
    assert asm_ours == asm_numba
    assert "<symbol>" in asm_ours and len(asm_ours) > 1000
