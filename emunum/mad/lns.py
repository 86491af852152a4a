"""GEMM on a logarithmic-number MAD unit: ``lns_matmul(A, B, fmt, add="exact")`` for a ``LogFormat``
(multiplication is exact in LNS; addition uses a stated approximation chosen by a parameter).

The datapath, precisely. F = 2**fmt.frac_bits; a nonzero LNS value is +-2**(k/F), k in [kmin, kmax]; the
emulator holds it as V(k), the float64 nearest 2**(k/F) (``LogFormat.value_of``).
Operands. A (M, K) and B (K, N) are rounded to fmt (nearest, ``emunum.quantize`` on their float64 values),
giving codes (sign, k) or zero or NaN.
Products (exact, as ``LogFormat.mul_codes``): k = ka + kb, sign = sa xor sb; k > kmax saturates to kmax;
k < kmin gives zero; a zero operand gives zero (the term is skipped). A NaN operand makes the output NaN.
Accumulation. For each output element, acc starts at zero and, for k = 0, 1, ..., K-1 in order, acc <- add(acc,
p_k) for every nonzero product p_k; a zero addend leaves the other unchanged (no rounding).
  add="exact": acc <- round(acc + p), the real sum of the addends' values (V of their codes) rounded to the LNS
    grid by fmt's own nearest rule (nearest in log2, saturating at +-max, zero below the log midpoint of zero
    and min). It is computed as the LogFormat rounding of the float64 sum fl(V(acc) + V(p)): that sum is
    itself rounded (53 bits) before the LNS rounding, which differs from rounding the exact sum only when the
    float64 rounding crosses an LNS log-domain midpoint (relative distance < 2**-53; never seen in the tests'
    random data, which compare against the exact sum).
  add="mitchell": the classic LNS addition log2(|x| +- |y|) = kh/F + log2(1 +- t), kh = max(kx, ky),
    d = |kx - ky|, t = 2**(-d/F) in (0, 1], with the Gaussian logarithms approximated by Mitchell's
    log2(1 + t) ~ t (same signs) and log2(1 - t) ~ -t (opposite signs). The result exponent is
    k = kh + n (same signs) or kh - n (opposite), n = round(F*t) to the nearest integer, ties (only F*t = 1/2,
    at d = F*(frac_bits+1)) to the even k; the sign is that of the larger magnitude. Opposite signs with d = 0
    (t = 1, exact cancellation) give zero. k > kmax saturates to kmax, k < kmin gives zero.
The output is the accumulator's value V(k) (or 0, NaN) in A's dtype (float32: nearest-even, +-inf or 0 for
values beyond float32's range, possible from int_bits 9 on). It runs on the CPU (``kernels.lns_gemm_cpu``,
rows in parallel); CUDA is not supported: CUDA tensors raise ValueError (move them with ``.cpu()``). It is not
differentiable: it emulates a forward pass.
"""
from __future__ import annotations

import decimal
import enum
import functools
from fractions import Fraction

import numpy as np
import torch

from ..formats import LogFormat
from ..formats.log import log_tables
from ..formats.base import parse_enum
from .compile_boundary import graph_break

_DTYPES = (torch.float32, torch.float64)


class LNSAdd(enum.Enum):
    """The LNS addition of ``lns_matmul`` (module docstring)."""
    EXACT = "exact"
    MITCHELL = "mitchell"


@functools.lru_cache(maxsize=None)
def mitchell_table(frac_bits: int) -> np.ndarray:
    """int64 [round(F * 2**(-d/F)) for d < F*(frac_bits+1)], F = 2**frac_bits: never a tie there (F*2**(-d/F)
    is irrational for d not a multiple of F, else the integer F/2**(d/F)); each entry is derived from a
    60-digit value and checked to lie > 1e-40 from a midpoint."""
    F = 1 << frac_bits
    out = []
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        for d in range(F * (frac_bits + 1)):
            if d % F == 0:
                v = Fraction(F, 2 ** (d // F))
            else:
                v = Fraction(F * decimal.Decimal(2) ** (-decimal.Decimal(d) / decimal.Decimal(F)))
            n = int(v + Fraction(1, 2))  # floor(v + 1/2)
            if d % F != 0 and abs(v - n - Fraction(1, 2)) < Fraction(1, 10**40):
                raise ArithmeticError(f"F*2**(-{d}/{F}) is too close to a midpoint to round with certainty")
            out.append(n)
    t = np.array(out, dtype=np.int64)
    t.setflags(write=False)
    return t


def _operand(t: torch.Tensor, fmt: LogFormat) -> tuple[np.ndarray, np.ndarray]:
    """t rounded to fmt (nearest) as (cls, k) int64 arrays: cls 0 zero, 1 positive, 2 negative, 3 NaN. A
    rounded value is V(k) for some k in [kmin, kmax], and k = rint(F * log2 V(k)) (the float64 log2 is far
    closer than 1/2 to k/F); each k is checked against V."""
    from ..quantize import quantize
    q = quantize(t.detach().cpu().to(torch.float64), fmt, "nearest").numpy()
    nan, zero = np.isnan(q), q == 0
    a = np.abs(np.where(nan | zero, 1.0, q))
    f = fmt.frac_bits
    k = np.rint(np.log2(a) * (1 << f)).astype(np.int64)
    v = np.ldexp(log_tables(f)[(2 << f) + (k & ((1 << f) - 1))], k >> f)
    if np.any((k < fmt.kmin) | (k > fmt.kmax) | (v != a)):
        raise ArithmeticError(f"lns_matmul: an operand rounded to {fmt.name} is not one of its values")
    cls = np.where(nan, 3, np.where(zero, 0, np.where(q < 0, 2, 1)))
    return np.ascontiguousarray(cls, dtype=np.int64), np.ascontiguousarray(k, dtype=np.int64)


@graph_break
def lns_matmul(A: torch.Tensor, B: torch.Tensor, fmt: LogFormat, add="exact") -> torch.Tensor:
    """A (M, K) @ B (K, N) on an LNS MAD unit of format fmt; add: "exact" or "mitchell" (module docstring)."""
    if not isinstance(fmt, LogFormat):
        raise TypeError(f"fmt must be a LogFormat, got {type(fmt).__name__} ({fmt!r})")
    mode = parse_enum(LNSAdd, add, "add", "LNS addition")
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed: float32, float64")
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}; lns_matmul runs on the CPU only: pass {name}.cpu()")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not chain: A is {tuple(A.shape)}, B is {tuple(B.shape)}")
    if A.dtype != B.dtype:
        raise ValueError(f"A and B must have one dtype: A is {A.dtype}, B is {B.dtype}")
    out = np.zeros((A.shape[0], B.shape[1]), dtype=np.float64)
    if out.size:
        from ..kernels import lns_gemm_cpu
        ca, ka = _operand(A, fmt)
        cb, kb = _operand(B, fmt)
        f = fmt.frac_bits
        mtab = mitchell_table(f) if mode is LNSAdd.MITCHELL else np.zeros(1, dtype=np.int64)
        add_id = lns_gemm_cpu.EXACT if mode is LNSAdd.EXACT else lns_gemm_cpu.MITCHELL
        lns_gemm_cpu.run(ca, ka, cb, kb, out, fmt.to_kernel_args().table, f, fmt.kmin, fmt.kmax, int(fmt.signed),
                         add_id, mtab, (1 << f) * (f + 1))
    return torch.from_numpy(out).to(A.dtype)
