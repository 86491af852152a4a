"""Slow, obviously-right rounding in float64 arithmetic: a second implementation for the tests, and the
fallback for devices without a kernel.

Two twins with the same semantics: numpy (``round_float_reference``, ``round_fixed_reference``,
``quantize_reference``: computed on the host) and torch (``round_float_torch``, ``round_fixed_torch``,
``quantize_torch``: computed on the tensor's own device, which is how tiny CUDA tensors skip a kernel launch).
Every step is exact in float64 (scaling by powers of two built from their bits, floor, compare), so both
give the kernels' bits. They share no code with the kernels except the counter-based random bits, re-derived
here, so that stochastic rounding can be compared bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

from .spec import FixedFormat, FloatFormat, Format, Overflow, RoundMode

_M64 = (1 << 64) - 1


def mix64_int(z: int) -> int:
    """splitmix64's finaliser on a Python int (the seed key: ``key = mix64_int(seed)``)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def seed_key(seed: int) -> int:
    return mix64_int(int(seed))


def random_bits_reference(key: int, n: int, nbits: int) -> np.ndarray:
    """The kernels' random bits for elements 0..n-1, as uint64."""
    return random_bits_torch(key, n, nbits).numpy().astype(np.uint64)


def round_float_reference(x, fmt: FloatFormat, mode: RoundMode, seed: int = 0, sr_bits: int = 32) -> np.ndarray:
    """Round float64 values to ``fmt`` (semantics of ``FloatFormat``), returning float64 (numpy in and out)."""
    t = torch.from_numpy(np.array(x, dtype=np.float64))
    return round_float_torch(t, fmt, RoundMode.parse(mode), seed, sr_bits).numpy()


def round_fixed_reference(x, fmt: FixedFormat, mode: RoundMode, seed: int = 0, sr_bits: int = 32) -> np.ndarray:
    """Round float64 values to fixed point ``fmt`` (semantics of ``FixedFormat``), returning float64."""
    t = torch.from_numpy(np.array(x, dtype=np.float64))
    return round_fixed_torch(t, fmt, RoundMode.parse(mode), seed, sr_bits).numpy()


def quantize_reference(x: torch.Tensor, fmt: Format, rounding=RoundMode.NEAREST, seed: int = 0,
                       sr_bits: int = 32) -> torch.Tensor:
    """Torch-in, torch-out on the host (for devices without kernels): same dtype, shape and device as ``x``."""
    return quantize_torch(x.detach().cpu(), fmt, rounding, seed, sr_bits).to(x.device)


_TINY = 5e-324  # stands in for a nonzero remainder lost to underflow: below every rounding threshold


# ---- torch twins: the same steps on torch tensors, on the tensor's own device -----------------------------

def _i64(c: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def random_bits_torch(key: int, n: int, nbits: int, device=None) -> torch.Tensor:
    """``random_bits_reference`` on ``device``: int64 tensor of the kernels' bits for elements 0..n-1."""
    z = torch.arange(1, n + 1, dtype=torch.int64, device=device) * _i64(0x9E3779B97F4A7C15) + _i64(key)
    z = (z ^ _shr(z, 30)) * _i64(0xBF58476D1CE4E5B9)  # int64 products wrap modulo 2**64
    z = (z ^ _shr(z, 27)) * _i64(0x94D049BB133111EB)
    z = z ^ _shr(z, 31)
    return _shr(z, 64 - nbits)


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


def round_float_torch(x: torch.Tensor, fmt: FloatFormat, mode: RoundMode, seed: int = 0,
                      sr_bits: int = 32) -> torch.Tensor:
    """``round_float_reference`` in torch on x's device: float64 in (other dtypes are converted), float64 out."""
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


def round_fixed_torch(x: torch.Tensor, fmt: FixedFormat, mode: RoundMode, seed: int = 0,
                      sr_bits: int = 32) -> torch.Tensor:
    """``round_fixed_reference`` in torch on x's device: float64 out."""
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


# The kernels' NaN bits: a NaN input comes back with its sign and payload and the quiet bit set (IEEE 754's
# rule for operations); a NaN made by overflow is the positive quiet NaN below.
_INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}
_QUIET_NAN = {torch.float32: 0x7FC00000, torch.float64: _i64(0x7FF8000000000000), torch.float16: 0x7E00,
              torch.bfloat16: 0x7FC0}
_QUIET_BIT = {torch.float32: 1 << 22, torch.float64: 1 << 51, torch.float16: 1 << 9, torch.bfloat16: 1 << 6}
_WIDE = (torch.float16, torch.bfloat16)


def quantize_torch(x: torch.Tensor, fmt: Format, rounding=RoundMode.NEAREST, seed: int = 0,
                   sr_bits: int = 32) -> torch.Tensor:
    """Torch-in, torch-out on x's device, with the kernels' bits (NaN included): same dtype and shape.

    float16/bfloat16 results go through float32 (as the kernels do: a fixed-point value is rounded to
    float32, then to 16 bits, both to nearest even).
    """
    mode = RoundMode.parse(rounding)
    if isinstance(fmt, FloatFormat):
        r = round_float_torch(x, fmt, mode, seed, sr_bits)
    else:
        r = round_fixed_torch(x, fmt, mode, seed, sr_bits)
    r = r.to(torch.float32).to(x.dtype) if x.dtype in _WIDE else r.to(x.dtype)
    ity = _INT_VIEW[x.dtype]
    bits = torch.where(torch.isnan(r), _QUIET_NAN[x.dtype], r.view(ity))
    nan_in = x.detach().view(ity) | _QUIET_BIT[x.dtype]  # a NaN comes back quietened (IEEE 754)
    bits = torch.where(torch.isnan(x), nan_in, bits)
    return bits.view(x.dtype)
