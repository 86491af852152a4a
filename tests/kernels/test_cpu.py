"""CPU kernels (emunum.kernels.cpu) called directly: serial and parallel loops give the same bits, on one or
two numba threads, in place or not, and agree bit for bit with the numpy reference."""
from __future__ import annotations

import re

import numpy as np
import pytest

import emunum
from emunum import FixedFormat, FloatFormat, RoundMode
from emunum.rng import seed_key
from emunum.reference import round_fixed_reference, round_float_reference

cpu = pytest.importorskip("emunum.kernels.cpu")
numba = pytest.importorskip("numba")

SEED = 31337
FLOAT_CASES = {
    "fp8_152": emunum.get_format("fp8_152"),
    "e4m3fnuz": emunum.get_format("e4m3fnuz"),
    "e4m3_nosub_sat": FloatFormat(4, 3, subnormals=False, saturate=True),
    "e8m3_bias140": FloatFormat(8, 3, bias=140),  # float32 inputs take the generic (not the fast) path
}
FIXED_CASES = {
    "int8": emunum.get_format("int8"),
    "fixed8_3_wrap": FixedFormat(8, 3, saturate=False),
    # round to nearest of float32 takes kernels/fixed_f32.py where the format saturates (these, not the one above)
    "fixed16_12": emunum.get_format("fixed16_12"),
    "ufixed8_m3": FixedFormat(8, -3, signed=False),
    "fixed25_64": FixedFormat(25, 64),
    "ufixed24_m64": FixedFormat(24, -64, signed=False),
}


