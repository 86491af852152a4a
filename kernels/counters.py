"""Numerics-trace counters for ``emunum.trace``: on their own, or fused into the CPU rounding loops.

Every entry point adds to ``out`` (float64[6]): (values, overflowed, underflowed to zero, NaN, signal power,
noise power) of rounding x -> q, as ``emunum.trace`` defines them.

One order of summation, on every path (so every path gives the same bits). The elements are cut into chunks of
``CHUNK`` consecutive elements; ``count_chunk`` counts one chunk; the chunk results (float64) are added up in
chunk order, starting from zero, and that total is added to ``out``. The standalone counters
(``counters_serial`` / ``counters_parallel``) and the fused rounding kernels (``*_counted_serial`` /
``*_counted_parallel``) all go through ``count_chunk`` and ``_total``, so their counts and sums agree bit for bit
whatever the thread count. The counts are exact.

The sums of one chunk. Where x and q are finite throughout the chunk (the common case), they are computed in
the tensor's dtype (``_count_finite``): for float32, the sum of the float32 terms x*x and (q - x)*(q - x), each
difference and product rounded to float32 (or the product fused into its addition), added in float32 lanes in
the compiler's lane order (vectorised; fixed for one build): the sum of float32 per-lane partial sums, converted
to float64. That result stands unless a sum overflowed, or is below ``TINY_F32`` (2**-100) without every one of
its terms being exactly zero (underflow may have lost terms). Such chunks, and any chunk with an inf or NaN in x
or q, are summed by ``_count_masked`` in float64 over the elements where x and q are both finite (for float32
values its terms are exact). Error bound, S the exact sum of a chunk's k terms, gamma_m = m u / (1 - m u):
float32 lanes |S' - S| <= (gamma_(k+2) + 2**-37) S with u = 2**-24 (k <= CHUNK: below 2.5e-4 relative, 0.0011 dB
of SQNR; typically ~1e-6); float64 (float64 tensors: ``TINY_F64`` = 2**-1000, likewise) gamma_(k+2) S with
u = 2**-53; the float64 total over chunks adds gamma_(chunks) with u = 2**-53 (``tests/kernels/test_counters.py``
checks both against ``math.fsum``). The float32 lanes cost half of the float64 ones (0.15 instead of 0.31
ns/element in the fused pass, AVX-512 host).

Fused rounding + counting (``f32_counted_*``, ``float_counted_*``, ``fixed_counted_*``): per chunk, the serial
rounding kernel of ``kernels/cpu.py`` (the same function, over the chunk's range of elements, so that a
stochastic rounding draws element i's bits: the bits do not change), then ``count_chunk`` on that chunk's
input and output while both are still in L1 cache. The separate pass re-read both tensors from memory and paid
a second call; the fused one reads each element once. Parallel: chunks are spread over threads (``prange``),
each chunk rounded and counted by one thread; ``dst`` must not be ``src`` (the counts need the input).
fastmath (reassociation, no-signed-zeros, contraction) applies only inside the two chunk loops, so that their
sums vectorise; NaN and inf tests keep their IEEE meaning, and the rounding loops are compiled without it.
"""
import functools

import numpy as np
from numba import carray, njit, prange

from . import _cache, cpu as _cpu  # noqa: F401  (cpu sets numba's threading layer beside torch's)
from . import elementwise_f32 as _ew, parallel as _parallel, scalar

_cache.guard(__file__, [_cpu.__file__, _ew.__file__, *scalar.SOURCES])

from .cpu import _voidptr, f32_range, fixed_range, float_range, mode_switch  # noqa: E402

# The rounding loops for a mode given at run time (the counted kernels take the mode as an argument).
f32_serial = mode_switch(f32_range)
fixed_serial = mode_switch(fixed_range)
from .direct import direct_caller  # noqa: E402

