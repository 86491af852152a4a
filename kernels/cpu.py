"""Numba CPU kernels: loops over flat, contiguous arrays, calling the shared scalar cores.

Each kernel exists twice, compiled lazily on first call (``cache=True``): a serial loop for small arrays,
and a ``parallel=True`` / ``prange`` loop for large ones, where the thread start-up pays off. Both visit
element ``i`` with the same arguments, so the bits never depend on the thread count. Entry points: on numpy
arrays (``quantize_float`` / ``quantize_fixed``) and on raw addresses (``quantize_float_at`` /
``quantize_fixed_at``, and the cached ``float_runner`` / ``fixed_runner`` that ``emunum.quantize`` uses).
"""

import functools
import math
import os

import numba
import numpy as np
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _cache, elementwise_f32 as _ew, parallel as _parallel, scalar
from .direct import direct_caller

_cache.guard(__file__, [*scalar.SOURCES, _ew.__file__])

# numba's OpenMP layer contends with torch's own OpenMP runtime (measured: half the throughput once torch is
# loaded); the workqueue layer does not. A user's explicit NUMBA_THREADING_LAYER wins.
if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"

from .scalar import (DOWN, NEAREST, NEAREST_AWAY, ODD, OVF_INF, OVF_NAN, STOCHASTIC,  # noqa: E402
                     TOWARD_ZERO, UP, random_bits, round_f32_fast, round_fixed_value, round_float_bits,
                     round_nearest_value)

# The scalar cores are inlined at numba-IR level (``inline="always"`` in kernels/scalar/). Called as separate
# functions, LLVM keeps each element's rounding a call and the serial loops do not vectorise: measured
# 7 ns/element serial against 1.4 ns inlined (float32 e5m2, one thread).

# From this many elements on, and only when numba may use more than one thread, the prange loop runs.
# Measured on a 2-core VM with the inlined loops (~1.6 ns/element serial): back to back, with numba's
# workers warm, the 2-thread loop wins from 2**12 (benchmarks/quantize.py --crossover); with a torch op
# before every call, as in training (benchmarks/call_overhead.py --parallel-sweep --threads 2), each
# workqueue launch costs ~45 us more and the serial loop won at every size up to 2**20. At 2**18 that
# launch cost is ~10% of the serial time, which a machine with free cores recovers many times over.
PARALLEL_MIN = 1 << 18

_F32 = np.dtype(np.float32)


