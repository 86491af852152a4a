"""``MADUnit``: the spec of an emulated multiply-accumulate datapath (frozen, hashable, validated once).

The datapath, precisely enough to build it in hardware or another emulator.

Operands. a and b are used exactly as given: they are assumed to be values of the operand format already
(rounding operands to a format is the caller's job, e.g. ``emunum.quantize`` or ``emunum.patch``). They
must be representable in float32 (every FloatFormat value and every FixedFormat value of <= 24 bits is),
which makes every product a*b exact in binary64; a float64 tensor holding other values is rejected.

One MAD step on an accumulator value acc (a value of acc_fmt):
  not fused:  acc <- round_acc(round_mul(a*b) + acc)      two roundings: product to mul_fmt, sum to acc_fmt
  fused:      acc <- round_acc(a*b + acc)                 one rounding of the exact a*b + acc (an FMA)
With ``multiplier`` (``emunum.mad.multiplier``), a*b above is the multiplier's binary64 value m(a, b) instead.
Every round_X rounds the exact real value once, with X's rounding mode and X's overflow, saturation and
subnormal rules (those of ``emunum.quantize``). Two exceptions, where a sum's exact value could need more
than binary64 holds: stochastic rounding of a sum and two's-complement wrap of a sum are applied to the
binary64 round-to-odd of the exact sum (53 significant bits, the last one sticky). That equals rounding the
exact sum whenever acc_fmt's mantissa plus sr_bits is at most 50 (float formats; e.g. every format of
<= 18 mantissa bits with the default 32 random bits), or |sum| < 2**(51 - frac_bits) (fixed with wrap).
Products are exact in binary64, so product roundings always see the exact value.
An exact zero sum is +0 unless both addends are -0 (in every mode). The accumulators start at +0; a rounding
to zero keeps the value's sign where the format has -0 (quantize's rule), so a negative product or sum that
rounds to zero (flushed without subnormals, below half the smallest subnormal, ...) is -0 there, and an
accumulator can then hold -0. Formats without -0 (fnuz) give +0.
A NaN result (from a NaN operand or bias, inf - inf, inf * 0, an overflow to NaN) is the positive quiet NaN
without payload (binary64 0x7FF8000000000000; float32 0x7FC00000 after the cast), whatever NaNs arose on the
way: their signs and payloads are the hardware's (x86 and CUDA differ), and no rounding turns a NaN into a
number, so they change nothing else.

A dot product sum_k a_k b_k of length K, for one output element:
  lanes w: w partial accumulators; lane l takes the terms k = l, l+w, l+2w, ... in increasing k.
  chunk C (None: no chunking): each lane accumulates its terms into an inner accumulator; after its C-th
    term in a chunk (and after its last term) the chunk closes: outer_l <- round_acc(outer_l + inner_l),
    inner_l <- +0 (Wang et al. 2018). Without chunking the inner accumulator is the lane's result.
    Lane l's chunk c holds its terms k = c*C*w + l + t*w, t = 0..C-1; the chunks of all lanes close
    together after the term k = (c+1)*C*w - 1.
  Accumulators (inner and outer) start at +0.
  Lane results are reduced pairwise in acc_fmt, level by level: v[q] <- round_acc(v[2q] + v[2q+1]) for
    q = 0, 1, ...; an odd last lane passes up unchanged; repeat until one value remains.
  Bias (linear, conv, mad's c): added last, y <- round_acc(dot + bias), with the bias value as given
    (any float64; not pre-rounded). Without bias, y is the reduced dot product (no extra rounding).
  The result is a value of acc_fmt, returned in the input dtype.

Multi-term units (tensor cores; ``terms``, ``align_bits``, ``align_floor``, ``carry_bits``, ``promote_every``;
Fasi et al. 2021, Khattak and Mikaitis 2025). A dot product d = sum_k a_k b_k + c (c: ``addmm``'s input, else
+0) of length K runs in steps of n = ``terms`` products, k = s*n .. s*n+n-1 in increasing k; c enters the
first step, and each step's result is the next step's accumulator value x (x_0 = c):
  1. products: exact a_k*b_k with exponent e_k = ea + eb, ea = max(floor(log2|a|), in_fmt.emin) (operands are
     kept unnormalised: a subnormal keeps the exponent emin and a significand below 1; the product's
     significand is in [0, 4)); or, with ``mul_fmt``, p_k = round_mul(a_k*b_k) with e_k = max(floor(log2|p|),
     mul_fmt.emin). Zero products are skipped.
  2. step exponent: E = max(e_k over nonzero products, max(floor(log2|x|), acc_fmt.emin) if x != 0,
     ``align_floor``). A step with no nonzero term gives +0.
  3. alignment: each term t (products and x) becomes sign(t) * R(|t| / 2**(E-p)) * 2**(E-p), p = ``align_bits``,
     R the integer rounding ``align_rounding`` (toward_zero: the shifted-out bits are dropped, as measured on
     NVIDIA parts). align_bits=None: no loss (the exact sum).
  4. carries: the aligned sum S is an integer multiple of 2**(E-p); with ``carry_bits`` c it wraps to a
     two's-complement adder of 3 + c + p bits (sign, 2 integer bits of a product, c carry bits, p fraction
     bits). None: no wrap (the adder is wide enough, as on the measured parts).
  5. normalisation and rounding, once per step: x <- round_acc(S) (acc_fmt, acc_rounding).
  Promotion (``promote_every`` P, a multiple of n; DeepSeek-V3's recipe): after every P products and after the
  last, outer <- round_outer(outer + x) (``outer_fmt``, ``outer_rounding``), x <- +0; the result is outer.
  Without promotion the result is x. Bias (linear) is then added with one rounding to the result's format.
  Non-finite terms: a step with an inf or NaN term gives round_acc of the sum of its non-finite terms.
Worked example (h100_fp8_e4m3: n=32, p=13, acc e8m13 toward zero): terms 1.0 (E=0) and 3*2**-15 align to the
quantum 2**-13; 3*2**-15 = 0.75 quanta truncates to 0, so 1.0 + 3*2**-15 gives 1.0 in one step, where fp32
accumulation gives 1.0000916.
Exact accumulation (``acc_fmt="exact"``): a Kulisch accumulator: c, every product (exact, or rounded to
mul_fmt) and the bias are summed without error and rounded once to the output dtype's format (fp32, fp16
or bf16) in ``acc_rounding`` (any mode; stochastic rounds the sum's binary64 round-to-odd, counter = the
output's flat index, stream 1). float64 outputs are refused.

Stochastic rounding. Every rounding draws ``sr_bits`` bits from the counter-based generator of
``emunum.quantize`` (``kernels.scalar.random_bits(key, counter, sr_bits)``), with one key per stream,
key_s = seed_key(seed) + s (mod 2**64) mixed by splitmix64 (``stream_keys``), and counters, for output
element o (flat C-order index in the GEMM's output; element index for ``mad``) and term k:
  s=0 product rounding of term k: o*K + k          s=1 accumulation of term k: o*K + k
  s=2 chunk close (lane l, chunk c): o*K + c*C*w + l
  s=3 lane reduction, n-th addition: o*w + n       s=4 bias addition: o
So results depend only on (seed, shapes, values), never on tiling, thread count or device.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Union

import numpy as np

from ..formats import (FixedFormat, FloatFormat, Format, HiFloat8Format, P3109Format, RoundMode, format_or_none,
                       parse_enum)
from ..kernels import abi
from ..kernels.abi import MAX_LANES, MAX_TERMS, NPARAM
from ..rng import mix64_int, seed_key
from .multiplier import Multiplier
from .presets import preset_kwargs

MAX_ALIGN_BITS = 40
MAX_CARRY_BITS = 10
EXACT = "exact"
NSTREAMS = 5


class Order(enum.IntEnum):
    """Summation order: SEQUENTIAL follows the datapath above, bit for bit. ANY lets torch sum in its own
    order (allowed only for an fp32 unit with round-to-nearest and no chunk or lanes; see ``MADUnit``)."""

    SEQUENTIAL = 0
    ANY = 1

    @classmethod
    def parse(cls, value: Union[str, "Order"]) -> "Order":
        return parse_enum(cls, value, "MADUnit.order", "an order")




def _int_in_range(field: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"MADUnit.{field} must be an int in [{lo}, {hi}], got {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"MADUnit.{field}={value} is out of range; allowed: {lo}..{hi}")
    return int(value)


def _is_fp32(fmt) -> bool:
    return isinstance(fmt, FloatFormat) and fmt == FloatFormat(8, 23)


@dataclass(frozen=True)
class MADUnit:
    """A multiply-accumulate unit: product rounding, accumulator, fusion, chunking and SIMD lanes.

    mul_fmt: format products are rounded to (with ``mul_rounding``); must be None when ``fused``.
    acc_fmt: the accumulator's format (with ``acc_rounding``); also the result's value set.
    fused: True -> one rounding of a*b + acc (FMA); False -> round(round(a*b) + acc).
    chunk: None, or the number of terms per inner (chunk) accumulation in each lane (>= 1).
    lanes: SIMD width w (1..64): w partial accumulators over k = l (mod w), reduced pairwise at the end.
    sr_bits: random bits per stochastic rounding (1..32).
    order: "sequential" (default: bit-exact datapath) or "any": only for fp32 round-to-nearest units
      without chunk or lanes; matmul/linear/conv then call torch in float32, which computes fp32 products
      and sums with fp32 rounding (fused or not, by the BLAS) but in its own summation order and blocking,
      so the bits are not reproduced, only the arithmetic (on CUDA, only with TF32 off:
      ``torch.backends.cuda.matmul.allow_tf32 = False``, torch's default). ``mad`` always runs the datapath.
    Multi-term (tensor-core) fields, see the module docstring (they exclude ``chunk`` and ``lanes``):
    terms: products per fused step (1..256); align_bits: fraction bits kept below the step exponent (0..40;
      None: lossless); align_rounding: what happens to the shifted-out bits (default toward_zero);
      align_floor: the lowest step exponent (None: none); carry_bits: adder carry bits (0..10; None:
      unlimited); in_fmt: the operands' format, whose emin is a subnormal operand's exponent (None: fp32);
      promote_every: products per promotion into the outer accumulator (``outer_fmt``, ``outer_rounding``,
      default fp32 to nearest), a multiple of terms.
    multiplier: None (exact products) or an ``emunum.mad.Multiplier`` (or "mitchell"): the product step
      a*b becomes the multiplier's value (approximate multipliers: tables, Mitchell, truncated, DRUM, a user
      function; ``emunum.mad.multiplier``); one-product units only. The rest of the datapath is unchanged.
    acc_fmt="exact": Kulisch accumulation rounded once to the output dtype (module docstring).
    ``MADUnit.preset(name)`` gives the published tensor-core datapaths (``emunum.mad.presets``).
    Formats may be given by name (``get_format``), modes by name (``RoundMode.parse``).
    The full datapath (order of operations, roundings, stochastic counters) is in the module docstring.
    """

    mul_fmt: Format | None
    acc_fmt: Format
    mul_rounding: RoundMode = RoundMode.NEAREST
    acc_rounding: RoundMode = RoundMode.NEAREST
    fused: bool = False
    chunk: int | None = None
    lanes: int = 1
    sr_bits: int = 32
    order: Order = Order.SEQUENTIAL
    terms: int = 1
    align_bits: int | None = None
    align_rounding: RoundMode = RoundMode.TOWARD_ZERO
    align_floor: int | None = None
    carry_bits: int | None = None
    in_fmt: Format | None = None
    promote_every: int | None = None
    outer_fmt: Format = "fp32"
    outer_rounding: RoundMode = RoundMode.NEAREST
    multiplier: Multiplier | None = None

    def __post_init__(self):
        if not isinstance(self.fused, (bool, np.bool_)):
            raise TypeError(f"MADUnit.fused must be a bool, got {self.fused!r}")
        object.__setattr__(self, "fused", bool(self.fused))
        if self.acc_fmt is None:
            raise ValueError("MADUnit.acc_fmt=None: the accumulator needs a format (e.g. 'fp32', 'fp16_169')")
        if isinstance(self.acc_fmt, str) and self.acc_fmt.lower() == EXACT:
            object.__setattr__(self, "acc_fmt", EXACT)
        else:
            object.__setattr__(self, "acc_fmt", format_or_none(self.acc_fmt, "MADUnit.acc_fmt"))
        object.__setattr__(self, "mul_fmt", format_or_none(self.mul_fmt, "MADUnit.mul_fmt"))
        for field in ("mul_fmt", "acc_fmt"):
            v = getattr(self, field)
            if v is not None and v != EXACT and not _float_kernel_format(v):
                allowed = ("a FloatFormat, FixedFormat, HiFloat8Format or signed P3109Format"
                           + (" or 'exact'" if field == "acc_fmt" else ""))
                raise ValueError(f"MADUnit.{field}={v.name}: allowed: {allowed} (round tensors to "
                                 f"{type(v).__name__}s with emunum.quantize or emunum.patch)")
        object.__setattr__(self, "mul_rounding", RoundMode.parse(self.mul_rounding, "MADUnit.mul_rounding"))
        object.__setattr__(self, "acc_rounding", RoundMode.parse(self.acc_rounding, "MADUnit.acc_rounding"))
        if self.fused and self.mul_fmt is not None:
            raise ValueError(f"MADUnit.mul_fmt={self.mul_fmt.name} with fused=True: a fused unit adds the exact "
                             "product; pass mul_fmt=None")
        if self.fused and self.mul_rounding != RoundMode.NEAREST:
            raise ValueError(f"MADUnit.mul_rounding={self.mul_rounding.name.lower()} with fused=True: a fused "
                             "unit does not round the product; leave mul_rounding at its default")
        if not self.fused and self.mul_fmt is None:
            raise ValueError("MADUnit.mul_fmt=None with fused=False: give the product format "
                             "(e.g. the accumulator's) or set fused=True")
        if self.chunk is not None:
            object.__setattr__(self, "chunk", _int_in_range("chunk", self.chunk, 1, 2**31 - 1))
        object.__setattr__(self, "lanes", _int_in_range("lanes", self.lanes, 1, MAX_LANES))
        object.__setattr__(self, "sr_bits", _int_in_range("sr_bits", self.sr_bits, 1, 32))
        object.__setattr__(self, "order", Order.parse(self.order))
        self._check_multiterm()
        object.__setattr__(self, "multiplier", Multiplier.parse(self.multiplier))
        if self.multiplier is not None and (self.is_multiterm or self.order != Order.SEQUENTIAL):
            raise ValueError(f"MADUnit.multiplier={self.multiplier.name} with a multi-term, exact or order='any' "
                             "unit: allowed: a one-product unit (terms=1, order='sequential')")
        if self.order == Order.ANY:
            ok = (_is_fp32(self.acc_fmt) and self.acc_rounding == RoundMode.NEAREST and self.chunk is None
                  and self.lanes == 1 and (self.fused or (_is_fp32(self.mul_fmt)
                                                          and self.mul_rounding == RoundMode.NEAREST)))
            if not ok:
                raise ValueError(f"MADUnit.order='any' needs an fp32 unit (fp32 or fused products, fp32 accumulator, "
                                 f"round-to-nearest, chunk=None, lanes=1); got {self}")

    def _check_multiterm(self):
        object.__setattr__(self, "terms", _int_in_range("terms", self.terms, 1, MAX_TERMS))
        for field, hi in (("align_bits", MAX_ALIGN_BITS), ("carry_bits", MAX_CARRY_BITS)):
            v = getattr(self, field)
            if v is not None:
                object.__setattr__(self, field, _int_in_range(field, v, 0, hi))
        if self.align_floor is not None:
            object.__setattr__(self, "align_floor", _int_in_range("align_floor", self.align_floor, -1100, 1100))
        if self.promote_every is not None:
            object.__setattr__(self, "promote_every", _int_in_range("promote_every", self.promote_every, 1,
                                                                    2**31 - 1))
        object.__setattr__(self, "align_rounding", RoundMode.parse(self.align_rounding, "MADUnit.align_rounding"))
        object.__setattr__(self, "outer_rounding", RoundMode.parse(self.outer_rounding, "MADUnit.outer_rounding"))
        object.__setattr__(self, "in_fmt", format_or_none(self.in_fmt, "MADUnit.in_fmt"))
        object.__setattr__(self, "outer_fmt", format_or_none(self.outer_fmt, "MADUnit.outer_fmt"))
        for field in ("in_fmt", "outer_fmt"):
            v = getattr(self, field)
            if v is not None and not isinstance(v, FloatFormat):
                raise ValueError(f"MADUnit.{field}={v.name}: allowed: a FloatFormat")
        if not self.is_multiterm:
            return
        if self.chunk is not None or self.lanes != 1:
            raise ValueError(f"MADUnit chunk={self.chunk}, lanes={self.lanes} with a multi-term or exact unit: "
                             "allowed: chunk=None, lanes=1 (promote_every generalises chunk)")
        if self.order != Order.SEQUENTIAL:
            raise ValueError("MADUnit.order='any' with a multi-term or exact unit: allowed: 'sequential'")
        if not self.fused and not isinstance(self.mul_fmt, FloatFormat):
            raise ValueError(f"MADUnit.mul_fmt={self.mul_fmt.name} with a multi-term or exact unit: allowed: a "
                             "FloatFormat, or fused=True (exact products)")
        if not self.fused and self.mul_rounding == RoundMode.STOCHASTIC:
            raise ValueError("MADUnit.mul_rounding='stochastic' with a multi-term or exact unit: allowed: a "
                             "deterministic mode")
        if self.align_rounding == RoundMode.STOCHASTIC:
            raise ValueError("MADUnit.align_rounding='stochastic': allowed: a deterministic mode")
        if self.acc_fmt == EXACT:
            extra = {k: getattr(self, k) for k in ("align_bits", "align_floor", "carry_bits", "promote_every")
                     if getattr(self, k) is not None}
            if self.terms != 1 or extra:
                raise ValueError(f"MADUnit acc_fmt='exact' with terms={self.terms}, {extra}: an exact "
                                 "accumulator has no steps; allowed: terms=1 and none of align_bits, "
                                 "align_floor, carry_bits, promote_every")
            return
        if not isinstance(self.acc_fmt, FloatFormat):
            raise ValueError(f"MADUnit.acc_fmt={self.acc_fmt.name} with a multi-term unit: allowed: a FloatFormat")
        if RoundMode.STOCHASTIC in (self.acc_rounding, self.outer_rounding):
            raise ValueError("MADUnit acc_rounding/outer_rounding='stochastic' with a multi-term unit: allowed: "
                             "a deterministic mode")
        if self.carry_bits is not None and self.align_bits is None:
            raise ValueError(f"MADUnit.carry_bits={self.carry_bits} with align_bits=None: a lossless adder has "
                             "no fixed width; give align_bits")
        if self.promote_every is not None and self.promote_every % self.terms != 0:
            raise ValueError(f"MADUnit.promote_every={self.promote_every} is not a multiple of "
                             f"terms={self.terms}; allowed: k * terms")

    @functools.cached_property  # asked on every GEMM; the fields are frozen
    def is_multiterm(self) -> bool:
        """Whether the unit runs the multi-term (or exact) datapath rather than one product per step."""
        return (self.terms > 1 or self.acc_fmt == EXACT or any(
            getattr(self, k) is not None for k in ("align_bits", "align_floor", "carry_bits", "promote_every")))

    @property
    def is_exact(self) -> bool:
        return self.acc_fmt == EXACT

    @classmethod
    def preset(cls, name: str) -> "MADUnit":
        """A published tensor-core datapath by name (``emunum.mad.presets.PRESETS``; aliases a2/a30 -> a100,
        l40s -> ada, h200 -> h100); each preset's documentation cites its source."""
        return cls(**preset_kwargs(name))

    def exact_out_format(self, dtype) -> FloatFormat:
        """The format an exact unit rounds to for an output dtype (fp32, fp16, bf16)."""
        import torch

        fmts = {torch.float32: FloatFormat(8, 23), torch.float16: FloatFormat(5, 10),
                torch.bfloat16: FloatFormat(8, 7)}
        if dtype not in fmts:
            raise ValueError(f"MADUnit acc_fmt='exact' rounds once to the output dtype; got {dtype}, allowed: "
                             "float32, float16, bfloat16")
        return fmts[dtype]

    def multiterm_params(self, dtype=None) -> tuple:
        """(prm, mul, acc, outer) int64 parameter vectors of ``kernels.multiterm_scalar`` (acc: the output
        format for exact units, from ``dtype``). Also used for one-product-per-step units (terms=1, lossless)
        with lanes=1 and chunk=None, whose bits it reproduces (addmm on such units)."""
        exact = self.is_exact
        prm = np.zeros(abi.NTPARAM, np.int64)
        prm[abi.T_KIND] = 1 if exact else 0
        prm[abi.T_TERMS] = self.terms
        prm[abi.T_P] = -1 if self.align_bits is None else self.align_bits
        prm[abi.T_AMODE] = int(self.align_rounding)
        prm[abi.T_FLOOR] = abi.NO_FLOOR if self.align_floor is None else self.align_floor
        prm[abi.T_CARRY] = -1 if self.carry_bits is None else self.carry_bits
        prm[abi.T_PROMOTE] = self.promote_every or 0
        prm[abi.T_FUSED] = int(self.fused)
        prm[abi.T_IN_EMIN] = (self.in_fmt or FloatFormat(8, 23)).emin
        acc = self.exact_out_format(dtype) if exact else self.acc_fmt
        prm[abi.T_C_EMIN] = acc.emin if isinstance(acc, FloatFormat) else 0
        prm[abi.T_MUL_EMIN] = self.mul_fmt.emin if isinstance(self.mul_fmt, FloatFormat) else 0
        mul = np.zeros(NPARAM, np.int64) if self.fused else format_params(self.mul_fmt, self.mul_rounding)
        return prm, mul, format_params(acc, self.acc_rounding), format_params(self.outer_fmt, self.outer_rounding)

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def stochastic(self) -> bool:
        return RoundMode.STOCHASTIC in (self.acc_rounding, None if self.fused else self.mul_rounding)

    @property
    def name(self) -> str:
        def fmt(f, m):
            return f"{f.name}:{m.name.lower()}"
        mul = "exact(fused)" if self.fused else fmt(self.mul_fmt, self.mul_rounding)
        extra = [f"chunk={self.chunk}"] if self.chunk is not None else []
        if self.lanes != 1:
            extra.append(f"lanes={self.lanes}")
        if self.stochastic and self.sr_bits != 32:
            extra.append(f"sr_bits={self.sr_bits}")
        if self.order != Order.SEQUENTIAL:
            extra.append("order=any")
        for k in ("terms", "align_bits", "align_floor", "carry_bits", "promote_every"):
            v = getattr(self, k)
            if v is not None and not (k == "terms" and v == 1):
                extra.append(f"{k}={v}")
        if self.is_multiterm and not self.is_exact:
            extra.append(f"align_rounding={self.align_rounding.name.lower()}")
        if self.promote_every is not None:
            extra.append(f"outer={fmt(self.outer_fmt, self.outer_rounding)}")
        if self.in_fmt is not None:
            extra.append(f"in_fmt={self.in_fmt.name}")
        if self.multiplier is not None:
            extra.append(f"multiplier={self.multiplier.name}")
        acc = f"exact:{self.acc_rounding.name.lower()}" if self.is_exact else fmt(self.acc_fmt, self.acc_rounding)
        return f"MAD[{mul} -> {acc}" + "".join(", " + e for e in extra) + "]"

    def __str__(self) -> str:
        return self.name

    def output_fits_float32(self) -> bool:
        """Whether every acc_fmt value is a float32 (float formats always; fixed point up to 24 bits)."""
        return self.is_exact or isinstance(self.acc_fmt, FloatFormat) or self.acc_fmt.bits <= 24

    def kernel_params(self) -> tuple[np.ndarray, np.ndarray]:
        """(mul, acc) int64 parameter vectors for ``kernels.gemm_scalar`` (mul: zeros when fused)."""
        mul = np.zeros(NPARAM, np.int64) if self.fused else format_params(self.mul_fmt, self.mul_rounding)
        return mul, format_params(self.acc_fmt, self.acc_rounding)


