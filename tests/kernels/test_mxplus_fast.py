"""The float32 fast paths of the MX+ kernel give the float64 loop's bits and scales (``mxplus_serial``), serial
and parallel, for every MX+ preset's element, blocks that tile the rows or not, partial blocks, zero/NaN/inf
blocks, float32 subnormals, equal maxima, and in place (dst = src): round to nearest by kernels/mxplus_fast.py,
stochastic rounding (every sr_bits width, the same random bits) by kernels/block_sr.py."""
from __future__ import annotations

import numpy as np
import pytest

from emunum.formats import MXPLUS_PRESETS, RoundMode
from emunum.kernels import block_sr, mxplus_cpu, mxplus_fast
from emunum.mxplus_quantize import mxplus_args

# (mode, key, sr_bits): nearest, and stochastic with 32, 8 and 1 random bits
MODES = {"nearest": (int(RoundMode.NEAREST), 0, 32), "sr32": (int(RoundMode.STOCHASTIC), 4242, 32),
         "sr8": (int(RoundMode.STOCHASTIC), 77, 8), "sr1": (int(RoundMode.STOCHASTIC), 5, 1)}


def fast_path_holds(args, mode: int) -> bool:
    """The float32 path that ``quantize_mxplus`` takes for this mode holds."""
    if mode == int(RoundMode.STOCHASTIC):
        return block_sr.sr_ok(block_sr.mxplus_block_args(args))
    return mxplus_fast.fast_ok(args)


def mxplus_serial(src, dst, scales, *args):
    """The float64 loop over every block (``mxplus_cpu.mxplus_range``)."""
    mxplus_cpu.mxplus_range(0, scales.size, src, dst, scales, *args)


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-150, 128, shape[:-1] + (1,))
    x = x.astype(np.float32).reshape(-1)
    x[5:40] = 0.0
    x[7] = -0.0
    x[50] = np.nan
    x[100] = np.inf
    x[101] = -np.inf
    x[130:140] = np.float32(-3.0)  # equal maxima
    x[200:230] = rng.integers(-4, 5, 30).astype(np.float32) * np.float32(2.0 ** -140)  # subnormal blocks
    return x.reshape(shape)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shape,tile", [((2, 8, 64), (1, 32)), ((1, 12, 70), (1, 32)), ((3, 5, 48), (1, 16)),
                                        ((1, 9, 31), (1, 7)), ((2, 12, 40), (4, 8)), ((1, 7, 45), (3, 16))])
