"""The HiFloat8 CPU kernels (kernels/hifloat8_cpu.py): the uint32-lane float32 cores (nearest, ties away, and
stochastic) give the bits of the float core they stand in for (``round_hif8_bits``, the float64 loop's core, on
binary32 bits), on float32 code-point classes and random bit patterns; serial and parallel loops, in place and
out of place, agree; float32 and float64 inputs with the same values round alike in every mode."""
import numpy as np
import pytest
import torch
from numba import njit

from emunum import HiFloat8Format
from emunum.formats import RoundMode
from emunum.kernels import hifloat8_cpu
from emunum.kernels.scalar import HIF8_MAX_BITS32, random_bits, round_hif8_bits, round_hif8_f32
from emunum.rng import seed_key


@njit(cache=False)
def reference_loop(src, dst, ovf, mode, key, nbits):
    """The generic core on binary32 bits, element by element (no fast path)."""
    for i in range(src.size):
        rnd = random_bits(key, i, nbits) if mode == 6 else np.uint64(0)
        dst[i] = np.uint32(round_hif8_bits(np.uint64(src[i]), 31, 23, 127, np.uint64(HIF8_MAX_BITS32), ovf, mode, rnd,
                                           nbits))


def patterns(n=1 << 16) -> np.ndarray:
    """float32 bits: random patterns; every binade's edges, midpoints and quarter points +- 1 ulp; specials."""
    rng = np.random.default_rng(4)
    u = [rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)]
    e = np.arange(-30, 20)
    for man in range(4):
        for k in range(2**man + 1):
            v = np.ldexp(1.0 + k / 2**man, e).astype(np.float32).view(np.uint32)
            for frac in (0, 2**(22 - man), 2**(21 - man)):
                u += [v + np.uint32(frac) + np.uint32(d) for d in (0, 1)] + [v + np.uint32(frac) - np.uint32(1)]
    u.append(np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 1, 0x47200000,
                       0x471FFFFF, 0x34000000, 0x33FFFFFF, 0x34800000], dtype=np.uint32))
    x = np.concatenate(u).astype(np.uint32)
    return np.concatenate([x, x ^ np.uint32(0x80000000)])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


CASES = [(m, 32) for m in RoundMode] + [(RoundMode.STOCHASTIC, 23), (RoundMode.STOCHASTIC, 8)]  # (mode, sr_bits)


@pytest.mark.parametrize("mode, nbits", CASES, ids=lambda c: c.name.lower() if isinstance(c, RoundMode) else str(c))
@pytest.mark.parametrize("fmt", [HiFloat8Format(), HiFloat8Format(saturate=True)], ids=str)
def test_float32_loops_give_the_generic_cores_bits(fmt, mode, nbits):
    src = patterns()
    ovf, key = fmt.to_kernel_args().overflow, seed_key(11)
    want = np.empty_like(src)
    reference_loop(src, want, ovf, int(mode), np.uint64(key), nbits)
    run = hifloat8_cpu.hif8_runner(np.dtype(np.float32), ovf)
    for parallel in (False, True):
        got = np.empty_like(src)
        run(src.ctypes.data, got.ctypes.data, src.size, int(mode), key, nbits, parallel)
        assert same_bits(got, want), parallel
        inplace = src.copy()
        run(inplace.ctypes.data, inplace.ctypes.data, src.size, int(mode), key, nbits, parallel)
        assert same_bits(inplace, want), parallel


@njit(cache=False)
def f32_core_loop(src, dst, ovf, mode):
    """The branch-free float32 core (the loops' path for the other modes), element by element."""
    for i in range(src.size):
        dst[i] = np.uint32(round_hif8_f32(src[i], ovf, mode, np.uint64(0), 32))


def values_and_midpoints() -> np.ndarray:
    """float32 bits: every HiF8 value, every midpoint between neighbours (0 and 2**-22, max and 1.5 * 2**15
    included), and the float32 neighbours of each, both signs; plus float32 subnormals, zeros, inf and NaNs."""
    pos = np.unique(np.abs(HiFloat8Format().values()[np.isfinite(HiFloat8Format().values())]))
    grid = np.concatenate([pos, [1.5 * 2.0**15]])
    x = np.concatenate([pos, (grid[:-1] + grid[1:]) / 2]).astype(np.float32).view(np.uint32)
    x = np.concatenate([x, x - np.uint32(1), x + np.uint32(1), np.uint32([1, 0x7FFFFF, 0x7F800000, 0x7F800001,
                                                                           0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF])])
    return np.concatenate([x, x ^ np.uint32(0x80000000)])


@pytest.mark.parametrize("mode", [RoundMode.NEAREST, RoundMode.NEAREST_AWAY], ids=lambda m: m.name.lower())
@pytest.mark.parametrize("fmt", [HiFloat8Format(), HiFloat8Format(saturate=True)], ids=str)
def test_nearest_loop_gives_the_cores_bits_on_every_value_and_midpoint(fmt, mode):
    src = values_and_midpoints()
    ovf = fmt.to_kernel_args().overflow
    want, core = np.empty_like(src), np.empty_like(src)
    reference_loop(src, want, ovf, int(mode), np.uint64(0), 32)
    f32_core_loop(src, core, ovf, int(mode))
    assert same_bits(core, want)
    got = np.empty_like(src)
    hifloat8_cpu.f32_loop(int(mode), False)(src, got, ovf, np.uint64(0), 32)
    assert same_bits(got, want)


@pytest.mark.exhaustive
@pytest.mark.parametrize("fmt", [HiFloat8Format(), HiFloat8Format(saturate=True)], ids=str)
def test_nearest_loop_gives_the_f32_cores_bits_on_every_float32(fmt):
    ovf = fmt.to_kernel_args().overflow
    loop = hifloat8_cpu.f32_loop(int(RoundMode.NEAREST), False)
    step = 1 << 26
    for start in range(0, 1 << 32, step):
        src = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32)
        want, got = np.empty_like(src), np.empty_like(src)
        f32_core_loop(src, want, ovf, int(RoundMode.NEAREST))
        loop(src, got, ovf, np.uint64(0), 32)
        assert same_bits(got, want), hex(start)


@pytest.mark.parametrize("mode", list(RoundMode), ids=lambda m: m.name.lower())
def test_float64_loop_rounds_float32_values_as_the_float32_loop(mode):
    src = patterns(1 << 12).view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        wide = src.astype(np.float64)
    key = seed_key(2)
    got32, got64 = np.empty_like(src), np.empty_like(wide)
    hifloat8_cpu.quantize_hif8(src, got32, 0, int(mode), key, 32)
    for parallel in (False, True):
        hifloat8_cpu.quantize_hif8(wide, got64, 0, int(mode), key, 32, parallel=parallel)
        with np.errstate(invalid="ignore"):
            assert np.array_equal(got64.astype(np.float32), got32, equal_nan=True), parallel


def test_quantize_hif8_rejects_mismatched_arrays_and_modes():
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="dst must match src in size and dtype"):
        hifloat8_cpu.quantize_hif8(a, np.zeros(4, np.float64), 0, 0, 0, 32)
    with pytest.raises(ValueError, match="mode=9"):
        hifloat8_cpu.quantize_hif8(a, a, 0, 9, 0, 32)
    with pytest.raises(TypeError, match="dtype=float16 is not supported"):
        hifloat8_cpu.hif8_runner(np.dtype(np.float16), 0)


def test_quantize_leaves_its_input_alone():
    x = torch.linspace(-50000, 50000, 1001)
    before = x.clone()
    import emunum
    emunum.quantize(x, "hifloat8", "stochastic", seed=1)
    assert torch.equal(x, before)
