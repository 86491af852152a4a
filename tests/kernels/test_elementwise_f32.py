"""The uint32-lane float32 cores (kernels/elementwise_f32.py) give the bits of the cores they replace, bit for bit:
round to nearest-even against ``round_nearest_value`` in float64 (the previous f32 nearest loop) and against the
bit-level ``round_float_bits``; stochastic rounding against ``round_f32_fast`` (the previous f32 loop) with the same
random bits. Inputs: every code point of e5m2, e4m3 (fn and fnuz), bf16 and fp16, every midpoint between
neighbours, each of those +-1 float32 ulp, subnormal and overflow boundaries, float32 subnormals, +-0, +-inf and
NaNs, with every overflow code and with and without -0. ``-m exhaustive``: all 2**32 float32 bit patterns."""
from __future__ import annotations

import numpy as np
import pytest

import emunum
from emunum.rng import seed_key

cpu = pytest.importorskip("emunum.kernels.cpu")
numba = pytest.importorskip("numba")
from emunum.kernels import elementwise_f32 as ew  # noqa: E402
from emunum.kernels.scalar import random_bits, round_f32_fast, round_float_bits, round_nearest_value  # noqa: E402

njit, prange = numba.njit, numba.prange
U64 = np.uint64
KEY = U64(seed_key(2024))
NAMES = ["fp8_152", "fp8_143", "e4m3fnuz", "bf16", "fp16"]
MODES = [(ovf, negzero) for ovf in (0, 1, 2) for negzero in (0, 1)]  # overflow inf / NaN / saturate; -0 or not


@njit(parallel=True)
def old_nearest(src, dst, man, emin, sub, max_value, ovf, negzero):
    """The previous f32 nearest loop: Veltkamp's split in float64 (``cpu._nearest_params``)."""
    split, magic, mn, ovfv = cpu._nearest_params(man, emin, sub, max_value, ovf)
    for i in prange(src.size):
        dst[i] = round_nearest_value(np.float64(src[i]), split, magic, mn, max_value, ovfv, negzero)


@njit(parallel=True)
def bit_nearest(src, dst, man, emin, sub, max_bits, ovf, negzero):
    """The bit-level core (``round_float_bits``) on binary32 bits, nearest-even."""
    for i in prange(src.size):
        dst[i] = round_float_bits(src[i], 31, 23, 127, man, emin, sub, max_bits, ovf, negzero, 0, 0, 32)


@njit(parallel=True)
def old_sr(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base):
    """The previous f32 stochastic loop: ``round_f32_fast`` with element base + i's bits."""
    for i in prange(src.size):
        dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, 6, random_bits(key, base + i, nbits),
                                nbits)


def _args(name, ovf=None, negzero=None):
    a = emunum.get_format(name).to_kernel_args()
    return (a.man, a.emin, a.subnormals, float(a.max), a.overflow if ovf is None else ovf,
            a.negzero if negzero is None else negzero)


def _codes(man, emin, sub, mx) -> np.ndarray:
    """Every nonnegative value of the format, ascending (float64)."""
    step = 2.0 ** (emin - man)
    vals = [k * step for k in range(1 << man)] if sub else [0.0]
    e = emin
    while 2.0 ** e <= mx:
        vals += [(1 + k / (1 << man)) * 2.0 ** e for k in range(1 << man)]
        e += 1
    v = np.array(vals)
    return v[v <= mx]


def sample(man, emin, sub, mx) -> np.ndarray:
    """float32 bits: the format's codes, the midpoints between neighbours (and above max: the overflow
    threshold), each +-1 ulp, both signs; float32 subnormals and extremes, +-0, +-inf, NaNs; random patterns."""
    c = _codes(man, emin, sub, mx)
    top = mx + 2.0 ** (np.floor(np.log2(mx)) - man - 1)  # halfway to the next binade step above max
    pts = np.concatenate([c, (c[1:] + c[:-1]) / 2, [top, 2 * mx, 2.0 ** emin / 2, 2.0 ** (emin - man - 1)]])
    pts = pts[pts <= np.finfo(np.float32).max]  # bf16: its overflow threshold lies beyond float32 (inf, below)
    f = pts.astype(np.float32)
    assert np.array_equal(f.astype(np.float64), pts)  # every point is a float32 value
    inf32 = np.float32(np.inf)
    f = np.concatenate([f, np.nextafter(f, inf32), np.nextafter(f, -inf32)])
    extremes = np.array([0, 1, 2, 3, 0x3FFFFF, 0x400000, 0x7FFFFF, 0x800000, 0x800001, 0x7F7FFFFF, 0x7F7FFFFE,
                         0x7F800000, 0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FC12345, 0x7FFFFFFF], np.uint32)
    rnd = np.random.default_rng(man * 1000 - emin).integers(0, 1 << 32, 1 << 15, dtype=np.uint64).astype(np.uint32)
    u = np.concatenate([f.view(np.uint32), extremes, rnd])
    return np.concatenate([u, u ^ np.uint32(0x80000000)])


