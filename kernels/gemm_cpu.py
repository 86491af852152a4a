"""Numba CPU kernels for emulated multiply-accumulate: batched GEMM and the element-wise MAD.

The datapath (order of operations, roundings, stochastic counters) is specified in ``emunum.mad``; this
module implements it. Output tiles of ``TM x TN`` elements are distributed over threads with ``prange``;
inside a tile, row i, then the K loop, then a contiguous run of TN columns, so the accumulators of TN
outputs advance together. Every output element sees the same operations in the same order whatever the
tiling or thread count, so the bits never depend on either.

Two GEMM kernels:
- ``gemm_general``: any formats and rounding modes (exact sums via TwoSum and round-to-odd, rounding by the
  bit-exact cores of ``kernels/scalar/``; stochastic bits from the counter-based generator).
- ``gemm_fast`` (``kernels/gemm_fast.py``): both roundings to nearest-even FloatFormats, product precision <=
  accumulator precision, not fused, in binary64 or binary32 without TwoSum where that is exact.
Nothing is compiled at import; each kernel compiles on first call (``cache=True``).
"""
import enum
from dataclasses import dataclass

import numba
import numpy as np
from numba import njit, prange

from . import _cache, gemm_scalar, gemm_vec, operand_scan, parallel as _parallel, scalar
from .abi import read_only

_cache.guard(__file__, [*scalar.SOURCES, gemm_scalar.__file__])

from .gemm_fast_plan import (  # noqa: E402,F401  (the planners' names, as before the split)
    _abs_range, _significant_bits, fast_applies, fast_consts, fast_params, fast_plan,
)
from .gemm_scalar import (  # noqa: E402
    NSTREAMS, S_ACC, S_BIAS, S_CHUNK, S_MUL, S_REDUCE, add_round, canonical_nan, finish_row, mac, tile_of,
)
from .gemm_fast import TM, TN, _round_acc, gemm_fast  # noqa: E402,F401  (tests reach them here)

MAX_TM = 32  # gemm_fast's tallest tile: 32 x TN float32 accumulators (and as many chunk sums) stay within L2


@njit(cache=True, parallel=True)
def gemm_general(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits):
    nb, M, N = out.shape
    K = A.shape[2]
    bA, bB = A.shape[0], B.shape[0]
    ti, tj = (M + TM - 1) // TM, (N + TN - 1) // TN
    span = chunk * lanes if chunk > 0 else max(K, 1)
    k_mul, k_acc, k_chunk, k_red, k_bias = keys[S_MUL], keys[S_ACC], keys[S_CHUNK], keys[S_REDUCE], keys[S_BIAS]
    for t in prange(nb * ti * tj):
        b, i0, i1, j0, nj, ab, bbi = tile_of(t, M, N, bA, bB, TM, TN)
        inner = np.zeros((lanes, TN))
        outer = np.zeros((lanes, TN))
        v = np.empty(lanes)
        for i in range(i0, i1):
            inner[:, :] = 0.0
            outer[:, :] = 0.0
            obase = (b * M + i) * N + j0
            for kk in range(0, K, span):
                for k in range(kk, min(K, kk + span)):
                    lane = k % lanes
                    a = A[ab, i, k]
                    for jj in range(nj):
                        inner[lane, jj] = mac(a, B[bbi, k, j0 + jj], inner[lane, jj], fused, mulp, accp,
                                              k_mul, k_acc, (obase + jj) * K + k, nbits)
                if chunk > 0:
                    for lane in range(lanes):
                        for jj in range(nj):
                            outer[lane, jj] = add_round(outer[lane, jj], inner[lane, jj], accp, k_chunk,
                                                        (obase + jj) * K + kk + lane, nbits)
                            inner[lane, jj] = 0.0
            src = outer if chunk > 0 else inner
            finish_row(out, src, v, b, i, j0, nj, lanes, accp, k_red, bias, has_bias, k_bias, obase, nbits)




@njit(cache=True, parallel=True)
def mad_elementwise(a, b, c, out, fused, mulp, accp, keys, nbits):
    for i in prange(out.size):
        out[i] = canonical_nan(mac(a[i], b[i], c[i], fused, mulp, accp, keys[S_MUL], keys[S_ACC], i, nbits))


