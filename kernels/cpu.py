"""Numba CPU kernels: loops over flat, contiguous float32/float64 memory, calling the shared scalar cores.

Each kernel is one serial loop over a range of elements, compiled lazily on first call (``cache=True``): called
over all elements for small arrays, and in contiguous shares on numba's threads (``shares.launcher``, under
parallel.py's lock) for large ones, where the thread start-up pays off. Every share visits element ``i`` with
the same arguments, so the bits never depend on the thread count. Entry points: on numpy arrays
(``quantize_float`` / ``quantize_fixed``) and on raw addresses (``quantize_float_at`` / ``quantize_fixed_at``,
and the cached ``float_runner`` / ``fixed_runner`` that ``emunum.quantize`` uses).
"""

import functools
import math
import os

import numba
import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _cache, elementwise_f32 as _ew, fixed_f32 as _fx, parallel as _parallel, scalar
from .shares import launcher
from .direct import direct_caller

_cache.guard(__file__, [*scalar.SOURCES, _ew.__file__, _fx.__file__])

# numba's OpenMP layer contends with torch's own OpenMP runtime (measured: half the throughput once torch is
# loaded); the workqueue layer does not. A user's explicit NUMBA_THREADING_LAYER wins.
if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"

from .scalar import (DOWN, NEAREST, NEAREST_AWAY, ODD, OVF_INF, OVF_NAN, STOCHASTIC,  # noqa: E402
                     TOWARD_ZERO, UP, random_bits, round_f32_fast, round_float_bits, round_nearest_value)
from .scalar.fixed import fixed_constants, round_fixed_const  # noqa: E402

# The scalar cores are inlined at numba-IR level (``inline="always"`` in kernels/scalar/). Called as separate
# functions, LLVM keeps each element's rounding a call and the serial loops do not vectorise: measured
# 7 ns/element serial against 1.4 ns inlined (float32 e5m2, one thread).

# From this many elements on, and only when numba may use more than one thread, the kernel runs in shares on
# numba's threads.
# Measured on a 2-core VM with the inlined loops (~1.6 ns/element serial): back to back, with numba's
# workers warm, the 2-thread loop wins from 2**12 (benchmarks/quantize.py --crossover); with a torch op
# before every call, as in training (benchmarks/call_overhead.py --parallel-sweep --threads 2), each
# workqueue launch costs ~45 us more and the serial loop won at every size up to 2**20. At 2**18 that
# launch cost is ~10% of the serial time, which a machine with free cores recovers many times over.
PARALLEL_MIN = 1 << 18

_F32 = np.dtype(np.float32)
U64 = np.uint64


# Every kernel is one serial loop over a range of elements on raw memory: ``k(lo, hi, src, dst, ...)`` rounds
# elements lo..hi-1 of the memory at addresses src, dst (dst may be src), element i drawing the random bits of
# element base + i. Torch tensors reach them through ``data_ptr()`` (0.1 us) instead of ``.numpy()`` views and
# numba's array unboxing (~10 us per call in all, measured on 1000 float32 values). The same kernel is the
# serial entry point (lo = 0, hi = n) and, through ``shares.launcher``, the parallel one (contiguous shares on
# numba's threads): one compiled body per kernel, no prange twin, no wrapper that links both loops (each such
# wrapper had LLVM optimise the loops it linked again: 2.5-5 CPU-s per mode). ``w`` is a zero-length array whose
# dtype says what the memory holds (a compile-time type). The plain loops run from 0 over arrays that start at
# element lo (loops from lo ran 2-10% slower: float32 up, float64, HiFloat8 out of cache), on unsigned indices
# where they vectorise (numba's negative-index wraparound turned the contiguous loads into gathers: 1.6x).

