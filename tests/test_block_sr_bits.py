"""Stochastic rounding of block elements with few random bits (``quantize(x, block_fmt, "stochastic",
sr_bits=8)``: 8 random bits per element, as PTX ``cvt.rs`` takes one 32-bit rbits word for 4 elements).

The definition (``emunum.quantize``'s docstring), per element y = x / S (S the block's scale): with quantum q of
the element at |y| and f = frac(|y| / q), f rounded to n = sr_bits bits (nearest-even) gives F in 0..2**n;
|y| rounds away from zero iff F + r >= 2**n, r the element's n random bits: the top n bits of splitmix64 at
counter index + 1 under the seed's key (index: the flat C-order index with the block axis last); then
saturation to the element's range. Hence E[result] = S * q * (floor(|y| / q) + F / 2**n): unbiased to within
2**-(n+1) q, and exactly unbiased for an f on the 2**-n grid.

Oracles here: that definition in fractions with splitmix64 written in numpy (bit-exact), an exhaustive
average over all 2**n values of r on the kernels' scalar core (exact), and a z-test of the mean of many draws
through ``emunum.quantize`` (fixed seed, 6 sigma: deterministic, false alarm ~2e-9 per check)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import quantize_block_checked
from emunum.formats import FixedFormat, FloatFormat, RoundMode, get_format

NAMES = ["mxfp8_e4m3", "mxfp8_e5m2_rceil", "mxfp6_e3m2_even", "mxfp6_e2m3", "mxfp4_e2m1_ceil", "mxint8"]
M64 = (1 << 64) - 1


def mix64(z: int) -> int:
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rbits(seed: int, index: int, n: int) -> int:
    """splitmix64 (Vigna) at counter index + 1 under key mix64(seed): its top n bits."""
    return mix64((mix64(seed) + (index + 1) * 0x9E3779B97F4A7C15) & M64) >> (64 - n)


def quantum(el, a: Fraction) -> Fraction:
    if isinstance(el, FixedFormat):
        return Fraction(1, 1 << el.frac_bits)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e = e - 1 if Fraction(2) ** e > a else e
    return Fraction(2) ** (max(e, el.emin) - el.man)


def round_even(v: Fraction) -> int:
    k = math.floor(v)
    return k + 1 if v - k > Fraction(1, 2) or (v - k == Fraction(1, 2) and k % 2) else k


def sr_element(y: Fraction, el, n: int, r: int) -> Fraction:
    """The definition: y rounded stochastically with n bits of fraction and random bits r, saturated."""
    if y == 0:
        return Fraction(0)
    a = abs(y)
    q = quantum(el, a)
    k = math.floor(a / q)
    F = round_even((a / q - k) * 2**n)
    v = (k + (F + r >= 2**n)) * q
    v = v if y > 0 else -v
    lo = Fraction(el.min) if isinstance(el, FixedFormat) else -Fraction(el.max)
    return min(max(v, lo), Fraction(el.max))


def _data(seed: int, shape=(6, 96)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.ldexp(1.0, rng.integers(-10, 10, (shape[0], 1)))).astype(np.float32)


@pytest.mark.parametrize("n", [8, 3, 32])
@pytest.mark.parametrize("name", NAMES)
def test_block_elements_equal_the_few_bit_stochastic_definition(name, n):
    fmt = get_format(name)
    x = _data(n)
    seed = 1234
    got, scales = quantize_block_checked(torch.from_numpy(x), fmt, RoundMode.STOCHASTIC, emunum.rng.seed_key(seed),
                                         n, -1, None, True)
    S = np.repeat(scales.numpy().reshape(x.shape[0], -1), fmt.block_size, axis=1)
    R, C = x.shape
    el = fmt.element
    want = np.array([[float(sr_element(Fraction(float(x[i, j])) / Fraction(S[i, j]), el, n,
                                       rbits(seed, i * C + j, n)) * Fraction(S[i, j])) for j in range(C)]
                     for i in range(R)], dtype=np.float32)
    neg_zero = isinstance(el, FloatFormat) and el.has_negative_zero
    want = np.where((want == 0) & (x < 0) & neg_zero, np.float32(-0.0), want)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    assert torch.equal(got, emunum.quantize(torch.from_numpy(x), fmt, "stochastic", seed=seed, sr_bits=n))


@pytest.mark.parametrize("name", NAMES)
def test_the_average_over_all_8_bit_random_words_is_the_input_rounded_to_8_fraction_bits(name):
    """The scalar core (CPU and CUDA kernels share it) averaged over r = 0..255: exactly
    q * (floor(|y| / q) + F / 256), on element grid points, midpoints and random values."""
    from emunum.block_quantize import block_args
    from emunum.kernels.scalar.block import round_element

    fmt = get_format(name)
    kind, p0, p1, p2, _, max_e, negzero = block_args(fmt, 1.0)[:7]
    el = fmt.element
    vals = np.unique(np.abs(el.values()))
    rng = np.random.default_rng(0)
    inside = vals[:-1] + (vals[1:] - vals[:-1]) * rng.uniform(0, 1, vals.size - 1)
    ys = np.concatenate([(vals[:-1] + vals[1:]) / 2, inside, vals[1:-1] * (1 + 2.0**-30), [el.max * 1.5]])
    ys = np.concatenate([ys, -ys])
    for y in ys:
        total = sum(Fraction(round_element(float(y), kind, p0, p1, p2, max_e, negzero, int(RoundMode.STOCHASTIC),
                                           np.uint64(r), 8)) for r in range(256))
        a = abs(Fraction(float(y)))
        q = quantum(el, a)
        k = math.floor(a / q)
        mag = (k + Fraction(round_even((a / q - k) * 256), 256)) * q
        lo = Fraction(el.min) if isinstance(el, FixedFormat) else -Fraction(el.max)
        # every draw lies on one side of a saturation bound (a grid point), so the mean saturates as each draw
        want = min(max(mag if y > 0 else -mag, lo), Fraction(el.max))
        assert total / 256 == want, (name, y)
        assert abs(want - Fraction(float(y))) <= q / 512 or abs(y) >= el.max  # within 2**-9 q (saturation apart)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1_rceil", "mxint8"])
def test_the_mean_of_many_draws_is_the_input_z_test(name):
    """N = 4096 copies of one block, one seed: each element's mean over the copies against its expectation
    (the input, for inputs whose fraction lies on the 2**-8 grid), |z| < 6 with the binomial sigma."""
    fmt = get_format(name)
    el = fmt.element
    rng = np.random.default_rng(5)
    vals = np.unique(np.abs(el.values()))
    vals = vals[vals < el.max / 2]
    lower = rng.choice(vals[vals > 0], 31)
    steps = np.array([float(quantum(el, Fraction(float(v)))) for v in lower])
    frac = rng.integers(1, 256, 31) / 256.0  # on the 2**-8 grid: the expectation is y itself
    y = (lower + frac * steps) * rng.choice([-1.0, 1.0], 31)
    block = np.concatenate([[el.max], y]).astype(np.float32)  # amax = max: scale 1 under floor and rceil
    assert np.array_equal(block[1:].astype(np.float64), y)
    N = 4096
    x = torch.from_numpy(np.tile(block, (N, 1)))
    q = emunum.quantize(x, fmt, "stochastic", seed=7, sr_bits=8).double()
    assert torch.all(q[:, 0] == el.max)  # the scale is 1 (floor and rceil alike)
    mean = q[:, 1:].mean(0).numpy()
    p = frac
    sigma = steps * np.sqrt(p * (1 - p) / N)
    z = (mean - y) / sigma
    assert np.all(np.abs(z) < 6), z
    assert np.abs(z).max() > 0.1  # the draws do vary: not a degenerate mean
