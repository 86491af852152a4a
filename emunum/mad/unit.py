"""``MADUnit``: the spec of an emulated multiply-accumulate datapath (frozen, hashable, validated once).

The datapath, precisely enough to build it in hardware or another emulator.

Operands. a and b are used exactly as given: they are assumed to be values of the operand format already
(rounding operands to a format is the caller's job, e.g. ``emunum.quantize`` or ``emunum.patch``). They
must be representable in float32 (every FloatFormat value and every FixedFormat value of <= 24 bits is),
which makes every product a*b exact in binary64; a float64 tensor holding other values is rejected.

One MAD step on an accumulator value acc (a value of acc_fmt):
  not fused:  acc <- round_acc(round_mul(a*b) + acc)      two roundings: product to mul_fmt, sum to acc_fmt
  fused:      acc <- round_acc(a*b + acc)                 one rounding of the exact a*b + acc (an FMA)
Every round_X rounds the exact real value once, with X's rounding mode and X's overflow, saturation and
subnormal rules (those of ``emunum.quantize``). Two exceptions, where a sum's exact value could need more
than binary64 holds: stochastic rounding of a sum and two's-complement wrap of a sum are applied to the
binary64 round-to-odd of the exact sum (53 significant bits, the last one sticky). That equals rounding the
exact sum whenever acc_fmt's mantissa plus sr_bits is at most 50 (float formats; e.g. every format of
<= 18 mantissa bits with the default 32 random bits), or |sum| < 2**(51 - frac_bits) (fixed with wrap).
Products are exact in binary64, so product roundings always see the exact value.
An exact zero sum is +0 unless both addends are -0 (in every mode); the accumulators start at +0, so they
never hold -0.

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
from dataclasses import dataclass
from typing import Union

import numpy as np

from ..formats import FloatFormat, Format, RoundMode, format_or_none, parse_enum
from ..rng import mix64_int, seed_key

MAX_LANES = 64
NPARAM = 12  # mirrors kernels.gemm_scalar.NPARAM (this layer compiles nothing)
NSTREAMS = 5


class Order(enum.IntEnum):
    """Summation order: SEQUENTIAL follows the datapath above, bit for bit. ANY lets torch sum in its own
    order (allowed only for an fp32 unit with round-to-nearest and no chunk or lanes; see ``MADUnit``)."""

    SEQUENTIAL = 0
    ANY = 1

    @classmethod
    def parse(cls, value: Union[str, "Order"]) -> "Order":
        return parse_enum(cls, value, "MADUnit.order", "an order")




def _positive_int(field: str, value, lo: int, hi: int) -> int:
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

    def __post_init__(self):
        if not isinstance(self.fused, (bool, np.bool_)):
            raise TypeError(f"MADUnit.fused must be a bool, got {self.fused!r}")
        object.__setattr__(self, "fused", bool(self.fused))
        if self.acc_fmt is None:
            raise ValueError("MADUnit.acc_fmt=None: the accumulator needs a format (e.g. 'fp32', 'fp16_169')")
        object.__setattr__(self, "acc_fmt", format_or_none(self.acc_fmt, "MADUnit.acc_fmt"))
        object.__setattr__(self, "mul_fmt", format_or_none(self.mul_fmt, "MADUnit.mul_fmt"))
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
            object.__setattr__(self, "chunk", _positive_int("chunk", self.chunk, 1, 2**31 - 1))
        object.__setattr__(self, "lanes", _positive_int("lanes", self.lanes, 1, MAX_LANES))
        object.__setattr__(self, "sr_bits", _positive_int("sr_bits", self.sr_bits, 1, 32))
        object.__setattr__(self, "order", Order.parse(self.order))
        if self.order == Order.ANY:
            ok = (_is_fp32(self.acc_fmt) and self.acc_rounding == RoundMode.NEAREST and self.chunk is None
                  and self.lanes == 1 and (self.fused or (_is_fp32(self.mul_fmt)
                                                          and self.mul_rounding == RoundMode.NEAREST)))
            if not ok:
                raise ValueError(f"MADUnit.order='any' needs an fp32 unit (fp32 or fused products, fp32 accumulator, "
                                 f"round-to-nearest, chunk=None, lanes=1); got {self}")

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
        return f"MAD[{mul} -> {fmt(self.acc_fmt, self.acc_rounding)}" + "".join(", " + e for e in extra) + "]"

    def __str__(self) -> str:
        return self.name

    def output_fits_float32(self) -> bool:
        """Whether every acc_fmt value is a float32 (float formats always; fixed point up to 24 bits)."""
        return isinstance(self.acc_fmt, FloatFormat) or self.acc_fmt.bits <= 24

    def kernel_params(self) -> tuple[np.ndarray, np.ndarray]:
        """(mul, acc) int64 parameter vectors for ``kernels.gemm_scalar`` (mul: zeros when fused)."""
        mul = np.zeros(NPARAM, np.int64) if self.fused else format_params(self.mul_fmt, self.mul_rounding)
        return mul, format_params(self.acc_fmt, self.acc_rounding)


def format_params(fmt: Format, mode: RoundMode) -> np.ndarray:
    """The int64 parameter vector of ``kernels.gemm_scalar`` (layout P_KIND..P_MODE) for fmt and mode."""
    p = np.zeros(NPARAM, np.int64)
    if isinstance(fmt, FloatFormat):
        _, man, emin, sub, mx, ovf, negzero = fmt.to_kernel_args()
        maxbits = int(np.array(mx, dtype=np.float64).view(np.int64))
        p[:7] = (0, man, emin, sub, maxbits, ovf, negzero)
    else:
        _, frac, cmin, cmax, sat = fmt.to_kernel_args()
        p[0], p[7:11] = 1, (frac, cmin, cmax, sat)
    p[11] = int(mode)
    return p


def stream_keys(seed: int) -> np.ndarray:
    """uint64 keys of the five stochastic-rounding streams: mix64(seed_key(seed) + s), s = 0..4."""
    base = seed_key(seed)
    return np.array([mix64_int(base + s) for s in range(NSTREAMS)], dtype=np.uint64)


def as_unit(unit, field: str = "unit") -> MADUnit:
    if isinstance(unit, MADUnit):
        return unit
    raise TypeError(f"{field} must be an emunum.MADUnit, got {type(unit).__name__}")
