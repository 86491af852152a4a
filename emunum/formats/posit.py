"""Posits: ``PositFormat(nbits, es)`` with the semantics of the Posit Standard (2022).

A posit code is an ``nbits``-bit two's-complement integer. Code 0 is zero, code ``2**(nbits-1)`` is NaR (not a
real); any other code is ``-1**s`` times the value of its magnitude pattern, read as regime (a run of equal
bits, ended by the opposite bit or the end of the word), ``es`` exponent bits, then fraction bits; bits cut off
by the word's end are 0. The value is ``2**(k * 2**es + e) * (1 + f)`` for regime value k (a run of r ones:
k = r-1; of r zeros: k = -r).

Rounding (``encode``, and the kernels, which compute the same bits):
- nearest: round to nearest on the bit pattern, ties to the even pattern (the standard's rule: the value's
  infinitely long pattern is cut to ``nbits`` bits). A nonzero value never becomes 0 or NaR: magnitudes
  below ``min_positive`` give ``min_positive``, beyond ``max`` give ``max``.
- nearest_away: as nearest with ties away from zero. toward_zero, up, down: the neighbouring posit in that
  direction (posit patterns are ordered like their values); odd: the neighbour with the odd pattern
  when inexact. Between 0 and ``min_positive`` these may give 0 (toward zero, and up/down toward zero).
- stochastic: one of the two neighbouring posits (0 and ``min_positive`` below ``min_positive``), the upper
  in magnitude with probability ``(|x| - lo) / (hi - lo)`` rounded to ``sr_bits`` bits.
- In every mode a magnitude of ``max`` or beyond gives ``±max``; NaN and ±inf give NaR.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..kernels.abi import PositArgs
from ..rng import random_bits_int, seed_key
from .base import NumberFormat, RoundMode, as_codes, check_int


@dataclass(frozen=True)
class PositFormat(NumberFormat):
    """A posit format of ``nbits`` bits (2..32) with ``es`` exponent bits (0..5); see the module doc."""

    nbits: int
    es: int = 2

    def __post_init__(self):
        check_int("PositFormat.nbits", self.nbits, 2, 32)
        check_int("PositFormat.es", self.es, 0, 5)

    # ---- structure -------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.nbits

    @property
    def useed(self) -> float:
        """2**(2**es): the factor between neighbouring regimes."""
        return math.ldexp(1.0, 1 << self.es)

    @property
    def max_exp(self) -> int:
        """log2(max) = 2**es * (nbits - 2); min_positive is 2**-max_exp."""
        return (1 << self.es) * (self.nbits - 2)

    @property
    def max(self) -> float:
        """maxpos, the largest posit: 2**(2**es * (nbits-2))."""
        return math.ldexp(1.0, self.max_exp)

    @property
    def min_positive(self) -> float:
        """minpos, the smallest positive posit: 2**-(2**es * (nbits-2))."""
        return math.ldexp(1.0, -self.max_exp)

    @property
    def nar_code(self) -> int:
        return 1 << (self.nbits - 1)

    @property
    def name(self) -> str:
        return f"posit{self.nbits}_{self.es}"

    def __str__(self) -> str:
        return self.name

    def to_kernel_args(self) -> PositArgs:
        """The kernels' record (``kernels.abi.PositArgs``)."""
        return PositArgs(nbits=self.nbits, es=self.es)

    # ---- codes -----------------------------------------------------------------------------------
    def _magnitude_value(self, p: int) -> float:
        return pattern_value(p, self.nbits, self.es)

    def _decode_one(self, c: int) -> float:
        if c == 0:
            return 0.0
        if c == self.nar_code:
            return math.nan
        if c >> (self.nbits - 1):
            return -self._magnitude_value((1 << self.nbits) - c)
        return self._magnitude_value(c)

    def decode(self, codes) -> np.ndarray:
        """Bit patterns (unsigned ints < 2**nbits) -> float64 values (NaR -> NaN)."""
        c = as_codes(codes, 2**self.nbits, self.name)
        out = np.fromiter((self._decode_one(int(v)) for v in c.ravel()), np.float64, c.size)
        return out.reshape(c.shape)

    def _round_magnitude(self, a: float, neg: bool, mode: RoundMode, rnd: int, sr_bits: int) -> int:
        """The magnitude pattern (0 .. 2**(nbits-1)-1) of the finite nonzero magnitude a, rounded."""
        maxp = (1 << (self.nbits - 1)) - 1
        m, e = math.frexp(a)
        big_m, big_e = int(m * 2.0**53), e - 1  # a = big_m * 2**(big_e - 52), 2**52 <= big_m < 2**53
        if big_e >= self.max_exp:
            return maxp
        if big_e < -self.max_exp:  # between 0 and minpos: the neighbours are patterns 0 and 1
            if mode in (RoundMode.NEAREST, RoundMode.NEAREST_AWAY):
                return 1  # never to zero
            kept, ratio, tie, beyond_half = 0, a / self.min_positive, False, False
        else:
            k = big_e >> self.es
            e_field = big_e - (k << self.es)
            regime, rlen = ((((1 << (k + 1)) - 1) << 1), k + 2) if k >= 0 else (1, 1 - k)
            width = self.es + 52
            full = (regime << width) | (e_field << 52) | (big_m - (1 << 52))
            drop = rlen + width - (self.nbits - 1)
            kept, rem = full >> drop, full & ((1 << drop) - 1)
            half = 1 << (drop - 1)
            if rem == 0:
                return kept
            ratio, tie, beyond_half = None, rem == half, rem > half
        odd = kept & 1 == 1
        if mode == RoundMode.NEAREST:
            up = beyond_half or (tie and odd)
        elif mode == RoundMode.NEAREST_AWAY:
            up = beyond_half or tie
        elif mode == RoundMode.TOWARD_ZERO:
            up = False
        elif mode == RoundMode.UP:
            up = not neg
        elif mode == RoundMode.DOWN:
            up = neg
        elif mode == RoundMode.ODD:
            up = not odd
        else:
            if ratio is None:
                lo, hi = self._magnitude_value(kept), self._magnitude_value(kept + 1)
                ratio = (a - lo) / (hi - lo)  # both differences exact in float64; one rounding in the division
            up = round(ratio * 2.0**sr_bits) + rnd >= 1 << sr_bits  # round(): ties to even
        return kept + int(up)

    def encode(self, values, rounding: str = "nearest", *, seed: int = 0, sr_bits: int = 32) -> np.ndarray:
        """Values -> codes (int64 in [0, 2**nbits)), rounded with ``rounding`` (see the module doc).

        Stochastic rounding takes the random bits ``emunum.quantize(..., seed=seed, sr_bits=sr_bits)`` gives
        the element at the same flat (C-order) index, so the two agree bit for bit."""
        mode = RoundMode.parse(rounding)
        check_int("sr_bits", sr_bits, 1, 32)
        v = np.asarray(values, dtype=np.float64)
        key = seed_key(seed)
        out = np.empty(v.size, np.int64)
        for i, x in enumerate(v.ravel().tolist()):
            if math.isnan(x) or math.isinf(x):
                out[i] = self.nar_code
                continue
            if x == 0.0:
                out[i] = 0
                continue
            rnd = 0
            if mode == RoundMode.STOCHASTIC:
                rnd = random_bits_int(key, i, sr_bits)
            p = self._round_magnitude(abs(x), x < 0, mode, rnd, sr_bits)
            out[i] = ((1 << self.nbits) - p) & ((1 << self.nbits) - 1) if x < 0 else p
        return out.reshape(v.shape)

    def values(self) -> np.ndarray:
        """Every posit value but NaR, sorted ascending, as float64 (formats of at most 16 bits)."""
        if self.nbits > 16:
            raise ValueError(f"values() lists formats of at most 16 bits; {self.name} has {self.nbits}")
        return _sorted_values(self.nbits, self.es).copy()


def pattern_value(p: int, nbits: int, es: int) -> float:
    """The value of the positive posit pattern p (1 <= p < 2**(nbits-1)) of an nbits-bit posit (any nbits >= 2:
    tests read the midpoints of n-bit posits as the odd patterns of (n+1)-bit ones)."""
    n1 = nbits - 1
    top = (p >> (n1 - 1)) & 1
    r = 0
    while r < n1 and ((p >> (n1 - 1 - r)) & 1) == top:
        r += 1
    k = r - 1 if top else -r
    rest_len = max(n1 - r - 1, 0)
    rest = p & ((1 << rest_len) - 1)
    if rest_len >= es:
        fb = rest_len - es
        e, frac = rest >> fb, rest & ((1 << fb) - 1)
    else:
        fb, e, frac = 0, rest << (es - rest_len), 0
    return math.ldexp(float((1 << fb) + frac), k * (1 << es) + e - fb)


@functools.lru_cache(maxsize=64)
def _sorted_values(nbits: int, es: int) -> np.ndarray:
    fmt = PositFormat(nbits, es)
    v = fmt.decode(np.arange(2**nbits))
    return np.sort(v[~np.isnan(v)])