def gemm(A, B, bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, fast=None, scans=None):
    """out[b] = A[b % bA] @ B[b % bB] (+ bias[b]) on the unit's datapath.

    A: (bA, M, K), B: (bB, K, N): float32-representable values (float32 or float64 arrays), used as given;
    bias: (nb, M, N) float64 or None; out: (nb, M, N) float64, written. mulp/accp: int64 parameter vectors;
    lanes >= 1; chunk 0 (none) or >= 1; keys: NSTREAMS uint64 stream keys; nbits: stochastic bits.
    fast: None picks ``gemm_fast`` whenever ``fast_plan`` allows, else ``gemm_vec`` (``kernels/gemm_vec.py``)
    whenever ``gemm_vec.vec_applies`` and the GEMM has at least ``VEC_MIN_MACS`` products, else
    ``gemm_general``; False forces ``gemm_general``; a tuple forces that ``gemm_fast`` plan, "vec" forces
    ``gemm_vec`` where it applies (tests, benchmarks). Same bits whichever runs. scans: the operands' scans
    where the caller has them (``fast_plan``'s ``scans``).
    """
    if len(keys) != NSTREAMS:
        raise ValueError(f"keys must hold {NSTREAMS} stream keys, got {len(keys)}")
    has_bias = bias is not None
    if bias is None:
        bias = np.zeros((1, 1, 1))
    choice = _choose(A, B, fused, mulp, accp, fast, scans, lanes, chunk)
    with _parallel.exclusive():
        _gemm(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, choice)


class Kernel(enum.Enum):
    """The CPU GEMM kernels, all giving the same bits where they apply."""

    FAST = "fast"  # gemm_fast: round to nearest, exact in the work dtype (fast_plan)
    VEC = "vec"  # kernels/gemm_vec.py: mode-specialised, vectorised over output columns
    GENERAL = "general"  # gemm_general: every unit


@dataclass(frozen=True)
class Choice:
    """The kernel ``gemm`` runs, and for ``Kernel.FAST`` its plan (``fast_plan``'s tuple)."""

    kernel: Kernel
    plan: tuple | None = None


_GENERAL, _VEC = Choice(Kernel.GENERAL), Choice(Kernel.VEC)


def _choose(A, B, fused, mulp, accp, fast, scans=None, lanes=None, chunk=None) -> Choice:
    """The kernel ``gemm`` runs (see its ``fast``); lanes and chunk: the unit's (None: not known to the caller,
    then the plan's bound holds for every datapath)."""
    if fast is False:
        return _GENERAL
    if fast is None:
        plan = fast_plan(A, B, fused, mulp, accp, scans, lanes, chunk)
        if plan is not None:
            return Choice(Kernel.FAST, plan)
        return _VEC if _vec_wanted(A, B, fused, mulp, accp) else _GENERAL
    if isinstance(fast, str):
        return _VEC if fast == "vec" and gemm_vec.vec_applies(fused, mulp, accp) else _GENERAL
    return Choice(Kernel.FAST, tuple(fast)) if fast_applies(fused, mulp, accp) else _GENERAL


def kernel_choice(A, B, fused, mulp, accp, fast=None, lanes=None, chunk=None) -> str:
    """Which kernel ``gemm`` runs: "fast", "vec" or "general" (tests assert the one they mean to reach)."""
    return _choose(A, B, fused, mulp, accp, fast, None, lanes, chunk).kernel.value


# gemm_vec compiles one variant per unit configuration (~17 s on first use, then cached on disk). Below this many
# products a gemm_general call takes about 2 ms (0.03 GMAC/s), so small GEMMs (unit tests, probes, tiny layers)
# skip that compile; anything larger pays it once and then runs 10-30x faster.
VEC_MIN_MACS = 1 << 16


def _vec_wanted(A, B, fused, mulp, accp) -> bool:
    macs = max(A.shape[0], B.shape[0]) * A.shape[1] * A.shape[2] * B.shape[2]
    return macs >= VEC_MIN_MACS and gemm_vec.vec_applies(fused, mulp, accp)


def _gemm(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits, choice: Choice):
    if choice.kernel is Kernel.VEC:
        gemm_vec.run(A, B, bias, has_bias, out, fused, mulp, accp, lanes, chunk, keys, nbits)
    elif choice.kernel is Kernel.FAST:
        _run_fast(A, B, bias, has_bias, out, mulp, accp, lanes, chunk, choice.plan)
    else:
        gemm_general(np.ascontiguousarray(A, dtype=np.float32), np.ascontiguousarray(B, dtype=np.float32),
                     read_only(bias), has_bias, out, int(fused), as_params(mulp), as_params(accp), lanes, chunk,
                     as_keys(keys), nbits)


