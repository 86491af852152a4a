"""Numba CPU kernels for user-defined types (``CustomFormat``).

- nearest: ``from_code(to_code(x))`` per element, the user's njit functions passed as first-class function
  arguments (numba compiles one specialisation per pair of functions, on the first call for that format and
  dtype; such kernels cannot be cached on disk, so each new format costs one compile per process).
- derived modes (toward_zero, up, down, stochastic; nbits <= 16): ``scalar.round_table_value`` over the
  type's finite values, finished by ``scalar.finish_derived`` (``cache=True``: no user code involved).
Every loop visits element i with the same arguments, so the bits never depend on the thread count: nearest's
serial and ``prange`` loops (the latter under kernels/parallel.py's lock), the derived modes' one loop over a
range of elements, run whole or in shares on threads (``threads.launch``). ``custom_runner`` binds a format for
``emunum.quantize`` (raw addresses), like ``table_runner``.
"""
import numba
import numpy as np
from numba import carray, njit, prange

from . import _cache, parallel as _parallel, scalar, threads

_cache.guard(__file__, scalar.SOURCES)

from .cpu import _VALUE_WITNESS, _check_dtype, _voidptr, use_parallel  # noqa: E402
from .scalar import NEAREST, STOCHASTIC, finish_derived, random_bits, round_table_value  # noqa: E402


# ---- nearest: the user's functions (no cache: their types are per function) ---------------------------
# Every code is checked before from_code sees it: a loop stops at its first out-of-range code, returns its
# index, and ``raise_for`` names the format, the value and the code. An exception raised by to_code/from_code
# propagates out of the serial loop; numba's parallel loop drops it (the worker's remaining iterations are
# abandoned), so each parallel run records that it finished, and the runner reruns the first unfinished run
# serially, which raises the user's exception. The checks cost one compare per element and one store per run.
# One compiled function per loop and format (each compile of a user type's loop is paid per process): the loops
# take the raw addresses themselves, so no wrapper links them and has LLVM optimise them again. They return
# (index of the first bad code or -1, the value there, and for the parallel loop the restart index): a failing
# element's dst is never written, so its value is read back even in place.
@njit
def nearest_serial_at(to_code, from_code, src, dst, size, w, limit):
    """(index of the first element whose code is outside 0 .. limit-1 (dst written up to it) or -1, its value)."""
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    for i in range(size):
        c = np.int64(to_code(np.float64(s[i])))
        if np.uint64(c) >= limit:  # a negative code wraps to a large unsigned one
            return i, np.float64(s[i])
        d[i] = from_code(c)
    return -1, 0.0


@njit(parallel=True)
def nearest_parallel_at(to_code, from_code, src, dst, size, w, limit, chunks):
    """(first bad index or -1, its value, start of the first run that did not finish or -1) over ``chunks``
    contiguous runs in parallel, each as nearest_serial_at."""
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    n = size
    per = (n + chunks - 1) // chunks
    first = np.full(chunks, n + 1, np.int64)  # n + 1 stays where a user function raised
    for c in prange(chunks):
        j = n
        for i in range(c * per, min(n, (c + 1) * per)):
            k = np.int64(to_code(np.float64(s[i])))
            if np.uint64(k) >= limit:
                j = i
                break
            d[i] = from_code(k)
        first[c] = j
    bad, restart = -1, -1
    for c in range(chunks):
        if first[c] == n + 1:
            restart = c * per
            break
        if first[c] < n:
            bad = first[c]
            break
    return bad, np.float64(s[bad]) if bad >= 0 else 0.0, restart


def check_code(args, code: int, what: str) -> int:
    """``code`` if it is one of the type's codes 0 .. ncodes-1 (``args``: its ``abi.CustomArgs``), else
    ValueError naming the type, ``what`` (the call that returned it) and the code."""
    if not 0 <= code < args.ncodes:
        raise ValueError(f"{args.name}: {what} returned code {code}, outside the codes 0..{args.ncodes - 1}")
    return code


