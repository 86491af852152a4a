"""Differential test of the kernels against the exact reference: every float format with exp <= 8
(several biases, subnormals on and off, every special-value policy, saturate on and off) x every rounding mode
x float32, float64, float16 and bfloat16 inputs, on the inputs that matter: float32 subnormals, the format's
min-normal boundary and the gap below it, midpoints, max and beyond, +-0, +-inf, NaN. Zero tolerance.

The default run checks a fixed-seed sample of the grid (every policy is in it); ``pytest -m exhaustive``
runs all of it (about 2,300 formats).
It would have caught the float32 core treating float32-subnormal inputs as normal for an 8-exponent-bit target
without subnormals (wrong in every mode but nearest).
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

import emunum
from emunum.formats import FloatFormat, RoundMode, Special
from emunum.reference import quantize_reference

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
MODES = list(RoundMode)


def _grid() -> list[FloatFormat]:
    out = []
    for exp, man, special, sub, sat in itertools.product(range(1, 9), (0, 1, 2, 3, 7), Special, (True, False),
                                                         (False, True)):
        default = 2 ** (exp - 1) - 1 + (special == Special.FNUZ)
        for bias in sorted({default, default - 1, default + 1, default + 3}):
            try:
                out.append(FloatFormat(exp, man, bias=bias, subnormals=sub, special=special, saturate=sat))
            except ValueError:  # outside float32's range: not a format emunum offers
                continue
    return out


GRID = _grid()
SAMPLE = random.Random(21).sample(GRID, 48)
# every 8-exponent-bit format with float32's own emin among the sampled ones: the class of the bug
SAMPLE += [f for f in GRID if f.exp == 8 and f.emin == -126 and f.man in (0, 7) and not f.subnormals
           and f not in SAMPLE]


def _inputs(fmt: FloatFormat) -> np.ndarray:
    f32 = np.finfo(np.float32)
    sub32 = np.array([f32.smallest_subnormal, 2 * f32.smallest_subnormal, 1e-45, 4e-41, 1e-39, 5.877471754111438e-39,
                      f32.smallest_normal / 2, f32.smallest_normal - f32.smallest_subnormal], dtype=np.float64)
    mn, mx = fmt.min_normal, fmt.max
    edges = np.array([mn, mn / 2, mn * 0.75, mn * 0.25, mn * 1.5, fmt.min_subnormal, fmt.min_subnormal / 2,
                      fmt.min_subnormal * 0.75, mx, mx * (1 + 2.0 ** -(fmt.man + 2)), mx * (1 + 2.0 ** -(fmt.man + 1)),
                      mx * 2, 1.0, 1.5, 1.0 + 2.0 ** -(fmt.man + 1), 3.0], dtype=np.float64)
    vals = fmt.values() if fmt.bits <= 10 else np.array([], dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    mids = (vals[:-1] + vals[1:]) / 2 if vals.size > 1 else vals
    base = np.concatenate([sub32, edges, vals, mids])
    base = np.concatenate([base, -base])
    return np.concatenate([base, np.nextafter(base, np.inf), np.nextafter(base, -np.inf),
                           [0.0, -0.0, np.inf, -np.inf, np.nan]])


def _check(fmt: FloatFormat, dtype: torch.dtype) -> None:
    x = torch.from_numpy(_inputs(fmt)).to(dtype)
    before = x.clone()
    for mode in MODES:
        got = emunum.quantize(x, fmt, mode, seed=7)
        want = quantize_reference(x, fmt, mode, seed=7)
        nan = torch.isnan(want)
        same = torch.equal(torch.isnan(got), nan) and torch.equal(got[~nan].double().view(torch.int64),
                                                                  want[~nan].double().view(torch.int64))
        if not same:
            bad = (got.double().view(torch.int64) != want.double().view(torch.int64)) & ~(torch.isnan(got) & nan)
            i = torch.nonzero(bad).flatten()[:5].tolist()
            rows = [f"x={x[j].item()!r} got {got[j].item()!r} want {want[j].item()!r}" for j in i]
            raise AssertionError(f"{fmt!r} {dtype} {mode.name}: " + "; ".join(rows))
    assert torch.equal(x.view(torch.uint8), before.view(torch.uint8))


def _id(f: FloatFormat) -> str:
    return f"e{f.exp}m{f.man}b{f.bias}{f.special.name.lower()}{'' if f.subnormals else '-nosub'}{'-sat' if f.saturate else ''}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", SAMPLE, ids=_id)
def test_kernels_equal_the_exact_reference_on_the_inputs_that_matter(fmt, dtype):
    _check(fmt, dtype)


@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_equal_the_exact_reference_on_every_format_of_the_grid(dtype):
    for fmt in GRID:
        _check(fmt, dtype)


@pytest.mark.parametrize("mode,want", [("up", 2.0**-126), ("odd", 2.0**-126), ("down", 0.0), ("nearest", 0.0)])
def test_float32_subnormals_round_into_a_no_subnormal_8_bit_exponent_format(mode, want):
    """Not flush-to-zero: FloatFormat(8, 7, subnormals=False) holds no value between 0 and 2**-126."""
    f = FloatFormat(8, 7, subnormals=False)
    for dtype in (torch.float32, torch.bfloat16):
        for v in ([4e-41, 1e-45] if dtype == torch.float32 else [2.0**-130, 2.0**-133]):  # subnormals of dtype
            got = emunum.quantize(torch.tensor([v], dtype=dtype), f, mode)
            assert got.item() == want, (dtype, v)
    assert emunum.quantize(torch.tensor([1e-39]), FloatFormat(8, 0, subnormals=False), "odd").item() == 2.0**-126
