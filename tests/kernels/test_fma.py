"""kernels/fma.py: ``fma`` rounds a * b + c once (against exact rationals, float32 and float64, with cases where
rounding the product first gives another value), keeps IEEE 754's signs of zero sums, and
``compiles_with_fma`` reads the target numba compiles for."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from numba import njit

from emunum.kernels import fma as fma_mod


@njit
def _fma_all(a, b, c, out):
    for i in range(a.size):
        out[i] = fma_mod.fma(a[i], b[i], c[i])


def _round_even(v: Fraction, bits: int) -> Fraction:
    """v rounded to ``bits`` significant bits, ties to even (the test keeps every value in the normal range)."""
    if v == 0:
        return v
    e = v.numerator.bit_length() - v.denominator.bit_length()
    e += 1 if abs(v) >= Fraction(2) ** (e + 1) else 0
    e -= 1 if abs(v) < Fraction(2) ** e else 0
    q = Fraction(2) ** (e + 1 - bits)
    n, r = divmod(v / q, 1)
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2 == 1):
        n += 1
    return n * q


@pytest.mark.parametrize("dtype, bits", [(np.float32, 24), (np.float64, 53)])
def test_fma_rounds_the_exact_sum_once(dtype, bits):
    rng = np.random.default_rng(bits)
    n = 4000
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(dtype)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(dtype)
    # c near -a*b for half of the cases: cancellation exposes the product's low bits
    c = np.where(rng.random(n) < 0.5, -(a.astype(np.float64) * b) * (1 + rng.standard_normal(n) * 2.0**-10),
                 rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(dtype)
    out = np.empty(n, dtype)
    _fma_all(a, b, c, out)
    unfused = 0
    for x, y, z, got in zip(a.tolist(), b.tolist(), c.tolist(), out.tolist()):
        want = _round_even(Fraction(x) * Fraction(y) + Fraction(z), bits)
        assert Fraction(got) == want, (x, y, z, got, float(want))
        p = _round_even(Fraction(x) * Fraction(y), bits)
        unfused += _round_even(p + Fraction(z), bits) != want
    assert unfused > 100  # the cases tell a fused operation from a product rounded first


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fma_zero_sums_take_the_signs_of_an_addition(dtype):
    a = np.array([-1.0, -1.0, 1.0, 1.0, 2.0], dtype)
    b = np.array([0.0, 0.0, -0.0, 0.0, 3.0], dtype)
    c = np.array([0.0, -0.0, -0.0, -0.0, -6.0], dtype)
    out = np.empty(5, dtype)
    _fma_all(a, b, c, out)
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert np.signbit(out).tolist() == [False, True, True, False, False]


@pytest.mark.parametrize("name, features, want", [
    (None, "+avx,+avx2,+fma", True), (None, "+avx,+avx2", False), ("haswell", None, False)])
def test_compiles_with_fma_reads_the_target_numba_compiles_for(monkeypatch, name, features, want):
    from numba.core import config

    monkeypatch.setattr(config, "CPU_NAME", name)
    monkeypatch.setattr(config, "CPU_FEATURES", features)
    assert fma_mod.compiles_with_fma() is want
