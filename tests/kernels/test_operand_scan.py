"""operand_scan.scan: the one-pass planner scan equals gemm_cpu's numpy reading (_abs_range, _significant_bits)."""
from __future__ import annotations

import numpy as np
import pytest

from emunum.kernels import gemm_cpu, operand_scan


def _numpy_reading(x):
    amax, amin = gemm_cpu._abs_range(x)
    return amax, amin, gemm_cpu._significant_bits(x)


def _same(got, want):
    for g, w in zip(got, want):
        assert (np.isnan(g) and np.isnan(w)) or g == w, (got, want)


def _cases():
    rng = np.random.default_rng(0)
    yield "randn", rng.standard_normal((33, 17)).astype(np.float32)
    yield "e5m2 grid", np.ldexp(rng.integers(-7, 8, (64, 9)).astype(np.float32), rng.integers(-20, 10, (64, 9)))
    yield "zeros", np.zeros((5, 7), np.float32)
    yield "empty", np.zeros((0, 3), np.float32)
    yield "signed zeros and one subnormal", np.array([-0.0, 0.0, 1e-45, -0.0], np.float32)
    yield "float32 subnormals", (rng.standard_normal(100) * 1e-40).astype(np.float32)
    x = rng.standard_normal(50).astype(np.float32)
    x[7] = np.inf
    yield "inf", x
    y = x.copy()
    y[3] = np.nan
    yield "nan", y
    yield "float64 holding float32 values", rng.standard_normal((8, 8)).astype(np.float32).astype(np.float64)
    yield "powers of two only", np.ldexp(1.0, rng.integers(-30, 30, 40)).astype(np.float32)
    yield "24-bit significands", (rng.integers(2**23, 2**24, 40) | 1).astype(np.float32)
    yield "non-contiguous", rng.standard_normal((10, 12)).astype(np.float32)[:, ::3]


@pytest.mark.parametrize("name,x", list(_cases()), ids=[c[0] for c in _cases()])
def test_scan_equals_the_numpy_reading(name, x):
    _same(operand_scan.scan(x), _numpy_reading(x))
