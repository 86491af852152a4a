"""Numba CPU kernels for MAD units with a multiplier (``emunum.mad.multiplier``): batched GEMM and element-wise MAD.

The datapath of ``gemm_cpu.gemm_general`` (same tiles, order, lanes, chunks, reduction, bias and stochastic
counters) with the product a*b replaced by ``multiplier_scalar.approx_product``. Built-in and table
multipliers run ``gemm_builtin`` / ``mad_builtin`` (``cache=True``); user functions run ``gemm_function`` /
``mad_function``, which take the function as an argument and are compiled once per function per process
(numba cannot cache code specialised on a function). ``c`` (addmm's accumulator input) starts lane 0's
accumulator (callers allow it only with lanes=1 and no chunk).
"""
import numba
import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, multiplier_scalar, parallel as _parallel, scalar
from .abi import read_only

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__, multiplier_scalar.__file__])

from .gemm_cpu import TM, TN, as_keys, as_params  # noqa: E402
from .gemm_scalar import (NSTREAMS, S_ACC, S_BIAS, S_CHUNK, S_MUL, S_REDUCE, add_round, canonical_nan,  # noqa: E402
                          finish_row)
from .multiplier_scalar import K_FUNCTION, approx_product, mac_product  # noqa: E402


@njit
def _tile(t, A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm, lut, fn):
    nb, M, N = out.shape
    K = A.shape[2]
    bA, bB = A.shape[0], B.shape[0]
    ti, tj = (M + TM - 1) // TM, (N + TN - 1) // TN
    span = chunk * lanes if chunk > 0 else max(K, 1)
    k_mul, k_acc, k_chunk, k_red, k_bias = keys[S_MUL], keys[S_ACC], keys[S_CHUNK], keys[S_REDUCE], keys[S_BIAS]
    b = t // (ti * tj)
    r = t % (ti * tj)
    i0, j0 = (r // tj) * TM, (r % tj) * TN
    i1, nj = min(i0 + TM, M), min(j0 + TN, N) - j0
    ab, bbi = b % bA, b % bB
    inner = np.zeros((lanes, TN))
    outer = np.zeros((lanes, TN))
    v = np.empty(lanes)
    for i in range(i0, i1):
        inner[:, :] = 0.0
        outer[:, :] = 0.0
        if has_c:
            for jj in range(nj):
                inner[0, jj] = c[b, i, j0 + jj]
        obase = (b * M + i) * N + j0
        for kk in range(0, K, span):
            for k in range(kk, min(K, kk + span)):
                lane = k % lanes
                a = A[ab, i, k]
                for jj in range(nj):
                    p = approx_product(a, B[bbi, k, j0 + jj], prm, lut, fn)
                    inner[lane, jj] = mac_product(p, inner[lane, jj], fused, mulp, accp, k_mul, k_acc,
                                                  (obase + jj) * K + k, nbits)
            if chunk > 0:
                for lane in range(lanes):
                    for jj in range(nj):
                        outer[lane, jj] = add_round(outer[lane, jj], inner[lane, jj], accp, k_chunk,
                                                    (obase + jj) * K + kk + lane, nbits)
                        inner[lane, jj] = 0.0
        src = outer if chunk > 0 else inner
        finish_row(out, src, v, b, i, j0, nj, lanes, accp, k_red, bias, has_bias, k_bias, obase, nbits)


def _ntiles(out):
    nb, M, N = out.shape
    return nb * ((M + TM - 1) // TM) * ((N + TN - 1) // TN)


@njit(cache=True, parallel=True)
def gemm_builtin(A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm, lut,
                 ntiles):
    for t in prange(ntiles):
        _tile(t, A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm, lut, None)


# A user function that raises inside a prange loop: numba drops the exception and abandons the rest of that
# worker's iterations. Each tile (chunk) records that it finished; the host reruns the first unfinished one
# serially, where the exception propagates to the caller.
@njit(parallel=True)
def gemm_function(A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm, lut,
                  ntiles, fn):
    """Returns done[t] = 1 for every tile that finished."""
    done = np.zeros(ntiles, np.uint8)
    for t in prange(ntiles):
        _tile(t, A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm, lut, fn)
        done[t] = 1
    return done


@njit
def gemm_function_tile(A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm,
                       lut, t, fn):
    _tile(t, A, B, bias, has_bias, c, has_c, out, fused, mulp, accp, lanes, chunk, keys, nbits, prm, lut, fn)


@njit
def _mad_one(i, a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut, fn):
    p = approx_product(a[i], b[i], prm, lut, fn)
    out[i] = canonical_nan(mac_product(p, c[i], fused, mulp, accp, keys[S_MUL], keys[S_ACC], i, nbits))


@njit(cache=True, parallel=True)
def mad_builtin(a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut):
    for i in prange(out.size):
        _mad_one(i, a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut, None)


@njit(parallel=True)
def mad_function(a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut, fn, chunks):
    """Over ``chunks`` contiguous runs; returns the start of the first run that did not finish, or -1."""
    n = out.size
    per = (n + chunks - 1) // chunks
    done = np.zeros(chunks, np.uint8)
    for r in prange(chunks):
        for i in range(r * per, min(n, (r + 1) * per)):
            _mad_one(i, a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut, fn)
        done[r] = 1
    for r in range(chunks):
        if done[r] == 0:
            return r * per
    return -1


@njit
def mad_function_from(a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut, fn, start):
    for i in range(start, out.size):
        _mad_one(i, a, b, c, out, fused, mulp, accp, keys, nbits, prm, lut, fn)


def gemm(A, B, bias, c, out, fused, mulp, accp, lanes, chunk, keys, nbits, margs, fn=None):
    """out[b] = A[b % bA] @ B[b % bB] (+ bias[b]) with the multiplier ``margs`` (``Multiplier.kernel_args()``;
    ``fn`` its function for the function kind; a table multiplier takes operand codes, ``encode_operands``).
    A, B float32 (bA, M, K) / (bB, K, N); bias, c: (nb, M, N) float64 or None; out (nb, M, N) float64."""
    if len(keys) != NSTREAMS:
        raise ValueError(f"keys must hold {NSTREAMS} stream keys, got {len(keys)}")
    prm, lut = margs[0], read_only(margs[1])  # a table multiplier's is read-only, the others' dummy not
    has_bias, has_c = bias is not None, c is not None
    dummy = np.zeros((1, 1, 1))
    args = (np.ascontiguousarray(A, dtype=np.float32), np.ascontiguousarray(B, dtype=np.float32),
            bias if has_bias else dummy, has_bias, c if has_c else dummy, has_c, out, int(fused), as_params(mulp),
            as_params(accp), lanes, chunk, as_keys(keys), nbits, tuple(int(v) for v in prm), lut,
            _ntiles(out))
    with _parallel.exclusive():
        if prm[0] == K_FUNCTION:
            done = gemm_function(*args, fn)
            if not done.all():  # fn raised there: the serial run of that tile raises it again
                gemm_function_tile(*args[:-1], int(np.flatnonzero(done == 0)[0]), fn)
                raise RuntimeError(f"Multiplier.function {getattr(fn, '__name__', fn)} raised in the parallel GEMM "
                                   "but not when called again (it must be a deterministic function)")
        else:
            gemm_builtin(*args)


def mad(a, b, c, out, fused, mulp, accp, keys, nbits, margs, fn=None):
    """out[i] = the one-step MAD of (a[i], b[i], c[i]) with the multiplier: flat a, b float32, c, out float64."""
    prm, lut = margs[0], read_only(margs[1])
    args = (a, b, c, out, int(fused), as_params(mulp), as_params(accp), as_keys(keys), nbits,
            tuple(int(v) for v in prm), lut)
    with _parallel.exclusive():
        if prm[0] == K_FUNCTION:
            start = mad_function(*args, fn, max(1, min(out.size, 8 * numba.get_num_threads())))
            if start >= 0:  # as in gemm
                mad_function_from(*args, fn, start)
                raise RuntimeError(f"Multiplier.function {getattr(fn, '__name__', fn)} raised in the parallel MAD "
                                   "but not when called again (it must be a deterministic function)")
        else:
            mad_builtin(*args)