@njit(cache=True)
def float_serial(src, dst, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits,
                 base=0):
    for i in range(src.size):
        rnd = random_bits(key, base + i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_float_bits(src[i], sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero,
                                  mode, rnd, nbits)


@njit(cache=True, parallel=True)
def float_parallel(src, dst, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits):
    for i in prange(src.size):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        dst[i] = round_float_bits(src[i], sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero,
                                  mode, rnd, nbits)


# Round to nearest even with man >= 1, where elementwise_f32 does not apply, takes Veltkamp's split in binary64
# on the values (bit-identical to the bit-level core): the f32 loops get the memory as uint32 bits (src, dst)
# and float32 values (sf, df), views made by the callers (a ``.view()`` in a parallel function lost writes).
@njit(inline="always")
def _nearest_params(man, emin, sub, max_value, ovf):
    split = math.ldexp(1.0, 52 - man) + 1.0
    magic = 1.5 * math.ldexp(1.0, 52 + (emin - man if sub != 0 else emin))
    ovfv = math.inf if ovf == OVF_INF else (math.nan if ovf == OVF_NAN else max_value)
    return split, magic, math.ldexp(1.0, emin), ovfv


# The float32 and fixed-point loops are specialised per rounding mode by a factory, with the mode a closure
# constant: the other modes' branches vanish and the loop vectorises (5x faster than a runtime mode). Nearest
# and stochastic call the uint32-lane loops of kernels/elementwise_f32.py where their ``*_ok`` holds. numba
# caches each closure on disk under its own key (the closure's values are part of it). ``prange`` is ``range``
# in a serial loop, so one body serves both; element i of a loop draws the random bits of element base + i.
MODES = (NEAREST, NEAREST_AWAY, TOWARD_ZERO, UP, DOWN, ODD, STOCHASTIC)


@functools.lru_cache(maxsize=None)
def f32_loop(MODE: int, PARALLEL: bool):
    """``loop(src, dst, sf, df, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits, base)``: dst =
    src rounded in mode MODE, src/dst as uint32 bits and sf/df as float32 views of the same memory."""

    @njit(cache=True, parallel=PARALLEL)
    def loop(src, dst, sf, df, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits, base):
        if MODE == NEAREST and _ew.nearest_ok(man, emin, sub, max_value):
            if PARALLEL:
                _ew.nearest_parallel(src, dst, man, emin, sub, max_bits, ovf, negzero)
            else:
                _ew.nearest_serial(src, dst, man, emin, sub, max_bits, ovf, negzero)
        elif MODE == STOCHASTIC and base == 0 and PARALLEL and _ew.sr_ok(man, emin, sub, max_value):
            _ew.sr_parallel(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits)
        elif MODE == STOCHASTIC and not PARALLEL and _ew.sr_ok(man, emin, sub, max_value):
            _ew.sr_serial(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, np.int64(base))
        elif MODE == NEAREST and man > 0:
            split, magic, mn, ovfv = _nearest_params(man, emin, sub, max_value, ovf)
            for i in prange(src.size):
                df[i] = round_nearest_value(np.float64(sf[i]), split, magic, mn, max_value, ovfv, negzero)
        else:
            for i in prange(src.size):
                rnd = random_bits(key, base + i, nbits) if MODE == STOCHASTIC else np.uint64(0)
                dst[i] = round_f32_fast(src[i], man, emin, sub, max_bits, ovf, negzero, MODE, rnd, nbits)

    return loop


@functools.lru_cache(maxsize=None)
def fixed_loop(MODE: int, PARALLEL: bool):
    """``loop(src, dst, frac_bits, code_min, code_max, saturate, key, nbits, base)``: dst = src (float32 or
    float64 values) rounded to fixed point in mode MODE."""

    @njit(cache=True, parallel=PARALLEL)
    def loop(src, dst, frac_bits, code_min, code_max, saturate, key, nbits, base):
        for i in prange(src.size):
            rnd = random_bits(key, base + i, nbits) if MODE == STOCHASTIC else np.uint64(0)
            dst[i] = round_fixed_value(np.float64(src[i]), frac_bits, code_min, code_max, saturate, MODE, rnd,
                                       nbits)

    return loop


@functools.lru_cache(maxsize=None)
def mode_switch(loop_factory, PARALLEL: bool):
    """``switch(mode, *args)``: ``loop_factory(mode, PARALLEL)(*args)`` for a mode known only at run time (the
    fused trace counters); compiling it compiles every mode's loop."""
    L0, L1, L2, L3, L4, L5, L6 = (loop_factory(m, PARALLEL) for m in MODES)

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


# ---- raw-memory entry points ------------------------------------------------------------------------
# The same loops on memory given by address: torch tensors reach them through ``data_ptr()`` (0.1 us) instead
# of ``.numpy()`` views and numba's array unboxing (~10 us per call in all, measured on 1000 float32 values).
# ``w`` is a zero-length array whose dtype says what the memory holds (a compile-time type, like the views).

@intrinsic
def _voidptr(typingctx, addr):
    """An integer address as a ``void*``."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(addr), codegen


@functools.lru_cache(maxsize=None)
def f32_at(MODE: int):
    """``at(src, dst, n, w, par, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits)``: ``f32_loop``
    on the ``n`` float32 values at address src into dst (w: a zero-length uint32 witness; par: the prange
    loop)."""
    serial, parallel = f32_loop(MODE, False), f32_loop(MODE, True)

    @njit(cache=True)
    def at(src, dst, n, w, par, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits):
        s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
        sf, df = carray(_voidptr(src), n, np.float32), carray(_voidptr(dst), n, np.float32)
        if par:
            parallel(s, d, sf, df, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits, 0)
        else:
            serial(s, d, sf, df, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits, 0)

    return at


@njit(cache=True)
def float_at(src, dst, n, w, par, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key,
             nbits):
    s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
    if par:
        float_parallel(s, d, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits)
    else:
        float_serial(s, d, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits)


@functools.lru_cache(maxsize=None)
def fixed_at(MODE: int):
    """``at(src, dst, n, w, par, frac_bits, code_min, code_max, saturate, key, nbits)``: ``fixed_loop`` on raw
    memory (w: a zero-length witness of the values' dtype)."""
    serial, parallel = fixed_loop(MODE, False), fixed_loop(MODE, True)

    @njit(cache=True)
    def at(src, dst, n, w, par, frac_bits, code_min, code_max, saturate, key, nbits):
        s, d = carray(_voidptr(src), n, w.dtype), carray(_voidptr(dst), n, w.dtype)
        if par:
            parallel(s, d, frac_bits, code_min, code_max, saturate, key, nbits, 0)
        else:
            serial(s, d, frac_bits, code_min, code_max, saturate, key, nbits, 0)

    return at


# Several tensors in one call, each rounded in place as a slice of their concatenation: element i of tensor t
# is element base_t + i of the concatenation (base_t = the sizes before t), so stochastic rounding draws the
# bits the concatenated tensor would (``OptimLP``: no concatenation, split and copy back). Serial loops.
@functools.lru_cache(maxsize=None)
def f32_many_at(MODE: int):
    """``many(addrs, sizes, w, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits)``."""
    serial = f32_loop(MODE, False)

    @njit(cache=True)
    def many(addrs, sizes, w, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits):
        base = 0
        for t in range(addrs.size):
            n = sizes[t]
            s, sf = carray(_voidptr(addrs[t]), n, w.dtype), carray(_voidptr(addrs[t]), n, np.float32)
            serial(s, s, sf, sf, man, emin, sub, max_bits, max_value, ovf, negzero, key, nbits, base)
            base += n

    return many


@njit(cache=True)
def float_many_at(addrs, sizes, w, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key,
                  nbits):
    base = 0
    for t in range(addrs.size):
        n = sizes[t]
        s = carray(_voidptr(addrs[t]), n, w.dtype)
        float_serial(s, s, sign_pos, in_man, in_bias, man, emin, sub, max_bits, ovf, negzero, mode, key, nbits, base)
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
    """The loop for ``n`` elements: ``parallel`` if given, else the prange loop from ``PARALLEL_MIN`` elements
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


def _runner(kernel_for, w, pre):
    """``run(src, dst, n, mode, key, nbits, parallel=None)`` calling the ``*_at`` kernel ``kernel_for(mode)``
    with the witness ``w`` and format arguments ``pre`` bound. Below ``PARALLEL_MIN`` (and parallel=None) the
    serial loop runs through the kernel's compiled entry point, without the lock and thread-count checks."""
    kernels = {}

    def run(src: int, dst: int, n: int, mode, key, nbits, parallel=None) -> None:
        m = int(mode)
        entry = kernels.get(m)
        if entry is None:
            fn, tail = kernel_for(_mode(m))
            entry = kernels[m] = (fn, tail, direct_caller(fn))
        fn, tail, serial = entry
        if parallel is None and n < PARALLEL_MIN:
            serial(int(src), int(dst), int(n), w, False, *pre, *tail, np.uint64(key), int(nbits))
            return
        with _parallel.try_parallel(use_parallel(n, parallel)) as par:
            fn(src, dst, n, w, par, *pre, *tail, np.uint64(key), nbits)

    def for_mode(mode):
        """``call(src, dst, n, key, nbits)`` = ``run(src, dst, n, mode, key, nbits)`` (ints throughout), with the
        mode's kernel and the bound arguments looked up once for the serial loop."""
        m = _mode(int(mode))
        fn, tail = kernel_for(m)
        args = (w, False, *pre, *tail)
        direct = direct_caller(fn)

        def call(src: int, dst: int, n: int, key: int, nbits: int) -> None:
            if n >= PARALLEL_MIN:
                run(src, dst, n, m, key, nbits)
            else:
                direct(src, dst, n, *args, np.uint64(key), nbits)

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
    w, mbits = _BITS_WITNESS[dt], _max_bits(max_value, dt)
    if dt == _F32 and emin >= -126:
        pre = (man, emin, subnormals, np.int64(mbits), float(max_value), overflow, negzero)
        run, many = _runner(_specialised(f32_at), w, pre), _specialised(f32_many_at)
    else:
        pre = (sign_pos, in_man, in_bias, man, emin, subnormals, np.uint64(mbits), overflow, negzero)
        run, many = _runner(_runtime_mode(float_at), w, pre), _runtime_mode(float_many_at)

    def run_many(addrs: np.ndarray, sizes: np.ndarray, mode, key, nbits) -> None:
        """Round the contiguous tensors at ``addrs`` (int64) of ``sizes`` in place as one concatenation."""
        fn, tail = many(_mode(mode))
        fn(addrs, sizes, w, *pre, *tail, np.uint64(key), nbits)

    run.many = run_many
    return run


def fixed_runner(dtype, frac_bits, code_min, code_max, saturate):
    """``quantize_fixed_at`` with the dtype and format arguments bound (see ``float_runner``)."""
    return _fixed_runner(_check_dtype(dtype), int(frac_bits), int(code_min), int(code_max), int(saturate))


@functools.lru_cache(maxsize=512)
def _fixed_runner(dt, frac_bits, code_min, code_max, saturate):
    w, pre = _VALUE_WITNESS[dt], (frac_bits, np.int64(code_min), np.int64(code_max), saturate)
    return _runner(_specialised(fixed_at), w, pre)


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


def quantize_float(src: np.ndarray, dst: np.ndarray, man, emin, subnormals, max_value, overflow, negzero,
                   mode, key, nbits, parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``)."""
    dtype = src.dtype
    uint, sign_pos, in_man, in_bias = LAYOUT[dtype]
    mbits = _max_bits(float(max_value), dtype)
    with _parallel.try_parallel(use_parallel(src.size, parallel)) as par:
        if dtype == _F32 and emin >= -126:
            f32_loop(_mode(mode), bool(par))(src.view(uint), dst.view(uint), src, dst, man, emin, subnormals,
                                             np.int64(mbits), float(max_value), overflow, negzero, np.uint64(key),
                                             nbits, 0)
            return
        run = float_parallel if par else float_serial
        run(src.view(uint), dst.view(uint), sign_pos, in_man, in_bias, man, emin, subnormals,
            np.uint64(mbits), overflow, negzero, mode, np.uint64(key), nbits)


def quantize_fixed(src: np.ndarray, dst: np.ndarray, frac_bits, code_min, code_max, saturate, mode, key, nbits,
                   parallel=None):
    """Round the flat float32/float64 array ``src`` to fixed point into ``dst``."""
    with _parallel.try_parallel(use_parallel(src.size, parallel)) as par:
        fixed_loop(_mode(mode), bool(par))(src, dst, frac_bits, np.int64(code_min), np.int64(code_max), saturate,
                                           np.uint64(key), nbits, 0)
