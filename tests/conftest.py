"""Shared cases and independent oracles for the core tests (formats, rounding, quantize, kernels).

Oracles, none of which shares code with emunum's rounding:
- ``gfloat_round``: gfloat's ``round_ndarray`` (float formats with subnormals; every mode but odd),
  plus round-to-odd derived from gfloat's toward-zero result and the target's codes;
- ``value_set_round``: brute force over ``fmt.values()`` (formats of <= 16 bits; every mode), the
  oracle for round-to-odd and for formats without subnormals;
- ``fixed_round``: exact integer arithmetic on Python ints (every mode, saturate or wrap).

Fixtures: ``gfloat_float_case`` / ``value_set_float_case`` / ``fixed_case`` (parametrised formats),
``rounding`` (every mode; stochastic with sr_bits 32, 8 and 3), ``oracles`` (the helpers below, as one
namespace: other test modules use it too, so keep its names stable).
"""
from __future__ import annotations

import os

# Before any kernel module loads: numba's inliner copies with one memo (kernels/_inline_copy.py), the same
# machine code in about half the compile time; subprocesses the tests start inherit it.
os.environ.setdefault("EMUNUM_NUMBA_INLINE_COPY", "1")
# torch.compile tests: inductor compiles in this process, not in a pool of workers that each import torch again
# (same generated code; about 10 CPU-s less per test process that compiles, measured on one compile test)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Idle OpenMP threads (torch's intra-op pool) sleep instead of spinning: two test processes share two cores (make
# test), and a pool spinning between torch ops burns the CPU that the other process waits for. Same thread count,
# same results; the CPU figures are in benchmarks/RESULTS.md ("OpenMP's idle threads"). Subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":  # the simulator's blocks wait on their threads, not spin
    import cuda_sim_scheduler

    cuda_sim_scheduler.install()
    # the simulator runs each CUDA thread as a Python thread: 32-thread blocks for the grid-stride kernels (their
    # launch shape changes speed only, kernels/cuda.py; the CUDA test files of kernels/cuda.py's launches took
    # 54 -> 41 s of wall time in one process)
    from emunum.kernels import cuda as _kernels_cuda

    _kernels_cuda.THREADS_PER_BLOCK = 32

import functools  # noqa: E402
import types
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import gfloat
import gfloat.formats as gff

from emunum.formats import PRESETS
from emunum.rng import random_bits_reference, seed_key
from emunum.formats import FixedFormat, FloatFormat, Overflow, RoundMode, Special

SEED = 20240611  # stochastic-rounding seed used by the oracle comparisons


# ---------------------------------------------------------------------------------------------------------
# pytest -n (make test): the shared kernels compile once, before the workers' first test (kernel_warmup.py)
# ---------------------------------------------------------------------------------------------------------
def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        import kernel_warmup

        kernel_warmup.start(str(config.rootpath))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    import kernel_warmup

    kernel_warmup.wait()


# ---------------------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rounding:
    """A rounding mode, with the number of random bits when stochastic."""

    mode: RoundMode
    sr_bits: int = 32

    @property
    def id(self) -> str:
        name = self.mode.name.lower()
        return f"{name}{self.sr_bits}" if self.mode == RoundMode.STOCHASTIC else name


ROUNDINGS = [Rounding(m) for m in RoundMode if m != RoundMode.STOCHASTIC] + [
    Rounding(RoundMode.STOCHASTIC, b) for b in (32, 8, 3)
]