fm = {"reassoc", "nsz", "contract"}
# Integers passed to another compiled kernel are int64, as the Python callers pass them: prange's index and
# ``.ctypes.data`` are uint64 and a constant 0 a literal, and each other type compiles the callee once more.
I64 = np.int64
CHUNK = 4096  # elements per chunk: two float32 chunks (x and q) take 32 KiB, inside L1
# the smallest fast-path chunk sum kept (float32, float64 chunks): at least 2**38 times the total error that
# CHUNK terms rounded in the subnormal range (each by at most half the smallest subnormal) can make
TINY_F32, TINY_F64 = 2.0**-100, 2.0**-1000


@njit(cache=True, nogil=True, fastmath=fm)
def _count_masked(x, q, lo, hi, sqnr, parts, c):
    """parts[c] = (overflowed, underflowed, NaN, signal, noise) of x -> q, every element tested (the exact
    definitions; the sums in float64, over the elements where x and q are both finite). The counts add up in
    float32 (whole numbers below 2**24: exact in any order, and twice the SIMD width of int64 counters)."""
    one, zero = np.float32(1.0), np.float32(0.0)
    over = under = nan = zero
    sig = noise = 0.0
    for i in range(x.size):
        a, b = x[i], q[i]
        fa = abs(a) < np.inf
        over += one if fa & ((a > hi) | (a < lo)) else zero
        under += one if (b == 0) & (a != 0) else zero
        nan += one if b != b else zero
        if sqnr:
            ok = fa & (abs(b) < np.inf)
            da = np.float64(a if ok else zero)
            d = np.float64(b if ok else zero) - da
            sig += da * da
            noise += d * d
    parts[c, 0] = over
    parts[c, 1] = under
    parts[c, 2] = nan
    parts[c, 3] = sig
    parts[c, 4] = noise


@njit(cache=True, nogil=True, fastmath=fm)
def _count_finite(x, q, lo, hi):
    """(outside [lo, hi], underflowed, signal, noise, nonzero x, nonzero q - x) of a chunk, nothing masked: the
    sums in x's dtype (float32 lanes for float32 chunks, half the work of float64 ones)."""
    one, zero = np.float32(1.0), np.float32(0.0)
    over = under = nzx = nzd = sig = noise = zero  # the sums take x's dtype (numba unifies with a * a)
    for i in range(x.size):
        a, b = x[i], q[i]
        d = b - a
        over += one if (a > hi) | (a < lo) else zero
        under += one if (b == 0) & (a != 0) else zero
        nzx += one if a != 0 else zero
        nzd += one if d != 0 else zero
        sig += a * a
        noise += d * d
    return over, under, sig, noise, nzx, nzd


@njit(cache=True, nogil=True)
def _sum_stands(s, nonzero, tiny):
    """A chunk sum is kept if finite and either at least ``tiny`` or zero with every term exactly zero."""
    return np.isfinite(s) and (s >= tiny or (s == 0 and nonzero == 0))


@njit(cache=True, nogil=True)
def count_chunk(x, q, lo, hi, sqnr, parts, c):
    """parts[c] = (overflowed, underflowed, NaN, signal, noise) of x -> q (one chunk, at most CHUNK elements).

    lo, hi: the range in x's dtype (``thresholds``). Counts: exact. With sqnr, ``_count_finite`` first; its
    result stands if both sums are finite (then every x and q of the chunk is finite: nothing to leave out of
    the sums, no NaN, and "outside [lo, hi]" is "overflowed") and neither may have lost terms to underflow (see
    ``_sum_stands``; ``TINY``); else (and without sqnr) ``_count_masked``. See the module doc for the sums'
    error bound."""
    if sqnr:
        over, under, sig, noise, nzx, nzd = _count_finite(x, q, lo, hi)
        tiny = TINY_F32 if x.itemsize == 4 else TINY_F64
        if _sum_stands(sig, nzx, tiny) and _sum_stands(noise, nzd, tiny):
            parts[c, 0] = over
            parts[c, 1] = under
            parts[c, 2] = 0.0
            parts[c, 3] = sig
            parts[c, 4] = noise
            return
    _count_masked(x, q, lo, hi, sqnr, parts, c)


