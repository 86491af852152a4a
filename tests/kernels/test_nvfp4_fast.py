"""The float32 fast paths of the NVFP4-family CPU kernel (kernels/nvfp4_fast.py) give the bits and scales of the scalar
cores (kernels/nvfp4_scalar.py, ``quantize_nvfp4(fast=False)``), per-row outer scales and 4/6 selection alike, over
random and adversarial tensors: rows spread over 2**+-40, exact and near ties of the element's midpoints, zeros and
-0, inf and NaN, subnormal rows (whose per-row scale would round to 0 and is 2**-149), huge rows, partial blocks and
tiles."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FourOverSix, RoundMode
from emunum.nvfp4_quantize import line_arrays, outer_scale_values
from emunum.kernels import block_fast, nvfp4_cpu

NEAREST = int(RoundMode.NEAREST)
KEY = 12345

ROW_FORMATS = [
    BLOCK_PRESETS["nvfp4_row"],
    BlockFormat("fp4_e2m1", 32, "e4m3fn", scale_rule="amax", outer_scale="row"),
    BlockFormat("fp4_e2m1", 16, "ue5m3", scale_rule="amax", outer_scale="row"),
]
FOS_FORMATS = [
    BLOCK_PRESETS["nvfp4_4over6"],
    BLOCK_PRESETS["nvfp4_4over6_mse"],
    BLOCK_PRESETS["nvfp4_4over6_2d"],
    BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", outer_scale="row",
                four_over_six=FourOverSix("absmax", 448)),
    BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", four_over_six=FourOverSix("mse", 256)),
    BlockFormat("fp4_e2m1", (16, 16), "ue5m3", scale_rule="amax", tensor_scale=True,
                four_over_six=FourOverSix("absmax", 448)),
    BlockFormat("fp4_e2m1", (16, 16), "e4m3fn", scale_rule="amax", tensor_scale=True,
                four_over_six=FourOverSix("mse", 448)),
]
SHAPE = (2, 40, 72)  # partial blocks of 16 and 32 along C, partial 16-row tiles along R


def spread(rng):
    return (rng.standard_normal(SHAPE) * 2.0 ** rng.integers(-40, 41, SHAPE[:2] + (1,))).astype(np.float32)


def grid(rng):
    """Quarter-integers times a power of two per row: many elements on e2m1 midpoints under either 4/6 candidate,
    and blocks whose two candidate errors tie."""
    x = rng.integers(-24, 25, SHAPE) * 0.25 * 2.0 ** rng.integers(-3, 4, SHAPE[:2] + (1,))
    x[0, 0, 0] = 5.0
    return x.astype(np.float32)


def specials(rng):
    x = spread(rng)
    x[0, 1] = 0.0
    x[0, 2, :20] = -0.0
    x[0, 3, 5] = np.nan
    x[0, 4, 17] = np.inf
    x[0, 5, 40] = -np.inf
    x[0, 6, :] = np.float32(1e-38) * rng.integers(-3, 4, SHAPE[2])  # tiny rows: a subnormal row scale T
    x[0, 7, :] = np.float32(2e-39) * rng.standard_normal(SHAPE[2]).astype(np.float32)
    x[1, 8, :] = np.float32(3e38) * rng.uniform(-1, 1, SHAPE[2]).astype(np.float32)
    x[1, 9, 3:19] = np.float32(3.4028235e38)
    x[1, 10, 16:32] = 0.0
    x[1, 11, 0:16] = -0.0
    x[1, 30:, 64:] = np.nan  # a whole partial tile
    return x


def ties(rng, fmt):
    """Elements on the midpoints M_i * S * T of their block and one float32 step either side, each block's
    first element its largest, so that S and T stay those of ``spread``'s blocks (found by the scalar core)."""
    x = spread(rng)
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    scales, _ = scalar(x, fmt)
    t = outer(x, fmt)
    mids = block_fast.element_table(block_args(fmt, 1.0)[:6])[0]
    for p in range(SHAPE[0]):
        for i in range(SHAPE[1]):
            for bj, c0 in enumerate(range(0, SHAPE[2], tile[1])):
                blk = x[p, i, c0:c0 + tile[1]]
                amax = np.abs(blk).max()
                blk[0] = amax
                full = scales[p, i // tile[0], bj] * t[p * SHAPE[1] + i]
                cand = (mids[rng.integers(0, 7, blk.size - 1)] * full).astype(np.float32)
                way = rng.integers(0, 3, cand.size)  # one step up, the midpoint itself, one step down
                cand = np.nextafter(cand, np.select([way == 0, way == 1], [cand * 2, cand], np.float32(0)))
                cand *= rng.choice(np.array([-1, 1], np.float32), cand.size)
                blk[1:] = np.where(np.abs(cand) < amax, cand, blk[1:])
    return x


def outer(x, fmt):
    lines = line_arrays(torch.from_numpy(x), fmt)
    return (lines[3] if lines[0] else lines[1]).double().numpy()


def run(x, fmt, fast, parallel=False):
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    scales = np.full((SHAPE[0], -(-SHAPE[1] // tile[0]), -(-SHAPE[2] // tile[1])), 7.0)
    dst = np.full_like(x, 7.0)
    args = block_args(fmt, 1.0)[:-1]
    if fast and fmt.four_over_six is None:
        assert nvfp4_cpu.quantize_rows(x, dst, scales, tile, args, NEAREST, KEY, 32, parallel=parallel)
        return scales, dst
    lines = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in line_arrays(torch.from_numpy(x), fmt))
    nvfp4_cpu.quantize_nvfp4(x, dst, scales, tile, lines, args, NEAREST, KEY, 32, parallel=parallel, fast=fast)
    return scales, dst


def scalar(x, fmt):
    return run(x, fmt, fast=False)


def assert_same(x, fmt, parallel=False):
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    assert nvfp4_cpu.fast_ok(x, x, tile, fmt.four_over_six is not None, block_args(fmt, 1.0)[:-1], NEAREST)
    want_s, want = scalar(x, fmt)
    got_s, got = run(x, fmt, fast=True, parallel=parallel)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got_s.view(np.uint64), want_s.view(np.uint64))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("make", [spread, grid, specials], ids=lambda f: f.__name__)
@pytest.mark.parametrize("fmt", ROW_FORMATS + FOS_FORMATS, ids=lambda f: f.name)
def test_fast_path_equals_scalar_core_bits_and_scales(fmt, make, seed):
    assert_same(make(np.random.default_rng(seed)), fmt)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("fmt", ROW_FORMATS + FOS_FORMATS[:3], ids=lambda f: f.name)
def test_fast_path_equals_scalar_core_on_midpoint_ties_and_their_neighbours(fmt, seed):
    assert_same(ties(np.random.default_rng(seed), fmt), fmt)


@pytest.mark.parametrize("fmt", [ROW_FORMATS[0], FOS_FORMATS[0], FOS_FORMATS[2]], ids=lambda f: f.name)
def test_parallel_fast_path_equals_scalar_core(fmt):
    assert_same(specials(np.random.default_rng(7)), fmt, parallel=True)


@pytest.mark.parametrize("fmt", [ROW_FORMATS[0], FOS_FORMATS[0]], ids=lambda f: f.name)
def test_fast_path_is_float32_round_to_nearest_only(fmt):
    x = spread(np.random.default_rng(0))
    args = block_args(fmt, 1.0)[:-1]
    fos = fmt.four_over_six is not None
    assert not nvfp4_cpu.fast_ok(x.astype(np.float64), x.astype(np.float64), (1, 16), fos, args, NEAREST)
    assert not nvfp4_cpu.fast_ok(x, x, (1, 16), fos, args, int(RoundMode.STOCHASTIC))


@pytest.mark.parametrize("fmt", ROW_FORMATS, ids=lambda f: f.name)
def test_a_row_whose_outer_scale_would_round_to_zero_takes_the_smallest_and_the_fast_path_gives_the_cores_bits(fmt):
    x = spread(np.random.default_rng(0))
    x[1, 12, :] = np.float32(1e-45) * (np.arange(SHAPE[2]) % 3)  # amax 2**-148: float32(amax / 2688) = 0
    x[0, 3, :] = np.float32(-1e-45) * (np.arange(SHAPE[2]) % 2)  # amax 2**-149
    assert_same(x, fmt)
    t = outer_scale_values(torch.from_numpy(x), fmt).view(2, 40)
    assert t[1, 12] == t[0, 3] == 2.0**-149
    y = emunum.quantize(torch.from_numpy(x), fmt)
    assert torch.isfinite(y).all() and torch.equal(y[1, 12].abs(), torch.from_numpy(x[1, 12]).abs())