@pytest.mark.parametrize("name", sorted(MXPLUS_PRESETS))
def test_fast_path_equals_the_float64_loop(name, shape, tile, parallel, mode):
    """(2-D tiles: stochastic rounding only; round to nearest takes the float64 loop there.)"""
    m, key, nbits = MODES[mode]
    args = mxplus_args(MXPLUS_PRESETS[name])
    assert fast_path_holds(args, m)
    src = _data(shape, tile[1])
    nb = (shape[0], -(-shape[1] // tile[0]), -(-shape[2] // tile[1]))
    want, s_want = np.empty_like(src), np.empty(nb)
    mxplus_serial(src, want, s_want, *tile, *args, m, np.uint64(key), nbits)
    got, s_got = np.empty_like(src), np.empty(nb)
    mxplus_cpu.quantize_mxplus(src, got, s_got, tile, args, m, key, nbits, parallel=parallel)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert np.array_equal(s_want, s_got, equal_nan=True)
    inplace, s_in = src.copy(), np.empty(nb)
    mxplus_cpu.quantize_mxplus(inplace, inplace, s_in, tile, args, m, key, nbits, parallel=parallel)
    assert np.array_equal(want.view(np.uint32), inplace.view(np.uint32))
    slow_inplace = src.copy()  # the float64 loop in place too
    mxplus_serial(slow_inplace, slow_inplace, np.empty(nb), *tile, *args, m, np.uint64(key), nbits)
    assert np.array_equal(want.view(np.uint32), slow_inplace.view(np.uint32))


def _bm_magnitudes(fmt):
    """Every block-max value |x| / S of the format (2**emax * (1 + k / 2**p)), every midpoint between two of them
    and the float32 neighbours of each midpoint (ties to even, and either side of them), and the values just
    below 2**(emax + 1) that round up out of the binade (a carry: saturation)."""
    p, emax = fmt.bm_bits, fmt.element_emax
    k = np.arange(2**p, dtype=np.float64)
    codes = np.ldexp(1.0 + k / 2**p, emax)
    mids = np.ldexp(1.0 + (k + 0.5) / 2**p, emax).astype(np.float32)
    top = np.float32(2.0 ** (emax + 1))
    return np.concatenate([codes.astype(np.float32), mids, np.nextafter(mids, np.float32(0)),
                           np.nextafter(mids, np.float32(np.inf)), np.nextafter(top, np.float32(0))[None]])


def _bm_blocks(fmt, tc, seed):
    """Blocks of tc float32 elements: each has one block max from ``_bm_magnitudes`` times a power of two S (from
    float32's subnormal range, where the scale clips at 2**-127, to the top of its range), at a position that
    cycles through the block, with a random sign; the others are random fractions of it, and every third block
    repeats the maximum magnitude later with the opposite sign (the first of equal maxima is the block max)."""
    rng = np.random.default_rng(seed)
    mags = _bm_magnitudes(fmt)
    exps = [-149 - fmt.element_emax, -140, -127 - fmt.element_emax, -126, -60, -3, 0, 7, 127 - fmt.element_emax]
    vals = np.concatenate([np.ldexp(mags.astype(np.float64), e) for e in exps])
    vals = vals[(vals > 0) & (vals < 2.0**128)].astype(np.float32)
    blocks = (rng.random((vals.size, tc)) * vals[:, None]).astype(np.float32)
    blocks *= rng.choice(np.float32([-1, 1]), blocks.shape)
    rows = np.arange(vals.size)
    pos = rows % tc
    sign = rng.choice(np.float32([-1, 1]), vals.size)
    blocks[rows, pos] = vals * sign
    dup = (rows % 3 == 0) & (pos + 1 < tc)
    later = np.minimum(pos + 1 + rows % 5, tc - 1)
    blocks[rows[dup], later[dup]] = -vals[dup] * sign[dup]
    return blocks


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("tail", [0, 3], ids=["rows_of_whole_blocks", "rows_ending_in_a_partial_block"])
@pytest.mark.parametrize("tc", [32, 16, 7, 64])
@pytest.mark.parametrize("name", sorted(MXPLUS_PRESETS))
def test_fast_path_equals_the_float64_loop_on_every_block_max_code_and_midpoint(name, tc, tail, mode):
    m, key, nbits = MODES[mode]
    fmt = MXPLUS_PRESETS[name]
    args = mxplus_args(fmt)
    blocks = _bm_blocks(fmt, tc, tc)
    rows = blocks[: blocks.shape[0] // 2 * 2].reshape(-1, 2 * tc)  # two blocks a row
    extra = np.random.default_rng(tc).standard_normal((rows.shape[0], tail)).astype(np.float32)
    src = np.ascontiguousarray(np.concatenate([rows, extra], axis=1))[None]
    if m == int(RoundMode.STOCHASTIC):
        src = np.concatenate([src] * 4, axis=1)  # more random draws per value
    nb = (1, src.shape[1], -(-src.shape[2] // tc))
    want, s_want = np.empty_like(src), np.empty(nb)
    mxplus_serial(src, want, s_want, 1, tc, *args, m, np.uint64(key), nbits)
    for parallel in (False, True):
        got, s_got = np.empty_like(src), np.empty(nb)
        mxplus_cpu.quantize_mxplus(src, got, s_got, (1, tc), args, m, key, nbits, parallel=parallel)
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
        assert np.array_equal(s_want, s_got)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", sorted(MXPLUS_PRESETS))
def test_fast_path_equals_the_float64_loop_on_every_element_code_and_midpoint(name, mode):
    """The elements beside the block max: every float32 value of the element grid times S, the midpoints between
    neighbours and their float32 neighbours, under one block max of 2**emax * S per block (S over float32's
    range, clipped at 2**-127 included)."""
    fmt = MXPLUS_PRESETS[name]
    args = mxplus_args(fmt)
    el = fmt.element
    pos = np.array(sorted({abs(float(v)) for v in el.values() if np.isfinite(v)}))
    mids = (pos[:-1] + pos[1:]) / 2
    grid = np.concatenate([pos, mids]).astype(np.float32)
    grid = np.concatenate([grid, np.nextafter(grid, np.float32(0)), np.nextafter(grid, np.float32(np.inf))])
    grid = grid[grid < 2.0 ** fmt.element_emax]
    tc = 32
    grid = np.concatenate([grid, np.zeros(-grid.size % (tc - 1), np.float32)]).reshape(-1, tc - 1)
    blocks = np.concatenate([np.full((grid.shape[0], 1), 2.0 ** fmt.element_emax, np.float32), grid], axis=1)
    blocks[1::2] = -blocks[1::2, ::-1]
    src = np.concatenate([np.ldexp(blocks.astype(np.float64), e).astype(np.float32)
                          for e in (-150, -135, -127, -40, 0, 40, 127 - fmt.element_emax)])[None]
    m, key, nbits = MODES[mode]
    if m == int(RoundMode.STOCHASTIC):
        src = np.concatenate([src] * 4, axis=1)  # more random draws per value
    nb = (1, src.shape[1], 1)
    want, s_want = np.empty_like(src), np.empty(nb)
    mxplus_serial(src, want, s_want, 1, tc, *args, m, np.uint64(key), nbits)
    got, s_got = np.empty_like(src), np.empty(nb)
    mxplus_cpu.quantize_mxplus(src, got, s_got, (1, tc), args, m, key, nbits, parallel=False)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert np.array_equal(s_want, s_got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # the fast path (tasks of 128 blocks), the float64 loop
@pytest.mark.parametrize("name", ["mxfp8_e4m3_plus", "mxfp4_e2m1_plus"])
def test_parallel_shares_give_the_serial_bits(name, dtype, launch_shares):
    args = mxplus_args(MXPLUS_PRESETS[name])
    src = _data((2, 40, 1000), 3).astype(dtype)  # 2560 blocks of 32: 20 tasks
    out = []
    for parallel in (False, True):
        got, sc = np.empty_like(src), np.empty((2, 40, 32))
        mxplus_cpu.quantize_mxplus(src, got, sc, (1, 32), args, 0, 0, 32, parallel=parallel)
        out.append((got.view(np.uint8), sc.view(np.uint64)))
    assert all(np.array_equal(a, b) for a, b in zip(*out))
