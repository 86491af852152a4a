"""``block_matmul``: a GEMM on a MAD unit whose operands are block-scaled (OCP MX, NVFP4).

The datapath, precisely (after the block-scaled MMA of OCP MX v1.0 section 6.4, "dot product of two MX
vectors", and NVIDIA's NVFP4 GEMMs, whose per-tensor scales enter as the epilogue's fp32 alpha):

Operands. C = A @ B, A (..., M, K), B (..., K, N) (equal batch dims), float tensors of any values. A is quantised to ``fmt_a`` along K
(axis -1), B to ``fmt_b`` along K (axis -2), with ``rounding`` (``emunum.quantize``'s semantics), into
element values a[m, k], b[k, n], block scales sa[m, j], sb[j, n] and tensor scales Ta, Tb (1 without
tensor_scale). A 2-D tile format (``nvfp4_2d``) gives its tile's scale to each element. Block j of the
reduction covers k = j*L .. j*L + L - 1 (the last block may be partial), L the blocks' length along K, which
must be the same for A and B (A: the block size, or a tile's columns; B: the block size, or a tile's rows).

One output element (m, n):
  1. Block-pair sums, exact: P_j = sum over block j of a[m, k] * b[k, n], every product and every partial
     sum without error (the hardware's block dot product is exact before its scaling, OCP MX 6.4).
  2. Scaling, exact: T_j = P_j * (sa[m, j] * sb[j, n]). For E8M0 scales this is a power of two; for float
     scales (NVFP4's e4m3) an exact product of two short significands.
  3. Accumulation in increasing j, acc starting at +0: acc <- round_acc(acc + T_j), one rounding per block
     pair of the exact sum, in the unit's acc_fmt and acc_rounding (``emunum.mad``'s fused step with a = acc,
     b = 1, c = T_j; stochastic rounding of that sum follows ``emunum.mad.unit``'s rule for sums, i.e. it
     rounds the binary64 round-to-odd of the exact sum). The unit's mul_fmt/mul_rounding/fused are not used:
     the products are exact by step 1.
  4. Tensor scales (only if a format has tensor_scale): alpha = float32(Ta * Tb) (nearest-even, as a caller
     computes cuBLAS's fp32 alpha), then acc <- round_acc(acc * alpha), one rounding of the exact product.
  The result is a value of acc_fmt, returned in the promoted dtype of A and B.

Why steps 1-2 are exact in binary64 (checked for each call; ``exact_bound_bits``). Every element of a
FloatFormat is an integer multiple of its quantum q = 2**(emin - man) (subnormal spacing; normals are
coarser multiples of it), with |a| <= max, so a = ia * q with |ia| <= Ia = max / q; a FixedFormat element is
ia * 2**-frac_bits with |ia| <= 2**(bits-1). A product is ia*ib * qa*qb, and P_j, a sum of at most L products,
is an integer multiple of qa*qb of magnitude at most L*Ia*Ib (in units of qa*qb); every partial sum on the
way obeys the same bound, so if L*Ia*Ib <= 2**53 every partial sum is a binary64 value and the summation
(in any order, with or without FMA) makes no error. A scale is a power of two (E8M0) or m*2**e with an odd
integer m < 2**(man+1) (a FloatFormat scale); so T_j is an integer multiple of a power of two with integer
part at most L*Ia*Ib*Ma*Mb (M = 1 for E8M0, 2**(man+1) - 1 otherwise). Exponents stay far inside binary64's
range (elements and scales are within 2**+-149 .. 2**128; a product of four such is within 2**-600 .. 2**520),
so L*Ia*Ib*Ma*Mb <= 2**53 makes T_j exact. For instance: mxfp8_e4m3 x mxfp8_e4m3, L = 32: Ia = 448 * 2**9 <
2**18, bound 2**5 * 2**35.6 < 2**41; mxfp4_e2m1: 2**5 * 12 * 12 < 2**13; nvfp4 (e2m1, e4m3 scales, L = 16):
2**4 * 144 * 15 * 15 < 2**19. e5m2 elements (Ia = 57344 * 2**16 ~ 2**31.8) exceed it: 32 * Ia * Ia ~ 2**68.6,
and so does e4m3 x e5m2 (~2**54.6); such pairs raise ValueError rather than round silently.

Units: one-product units (``MADUnit`` with terms=1) with lanes=1, chunk=None, order='sequential', and an
acc_fmt whose values fit float32 (every FloatFormat; FixedFormat up to 24 bits). Stochastic accumulation
draws, for block step j, from the stream keys of seed_j = mix64(seed_key(seed) + 16 + j) mod 2**63 with
counter = the output element's flat C-order index (``emunum.mad``'s element-wise counters); the epilogue uses j = nblocks. Stochastic operand
rounding uses seeds mix64(seed_key(seed) + 5) (A) and + 6 (B) mod 2**63. Not differentiable.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import gemm_listener
from ..block_quantize import quantize_block_checked, tensor_scale, working_layout
from ..formats import BlockFormat, E8M0Format, FixedFormat, FloatFormat, MXPlusFormat, RoundMode, get_format
from ..quantize import check_sr_bits, check_tensor, resolve_seed
from ..rng import mix64_int, seed_key
from . import backend
from .compile_boundary import graph_break
from .unit import MADUnit, Order, as_unit

_SEED_A, _SEED_B, _SEED_STEP = 5, 6, 16


def _derived(seed: int, offset: int) -> int:
    return mix64_int(seed_key(seed) + offset) & (2**63 - 1)


def _element_int_bound(fmt: BlockFormat) -> int:
    """Ia: the largest |element| in units of the element format's quantum; for MX+ the largest block max,
    2**emax * (2 - 2**-p), in units of the finer of that quantum and the block max's 2**(emax - p)."""
    el = fmt.element
    if isinstance(el, FixedFormat):
        return 1 << (el.bits - 1)
    if isinstance(fmt, MXPlusFormat):
        return int(math.ldexp(fmt.bm_max, -min(el.emin - el.man, fmt.element_emax - fmt.bm_bits)))
    return int(math.ldexp(el.max, el.man - el.emin))