# every preset of 8 bits or fewer, and custom formats (<= 16 bits) covering odd and negative biases, no
# subnormals, each special policy, saturation, normals below float32's normal range, and man=0
SMALL_FLOAT_FORMATS = {
    **{name: PRESETS[name] for name in
       ("fp8_152", "fp8_143", "e4m3fn", "e4m3fnuz", "e5m2fnuz", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1")},
    "e3m4_bias5": FloatFormat(3, 4, bias=5),
    "e4m3_nosub": FloatFormat(4, 3, subnormals=False),
    "e5m2_sat": FloatFormat(5, 2, saturate=True),
    "e4m2fnuz": FloatFormat(4, 2, special="fnuz"),
    "e4m3fn_sat": FloatFormat(4, 3, special="fn", saturate=True),
    "e3m3fn_bias2": FloatFormat(3, 3, special="fn", bias=2),
    "e3m2_bias-1": FloatFormat(3, 2, bias=-1),
    "e2m2none_nosub": FloatFormat(2, 2, special="none", subnormals=False),
    "e3m1fnuz_nosub_sat": FloatFormat(3, 1, special="fnuz", subnormals=False, saturate=True),
    "e5m2_nosub_bias7": FloatFormat(5, 2, bias=7, subnormals=False),
    "e8m3_bias140": FloatFormat(8, 3, bias=140),  # normals inside float32's subnormal range
    "e6m2_bias-40": FloatFormat(6, 2, bias=-40),
    # man=0: the significand is the implicit bit alone, so ties-to-even and odd use the code's parity,
    # which is the biased exponent's (gfloat's rule)
    "e4m0": FloatFormat(4, 0),
    "e3m0none": FloatFormat(3, 0, special="none"),
}
WIDE_FLOAT_FORMATS = {name: PRESETS[name] for name in ("fp16", "bf16", "fp16_169", "tf32", "fp32")}

FIXED_FORMATS = {
    "int8": PRESETS["int8"],
    "int4": PRESETS["int4"],
    "uint8": PRESETS["uint8"],
    "fixed16_12": PRESETS["fixed16_12"],
    "fixed8_3_wrap": FixedFormat(8, 3, saturate=False),
    "ufixed6_2": FixedFormat(6, 2, signed=False),
    "ufixed6_2_wrap": FixedFormat(6, 2, signed=False, saturate=False),
    "fixed5_-2": FixedFormat(5, -2),
    "fixed1_0": FixedFormat(1, 0),
}

# gfloat's own FormatInfo for the formats it ships; the rest are built by gfloat_info()
GFLOAT_NATIVE = {
    "fp8_152": gff.format_info_ocp_e5m2,
    "e4m3fn": gff.format_info_ocp_e4m3,
    "fp6_e3m2": gff.format_info_ocp_e3m2,
    "fp6_e2m3": gff.format_info_ocp_e2m3,
    "fp4_e2m1": gff.format_info_ocp_e2m1,
    "fp16": gff.format_info_binary16,
    "bf16": gff.format_info_bfloat16,
    "fp32": gff.format_info_binary32,
}


def gfloat_info(fmt: FloatFormat) -> gfloat.FormatInfo | None:
    """A gfloat FormatInfo with fmt's value set, or None where gfloat's semantics differ (no subnormals:
    gfloat then rounds below min_normal at the input's own binade instead of to the value set)."""
    if not fmt.subnormals:
        return None
    for name, fi in GFLOAT_NATIVE.items():
        if PRESETS[name] == fmt:
            return fi
    domain = gfloat.Domain.Extended if fmt.special == Special.IEEE else gfloat.Domain.Finite
    high_nans = {Special.IEEE: 2**fmt.man - 1, Special.FN: 1, Special.FNUZ: 0, Special.NONE: 0}[fmt.special]
    return gfloat.FormatInfo(
        fmt.name, k=fmt.bits, precision=fmt.man + 1, bias=fmt.bias, is_signed=True, domain=domain,
        has_nz=fmt.has_negative_zero, num_high_nans=high_nans, has_subnormals=True, is_twos_complement=False,
    )


def _ids(d):
    return list(d)


_GFLOAT_CASES = {k: f for k, f in {**SMALL_FLOAT_FORMATS, **WIDE_FLOAT_FORMATS}.items() if f.subnormals}
_VALUE_SET_CASES = {k: f for k, f in {**SMALL_FLOAT_FORMATS, **WIDE_FLOAT_FORMATS}.items() if f.bits <= 16}


@pytest.fixture(params=list(_GFLOAT_CASES.values()), ids=_ids(_GFLOAT_CASES))
def gfloat_float_case(request) -> FloatFormat:
    """Every float case gfloat can express (those with subnormals)."""
    return request.param


@pytest.fixture(params=list(_VALUE_SET_CASES.values()), ids=_ids(_VALUE_SET_CASES))
def value_set_float_case(request) -> FloatFormat:
    """Every float case of <= 16 bits (``fmt.values()`` lists it)."""
    return request.param


@pytest.fixture(params=list(FIXED_FORMATS.values()), ids=_ids(FIXED_FORMATS))
def fixed_case(request) -> FixedFormat:
    return request.param


@pytest.fixture(params=ROUNDINGS, ids=[r.id for r in ROUNDINGS])
def rounding(request) -> Rounding:
    return request.param


# ---------------------------------------------------------------------------------------------------------
# probe values
# ---------------------------------------------------------------------------------------------------------
def _quiet(fn):
    """Run fn with numpy's overflow/invalid warnings off (probes deliberately overflow and hold NaNs)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore"):
            return fn(*args, **kwargs)
    return wrapped


def _with_neighbours(v: np.ndarray) -> np.ndarray:
    """v, and the next values of v's dtype toward -inf and +inf (one ulp either side)."""
    return np.concatenate([v, np.nextafter(v, v.dtype.type(np.inf)), np.nextafter(v, v.dtype.type(-np.inf))])


def _special_values(dtype) -> np.ndarray:
    fi = np.finfo(dtype)
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, -fi.max, fi.smallest_subnormal,
                     -fi.smallest_subnormal, fi.smallest_normal, -fi.smallest_normal], dtype=dtype)