@intrinsic
def _voidptr(typingctx, addr):
    """An integer address as a ``void*``."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(addr), codegen


@njit(cache=True, nogil=True)
def float_range(lo, hi, src, dst, w, base, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode,
                key, nbits):
    """Any float format, the mode an argument: the bits (w: the uint witness of the memory's float dtype)."""
    m = hi - lo
    s = carray(_voidptr(src + lo * w.itemsize), m, w.dtype)
    d = carray(_voidptr(dst + lo * w.itemsize), m, w.dtype)
    b = base + lo
    for i in range(m):
        rnd = random_bits(key, b + i, nbits) if mode == STOCHASTIC else U64(0)
        d[i] = round_float_bits(s[i], sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, rnd,
                                nbits)


# Round to nearest even with man >= 1, where elementwise_f32 does not apply, takes Veltkamp's split in binary64
# on the values (bit-identical to the bit-level core).
@njit(inline="always")
def _nearest_params(man, emin, sub, max_value, ovf):
    split = math.ldexp(1.0, 52 - man) + 1.0
    magic = 1.5 * math.ldexp(1.0, 52 + (emin - man if sub != 0 else emin))
    ovfv = math.inf if ovf == OVF_INF else (math.nan if ovf == OVF_NAN else max_value)
    return split, magic, math.ldexp(1.0, emin), ovfv


# The float32 and fixed-point kernels are specialised per rounding mode by a factory, with the mode a closure
# constant: the other modes' branches vanish and the loop vectorises (5x faster than a runtime mode). Nearest
# and stochastic call the uint32-lane kernels of kernels/elementwise_f32.py where their ``*_ok`` holds. numba
# caches each closure on disk under its own key (the closure's values are part of it).
MODES = (NEAREST, NEAREST_AWAY, TOWARD_ZERO, UP, DOWN, ODD, STOCHASTIC)


@njit(inline="always")
def _nearest_value_loop(sf, df, split, magic, mn, max_value, ovfv, negzero):
    for i in range(U64(sf.size)):
        df[i] = round_nearest_value(np.float64(sf[i]), split, magic, mn, max_value, ovfv, negzero)


@njit(inline="always")
def _f32_fast_loop(s, d, b, man, emin, sub, max_bits, ovf, negzero, MODE, key, nbits):
    for i in range(U64(s.size)):
        rnd = random_bits(key, b + i, nbits) if MODE == STOCHASTIC else U64(0)
        d[i] = round_f32_fast(s[i], man, emin, sub, max_bits, ovf, negzero, MODE, rnd, nbits)


@functools.lru_cache(maxsize=None)
def f32_range(MODE: int):
    """``rng(lo, hi, src, dst, base, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits)``: float32
    memory rounded in mode MODE (elements lo..hi-1; base: see above)."""

    def rng(lo, hi, src, dst, base, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits):
        if MODE == NEAREST and _ew.nearest_ok(man, emin, sub, max_value):
            s, d = carray(_voidptr(src), hi, np.uint32), carray(_voidptr(dst), hi, np.uint32)
            _ew.nearest_range(lo, hi, s, d, man, emin, sub, max_bits, ovf, negzero)
        elif MODE == STOCHASTIC and _ew.sr_ok(man, emin, sub, max_value):
            s, d = carray(_voidptr(src), hi, np.uint32), carray(_voidptr(dst), hi, np.uint32)
            _ew.sr_range(lo, hi, s, d, man, emin, sub, max_bits, ovf, negzero, key, nbits, np.int64(base))
        elif MODE == NEAREST and man > 0:
            sf, df = carray(_voidptr(src + 4 * lo), hi - lo, np.float32), carray(_voidptr(dst + 4 * lo), hi - lo,
                                                                                  np.float32)
            split, magic, mn, ovfv = _nearest_params(man, emin, sub, max_value, ovf)
            if src == dst:  # one array read and written: no overlap check for LLVM (it fell back to scalar code)
                _nearest_value_loop(df, df, split, magic, mn, max_value, ovfv, negzero)
            else:
                _nearest_value_loop(sf, df, split, magic, mn, max_value, ovfv, negzero)
        else:
            s, d = carray(_voidptr(src + 4 * lo), hi - lo, np.uint32), carray(_voidptr(dst + 4 * lo), hi - lo,
                                                                                np.uint32)
            if src == dst:
                _f32_fast_loop(d, d, U64(base + lo), man, emin, sub, max_bits, ovf, negzero, MODE, key, nbits)
            else:
                _f32_fast_loop(s, d, U64(base + lo), man, emin, sub, max_bits, ovf, negzero, MODE, key, nbits)

    return njit(cache=True, nogil=True)(_cache.variant(rng, f"mode{MODE}"))


@njit(inline="always")
def _fixed_loop(s, d, b, c, saturate, MODE, key, nbits):
    """d[i] = ``round_fixed_const``(s[i]) with the constants c (``fixed_constants``), element b + i's random bits."""
    for i in range(U64(s.size)):
        rnd = random_bits(key, b + i, nbits) if MODE == STOCHASTIC else U64(0)
        d[i] = round_fixed_const(np.float64(s[i]), c, saturate, MODE, rnd)


@functools.lru_cache(maxsize=None)
def fixed_range(MODE: int):
    """``rng(lo, hi, src, dst, w, base, frac_bits, code_min, code_max, saturate, key, nbits)``: float32 or float64
    memory (w: a witness of that dtype) rounded to fixed point in mode MODE."""

    def rng(lo, hi, src, dst, w, base, frac_bits, code_min, code_max, saturate, key, nbits):
        if MODE == NEAREST and w.itemsize == 4 and _fx.nearest_ok(frac_bits, code_min, code_max, saturate):
            su, du = carray(_voidptr(src), hi, np.uint32), carray(_voidptr(dst), hi, np.uint32)
            _fx.nearest_range(lo, hi, su, du, frac_bits, code_min, code_max)
            return
        m = hi - lo
        s = carray(_voidptr(src + lo * w.itemsize), m, w.dtype)
        d = carray(_voidptr(dst + lo * w.itemsize), m, w.dtype)
        c = fixed_constants(frac_bits, code_min, code_max, saturate, MODE, nbits)
        if src == dst:  # one array read and written: no overlap check for LLVM (it fell back to scalar code)
            _fixed_loop(d, d, U64(base + lo), c, saturate, MODE, key, nbits)
        else:
            _fixed_loop(s, d, U64(base + lo), c, saturate, MODE, key, nbits)

    # error_model="numpy": a division by zero is IEEE's, not a raise; the divisors (the period 2**(bits -
    # frac_bits), the span 2**bits) are never zero for a FixedFormat, and the raise's branch per division kept
    # the loop from vectorising
    return njit(cache=True, nogil=True, error_model="numpy")(_cache.variant(rng, f"mode{MODE}"))


@functools.lru_cache(maxsize=None)
def mode_switch(factory):
    """``switch(mode, *args)``: ``factory(mode)(*args)`` for a mode known only at run time (the fused trace
    counters); compiling it compiles every mode's kernel."""
    L0, L1, L2, L3, L4, L5, L6 = (factory(m) for m in MODES)

    @njit(cache=True)
    def switch(mode, *args):
        if mode == MODES[0]:
            L0(*args)
        elif mode == MODES[1]:
            L1(*args)
        elif mode == MODES[2]:
            L2(*args)
        elif mode == MODES[3]:
            L3(*args)
        elif mode == MODES[4]:
            L4(*args)
        elif mode == MODES[5]:
            L5(*args)
        else:
            L6(*args)

    return switch


# Several tensors in one call, each rounded in place as a slice of their concatenation: element i of tensor t
# is element base_t + i of the concatenation (base_t = the sizes before t), so stochastic rounding draws the
# bits the concatenated tensor would (``OptimLP``: no concatenation, split and copy back). Serial loops.
@functools.lru_cache(maxsize=None)
def f32_many_at(MODE: int):
    """``many(addrs, sizes, base0, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits)``: the tensors
    at ``addrs`` (int64) of ``sizes`` in place, the first one's first element being element base0."""
    rng = f32_range(MODE)

    @njit(cache=True)
    def many(addrs, sizes, base0, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits):
        base = base0
        for t in range(addrs.size):
            n = sizes[t]
            rng(np.int64(0), n, addrs[t], addrs[t], base, man, emin, sub, max_bits, max_value, ovf, negzero, key,
                nbits)  # lo an int64 as from Python: a literal 0 would compile rng once more
            base += n

    return many


@njit(cache=True)
def float_many_at(addrs, sizes, w, base0, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode,
                  key, nbits):
    base = base0
    for t in range(addrs.size):
        n = sizes[t]
        float_range(np.int64(0), n, addrs[t], addrs[t], w, base, sign_pos, in_man, in_bias, man, emin, sub, max_bits,
                    ovf, negzero, mode, key, nbits)
        base += n


# ---- dispatch ---------------------------------------------------------------------------------------------
# binary layout of the float dtypes the float kernels read as bits: (uint view, sign_pos, man, bias)
LAYOUT = {
    np.dtype(np.float32): (np.uint32, 31, 23, 127),
    np.dtype(np.float64): (np.uint64, 63, 52, 1023),
}
_BITS_WITNESS = {dt: np.empty(0, LAYOUT[dt][0]) for dt in LAYOUT}  # float loops read the values' bits
_VALUE_WITNESS = {dt: np.empty(0, dt) for dt in LAYOUT}  # fixed-point loops read the values


@functools.lru_cache(maxsize=256)
def _max_bits(max_value: float, dtype: np.dtype) -> int:
    return int(np.array(max_value, dtype=dtype).view(LAYOUT[dtype][0]))


def max_bits(max_value: float, dtype) -> int:
    """Bits of ``max_value`` in the binary layout of ``dtype`` (float32 or float64); cached per (value, dtype)."""
    return _max_bits(float(max_value), np.dtype(dtype))


def use_parallel(n: int, parallel=None) -> bool:
    """The loop for ``n`` elements: ``parallel`` if given, else the parallel launch from ``PARALLEL_MIN`` elements
    on when numba may use more than one thread (with one thread the serial loop is never slower)."""
    if parallel is not None:
        return bool(parallel)
    return n >= PARALLEL_MIN and numba.get_num_threads() > 1


def _check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in LAYOUT:
        raise TypeError(f"dtype={dt} is not supported by the CPU kernels; allowed: float32, float64")
    return dt


def _mode(mode) -> int:
    m = int(mode)
    if m not in MODES:
        raise ValueError(f"mode={mode!r}; allowed: the rounding mode codes {MODES}")
    return m


def _specialised(factory):
    """``kernel_for(mode) -> (fn, tail)`` for a factory of mode-specialised kernels (no mode argument)."""
    return lambda mode: (factory(mode), ())


def _runtime_mode(fn):
    """``kernel_for(mode) -> (fn, (mode,))`` for a kernel that takes the mode as its argument before key."""
    return lambda mode: (fn, (mode,))


def run_range(rng, n: int, args: tuple, parallel=None) -> None:
    """``rng(0, n, *args)``, or with ``use_parallel(n, parallel)`` and parallel.py's lock free, the same in shares
    on numba's threads (``shares.launcher``)."""
    with _parallel.try_parallel(use_parallel(n, parallel)) as par:
        if par:
            launcher(rng)(n, *args)
        else:
            rng(0, n, *args)


def _runner(kernel_for, pre):
    """``run(src, dst, n, mode, key, nbits, parallel=None)`` calling the range kernel ``kernel_for(mode)`` (see
    the kernels above: ``fn(lo, hi, src, dst, *pre, *tail, key, nbits)``) with the format arguments ``pre`` bound.
    Below ``PARALLEL_MIN`` (and parallel=None) it runs through the kernel's compiled entry point, without the lock
    and thread-count checks."""
    kernels = {}

    def run(src: int, dst: int, n: int, mode, key, nbits, parallel=None) -> None:
        m = int(mode)
        entry = kernels.get(m)
        if entry is None:
            fn, tail = kernel_for(_mode(m))
            entry = kernels[m] = (fn, tail, direct_caller(fn))
        fn, tail, serial = entry
        if parallel is None and n < PARALLEL_MIN:
            serial(0, int(n), int(src), int(dst), *pre, *tail, np.uint64(key), int(nbits))
            return
        run_range(fn, int(n), (int(src), int(dst), *pre, *tail, np.uint64(key), int(nbits)), parallel)

    def for_mode(mode):
        """``call(src, dst, n, key, nbits)`` = ``run(src, dst, n, mode, key, nbits)`` (ints throughout), with the
        mode's kernel and the bound arguments looked up once for the serial loop."""
        m = _mode(int(mode))
        fn, tail = kernel_for(m)
        args = (*pre, *tail)
        direct = direct_caller(fn)

        def call(src: int, dst: int, n: int, key: int, nbits: int) -> None:
            if n >= PARALLEL_MIN:
                run(src, dst, n, m, key, nbits)
            else:
                direct(0, n, src, dst, *args, np.uint64(key), nbits)

        return call

    run.for_mode = for_mode
    return run


def float_runner(dtype, man, emin, subnormals, max_value, overflow, negzero):
    """``quantize_float_at`` with the dtype and format arguments checked and converted once:
    returns ``run(src, dst, n, mode, key, nbits, parallel=None)``. Cached per argument tuple."""
    return _float_runner(_check_dtype(dtype), int(man), int(emin), int(subnormals), float(max_value),
                         int(overflow), int(negzero))


@functools.lru_cache(maxsize=512)
def _float_runner(dt, man, emin, subnormals, max_value, overflow, negzero):
    _, sign_pos, in_man, in_bias = LAYOUT[dt]
    mbits = _max_bits(max_value, dt)
    if dt == _F32 and emin >= -126:
        pre = (0, man, emin, subnormals, np.int64(mbits), float(max_value), overflow, negzero)
        run, many = _runner(_specialised(f32_range), pre), _specialised(f32_many_at)
    else:
        pre = (_BITS_WITNESS[dt], 0, sign_pos, in_man, in_bias, man, emin, subnormals, np.uint64(mbits), overflow,
               negzero)
        run, many = _runner(_runtime_mode(float_range), pre), _runtime_mode(float_many_at)

    def run_many(addrs: np.ndarray, sizes: np.ndarray, mode, key, nbits) -> None:
        """Round the contiguous tensors at ``addrs`` (int64) of ``sizes`` in place as one concatenation."""
        fn, tail = many(_mode(mode))
        fn(addrs, sizes, *pre, *tail, np.uint64(key), nbits)

    run.many = run_many
    return run


def fixed_runner(dtype, frac_bits, code_min, code_max, saturate):
    """``quantize_fixed_at`` with the dtype and format arguments bound (see ``float_runner``)."""
    return _fixed_runner(_check_dtype(dtype), int(frac_bits), int(code_min), int(code_max), int(saturate))


@functools.lru_cache(maxsize=512)
def _fixed_runner(dt, frac_bits, code_min, code_max, saturate):
    pre = (_VALUE_WITNESS[dt], 0, frac_bits, np.int64(code_min), np.int64(code_max), saturate)
    return _runner(_specialised(fixed_range), pre)


def quantize_float_at(src: int, dst: int, n: int, dtype, man, emin, subnormals, max_value, overflow, negzero,
                      mode, key, nbits, parallel=None):
    """``quantize_float`` on raw memory: ``n`` contiguous ``dtype`` (float32/float64) values at address ``src``
    rounded into the ``n`` at ``dst`` (may equal ``src``). The caller keeps both buffers alive, writable and
    of that dtype for the duration of the call (for torch tensors: ``t.data_ptr()`` of contiguous tensors)."""
    float_runner(dtype, man, emin, subnormals, max_value, overflow, negzero)(src, dst, n, mode, key, nbits,
                                                                             parallel)


def quantize_fixed_at(src: int, dst: int, n: int, dtype, frac_bits, code_min, code_max, saturate, mode, key,
                      nbits, parallel=None):
    """``quantize_fixed`` on raw memory (see ``quantize_float_at`` for the caller's obligations)."""
    fixed_runner(dtype, frac_bits, code_min, code_max, saturate)(src, dst, n, mode, key, nbits, parallel)


def _check_pair(src: np.ndarray, dst: np.ndarray) -> None:
    if src.dtype != dst.dtype or src.size != dst.size or not (src.flags.c_contiguous and dst.flags.c_contiguous):
        raise ValueError(f"dst must match src in size and dtype, both contiguous: src is {src.size} x {src.dtype}, "
                         f"dst is {dst.size} x {dst.dtype}")


def quantize_float(src: np.ndarray, dst: np.ndarray, man, emin, subnormals, max_value, overflow, negzero,
                   mode, key, nbits, parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    _check_pair(src, dst)
    quantize_float_at(src.ctypes.data, dst.ctypes.data, src.size, src.dtype, man, emin, subnormals, max_value,
                      overflow, negzero, mode, key, nbits, parallel)


def quantize_fixed(src: np.ndarray, dst: np.ndarray, frac_bits, code_min, code_max, saturate, mode, key, nbits,
                   parallel=None):
    """Round the flat float32/float64 array ``src`` to fixed point into ``dst``."""
    _check_pair(src, dst)
    quantize_fixed_at(src.ctypes.data, dst.ctypes.data, src.size, src.dtype, frac_bits, code_min, code_max,
                      saturate, mode, key, nbits, parallel)