def _inputs(dtype, n: int = 3 * (1 << 14)) -> np.ndarray:
    """Random bit patterns (every exponent, NaN payloads, subnormals) and log-uniform values of either sign."""
    rng = np.random.default_rng(4)
    uint = np.uint32 if dtype == np.float32 else np.uint64
    bits = rng.integers(0, np.iinfo(uint).max, n // 2, dtype=uint, endpoint=True).view(dtype)
    mags = np.exp2(rng.uniform(-40, 40, n - n // 2)) * np.where(rng.random(n - n // 2) < 0.5, -1, 1)
    return np.concatenate([bits, mags.astype(dtype)])


def _float_call(fmt: FloatFormat, src, dst, mode, sr_bits=32, parallel=None):
    cpu.quantize_float(src, dst, *fmt.to_kernel_args(), int(mode), seed_key(SEED), sr_bits,
                       parallel=parallel)


def _fixed_call(fmt: FixedFormat, src, dst, mode, sr_bits=32, parallel=None):
    cpu.quantize_fixed(src, dst, *fmt.to_kernel_args(), int(mode), seed_key(SEED), sr_bits, parallel=parallel)


def _run(fmt, src, mode, sr_bits=32, parallel=None, inplace=False):
    dst = src.copy() if inplace else np.empty_like(src)
    call = _float_call if isinstance(fmt, FloatFormat) else _fixed_call
    call(fmt, dst if inplace else src, dst, mode, sr_bits, parallel)
    return dst


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _reference(fmt, src, mode, sr_bits=32):
    with np.errstate(invalid="ignore"):
        v = src.astype(np.float64)
    if isinstance(fmt, FloatFormat):
        return round_float_reference(v, fmt, mode, seed=SEED, sr_bits=sr_bits)
    return round_fixed_reference(v, fmt, mode, seed=SEED, sr_bits=sr_bits)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):
        got = got.astype(np.float64)
    gn, wn = np.isnan(got), np.isnan(want)
    bad = (gn != wn) | (~gn & ((got != want) | (np.signbit(got) != np.signbit(want))))
    assert not bad.any(), (np.flatnonzero(bad)[:5], got[bad][:5], want[bad][:5])


# the generic float32 path (e8m3_bias140) with two modes here; test_quantize.py covers all its modes
FLOAT_RUNS = [(n, m) for n in FLOAT_CASES for m in RoundMode
              if n != "e8m3_bias140" or m in (RoundMode.NEAREST, RoundMode.STOCHASTIC)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,mode", FLOAT_RUNS, ids=[f"{n}-{m.name.lower()}" for n, m in FLOAT_RUNS])
def test_float_serial_parallel_and_reference_agree(name, mode, dtype):
    fmt = FLOAT_CASES[name]
    src = _inputs(dtype)
    before = src.copy()
    serial = _run(fmt, src, mode, parallel=False)
    parallel = _run(fmt, src, mode, parallel=True)
    assert np.array_equal(_bits(serial), _bits(parallel))
    assert np.array_equal(_bits(_run(fmt, src, mode, inplace=True)), _bits(serial))
    assert np.array_equal(_bits(src), _bits(before))
    _same(serial, _reference(fmt, src, mode))
    nan_in = np.isnan(src)
    quiet = _bits(src).dtype.type(1 << (22 if dtype == np.float32 else 51))
    # an input NaN comes back as the same NaN, quietened (IEEE 754): sign and payload kept
    assert np.array_equal(_bits(serial)[nan_in], _bits(src)[nan_in] | quiet)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", list(RoundMode), ids=lambda m: m.name.lower())
@pytest.mark.parametrize("name", list(FIXED_CASES))
def test_fixed_serial_parallel_and_reference_agree(name, mode, dtype):
    fmt = FIXED_CASES[name]
    src = _inputs(dtype)
    serial = _run(fmt, src, mode, parallel=False)
    parallel = _run(fmt, src, mode, parallel=True)
    assert np.array_equal(_bits(serial), _bits(parallel))
    assert np.array_equal(_bits(_run(fmt, src, mode, inplace=True)), _bits(serial))
    _same(serial, _reference(fmt, src, mode))


@pytest.mark.parametrize("sr_bits", [1, 3, 8, 32])
def test_stochastic_bits_independent_of_thread_count(sr_bits):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has a single thread here")
    src = _inputs(np.float32, 1 << 16)
    fmt, fx = FLOAT_CASES["fp8_152"], FIXED_CASES["int8"]
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _run(fmt, src, RoundMode.STOCHASTIC, sr_bits, parallel=True)
        one_fx = _run(fx, src, RoundMode.STOCHASTIC, sr_bits, parallel=True)
        numba.set_num_threads(2)
        two = _run(fmt, src, RoundMode.STOCHASTIC, sr_bits, parallel=True)
        two_fx = _run(fx, src, RoundMode.STOCHASTIC, sr_bits, parallel=True)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(_bits(one), _bits(two))
    assert np.array_equal(_bits(one_fx), _bits(two_fx))
    assert np.array_equal(_bits(one), _bits(_run(fmt, src, RoundMode.STOCHASTIC, sr_bits, parallel=False)))
    _same(one, _reference(fmt, src, RoundMode.STOCHASTIC, sr_bits))


def test_size_picks_the_loop_without_changing_bits():
    fmt = FLOAT_CASES["fp8_152"]
    for n in sorted({max(1, cpu.PARALLEL_MIN - 1), max(1, cpu.PARALLEL_MIN), cpu.PARALLEL_MIN + 1}):
        src = _inputs(np.float32, n)
        auto = _run(fmt, src, RoundMode.STOCHASTIC)
        assert np.array_equal(_bits(auto), _bits(_run(fmt, src, RoundMode.STOCHASTIC, parallel=False)))


def test_empty_and_single_element_arrays():
    fmt = FLOAT_CASES["fp8_152"]
    for parallel in (False, True):
        assert _run(fmt, np.empty(0, np.float32), RoundMode.NEAREST, parallel=parallel).size == 0
        assert _run(fmt, np.array([1.1], np.float32), RoundMode.NEAREST, parallel=parallel)[0] == 1.0


def test_max_bits_is_the_binary_layout_of_max():
    assert cpu.max_bits(448.0, np.float32) == 0x43E00000
    assert cpu.max_bits(57344.0, np.float64) == 0x40EC000000000000
    assert cpu.LAYOUT[np.dtype(np.float32)][1:] == (31, 23, 127)
    assert cpu.LAYOUT[np.dtype(np.float64)][1:] == (63, 52, 1023)


@pytest.mark.parametrize("mode", [RoundMode.NEAREST, RoundMode.STOCHASTIC])
def test_fixed_point_loop_vectorises(mode):
    """The fixed-point element loop, compiled afresh from its source with its own options: no exception branch
    (numba's default error model raises on a division by zero, a branch per division that kept the loop scalar)
    and no per-element ``math.ldexp`` call (the format's powers of two are made once, before the loop), so LLVM
    runs it in vector registers (14 -> 2 ns per element, benchmarks/RESULTS.md "Stop 55"). Either defect
    alone leaves no packed float64 arithmetic in the function."""
    import llvmlite.binding as llvm

    disp = cpu.fixed_range(int(mode))
    fresh = numba.njit(**{k: v for k, v in disp.targetoptions.items() if k not in ("cache", "nopython")})(
        disp.py_func)
    fmt = FIXED_CASES["fixed8_3_wrap"]  # wraps: the float64 loop, not kernels/fixed_f32.py
    src = _inputs(np.float32, 64)
    dst = np.empty_like(src)
    frac, cmin, cmax, sat = fmt.to_kernel_args()
    fresh(0, src.size, src.ctypes.data, dst.ctypes.data, src[:0], 0, frac, np.int64(cmin), np.int64(cmax), sat,
          np.uint64(seed_key(SEED)), 32)
    assert np.array_equal(_bits(dst), _bits(_run(fmt, src, mode)))
    features = llvm.get_host_cpu_features()
    if not (features.get("avx2") or features.get("avx512f")):
        pytest.skip("not an x86 host with AVX2: the vector check is for x86's registers")
    asm = fresh.inspect_asm(fresh.signatures[0])
    packed = re.findall(r"\n\s*(v\w+pd)\s[^\n]*[yz]mm", asm)  # float64 arithmetic on 256/512-bit registers
    assert len(packed) >= 10, packed


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", ["int8", "fixed16_12", "ufixed8_m3", "fixed25_64", "ufixed24_m64"])
def test_fixed_nearest_float32_lanes_match_the_float64_core_on_every_float32(name):
    """kernels/fixed_f32.py against the float64 core (the same kernel on the values as float64, rounded to
    float32 as the core stores them) on all 2**32 float32 bit patterns."""
    fmt = FIXED_CASES[name]
    step = 1 << 24
    for start in range(0, 1 << 32, step):
        src = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        fast = _run(fmt, src, RoundMode.NEAREST)
        core = _run(fmt, src.astype(np.float64), RoundMode.NEAREST).astype(np.float32)
        bad = _bits(fast) != _bits(core)
        assert not bad.any(), (start, src[bad][:5], fast[bad][:5], core[bad][:5])