def _scale_sig_bound(sc) -> int:
    return 1 if isinstance(sc, E8M0Format) else (1 << (sc.man + 1)) - 1


def exact_bound_bits(fmt_a: BlockFormat, fmt_b: BlockFormat, length: int) -> float:
    """log2(L * Ia * Ib * Ma * Mb): the block-pair sums are exact in binary64 when it is at most 53."""
    bound = (length * _element_int_bound(fmt_a) * _element_int_bound(fmt_b)
             * _scale_sig_bound(fmt_a.scale) * _scale_sig_bound(fmt_b.scale))
    return math.log2(bound)


def _k_length(fmt: BlockFormat, k_axis_is_last: bool) -> int:
    r, c = fmt.tile
    return c if (r == 0 or k_axis_is_last) else r


def check_unit(unit: MADUnit) -> None:
    """Raise ValueError unless ``unit`` can run the block datapath (see the module docstring)."""
    if unit.multiplier is not None:
        raise ValueError(f"block_matmul on {unit}: the block datapath sums block pairs exactly; allowed: a unit "
                         "without a multiplier")
    if unit.is_multiterm or unit.lanes != 1 or unit.chunk is not None or unit.order != Order.SEQUENTIAL:
        raise ValueError(f"block_matmul on {unit}: the block datapath sums each block pair exactly and "
                         "accumulates the block sums one by one; allowed: a one-product unit (terms=1, no "
                         "align/promote/exact accumulator) with lanes=1, chunk=None, order='sequential'")
    if not unit.output_fits_float32():
        raise ValueError(f"block_matmul: MADUnit.acc_fmt={unit.acc_fmt.name} has values float32 cannot hold; "
                         "allowed: a FloatFormat, or a FixedFormat of at most 24 bits")


def _split(x: torch.Tensor, fmt: BlockFormat, axis: int, mode: RoundMode, key: int, nbits: int):
    """(element values, full block scale per element, tensor scale T), all exact, float64, x's shape."""
    x64 = x.detach().to(torch.float64)
    deq, scales = quantize_block_checked(x64, fmt, mode, key, nbits, axis, return_scales=True)
    work, tile, _ = working_layout(x64, fmt, axis)
    t = tensor_scale(work, fmt)
    if fmt.four_over_six is not None:  # 4/6's outer scale is TransformerEngine's decode scale (emunum/nvfp4_quantize.py)
        from ..nvfp4_quantize import outer_scale_values
        t = float(outer_scale_values(work, fmt)[0]) if work.numel() else 1.0
    P, R, C = work.shape
    s = scales.repeat_interleave(tile[0], 1)[:, :R].repeat_interleave(tile[1], 2)[:, :, :C]  # per element
    if fmt.tile[0] == 0:  # 1-D blocks: the working layout is x with ``axis`` moved last
        s = s.reshape(x64.movedim(axis, -1).shape).movedim(-1, axis)
    return deq / (s.reshape(x.shape) * t), s.reshape(x.shape), t


def check_pair(fa: BlockFormat, fb: BlockFormat) -> int:
    """The common block length along K of A's format ``fa`` (K last) and B's ``fb`` (K first); raises
    ValueError if they differ or if their block-pair sums are not provably exact in binary64."""
    length = _k_length(fa, True)
    if _k_length(fb, False) != length:
        raise ValueError(f"block_matmul: fmt_a={fa.name} has blocks of {length} along K and fmt_b={fb.name} of "
                         f"{_k_length(fb, False)}; allowed: the same length (blocks are multiplied in pairs)")
    bits = exact_bound_bits(fa, fb, length)
    if bits > 53:
        raise ValueError(f"block_matmul: {fa.name} x {fb.name} blocks of {length} need {bits:.1f} bits for an exact "
                         "block-pair sum, more than binary64's 53; allowed: element/scale pairs within 2**53 "
                         "(e.g. mxfp8_e4m3, mxfp6_*, mxfp4_e2m1, mxint8, nvfp4), or shorter blocks")
    return length