def _ulp_of_max(fmt: FloatFormat) -> float:
    return float(np.ldexp(1.0, fmt.emax - fmt.man))


def _log_uniform(rng, lo_exp: float, hi_exp: float, n: int) -> np.ndarray:
    mag = np.exp2(rng.uniform(lo_exp, hi_exp, n))
    return np.where(rng.random(n) < 0.5, -mag, mag)


@functools.lru_cache(maxsize=None)
@_quiet
def float_probes(fmt: FloatFormat, dtype, n_random: int = 4000) -> np.ndarray:
    """Every code point and midpoint (<= 12-bit formats) or random codes and their midpoints (wider),
    each +-1 ulp of ``dtype``; the overflow boundary; values below half the smallest subnormal; +-0,
    +-inf, NaN; log-uniform random values; random bit patterns; for <= 8-bit formats and float32, every
    float16 value."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(abs(hash((fmt.name, dtype.name))) % 2**32)
    if fmt.bits <= 12:
        vals = fmt.values()
    else:  # random codes and their successors (neighbour pairs), both signs
        codes = rng.integers(0, 2 ** (fmt.bits - 1) - 1, 3000)
        vals = fmt.decode(codes)
        vals = np.concatenate([vals, fmt.decode(codes + 1)])
        vals = np.unique(vals[np.isfinite(vals)])
        vals = np.concatenate([vals, -vals])
        vals = np.unique(vals)
    mids = (vals[:-1] + vals[1:]) / 2  # exact in float64
    s, top = _ulp_of_max(fmt), fmt.max + _ulp_of_max(fmt)
    tiny = fmt.min_subnormal
    edges = np.array([fmt.max, fmt.max + s / 2, fmt.max + s / 4, fmt.max + 3 * s / 4, top, top + s / 2, 2 * top,
                      4 * fmt.max, tiny / 2, tiny / 4, 3 * tiny / 4, tiny / 2**20, fmt.min_normal / 2])
    edges = np.concatenate([edges, -edges])
    base = np.concatenate([vals, mids, edges]).astype(dtype)
    base = base[np.isfinite(base)]
    rand = _log_uniform(rng, np.log2(tiny) - 4, np.log2(top) + 2, n_random).astype(dtype)
    uint = np.uint32 if dtype == np.float32 else np.uint64
    bits = rng.integers(0, np.iinfo(uint).max, 1000, dtype=uint, endpoint=True).view(dtype)
    parts = [_with_neighbours(base), _special_values(dtype), rand, bits]
    if fmt.bits <= 8 and dtype == np.float32:  # float64 holds the same values: one dtype suffices
        parts.append(np.arange(2**16, dtype=np.uint16).view(np.float16).astype(dtype))
    out = np.concatenate(parts)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=None)
@_quiet
def fixed_probes(fmt: FixedFormat, dtype, n_random: int = 1500) -> np.ndarray:
    """Every code and midpoint (codes of 16 bits or fewer, else random codes), each +-1 ulp; values beyond
    the range by up to 8x (wrap-around); tiny values; +-0, +-inf, NaN; log-uniform random values."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(abs(hash((fmt.name, dtype.name))) % 2**32)
    if fmt.bits <= 12:
        codes = np.arange(fmt.code_min - 2**fmt.bits, fmt.code_max + 2**fmt.bits + 2, dtype=np.float64)
    else:
        codes = rng.integers(fmt.code_min, fmt.code_max, 1000, endpoint=True).astype(np.float64)
        codes = np.concatenate([codes, [fmt.code_min, fmt.code_max, fmt.code_max + 1, fmt.code_min - 1]])
    vals = np.ldexp(codes, -fmt.frac_bits)
    mids = np.ldexp(codes + 0.5, -fmt.frac_bits)
    quarter = np.ldexp(codes + 0.25, -fmt.frac_bits)
    span = max(abs(fmt.max), abs(fmt.min), fmt.eps)
    edges = np.array([fmt.eps / 2**30, fmt.eps / 3, 8 * span, 8 * span + fmt.eps / 2, 2.0**40 * span])
    base = np.concatenate([vals, mids, quarter, edges, -edges]).astype(dtype)
    rand = _log_uniform(rng, np.log2(fmt.eps) - 6, np.log2(span) + 4, n_random).astype(dtype)
    out = np.concatenate([_with_neighbours(base), _special_values(dtype), rand])
    out.setflags(write=False)
    return out