def thresholds(lo: float, hi: float, dtype):
    """(lo, hi) for ``count_chunk`` on ``dtype`` values: for float32, the float32 at or above lo and the one at
    or below hi, so that a float32 a compares as with the exact limits (a > hi32 iff a > hi: no float32 lies in
    (hi32, hi]; likewise for lo), in float32 vectors; float64 values compare with the limits themselves."""
    if np.dtype(dtype) != np.float32:
        return float(lo), float(hi)
    with np.errstate(over="ignore"):  # a limit beyond float32's range becomes +-inf, then float32's max below
        lo32, hi32 = np.float32(lo), np.float32(hi)
    if float(lo32) < lo:
        lo32 = np.nextafter(lo32, np.float32(np.inf))
    if float(hi32) > hi:
        hi32 = np.nextafter(hi32, np.float32(-np.inf))
    return lo32, hi32


@njit(cache=True, nogil=True)
def _total(parts, n, out):
    """out += (n, the chunk results added in chunk order from zero)."""
    t = np.zeros(5)
    for c in range(parts.shape[0]):
        for k in range(5):
            t[k] += parts[c, k]
    out[0] += n
    for k in range(5):
        out[1 + k] += t[k]


@njit(cache=True, nogil=True)
def _nchunks(n):
    return (n + CHUNK - 1) // CHUNK


@njit(cache=True, nogil=True)
def counters_serial(x, q, lo, hi, sqnr, out):
    n = x.size
    parts = np.empty((_nchunks(n), 5))
    for c in range(parts.shape[0]):
        a = c * CHUNK
        b = min(a + CHUNK, n)
        count_chunk(x[a:b], q[a:b], lo, hi, sqnr, parts, c)
    _total(parts, n, out)


@njit(cache=True, parallel=True)
def counters_parallel(x, q, lo, hi, sqnr, out):
    n = x.size
    parts = np.empty((_nchunks(n), 5))
    for c in prange(parts.shape[0]):
        a = c * CHUNK
        b = min(a + CHUNK, n)
        count_chunk(x[a:b], q[a:b], lo, hi, sqnr, parts, I64(c))
    _total(parts, n, out)


# ---- fused: round a chunk, then count it --------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _f32_chunk(s, d, sf, df, c, man, emin, sub, max_bits, max_value, ovf, negzero, mode, key, nbits, lo, hi,
               sqnr, parts):
    a = c * CHUNK
    b = min(a + CHUNK, s.size)
    f32_serial(mode, a, b, I64(s.ctypes.data), I64(d.ctypes.data), I64(0), man, emin, sub, max_bits, max_value, ovf,
               negzero, key, nbits)
    count_chunk(sf[a:b], df[a:b], lo, hi, sqnr, parts, c)


@njit(cache=True, nogil=True)
def _float_chunk(s, d, sv, dv, c, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key,
                 nbits, lo, hi, sqnr, parts):
    a = c * CHUNK
    b = min(a + CHUNK, s.size)
    float_range(a, b, I64(s.ctypes.data), I64(d.ctypes.data), s, I64(0), sign_pos, in_man, in_bias, man, emin, sub,
                max_bits, ovf, negzero, mode, key, nbits)
    count_chunk(sv[a:b], dv[a:b], lo, hi, sqnr, parts, c)


@njit(cache=True, nogil=True)
def _fixed_chunk(s, d, c, frac_bits, code_min, code_max, saturate, mode, key, nbits, lo, hi, sqnr, parts):
    a = c * CHUNK
    b = min(a + CHUNK, s.size)
    fixed_serial(mode, a, b, I64(s.ctypes.data), I64(d.ctypes.data), s, I64(0), frac_bits, code_min, code_max,
                 saturate, key, nbits)
    count_chunk(s[a:b], d[a:b], lo, hi, sqnr, parts, c)