@graph_break
def block_matmul(A: torch.Tensor, B: torch.Tensor, fmt_a, fmt_b, unit: MADUnit, *, rounding="nearest",
                 rounding_b=None, seed: int | None = None, sr_bits: int = 32) -> torch.Tensor:
    """C = A @ B with A quantised to ``fmt_a`` along K and B to ``fmt_b`` along K, block pairs summed exactly,
    scaled, and accumulated on ``unit`` (the module docstring gives the datapath). A (..., M, K), B (..., K, N):
    float tensors on one device with the same batch dims (each quantised as one tensor: blocks along K, one
    tensor scale); fmt_a/fmt_b: BlockFormats or their names; rounding: the operands' rounding
    mode (``rounding_b``: B's, if different); seed: for stochastic operand rounding and accumulation (None:
    drawn from torch's generator when anything rounds stochastically)."""
    unit = as_unit(unit)
    check_tensor(A, "A")
    check_tensor(B, "B")
    backend.check_same_device(A=A, B=B)
    if A.dim() < 2 or A.dim() != B.dim() or A.shape[:-2] != B.shape[:-2] or A.shape[-1] != B.shape[-2]:
        raise ValueError(f"block_matmul needs A (..., M, K) and B (..., K, N) with the same batch dims, got A "
                         f"{tuple(A.shape)}, B {tuple(B.shape)}")
    fa, fb = get_format(fmt_a), get_format(fmt_b)
    for name, f in (("fmt_a", fa), ("fmt_b", fb)):
        if not isinstance(f, BlockFormat):
            raise TypeError(f"block_matmul {name}={f.name}: allowed: a BlockFormat (e.g. 'mxfp8_e4m3', 'nvfp4'); "
                            "for element formats quantise first and use emunum.mad.matmul")
    for name, f in (("fmt_a", fa), ("fmt_b", fb)):
        if f.outer_scale.value == "row":
            raise ValueError(f"block_matmul {name}={f.name}: outer_scale='row' is not on the MAD-unit block "
                             "datapath; allowed: outer_scale 'tensor' or none (per-row scales run in patched "
                             "layers without a MAD unit)")
    length = check_pair(fa, fb)
    check_unit(unit)
    mode = RoundMode.parse(rounding)
    mode_b = mode if rounding_b is None else RoundMode.parse(rounding_b, "rounding_b")
    nbits = check_sr_bits(sr_bits)
    step = MADUnit(None, unit.acc_fmt, acc_rounding=unit.acc_rounding, fused=True, sr_bits=unit.sr_bits)
    stochastic = RoundMode.STOCHASTIC in (mode, mode_b) or step.stochastic
    seed = resolve_seed(seed) if stochastic else 0
    key_a = seed_key(_derived(seed, _SEED_A)) if mode == RoundMode.STOCHASTIC else seed_key(0)
    key_b = seed_key(_derived(seed, _SEED_B)) if mode_b == RoundMode.STOCHASTIC else seed_key(0)
    dtype = torch.promote_types(A.dtype, B.dtype)
    M, K = A.shape[-2:]
    flops = 2 * math.prod(A.shape[:-1]) * K * B.shape[-1]  # coverage counts K, not K padded to whole blocks
    with torch.no_grad(), gemm_listener.native("block_gemm", flops):
        ea, sa, ta = _split(A, fa, -1, mode, key_a, nbits)  # (..., M, K)
        eb, sb, tb = _split(B, fb, -2, mode_b, key_b, nbits)  # (..., K, N)
        nblk = -(-K // length) if K else 0
        pad = nblk * length - K
        F = torch.nn.functional
        ea = F.pad(ea, (0, pad)).unflatten(-1, (nblk, length))  # (..., M, nblk, L)
        eb = F.pad(eb, (0, 0, 0, pad)).unflatten(-2, (nblk, length))  # (..., nblk, L, N)
        sa_blk = F.pad(sa, (0, pad), value=1.0).unflatten(-1, (nblk, length))[..., 0]  # (..., M, nblk)
        sb_blk = F.pad(sb, (0, 0, 0, pad), value=1.0).unflatten(-2, (nblk, length))[..., 0, :]  # (..., nblk, N)
        partial = torch.einsum("...mjl,...jln->...jmn", ea, eb)  # exact: see the module docstring
        terms = partial * (sa_blk.transpose(-1, -2)[..., :, :, None] * sb_blk[..., :, None, :])  # exact
        one = torch.ones((), dtype=torch.float32, device=A.device)
        acc = torch.zeros(terms.shape[:-3] + terms.shape[-2:], dtype=torch.float64, device=A.device)
        for j in range(nblk):
            sj = _derived(seed, _SEED_STEP + j) if step.stochastic else 0
            acc = backend.elementwise(acc.to(torch.float32), one, terms[..., j, :, :], step, sj)
        if fa.tensor_scale or fb.tensor_scale:
            alpha = torch.tensor(float(np.float32(ta * tb)), dtype=torch.float32, device=A.device)
            sj = _derived(seed, _SEED_STEP + nblk) if step.stochastic else 0
            zero = torch.zeros((), dtype=torch.float64, device=A.device)
            acc = backend.elementwise(acc.to(torch.float32), alpha, zero, step, sj)
    return acc.to(dtype)