def _new(u, args, mode, nbits=32, parallel=True, inplace=False):
    man, emin, sub, mx, ovf, negzero = args
    out = u.copy() if inplace else np.empty_like(u)
    src = out if inplace else u
    cpu.quantize_float(src.view(np.float32), out.view(np.float32), man, emin, sub, mx, ovf, negzero, mode, KEY, nbits,
                       parallel=parallel)
    return out


def _check_nearest(u, args):
    man, emin, sub, mx, ovf, negzero = args
    assert ew.nearest_ok(man, emin, sub, mx)  # the new core runs: the comparison is new against old
    got = _new(u, args, 0)
    want = np.empty_like(u)
    old_nearest(u.view(np.float32), want.view(np.float32), man, emin, sub, mx, ovf, negzero)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(u[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]
    return got


@pytest.mark.parametrize("ovf,negzero", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_nearest_matches_float64_veltkamp_and_bit_core(name, ovf, negzero):
    args = _args(name, ovf, negzero)
    man, emin, sub, mx = args[:4]
    u = sample(man, emin, sub, mx)
    got = _check_nearest(u, args)
    bits = np.empty(u.size, np.uint64)
    bit_nearest(u.astype(np.uint64), bits, man, emin, sub, U64(cpu.max_bits(mx, np.float32)), ovf, negzero)
    assert np.array_equal(got.astype(np.uint64), bits)
    assert np.array_equal(_new(u, args, 0, parallel=False), got)
    assert np.array_equal(_new(u, args, 0, inplace=True), got)
    assert np.array_equal(_new(u, args, 0, parallel=False, inplace=True), got)


def _check_sr(u, args, nbits, base=0):
    man, emin, sub, mx, ovf, negzero = args
    assert ew.sr_ok(man, emin, sub, mx)
    got = _new(u, args, 6, nbits)
    want = np.empty_like(u)
    old_sr(u, want, man, emin, sub, np.int64(cpu.max_bits(mx, np.float32)), ovf, negzero, KEY, nbits, base)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(u[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]
    return got


@pytest.mark.parametrize("nbits", [1, 5, 13, 21, 22, 23, 24, 31, 32])
@pytest.mark.parametrize("name", NAMES)
def test_stochastic_matches_round_f32_fast(name, nbits):
    """nbits below, at and above the remainder's width 23 - man (e5m2: 21, bf16: 16, fp16: 13)."""
    for ovf, negzero in MODES[::2] + [MODES[3]]:
        args = _args(name, ovf, negzero)
        u = sample(*args[:4])
        got = _check_sr(u, args, nbits)
        assert np.array_equal(_new(u, args, 6, nbits, parallel=False), got)
        assert np.array_equal(_new(u, args, 6, nbits, inplace=True), got)


def test_stochastic_tensor_list_draws_the_concatenations_bits():
    """``run.many`` (in place, element i of tensor t is element base_t + i) against one call on the
    concatenation, and the fused trace counters' chunked loop (chunk base) against the plain kernel."""
    import torch
    from emunum.kernels import counters

    args = _args("fp8_152")
    man, emin, sub, mx, ovf, negzero = args
    u = sample(man, emin, sub, mx)[:20000]
    whole = _check_sr(u, args, 32)
    parts = [torch.from_numpy(u[:7001].copy().view(np.float32)), torch.from_numpy(u[7001:].copy().view(np.float32))]
    run = cpu.float_runner(np.float32, man, emin, sub, mx, ovf, negzero)
    run.many(np.array([p.data_ptr() for p in parts], np.int64), np.array([p.numel() for p in parts], np.int64), 6,
             KEY, 32)
    assert np.array_equal(np.concatenate([p.numpy().view(np.uint32) for p in parts]), whole)
    src = torch.from_numpy(u.view(np.float32))
    dst, acc = torch.empty_like(src), np.zeros(6)
    counters.float_counted_runner(np.float32, man, emin, sub, mx, ovf, negzero)(
        src.data_ptr(), dst.data_ptr(), src.numel(), 6, KEY, 32, -mx, mx, True, acc.ctypes.data, parallel=False)
    assert np.array_equal(dst.numpy().view(np.uint32), whole) and acc[0] == u.size


def test_fast_paths_apply_only_where_they_hold():
    assert ew.nearest_ok(*_args("bf16")[:4]) and ew.sr_ok(*_args("bf16")[:4])
    assert not ew.nearest_ok(0, -126, 0, 2.0 ** 127)  # no mantissa bits (ties to the even code: old path)
    assert not ew.nearest_ok(23, -126, 1, 3.4028234663852886e38)  # float32 itself: nothing to round
    assert not ew.nearest_ok(3, -6, 1, 448.0000001)  # max not a float32 value
    assert not ew.sr_ok(3, -6, 1, 1e39)  # max beyond float32
    assert not ew.sr_ok(3, 10, 0, 1e4)  # quantum above 1: |x| * 2**-q would not be exact


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", ["fp8_152", "fp8_143"])
def test_every_float32_exhaustive(name):
    """All 2**32 float32 bit patterns, nearest and stochastic (32 bits), every overflow code."""
    for ovf in (0, 1, 2):
        args = _args(name, ovf)
        for start in range(0, 1 << 32, 1 << 26):
            u = np.arange(start, start + (1 << 26), dtype=np.uint64).astype(np.uint32)
            _check_nearest(u, args)
            _check_sr(u, args, 32)


SIZES = [1, ew.CHUNK - 1, ew.CHUNK, ew.CHUNK + 1, ew.AHEAD + ew.CHUNK + 17, 3 * ew.AHEAD + 5]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("base", [0, 1, ew.CHUNK + 3])
def test_chunked_loops_keep_every_elements_bits_and_random_stream(size, base):
    """The loops run in chunks with prefetch hints: at every size around a chunk's and the hint distance's
    boundaries, serial and parallel, in place or not, from any stream offset ``base``, element i is rounded as
    the unchunked reference loop rounds it with element base + i's random bits."""
    args = _args("fp8_152")
    man, emin, sub, mx, ovf, negzero = args
    u = np.resize(sample(man, emin, sub, mx)[::-1], size)  # varied values at every position (sample is sorted)
    mb = np.int64(cpu.max_bits(mx, np.float32))
    want = np.empty_like(u)
    old_sr(u, want, man, emin, sub, mb, ovf, negzero, KEY, 32, base)
    got = np.empty_like(u)
    ew.sr_serial(u, got, man, emin, sub, mb, ovf, negzero, KEY, 32, np.int64(base))
    assert np.array_equal(got, want)
    inplace = u.copy()
    ew.sr_serial(inplace, inplace, man, emin, sub, mb, ovf, negzero, KEY, 32, np.int64(base))
    assert np.array_equal(inplace, want)
    if base == 0:
        got[:] = 0
        ew.sr_parallel(u, got, man, emin, sub, mb, ovf, negzero, KEY, 32)
        assert np.array_equal(got, want)
    want_n = np.empty_like(u)
    old_nearest(u.view(np.float32), want_n.view(np.float32), man, emin, sub, mx, ovf, negzero)
    for kernel in (ew.nearest_serial, ew.nearest_parallel):
        got[:] = 0
        kernel(u, got, man, emin, sub, mb, ovf, negzero)
        assert np.array_equal(got, want_n)


@pytest.mark.parametrize("nbits", [8, 32])
def test_parallel_chunks_draw_their_own_random_words(nbits):
    """The stochastic loop writes each chunk's random words to a buffer in the running thread's own stack frame,
    then rounds the chunk with them: with every thread at work on many chunks, element i still gets element i's
    random bits (a buffer shared by the threads would hand one chunk another's words; such a race is rare on a
    loaded machine, hence many repeats over a long array)."""
    man, emin, sub, mx, ovf, negzero = _args("fp8_152")
    u = np.resize(sample(man, emin, sub, mx)[::-1], 1 << 22)
    mb = np.int64(cpu.max_bits(mx, np.float32))
    want, got = np.empty_like(u), np.empty_like(u)
    old_sr(u, want, man, emin, sub, mb, ovf, negzero, KEY, nbits, 0)
    for _ in range(20):
        ew.sr_parallel(u, got, man, emin, sub, mb, ovf, negzero, KEY, nbits)
        assert np.array_equal(got, want)
