"""Exact rounding of values to a format, in float64 torch arithmetic on the tensor's own device.

Every step is exact in float64 (scaling by powers of two built from their bits, floor, compare), so the
result is the format's correctly rounded value with the kernels' semantics. The formats' ``encode`` uses
it; ``emunum.reference`` builds the tests' reference and the pure-torch fallback on it. It reads a spec's
fields by name (``emin``, ``man``, ``max``, ...) and imports no spec, so the specs can import it.
"""
from __future__ import annotations

import torch

from ..rng import random_bits_torch, seed_key
from .base import Overflow, RoundMode

_TINY = 5e-324  # stands in for a nonzero remainder lost to underflow: below every rounding threshold


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2.0**e in float64, exact, for int64 e in [-1022, 1023] (built from its bits)."""
    return ((e + 1023) << 52).view(torch.float64)


def _round_magnitude_torch(k, r, neg, mode: RoundMode, rbits, nbits, odd=None):
    """k = floor(|y|), r = |y| - k in [0, 1); returns k or k+1 by the rounding mode. ``odd``: whether the
    lower neighbour's code is odd (default: k is odd)."""
    if odd is None:
        odd = torch.remainder(k, 2.0) == 1.0
    if mode == RoundMode.NEAREST:
        up = (r > 0.5) | ((r == 0.5) & odd)
    elif mode == RoundMode.NEAREST_AWAY:
        up = r >= 0.5
    elif mode == RoundMode.TOWARD_ZERO:
        up = torch.zeros_like(r, dtype=torch.bool)
    elif mode == RoundMode.UP:
        up = (r > 0) & ~neg
    elif mode == RoundMode.DOWN:
        up = (r > 0) & neg
    elif mode == RoundMode.ODD:
        up = (r > 0) & ~odd
    else:
        drnd = torch.round(r * float(2**nbits))  # ties to even
        up = drnd + rbits.to(torch.float64) >= float(2**nbits)
    return k + up.to(torch.float64)


def _prelude(x: torch.Tensor, mode, seed: int, sr_bits: int):
    """(mode, x as a flat float64 tensor on its device, the stochastic bits or None)."""
    mode = RoundMode.parse(mode)
    flat = x.detach().to(torch.float64).reshape(-1)
    stochastic = mode == RoundMode.STOCHASTIC
    rbits = random_bits_torch(seed_key(seed), flat.numel(), sr_bits, flat.device) if stochastic else None
    return mode, flat, rbits


def round_float_torch(x: torch.Tensor, fmt, mode: RoundMode, seed: int = 0,
                      sr_bits: int = 32) -> torch.Tensor:
    """Round x to the float format ``fmt`` (``FloatFormat`` semantics) on x's device: any float dtype in,
    float64 out."""
    mode, flat, rbits = _prelude(x, mode, seed, sr_bits)
    neg = torch.signbit(flat)
    a = flat.abs()
    finite = torch.isfinite(a) & (a > 0)
    safe = torch.where(finite, a, 1.0)
    e = torch.frexp(safe).exponent.to(torch.int64) - 1
    below = fmt.emin - fmt.man if fmt.subnormals else fmt.emin
    qe = torch.where(e >= fmt.emin, e - fmt.man, below)
    half = torch.div(-qe, 2, rounding_mode="floor")  # two factors keep each power of two normal
    y = safe * _pow2(half) * _pow2(-qe - half)
    k = torch.floor(y)
    r = torch.where(y == 0, _TINY, y - k)  # a tiny x under a huge quantum underflows: its remainder is not 0
    # with no mantissa bits every normal k is 1: the parity of the code is the biased exponent's
    odd = (k == 1) & (torch.remainder(e + fmt.bias, 2) == 1) if fmt.man == 0 else None
    mag = _round_magnitude_torch(k, r, neg, mode, rbits, sr_bits, odd) * _pow2(qe)  # may overflow to inf
    mag = torch.where(finite, mag, a)

    over = mag > fmt.max
    to_max = torch.full_like(over, fmt.overflow == Overflow.SATURATE)
    if mode in (RoundMode.TOWARD_ZERO, RoundMode.ODD):
        to_max |= torch.isfinite(a)
    elif mode == RoundMode.UP:
        to_max |= torch.isfinite(a) & neg
    elif mode == RoundMode.DOWN:
        to_max |= torch.isfinite(a) & ~neg
    beyond = float("inf") if fmt.overflow == Overflow.INF else float("nan")
    mag = torch.where(over & to_max, fmt.max, torch.where(over, beyond, mag))  # scalars take mag's float64
    out = torch.where(neg, -mag, mag)
    if not fmt.has_negative_zero:
        out = torch.where(out == 0, 0.0, out)
    return out.reshape(x.shape)


def round_fixed_torch(x: torch.Tensor, fmt, mode: RoundMode, seed: int = 0,
                      sr_bits: int = 32) -> torch.Tensor:
    """Round x to the fixed-point format ``fmt`` (``FixedFormat`` semantics) on x's device: float64 out."""
    mode, flat, rbits = _prelude(x, mode, seed, sr_bits)
    if not fmt.saturate:  # wrap: reduce modulo the period (exact) so that x * 2**frac_bits stays finite
        flat = torch.where(torch.isfinite(flat), torch.fmod(flat, 2.0 ** (fmt.bits - fmt.frac_bits)), flat)
    y = flat * 2.0**fmt.frac_bits  # exact Python floats; scalars keep the path free of host-to-device copies
    neg = flat < 0
    a = torch.where(torch.isfinite(y), y.abs(), 0.0)
    k = torch.floor(a)
    r = torch.where((a == 0) & (flat != 0), _TINY, a - k)  # remainder lost to underflow (frac_bits < 0)
    kk = _round_magnitude_torch(k, r, neg, mode, rbits, sr_bits)
    v = torch.where(neg, -kk, kk) + 0.0
    lo, hi = float(fmt.code_min), float(fmt.code_max)
    if fmt.saturate:
        v = v.clamp(lo, hi)
    else:
        span = hi - lo + 1.0
        v = torch.remainder(torch.fmod(v, span) - lo, span) + lo
    v = torch.where(torch.isinf(y) & (y > 0), hi, torch.where(torch.isinf(y), lo, v))
    v = torch.where(torch.isnan(flat), float("nan"), v)
    return (v * 2.0**-fmt.frac_bits).reshape(x.shape)


