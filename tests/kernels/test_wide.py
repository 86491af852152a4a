"""``prefer_wide_vectors`` marks only the compiled function that calls it with LLVM's "prefer-vector-width"
attribute, and leaves its results alone (a loop of float32 compares and selects, against numpy)."""
import numpy as np
from numba import njit

from emunum.kernels.wide import prefer_wide_vectors

ATTR = '"prefer-vector-width"="512"'


def _body(a, b, out):
    for i in range(a.size):
        out[i] = a[i] * b[i] if a[i] > np.float32(0.5) else b[i]


def test_marks_the_calling_function_only_and_keeps_results():
    plain = njit(_body)

    @njit
    def wide(a, b, out):
        prefer_wide_vectors()
        _body_jit(a, b, out)

    _body_jit = njit(inline="always")(_body)
    rng = np.random.default_rng(0)
    a, b = rng.random(1000).astype(np.float32), rng.random(1000).astype(np.float32)
    want = np.where(a > np.float32(0.5), a * b, b)
    for f in (plain, wide):
        out = np.empty_like(a)
        f(a, b, out)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    ir_wide = wide.inspect_llvm(wide.signatures[0])
    ir_plain = plain.inspect_llvm(plain.signatures[0])
    assert ATTR in ir_wide and ATTR not in ir_plain