def raise_for(args, x: float) -> None:
    """Raise what ``from_code(to_code(x))`` does, called from Python on the value a kernel stopped at:
    ValueError for a code out of range, or the user's exception."""
    args.from_code(check_code(args, int(args.to_code(x)), f"to_code({x!r})"))
    raise RuntimeError(f"{args.name}: to_code/from_code failed on {x!r} in the kernel but not when called again "
                       "(they must be deterministic functions of their argument)")


# ---- derived modes ---------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def derived_at(lo, hi, src, dst, size, w, tab, n, snap32, ninf, pinf, negzero, mode, key, nbits):
    """Elements lo..hi-1 of the ``size`` values of w's dtype at addresses src, dst."""
    s, d = carray(_voidptr(src), size, w.dtype), carray(_voidptr(dst), size, w.dtype)
    for i in range(lo, hi):
        rnd = random_bits(key, i, nbits) if mode == STOCHASTIC else np.uint64(0)
        x = np.float64(s[i])
        q = round_table_value(x, tab, n, snap32, mode, rnd, nbits)
        d[i] = finish_derived(x, q, tab[0], tab[n - 1], ninf, pinf, negzero, mode)


def custom_runner(dtype, args):
    """``run(src, dst, size, mode, key, nbits, parallel=None)`` on raw addresses of ``size`` contiguous
    float32/float64 values (dst may be src) for the user type of ``args`` (``abi.CustomArgs``: ``to_code`` /
    ``from_code`` for nearest; ``derived(mode)`` for the other modes, which raises ValueError where a mode is
    not available)."""
    dt = _check_dtype(dtype)
    w = _VALUE_WITNESS[dt]
    to_code, from_code = args.to_code, args.from_code
    snap32 = np.int64(dt == np.float32)
    limit = np.uint64(args.ncodes)

    def run(src: int, dst: int, size: int, mode, key, nbits, parallel=None) -> None:
        if int(mode) == NEAREST:
            try:
                bad, x = _nearest(src, dst, size, parallel)
            except Exception as e:
                e.add_note(f"raised by {args.name}'s to_code/from_code (CustomFormat), rounding {size} values")
                raise
            if bad >= 0:
                raise_for(args, x)
            return
        (n, tab), ninf, pinf, negzero = args.derived(mode)  # abi.TableArgs and flags
        threads.launch(derived_at, size, src, dst, size, w, tab, np.int64(n), snap32, np.int64(ninf), np.int64(pinf),
                       np.int64(negzero), mode, np.uint64(key), nbits, parallel=use_parallel(size, parallel))

    def _nearest(src, dst, size, parallel):
        with _parallel.try_parallel(use_parallel(size, parallel)) as par:
            if par:
                bad, x, restart = nearest_parallel_at(to_code, from_code, src, dst, size, w, limit,
                                                      np.int64(max(1, min(size, 8 * numba.get_num_threads()))))
                if restart >= 0:  # a user function raised there: the serial loop raises it again
                    step = restart * w.dtype.itemsize
                    bad, x = nearest_serial_at(to_code, from_code, src + step, dst + step, size - restart, w,
                                               limit)
                    if bad < 0:
                        raise RuntimeError(
                            f"{args.name}: to_code/from_code raised in the parallel loop at or after element "
                            f"{restart} but not when called again (they must be deterministic functions of "
                            "their argument)")
            else:
                bad, x = nearest_serial_at(to_code, from_code, src, dst, size, w, limit)
        return bad, x

    return run


def quantize_custom(src: np.ndarray, dst: np.ndarray, args, mode, key, nbits, parallel=None):
    """Round the flat float32/float64 array ``src`` into ``dst`` (same dtype and size; may be ``src``) to the
    user type of ``args`` (``abi.CustomArgs``)."""
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"dst must match src: {dst.size} x {dst.dtype} against {src.size} x {src.dtype}")
    custom_runner(src.dtype, args)(src.ctypes.data, dst.ctypes.data, src.size, mode, key, nbits, parallel)