# ---------------------------------------------------------------------------------------------------------
# oracles
# ---------------------------------------------------------------------------------------------------------
def as_f64(v) -> np.ndarray:
    """float64 copy of v without numpy's 'invalid value' warning for signalling-NaN bit patterns."""
    with np.errstate(invalid="ignore"):
        return np.asarray(v, dtype=np.float64)


GFLOAT_MODE = {
    RoundMode.NEAREST: gfloat.RoundMode.TiesToEven,
    RoundMode.NEAREST_AWAY: gfloat.RoundMode.TiesToAway,
    RoundMode.TOWARD_ZERO: gfloat.RoundMode.TowardZero,
    RoundMode.UP: gfloat.RoundMode.TowardPositive,
    RoundMode.DOWN: gfloat.RoundMode.TowardNegative,
    RoundMode.STOCHASTIC: gfloat.RoundMode.Stochastic,
}


def random_bits(n: int, sr_bits: int, seed: int = SEED) -> np.ndarray:
    """The random bits emunum uses for elements 0..n-1, as int64 (for gfloat's integer arithmetic)."""
    return random_bits_reference(seed_key(seed), n, sr_bits).astype(np.int64)


@_quiet
def gfloat_round(fmt: FloatFormat, v: np.ndarray, rnd: Rounding, seed: int = SEED) -> np.ndarray:
    """gfloat's rounding of the float64 values of ``v`` (emunum's overflow policy: gfloat's sat=True where
    fmt saturates, including special='none'). Round-to-odd: toward zero, then the next value away from
    zero when inexact and the truncated code is even, never past max."""
    fi = gfloat_info(fmt)
    assert fi is not None, fmt
    v = as_f64(v)
    # gfloat scales |v| by 2**-(quantum exponent) with ldexp, which underflows to 0 for tiny float64 inputs
    # and a format whose quantum is huge (e.g. bias=-40: 5e-324 * 2**-39), losing a nonzero remainder.
    # Any |v| below min_subnormal * 2**-64 rounds exactly like that bound in every mode (zero unless the
    # mode rounds away; stochastic: frac * 2**sr_bits < 1/2), so pass the bound instead.
    floor = fmt.min_subnormal * 2.0**-64
    v = np.where((v != 0) & (np.abs(v) < floor), np.copysign(floor, v), v)
    sat = fmt.overflow == Overflow.SATURATE
    if rnd.mode == RoundMode.ODD:
        t = gfloat.round_ndarray(fi, v, gfloat.RoundMode.TowardZero, sat=sat)
        inexact = np.isfinite(v) & (t != v)
        even = np.zeros(v.shape, dtype=bool)
        even[inexact] = (fmt.encode(t[inexact]) & 1) == 0
        # the next value of fmt above |t|: round a point just above |t| toward +inf (saturating at max)
        above = np.maximum(np.nextafter(np.abs(np.where(inexact, t, 0.0)), np.inf), floor)
        nxt = gfloat.round_ndarray(fi, above, gfloat.RoundMode.TowardPositive, sat=True)
        nxt = np.where(np.signbit(v), -nxt, nxt)
        return np.where(inexact & even, nxt, t)
    if rnd.mode == RoundMode.STOCHASTIC:
        srbits = random_bits(v.size, rnd.sr_bits, seed)
        return gfloat.round_ndarray(fi, v, GFLOAT_MODE[rnd.mode], sat=sat, srbits=srbits, srnumbits=rnd.sr_bits)
    return gfloat.round_ndarray(fi, v, GFLOAT_MODE[rnd.mode], sat=sat)