def _run_fast(A, B, bias, has_bias, out, mulp, accp, lanes, chunk, plan):
    """``gemm_fast`` on a layout of the same products that fills its TM x TN tiles.

    gemm_fast computes each output element alone, with the same operations in the same order whatever the
    tiling, and draws no random bits (round to nearest only), so any layout that gives every output element its
    own row of A and column of B gives the same bits:
    - a batch of A over one B: out[b] = A[b] @ B is one GEMM of nb*M rows (out viewed as (1, nb*M, N));
    - one A over a batch of narrow B (N < TN, e.g. a conv's im2col per sample): out[b] = A @ B[b] is one GEMM
      A @ [B[0] | B[1] | ...] of nb*N columns;
    - a narrow output (N < TN/2 < M, e.g. a bias-gradient GEMM with N = 1): out^T = B^T @ A^T, since every
      product a*b == b*a exactly and the formats, modes and plan flags are symmetric in the two operands.
    """
    nb, M, N = out.shape
    K = A.shape[2]
    if nb > 1 and B.shape[0] == 1 and A.shape[0] == nb and out.flags.c_contiguous:
        o = out.reshape(1, nb * M, N)
        b2 = np.ascontiguousarray(bias).reshape(1, nb * M, N) if has_bias else bias
        _run_fast(A.reshape(1, nb * M, K), B, b2, has_bias, o, mulp, accp, lanes, chunk, plan)
        return
    if nb > 1 and A.shape[0] == 1 and B.shape[0] == nb and N < TN:
        o = np.empty((1, M, nb * N))
        b2 = np.ascontiguousarray(bias.transpose(1, 0, 2)).reshape(1, M, nb * N) if has_bias else bias
        _run_fast(A, np.ascontiguousarray(B.transpose(1, 0, 2)).reshape(1, K, nb * N), b2, has_bias, o, mulp, accp,
                  lanes, chunk, plan)
        out[...] = o.reshape(M, nb, N).transpose(1, 0, 2)
        return
    if 2 * N < TN and M > N:
        o = np.empty((nb, N, M))
        b2 = np.ascontiguousarray(bias.transpose(0, 2, 1)) if has_bias else bias
        _run_fast(B.transpose(0, 2, 1), A.transpose(0, 2, 1), b2, has_bias, o, mulp, accp, lanes, chunk, plan)
        out[...] = o.transpose(0, 2, 1)
        return
    dtype, mul_sub, acc_sub, checks, mul_exact = _flags(plan)
    gemm_fast(np.ascontiguousarray(A, dtype=dtype), np.ascontiguousarray(B, dtype=dtype), read_only(bias), has_bias,
              out, *fast_consts(mulp, accp, dtype), lanes, chunk, mul_sub, acc_sub, checks, mul_exact,
              row_tile(nb, M, N, numba.get_num_threads()))


def _flags(plan) -> tuple:
    """(work dtype, mul_sub, acc_sub, checks, mul_exact) of a ``fast_plan`` tuple, the flags as Python bools (one
    compiled variant of the kernels); a forced 4-tuple plan has no mul_exact, and checks exclude it."""
    dtype, mul_sub, acc_sub, checks = plan[:4]
    return dtype, bool(mul_sub), bool(acc_sub), bool(checks), len(plan) > 4 and bool(plan[4]) and not checks


def conv(x, A, bias, out, fused, mulp, accp, lanes, chunk, geometry, scans) -> bool:
    """The per-sample GEMMs of a 2-D convolution on ``kernels/conv_fast.py`` (each sample's im2col columns made
    just before its GEMM reads them), where ``gemm_fast`` runs them in float32; returns whether it ran (else
    nothing was written: the caller lays the columns out for ``gemm``). x (N, C, H, W) float32, padded; A (G, O/G,
    K) float32; bias (O,) float64 or None; out (N*G, O/G, Ho*Wo) float64; geometry (kh, kw, sh, sw, dh, dw, Ho,
    Wo); scans: (A's, x's) as ``gemm``'s (x holds every nonzero value of the columns)."""
    sx = scans[1] if scans[1] is not None else operand_scan.scan(x)
    plan = fast_plan(A, x, fused, mulp, accp, (scans[0], sx), lanes, chunk)
    if plan is None or plan[0] != np.float32 or out.size == 0:
        return False
    from .conv_fast import conv_fast  # noqa: PLC0415  (compiled on first use)

    G, Og, _ = A.shape
    L = geometry[6] * geometry[7]
    rows = np.zeros((1, 1, 1))
    if bias is not None:
        rows = np.ascontiguousarray(np.broadcast_to(bias.reshape(G, Og, 1), (G, Og, L)))
    dtype, mul_sub, acc_sub, checks, mul_exact = _flags(plan)
    with _parallel.exclusive():
        conv_fast(x, A, read_only(rows), bias is not None, out, *fast_consts(mulp, accp, dtype), lanes, chunk,
                  mul_sub, acc_sub, checks, mul_exact, row_tile(G, Og, L, numba.get_num_threads()), *geometry)
    return True