# ---- GEMM on codes (emunum.mad.custom_matmul) -----------------------------------------------------------
@njit
def checked_op(f, a, b, limit):
    """(f(a, b), True) for a code in 0 .. limit-1, else (0, False) (out of range, or f raised)."""
    try:
        c = np.int64(f(a, b))
    except Exception:
        return np.int64(0), False
    return c, np.uint64(c) < limit


@njit
def checked_decode(from_code, c):
    try:
        return np.float64(from_code(c)), True
    except Exception:
        return 0.0, False


@njit(parallel=True)
def matmul_codes(zero, from_code, add, mul, ca, cb, out, limit):
    """out[i, j] = from_code(acc) with acc = add(... add(add(zero, mul(ca[i,0], cb[0,j])), mul(ca[i,1], ...)),
    k in order 0..K-1; ca (m, K), cb (K, n) int64 codes. Rows run in parallel, each dot product serially.
    Returns per row the first column whose dot product failed (a function raised or returned a code outside
    0 .. limit-1; the row stops there), or n."""
    m, k = ca.shape
    n = cb.shape[1]
    failed = np.full(m, n, np.int64)
    for i in prange(m):
        for j in range(n):
            acc = zero
            ok = True
            for kk in range(k):
                p, ok = checked_op(mul, ca[i, kk], cb[kk, j], limit)
                if not ok:
                    break
                acc, ok = checked_op(add, acc, p, limit)
                if not ok:
                    break
            if ok:
                v, ok = checked_decode(from_code, acc)
            if not ok:
                failed[i] = j
                break
            out[i, j] = v
    return failed


@njit
def encode_values(to_code, x, out):
    for i in range(x.size):
        out[i] = to_code(np.float64(x[i]))


def _encode(args, x: np.ndarray) -> np.ndarray:
    codes = np.empty(x.shape, np.int64)
    encode_values(args.to_code, x.reshape(-1), codes.reshape(-1))
    bad = np.flatnonzero((codes < 0) | (codes >= args.ncodes))
    if bad.size:
        raise_for(args, float(x.reshape(-1)[bad[0]]))
    return codes


def _replay(args, ca: np.ndarray, cb: np.ndarray, zero: int, i: int, j: int) -> None:
    """Run out[i, j]'s dot product from Python, raising what its first failing call does."""
    acc = zero
    for kk in range(ca.shape[1]):
        a, b = int(ca[i, kk]), int(cb[kk, j])
        p = check_code(args, int(args.mul(a, b)), f"mul({a}, {b})")
        acc = check_code(args, int(args.add(acc, p)), f"add({acc}, {p})")
    args.from_code(acc)
    raise RuntimeError(f"{args.name}: add/mul/from_code failed on out[{i}, {j}] in the kernel but not when called "
                       "again (they must be deterministic functions of their arguments)")


def custom_matmul_codes(args, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out`` (m, n float32/float64) = the code-level GEMM of float arrays a (m, K) and b (K, n), rounded to
    the user type of ``args`` (``abi.CustomArgs`` with ``add`` and ``mul``) by its ``to_code`` first (see
    ``emunum.mad.custom_matmul``). Every code that to_code, mul and add return is checked (ValueError naming
    the call and the code), and their exceptions reach the caller."""
    ca, cb = _encode(args, a), _encode(args, b)
    zero = check_code(args, int(args.to_code(0.0)), "to_code(0.0)")
    with _parallel.exclusive():
        failed = matmul_codes(np.int64(zero), args.from_code, args.add, args.mul, ca, cb, out,
                              np.uint64(args.ncodes))
    rows = np.flatnonzero(failed < out.shape[1])
    if rows.size:
        _replay(args, ca, cb, zero, int(rows[0]), int(failed[rows[0]]))