@_quiet
def value_set_round(fmt: FloatFormat, v: np.ndarray, rnd: Rounding, seed: int = SEED) -> np.ndarray:
    """Brute-force rounding to the value set ``fmt.values()`` (<= 16-bit float formats).

    The neighbours lo <= |v| < hi come from a sorted search of the non-negative values, extended by a
    sentinel one ulp above max (the first value of the unbounded exponent range beyond max). Parity, for
    ties-to-even, odd and stochastic's ties, is the parity of lo's code (``fmt.encode``); hi has the
    other parity (neighbouring codes), which also holds for the gap [0, min_normal] of a format without
    subnormals: 0 counts as even, min_normal as odd (the quantum there is min_normal). A result at the
    sentinel is an overflow: +-max if fmt saturates or the mode is toward zero / odd / toward max's side,
    else inf or NaN by the special-value policy. Infinite inputs follow the overflow policy.
    """
    v = as_f64(v)
    floor = fmt.min_subnormal * 2.0**-64  # as in gfloat_round: keeps (|v| - 0) / hi from underflowing
    v = np.where((v != 0) & (np.abs(v) < floor), np.copysign(floor, v), v)
    mode = rnd.mode
    vals = fmt.values()
    pos = vals[vals >= 0] + 0.0  # the zero as +0
    par = (fmt.encode(pos) & 1).astype(bool)
    sentinel = fmt.max + _ulp_of_max(fmt)
    ext = np.append(pos, sentinel)
    neg = np.signbit(v)
    a = np.abs(v)
    fin = np.isfinite(a)
    aa = np.where(fin, np.minimum(a, sentinel), 0.0)
    i = np.searchsorted(ext, aa, side="right") - 1
    i = np.minimum(i, ext.size - 2)
    lo, hi = ext[i], ext[i + 1]
    lo_odd = par[i]
    delta = (aa - lo) / (hi - lo)  # exact: |v| - lo is exact (Sterbenz) and hi - lo is a power of two
    if mode == RoundMode.NEAREST:
        away = (delta > 0.5) | ((delta == 0.5) & lo_odd)
    elif mode == RoundMode.NEAREST_AWAY:
        away = delta >= 0.5
    elif mode == RoundMode.TOWARD_ZERO:
        away = np.zeros_like(neg)
    elif mode == RoundMode.UP:
        away = (delta > 0) & ~neg
    elif mode == RoundMode.DOWN:
        away = (delta > 0) & neg
    elif mode == RoundMode.ODD:
        away = (delta > 0) & ~lo_odd
    else:
        d = np.ldexp(delta, rnd.sr_bits)
        f = np.floor(d)
        dd = d - f
        drnd = f + ((dd > 0.5) | ((dd == 0.5) & (np.mod(f, 2) == 1)))
        away = drnd + random_bits(v.size, rnd.sr_bits, seed).astype(np.float64) >= 2.0**rnd.sr_bits
    mag = np.where(away, hi, lo)
    beyond = fin & (a >= sentinel)  # rounds past max in every mode that rounds away from zero here
    if mode in (RoundMode.NEAREST, RoundMode.NEAREST_AWAY, RoundMode.STOCHASTIC):
        mag = np.where(beyond, sentinel, mag)
    elif mode == RoundMode.UP:
        mag = np.where(beyond, np.where(neg, fmt.max, sentinel), mag)
    elif mode == RoundMode.DOWN:
        mag = np.where(beyond, np.where(neg, sentinel, fmt.max), mag)
    else:
        mag = np.where(beyond, fmt.max, mag)
    overflow_value = {Overflow.SATURATE: fmt.max, Overflow.INF: np.inf, Overflow.NAN: np.nan}[fmt.overflow]
    to_max = mode in (RoundMode.TOWARD_ZERO, RoundMode.ODD)
    mag = np.where(mag == sentinel, fmt.max if to_max else overflow_value, mag)
    mag = np.where(np.isinf(a), overflow_value, mag)
    mag = np.where(np.isnan(a), np.nan, mag)
    out = np.where(neg, -mag, mag)
    if not fmt.has_negative_zero:
        out = np.where(out == 0, 0.0, out)
    return out