def conv_wgrad(g, x, taps, out, fused, mulp, accp, lanes, chunk, geometry, scans) -> bool:
    """A convolution's weight gradient (one group) on ``kernels/conv_fast.wgrad_fast``, where the plan for its
    operands is ``gemm_fast``'s exact-product path in float32 (exact products, no subnormal sums, no checks) and
    the unit chunks its sums (chunk > 0, at most ``PANEL_TERMS`` terms per span) and each term's products (O x Kc)
    outnumber its panel copies (O + Kc) 16 to 1 (below, the copies cost more than laying the operands out: conv1
    of cnn2d, 16 x 27, measured 8.1 ms laid out against 8.7 in panels, one thread); returns whether it ran (else
    nothing was written: the caller lays the operands out for ``gemm``). g (N, O, L) float32, the output gradient;
    x (N, C, H, W) float32, the padded input; taps (Kc,) int64, each im2col column's offset in a sample of x;
    out (1, O, Kc) float64; geometry (sh, sw, Wo); scans: (g's, x's), each None or ``operand_scan.scan``."""
    N, O, L = g.shape
    Kc = taps.size
    if chunk <= 0 or chunk * lanes > PANEL_TERMS or out.size == 0 or N * L == 0 or O * Kc < 16 * (O + Kc):
        return False
    sg = scans[0] if scans[0] is not None else operand_scan.scan(g)
    sx = scans[1] if scans[1] is not None else operand_scan.scan(x)
    shape_a = np.broadcast_to(np.float32(0.0), (1, O, N * L))  # the GEMM's A, for the planner's K only
    plan = fast_plan(shape_a, x, fused, mulp, accp, (sg, sx), lanes, chunk)
    if plan is None:
        return False
    dtype, _, acc_sub, checks, mul_exact = _flags(plan)
    if dtype != np.float32 or acc_sub or not mul_exact:  # mul_exact excludes checks
        return False
    from .conv_fast import wgrad_fast  # noqa: PLC0415  (compiled on first use)

    _, accf, acc64 = fast_consts(mulp, accp, np.float32)
    with _parallel.exclusive():
        wgrad_fast(g, x, taps, out, accf, acc64, lanes, chunk, row_tile(1, O, taps.size, numba.get_num_threads()),
                   *geometry)
    return True


PANEL_TERMS = 256  # the most terms per span ``wgrad_fast`` copies into its tiles' panels


def row_tile(nb: int, M: int, N: int, threads: int) -> int:
    """``gemm_fast``'s rows per tile: TM, doubled up to ``MAX_TM`` while the GEMM keeps a tile per thread. A tile
    reads its K x TN panel of B once for all its rows: a long, narrow GEMM (a convolution's weight gradient, K =
    batch x positions) streamed B from memory once per TM rows."""
    tj = -(-N // TN)
    tm = TM
    while tm < min(MAX_TM, M) and nb * -(-M // (2 * tm)) * tj >= threads:
        tm *= 2
    return tm


def mad(a, b, c, out, fused, mulp, accp, keys, nbits):
    """out[i] = the one-step MAD of (a[i], b[i], c[i]): flat a, b float32, c and out float64."""
    with _parallel.exclusive():
        mad_elementwise(a, b, c, out, int(fused), as_params(mulp), as_params(accp), as_keys(keys), nbits)


def as_params(p) -> tuple:
    """A parameter vector as the tuple of ints the kernels take (tuples pass to CPU and CUDA code alike)."""
    return tuple(int(v) for v in p)


def as_keys(keys) -> tuple:
    return tuple(np.uint64(k) for k in keys)