def _float_kernel_format(fmt) -> bool:
    """Whether the MAD kernels' rounding steps take fmt: a float or fixed-point record (a signed P3109 format
    rounds as its FloatArgs say; an unsigned one also needs x < 0 -> NaN, which they do not do), or HiFloat8
    (its own kind: ``gemm_scalar.round_value``)."""
    return (isinstance(fmt, (FloatFormat, FixedFormat, HiFloat8Format))
            or (isinstance(fmt, P3109Format) and fmt.signed))


def format_params(fmt: Format, mode: RoundMode) -> np.ndarray:
    """The int64 parameter vector of ``kernels.gemm_scalar`` (layout P_KIND..P_MODE) for fmt and mode."""
    p = np.zeros(NPARAM, np.int64)
    a = fmt.to_kernel_args()
    p[abi.P_KIND] = a.KIND
    if isinstance(a, abi.HiF8Args):
        p[abi.P_OVF] = a.overflow
    elif isinstance(a, abi.FloatArgs):
        p[abi.P_MAN], p[abi.P_EMIN], p[abi.P_SUB], p[abi.P_OVF], p[abi.P_NEGZERO] = (
            a.man, a.emin, a.subnormals, a.overflow, a.negzero)
        p[abi.P_MAXBITS] = int(np.array(a.max, dtype=np.float64).view(np.int64))
    else:
        p[abi.P_FRAC], p[abi.P_CMIN], p[abi.P_CMAX], p[abi.P_SAT] = a.frac, a.code_min, a.code_max, a.saturate
    p[abi.P_MODE] = int(mode)
    return p


def stream_keys(seed: int) -> np.ndarray:
    """uint64 keys of the five stochastic-rounding streams: mix64(seed_key(seed) + s), s = 0..4."""
    base = seed_key(seed)
    return np.array([mix64_int(base + s) for s in range(NSTREAMS)], dtype=np.uint64)


def as_unit(unit, field: str = "unit") -> MADUnit:
    if isinstance(unit, MADUnit):
        return unit
    raise TypeError(f"{field} must be an emunum.MADUnit, got {type(unit).__name__}")
