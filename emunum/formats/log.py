"""Logarithmic numbers: ``LogFormat`` (value = +-2**(k / 2**frac_bits), k a two's-complement fixed-point
exponent), as in Coleman et al., "The European Logarithmic Microprocessor" (IEEE TC 2008) and Miyashita et
al., "Convolutional Neural Networks using Logarithmic Data Representation" (arXiv:1603.01025)."""
from __future__ import annotations

import decimal
import functools
import math
from dataclasses import KW_ONLY, dataclass
from fractions import Fraction

import numpy as np

from ..kernels.abi import LogArgs
from .base import NumberFormat, RoundMode, as_codes, check_bool, check_int
from .table import seed0_bits, stochastic_up_np

MAX_FRAC_BITS = 10


@dataclass(frozen=True)
class LogFormat(NumberFormat):
    """A logarithmic number system: value = +-2**(k / 2**frac_bits), with the exponent k an E-bit two's-
    complement integer, E = int_bits + frac_bits (a fixed-point exponent with int_bits integer bits).

    Code layout (``bits`` = E + signed): ``[sign bit, if signed][E-bit exponent field, two's complement]``.
    The exponent code k = -2**(E-1) (field 100...0) is reserved for zero, so nonzero magnitudes have
    k in [kmin, kmax] = [-2**(E-1)+1, 2**(E-1)-1]: min = 2**(kmin/2**frac_bits), max = 2**(kmax/2**frac_bits).
    Signed: the sign bit with the zero field (code 2**E + 2**(E-1)) is NaN; zero is +0.
    Unsigned: no sign bit, no NaN code; negative inputs become 0 in every mode.

    A code's value V(k) is the float64 nearest to 2**(k/2**frac_bits) (exact for k a multiple of
    2**frac_bits); ``quantize`` casts it to x's dtype (nearest-even). An x equal to some +-V(k) (in a float32
    tensor also +-float32(V(k))) is exact: it comes back unchanged in every mode, so rounding twice changes
    nothing (no other double lies between V(k) and 2**(k/2**frac_bits); float16/bfloat16 tensors are rounded
    through float32 and get no such guarantee for directed modes). Any other x is rounded in the log domain, on t = 2**frac_bits * log2|x| (the sign is
    kept):
    - nearest: k = round(t). Ties cannot occur: every midpoint 2**((k+1/2)/2**frac_bits) is irrational, so
      the tie rule (to the even code) never applies; nearest_away is the same as nearest.
    - toward_zero / up / down / odd: floor(t), or floor(t)+1 where the direction (of x, not |x|) asks for
      it; odd takes the neighbour with an odd k.
    - stochastic: floor(t)+1 with probability t - floor(t) (the log-distance; float64 log2, quantised to
      ``sr_bits`` bits), else floor(t). Unbiased in log2|x|, not in x.
    - Overflow (t > kmax, and infinities) saturates to +-max in every mode.
    - Underflow (|x| < min): zero sits where the code kmin-1 would be, and rounding treats it so: nearest
      gives zero below the log-domain midpoint 2**((kmin - 1/2)/2**frac_bits) and min from it up; down /
      toward_zero (for |x|) give zero, away from zero gives min; odd gives min. Stochastic gives +-min with
      probability |x|/min, else zero (unbiased in x, since log2(0) has no distance).
    - NaN stays NaN; +-0 gives +0.
    The stochastic probability uses float64 log2: CPU and CUDA agree bit for bit in numba's simulator; on a
    GPU, CUDA's log2 may differ from the CPU's in the last bit, which flips a decision only when the
    probability lies within ~1e-16 of a multiple of 2**-sr_bits. int_bits 0..10, frac_bits 0..10, E >= 2.
    Code values beyond a tensor dtype's range become +-inf or 0 in the final cast (possible from int_bits 9
    on for float32, 8 for bfloat16, 6 for float16); float64 holds every one.
    """

    int_bits: int
    frac_bits: int
    _: KW_ONLY
    signed: bool = True

    def __post_init__(self):
        check_int("LogFormat.int_bits", self.int_bits, 0, 10)
        check_int("LogFormat.frac_bits", self.frac_bits, 0, MAX_FRAC_BITS)
        check_bool("LogFormat.signed", self.signed)
        if self.int_bits + self.frac_bits < 2:
            raise ValueError(f"LogFormat: int_bits + frac_bits = {self.int_bits + self.frac_bits}; allowed: >= 2 "
                             "(one exponent code is zero's)")

    @property
    def exp_bits(self) -> int:
        return self.int_bits + self.frac_bits

    @property
    def bits(self) -> int:
        return self.exp_bits + int(self.signed)

    @property
    def kmin(self) -> int:
        return -(2 ** (self.exp_bits - 1)) + 1

    @property
    def kmax(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def zero_field(self) -> int:
        """The exponent field of zero: 2**(E-1), the two's-complement pattern of k = -2**(E-1)."""
        return 2 ** (self.exp_bits - 1)

    @property
    def nan_code(self) -> int | None:
        return (1 << self.exp_bits) | self.zero_field if self.signed else None

    @property
    def max(self) -> float:
        return self.value_of(self.kmax)

    @property
    def min_positive(self) -> float:
        return self.value_of(self.kmin)

    @property
    def min(self) -> float:
        """The smallest value: -max (signed) or 0."""
        return -self.max if self.signed else 0.0

    @property
    def name(self) -> str:
        return f"{'lns' if self.signed else 'ulns'}{self.int_bits}_{self.frac_bits}"

    def __str__(self) -> str:
        return self.name

    def value_of(self, k: int) -> float:
        """The float64 value of exponent code k (nearest to 2**(k/2**frac_bits))."""
        f = self.frac_bits
        return math.ldexp(log_tables(f)[2 << f:][k & ((1 << f) - 1)], k >> f)

    def to_kernel_args(self) -> LogArgs:
        """``kernels.abi.LogArgs``: table = float64 [RD(2**(j/2**(f+1))) for j < 2**(f+1); RN(2**(m/2**f)) for
        m < 2**f] (rounded down / to nearest, f = frac_bits)."""
        return LogArgs(frac=self.frac_bits, kmin=self.kmin, kmax=self.kmax, signed=int(self.signed),
                       table=log_tables(self.frac_bits))

    def decode(self, codes) -> np.ndarray:
        c = as_codes(codes, 2**self.bits, self.name)
        E = self.exp_bits
        field = c & ((1 << E) - 1)
        neg = (c >> E) & 1
        k = np.where(field >= self.zero_field, field - (1 << E), field)
        f = self.frac_bits
        mag = np.ldexp(log_tables(f)[(2 << f) + (k & ((1 << f) - 1))], k >> f)
        v = np.where(neg == 1, -mag, mag)
        v = np.where(field == self.zero_field, np.where(neg == 1, np.nan, 0.0), v)
        return v

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> codes (int64 in [0, 2**bits)), rounded as the class docstring says (a numpy
        implementation; stochastic rounding draws the bits of seed 0). NaN -> the NaN code (signed formats;
        unsigned ones have none: ValueError)."""
        mode = RoundMode.parse(rounding)
        v = np.array(values, dtype=np.float64)
        nan = np.isnan(v)
        if np.any(nan) and not self.signed:
            raise ValueError(f"{self.name} has no code for NaN")
        q = round_log_np(self, v.reshape(-1), mode).reshape(v.shape)
        return self._codes_of(q, nan)

    def _codes_of(self, q: np.ndarray, nan: np.ndarray) -> np.ndarray:
        table = self.magnitudes()  # zero, then exponent codes kmin..kmax
        mag = np.abs(np.where(nan, 0.0, q))
        idx = np.searchsorted(table, mag)
        E = self.exp_bits
        k = idx - 1 + self.kmin  # index 0 is zero (field zero_field)
        field = np.where(idx == 0, self.zero_field, k & ((1 << E) - 1))
        sign = ((q < 0) & (mag > 0)).astype(np.int64) if self.signed else 0
        code = (sign << E) | field
        return np.where(nan, self.nan_code if self.signed else 0, code).astype(np.int64)

    def magnitudes(self) -> np.ndarray:
        """The nonnegative values, ascending: 0, then the values of exponent codes kmin..kmax."""
        if self.exp_bits > 16:
            raise ValueError(f"{self.name}: values are listed for at most 16 exponent bits, it has {self.exp_bits}")
        k = np.arange(self.kmin, self.kmax + 1)
        f = self.frac_bits
        mag = np.ldexp(log_tables(f)[(2 << f) + (k & ((1 << f) - 1))], k >> f)
        return np.concatenate([[0.0], mag])

    def values(self) -> np.ndarray:
        """Every value, ascending (the negatives mirror the positives when signed)."""
        m = self.magnitudes()
        return np.concatenate([-m[:0:-1], m]) if self.signed else m

    def mul_codes(self, a, b) -> np.ndarray:
        """The product of codes a and b (numpy int arrays, broadcast), exactly as LNS hardware forms it: the
        exponents add (k = ka + kb, exact), signs multiply. k > kmax saturates to kmax; k < kmin is below the
        log-domain midpoint of zero and min (k <= kmin - 1), so it is zero, as ``encode(x*y, "nearest")`` of
        the exact product gives. Zero times anything is zero; NaN times anything is NaN."""
        a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
        for nm, c in (("a", a), ("b", b)):
            if not np.issubdtype(c.dtype, np.integer):
                raise TypeError(f"{nm} must be integer codes, got dtype {c.dtype}")
            if np.any((c < 0) | (c >= 2**self.bits)):
                raise ValueError(f"{nm}: codes must be in [0, {2**self.bits}) for {self.name}")
        a, b = a.astype(np.int64), b.astype(np.int64)
        E, zf = self.exp_bits, self.zero_field
        fa, fb = a & ((1 << E) - 1), b & ((1 << E) - 1)
        ka = np.where(fa >= zf, fa - (1 << E), fa)
        kb = np.where(fb >= zf, fb - (1 << E), fb)
        k = np.minimum(ka + kb, self.kmax)
        zero = (fa == zf) | (fb == zf) | (k < self.kmin)
        sign = ((a >> E) ^ (b >> E)) & 1 if self.signed else np.zeros_like(a)
        code = np.where(zero, zf, (sign << E) | (k & ((1 << E) - 1)))
        if self.signed:
            nan = ((fa == zf) & (a >> E == 1)) | ((fb == zf) & (b >> E == 1))
            code = np.where(nan, self.nan_code, code)
        return code.astype(np.int64)


def round_log_np(fmt: LogFormat, x: np.ndarray, mode: RoundMode) -> np.ndarray:
    """Flat float64 x rounded to ``fmt`` (float64 values), numpy; the decisions of kernels/scalar/log.py."""
    f, F = fmt.frac_bits, 1 << fmt.frac_bits
    tab = log_tables(f)
    kmin, kmax = fmt.kmin, fmt.kmax
    neg = x < 0
    a = np.abs(x)
    fin = np.isfinite(a) & (a > 0)
    m, e2 = np.frexp(np.where(fin, a, 1.0))
    s = 2.0 * m
    h = np.searchsorted(tab[1:2 * F], s, side="left")  # #{j >= 1: RD(2**(j/2F)) < s}
    H = 2 * F * (e2.astype(np.int64) - 1) + h
    kf, half, exact = H >> 1, H & 1, s == 1.0
    under = kf < kmin - 1
    kf, half, exact = np.where(under, kmin - 1, kf), np.where(under, 0, half), exact & ~under

    def value(k):
        return np.ldexp(tab[2 * F + (k & (F - 1))], k >> f)

    with np.errstate(over="ignore"):
        hit1 = (kf + 1 >= kmin) & (kf + 1 <= kmax) & (a == value(kf + 1))
        kf = np.where(hit1, kf + 1, kf)
        exact = exact | hit1 | ((kf >= kmin) & (kf <= kmax) & (a == value(kf)))
    if mode in (RoundMode.NEAREST, RoundMode.NEAREST_AWAY):
        kr = kf + half
    elif mode == RoundMode.TOWARD_ZERO:
        kr = kf
    elif mode == RoundMode.UP:
        kr = kf + ~neg
    elif mode == RoundMode.DOWN:
        kr = kf + neg
    elif mode == RoundMode.ODD:
        kr = np.where(kf % 2 == 1, kf, kf + 1)
    else:
        p_log = np.clip(np.log2(s) * F - (h >> 1), 0.0, 1.0)
        p_val = a / fmt.min_positive
        kr = kf + stochastic_up_np(np.where(kf >= kmin, p_log, p_val), seed0_bits(x.size))
    kr = np.where(exact, kf, kr)
    kr = np.where(np.isinf(a), kmax, np.minimum(kr, kmax))
    mag = np.ldexp(tab[2 * F + (kr & (F - 1))], kr >> f)
    mag = np.where(kr < kmin, 0.0, mag)
    q = np.where(neg, -mag, mag)
    q = np.where((a == 0) | (neg & (not fmt.signed)), 0.0, q)
    return np.where(np.isnan(x), np.nan, q)


_EPS = Fraction(1, 10**55)  # relative error bound of the 60-digit decimal powers (< 1 ulp of 60 digits)


def _pow2_bounds(num: int, den: int) -> tuple[float, float]:
    """(RD, RN) in float64 of 2**(num/den), 0 < num < den: an irrational number, so never a double nor a
    midpoint of two; both are derived from a 60-digit approximation and checked against its error bound."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        d = Fraction(decimal.Decimal(2) ** (decimal.Decimal(num) / decimal.Decimal(den)))
    lo_b, hi_b = d * (1 - _EPS), d * (1 + _EPS)
    f = float(d)
    if Fraction(f) > d:
        f = math.nextafter(f, 0.0)
    g = math.nextafter(f, math.inf)
    mid = (Fraction(f) + Fraction(g)) / 2
    if not (Fraction(f) < lo_b and hi_b < Fraction(g)) or (lo_b < mid < hi_b):
        raise ArithmeticError(f"2**({num}/{den}) could not be rounded to float64 with certainty")
    return f, (f if hi_b < mid else g)


@functools.lru_cache(maxsize=None)
def log_tables(frac_bits: int) -> np.ndarray:
    """float64 [RD(2**(j/2F)) for j < 2F] + [RN(2**(m/F)) for m < F], F = 2**frac_bits (entry 0 of each: 1.0)."""
    F = 1 << frac_bits
    rd = [1.0] + [_pow2_bounds(j, 2 * F)[0] for j in range(1, 2 * F)]
    rn = [1.0] + [_pow2_bounds(2 * m, 2 * F)[1] for m in range(1, F)]
    t = np.array(rd + rn, dtype=np.float64)
    t.setflags(write=False)
    return t