# Each fused kernel exists as a serial and a parallel (prange over chunks) entry on raw addresses, chosen in
# Python (``_bind``): one entry that took a flag and called both loops linked them and had LLVM optimise them
# again (measured: as much compile time as the loops). The loops call the chunk kernels above, compiled once: a
# chunk loop with the rounding inlined into it compiled ~1.5x slower (measured).
@njit(inline="always")
def _f32_chunks(src, dst, n, w, man, emin, sub, max_bits, max_value, ovf, negzero, mode, key, nbits, lo, hi, sqnr,
                acc):
    s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
    sf, df = carray(_voidptr(src), n, np.float32), carray(_voidptr(dst), n, np.float32)
    parts = np.empty((_nchunks(n), 5))
    for c in prange(parts.shape[0]):
        _f32_chunk(s, d, sf, df, I64(c), man, emin, sub, max_bits, max_value, ovf, negzero, mode, key, nbits, lo, hi,
                   sqnr, parts)
    _total(parts, n, carray(_voidptr(acc), 6, np.float64))


@njit(cache=True)
def f32_counted_serial(src, dst, n, w, man, emin, sub, max_bits, max_value, ovf, negzero, mode, key, nbits, lo, hi,
                       sqnr, acc):
    """``cpu.f32_range`` (float32 memory, w: a uint32 witness) and ``counters`` into the float64[6] at ``acc``."""
    _f32_chunks(src, dst, n, w, man, emin, sub, max_bits, max_value, ovf, negzero, mode, key, nbits, lo, hi, sqnr,
                acc)


@njit(cache=True, parallel=True)
def f32_counted_parallel(src, dst, n, w, man, emin, sub, max_bits, max_value, ovf, negzero, mode, key, nbits, lo,
                         hi, sqnr, acc):
    """``f32_counted_serial``, chunks in parallel."""
    _f32_chunks(src, dst, n, w, man, emin, sub, max_bits, max_value, ovf, negzero, mode, key, nbits, lo, hi, sqnr,
                acc)


@njit(inline="always")
def _float_chunks(src, dst, n, w, wv, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key,
                  nbits, lo, hi, sqnr, acc):
    s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
    sv, dv = carray(_voidptr(src), n, wv.dtype), carray(_voidptr(dst), n, wv.dtype)
    parts = np.empty((_nchunks(n), 5))
    for c in prange(parts.shape[0]):
        _float_chunk(s, d, sv, dv, I64(c), sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode,
                     key, nbits, lo, hi, sqnr, parts)
    _total(parts, n, carray(_voidptr(acc), 6, np.float64))


@njit(cache=True)
def float_counted_serial(src, dst, n, w, wv, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero,
                         mode, key, nbits, lo, hi, sqnr, acc):
    """``cpu.float_range`` (w: the uint witness, wv: the float witness of the memory) and the counters."""
    _float_chunks(src, dst, n, w, wv, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key,
                  nbits, lo, hi, sqnr, acc)


@njit(cache=True, parallel=True)
def float_counted_parallel(src, dst, n, w, wv, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero,
                           mode, key, nbits, lo, hi, sqnr, acc):
    """``float_counted_serial``, chunks in parallel."""
    _float_chunks(src, dst, n, w, wv, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key,
                  nbits, lo, hi, sqnr, acc)


@njit(inline="always")
def _fixed_chunks(src, dst, n, w, frac_bits, code_min, code_max, saturate, mode, key, nbits, lo, hi, sqnr, acc):
    s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
    parts = np.empty((_nchunks(n), 5))
    for c in prange(parts.shape[0]):
        _fixed_chunk(s, d, I64(c), frac_bits, code_min, code_max, saturate, mode, key, nbits, lo, hi, sqnr, parts)
    _total(parts, n, carray(_voidptr(acc), 6, np.float64))