def _fixed_one(x: float, fmt: FixedFormat, mode: RoundMode, rbits: int, sr_bits: int) -> float:
    if x != x:
        return float("nan")
    if x in (float("inf"), float("-inf")):
        return float(np.ldexp(float(fmt.code_max if x > 0 else fmt.code_min), -fmt.frac_bits))
    num, den = x.as_integer_ratio()
    if fmt.frac_bits >= 0:
        num <<= fmt.frac_bits
    else:
        den <<= -fmt.frac_bits
    neg = num < 0
    k, r = divmod(abs(num), den)  # |x| * 2**frac = k + r/den
    if r:
        odd = k & 1 == 1
        if mode == RoundMode.NEAREST:
            up = 2 * r > den or (2 * r == den and odd)
        elif mode == RoundMode.NEAREST_AWAY:
            up = 2 * r >= den
        elif mode == RoundMode.TOWARD_ZERO:
            up = False
        elif mode == RoundMode.UP:
            up = not neg
        elif mode == RoundMode.DOWN:
            up = neg
        elif mode == RoundMode.ODD:
            up = not odd
        else:
            q, rr = divmod(r << sr_bits, den)  # r/den to sr_bits bits, ties to even
            q += 2 * rr > den or (2 * rr == den and q & 1 == 1)
            up = q + rbits >= 1 << sr_bits
        k += up
    code = -k if neg else k
    if not fmt.code_min <= code <= fmt.code_max:
        if fmt.saturate:
            code = min(max(code, fmt.code_min), fmt.code_max)
        else:
            code = (code - fmt.code_min) % 2**fmt.bits + fmt.code_min
    return float(np.ldexp(float(code), -fmt.frac_bits)) + 0.0  # +0.0: zero is +0


def fixed_round(fmt: FixedFormat, v: np.ndarray, rnd: Rounding, seed: int = SEED) -> np.ndarray:
    """Fixed-point rounding by exact integer arithmetic on Python ints (every mode; clamp or wrap)."""
    v = as_f64(v).reshape(-1)
    rb = random_bits(v.size, rnd.sr_bits, seed) if rnd.mode == RoundMode.STOCHASTIC else np.zeros(v.size, np.int64)
    return np.array([_fixed_one(float(x), fmt, rnd.mode, int(b), rnd.sr_bits) for x, b in zip(v, rb)])


@functools.lru_cache(maxsize=None)
def _fixed_expected(fmt: FixedFormat, dtype: str, rnd: Rounding) -> np.ndarray:
    out = fixed_round(fmt, fixed_probes(fmt, np.dtype(dtype)), rnd)
    out.setflags(write=False)
    return out


def fixed_expected(fmt: FixedFormat, dtype, rnd: Rounding) -> np.ndarray:
    """``fixed_round`` of ``fixed_probes(fmt, dtype)``, computed once per session (Python-int arithmetic
    is the slowest oracle; the kernel and reference sweeps share it)."""
    return _fixed_expected(fmt, np.dtype(dtype).str, rnd)


# ---------------------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------------------
def assert_same_values(got, want, inputs=None, what: str = "") -> None:
    """Zero-tolerance equality: NaN where NaN (any sign), otherwise equal values with equal sign bits
    (so -0 and +0 differ). The message lists the first mismatches with their inputs."""
    got = as_f64(got).reshape(-1)
    want = as_f64(want).reshape(-1)
    assert got.shape == want.shape, (got.shape, want.shape)
    gn, wn = np.isnan(got), np.isnan(want)
    bad = (gn != wn) | (~gn & ~wn & ((got != want) | (np.signbit(got) != np.signbit(want))))
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        rows = []
        for j in idx:
            src = f"x={float(inputs.reshape(-1)[j])!r} ({float(inputs.reshape(-1)[j]).hex()}) " if inputs is not None else ""
            rows.append(f"  [{j}] {src}got {got[j]!r} want {want[j]!r}")
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} differ\n" + "\n".join(rows))


@pytest.fixture(scope="session")
def oracles():
    """The oracle helpers of this module, for tests (conftest is not imported directly)."""
    return types.SimpleNamespace(
        SEED=SEED, ROUNDINGS=ROUNDINGS, Rounding=Rounding, SMALL_FLOAT_FORMATS=SMALL_FLOAT_FORMATS,
        WIDE_FLOAT_FORMATS=WIDE_FLOAT_FORMATS,
        FIXED_FORMATS=FIXED_FORMATS, GFLOAT_NATIVE=GFLOAT_NATIVE, gfloat_info=gfloat_info,
        float_probes=float_probes, fixed_probes=fixed_probes, gfloat_round=gfloat_round,
        value_set_round=value_set_round, fixed_round=fixed_round, random_bits=random_bits,
        assert_same_values=assert_same_values, quantize_np=quantize_np, fixed_expected=fixed_expected,
    )


def quantize_np(v: np.ndarray, fmt, rnd: Rounding, seed: int = SEED) -> np.ndarray:
    """emunum.quantize on a numpy array (a copy), returning numpy."""
    import emunum

    t = torch.from_numpy(np.array(v))
    return emunum.quantize(t, fmt, rnd.mode, seed=seed, sr_bits=rnd.sr_bits).numpy()