@njit(cache=True)
def fixed_counted_serial(src, dst, n, w, frac_bits, code_min, code_max, saturate, mode, key, nbits, lo, hi, sqnr,
                         acc):
    """``cpu.fixed_range`` (w: the float witness of the memory) and the counters."""
    _fixed_chunks(src, dst, n, w, frac_bits, code_min, code_max, saturate, mode, key, nbits, lo, hi, sqnr, acc)


@njit(cache=True, parallel=True)
def fixed_counted_parallel(src, dst, n, w, frac_bits, code_min, code_max, saturate, mode, key, nbits, lo, hi, sqnr,
                           acc):
    """``fixed_counted_serial``, chunks in parallel."""
    _fixed_chunks(src, dst, n, w, frac_bits, code_min, code_max, saturate, mode, key, nbits, lo, hi, sqnr, acc)


# ---- Python side: the fused kernels with their format arguments bound (as cpu.float_runner) -----------------
def float_counted_runner(dtype, man, emin, subnormals, max_value, overflow, negzero):
    """``cpu.float_runner``'s twin that also counts: ``run(src, dst, n, mode, key, nbits, lo, hi, sqnr, acc,
    parallel=None)``, ``acc`` the address of a float64[6]; ``dst`` must not be ``src``. Cached."""
    return _float_counted_runner(_cpu._check_dtype(dtype), int(man), int(emin), int(subnormals), float(max_value),
                                 int(overflow), int(negzero))


@functools.lru_cache(maxsize=512)
def _float_counted_runner(dt, man, emin, subnormals, max_value, overflow, negzero):
    _, sign_pos, in_man, in_bias = _cpu.LAYOUT[dt]
    w, wv, mbits = _cpu._BITS_WITNESS[dt], _cpu._VALUE_WITNESS[dt], _cpu._max_bits(max_value, dt)
    if dt == np.dtype(np.float32) and emin >= -126:
        fns, wit = (f32_counted_serial, f32_counted_parallel), (w,)
        pre = (man, emin, subnormals, np.int64(mbits), float(max_value), overflow, negzero)
    else:
        fns, wit = (float_counted_serial, float_counted_parallel), (w, wv)
        pre = (sign_pos, in_man, in_bias, man, emin, subnormals, np.uint64(mbits), overflow, negzero)
    return _bind(*fns, wit, pre, dt)


def fixed_counted_runner(dtype, frac_bits, code_min, code_max, saturate):
    """``cpu.fixed_runner``'s twin that also counts (see ``float_counted_runner``)."""
    dt = _cpu._check_dtype(dtype)
    return _fixed_counted_runner(dt, int(frac_bits), int(code_min), int(code_max), int(saturate))


@functools.lru_cache(maxsize=512)
def _fixed_counted_runner(dt, frac_bits, code_min, code_max, saturate):
    pre = (frac_bits, np.int64(code_min), np.int64(code_max), saturate)
    return _bind(fixed_counted_serial, fixed_counted_parallel, (_cpu._VALUE_WITNESS[dt],), pre, dt)


_thresholds = functools.lru_cache(maxsize=1024)(thresholds)


def _bind(fn, par, wit, pre, dt):
    """``run(...)`` (see ``float_counted_runner``) calling the serial kernel ``fn`` or the parallel one ``par`` with
    the witnesses ``wit`` and format arguments ``pre``; as ``cpu._runner``, serial calls below ``PARALLEL_MIN`` go
    through fn's compiled entry point (no lock, no thread-count check, no type dispatch)."""
    serial = direct_caller(fn)

    def run(src: int, dst: int, n: int, mode, key, nbits, lo, hi, sqnr, acc: int, parallel=None) -> None:
        th = _thresholds(float(lo), float(hi), dt)
        args = (int(src), int(dst), int(n), *wit, *pre, int(mode), np.uint64(key), int(nbits), *th, bool(sqnr),
                int(acc))
        if parallel is None and n < _cpu.PARALLEL_MIN:  # serial: no lock, no thread-count check
            serial(*args)
            return
        with _parallel.try_parallel(_cpu.use_parallel(n, parallel)) as p:
            (par if p else serial)(*args)

    return run
