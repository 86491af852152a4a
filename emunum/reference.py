"""Slow, obviously-right rounding in float64 arithmetic (numpy): a second implementation for the tests,
and the fallback for devices without a kernel.

It shares no code with the kernels except the counter-based random bits, re-derived here in numpy, so
that stochastic rounding can be compared bit for bit.
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
    """The kernels' random bits for elements 0..n-1, as uint64 (numpy wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z >> np.uint64(64 - nbits)


def _round_magnitude(k, r, neg, mode: RoundMode, rbits, nbits):
    """k = floor(|y|), r = |y| - k in [0, 1); returns k or k+1 by the rounding mode."""
    odd = np.mod(k, 2.0) == 1.0
    if mode == RoundMode.NEAREST:
        up = (r > 0.5) | ((r == 0.5) & odd)
    elif mode == RoundMode.NEAREST_AWAY:
        up = r >= 0.5
    elif mode == RoundMode.TOWARD_ZERO:
        up = np.zeros_like(r, dtype=bool)
    elif mode == RoundMode.UP:
        up = (r > 0) & ~neg
    elif mode == RoundMode.DOWN:
        up = (r > 0) & neg
    elif mode == RoundMode.ODD:
        up = (r > 0) & ~odd
    else:
        d = np.ldexp(r, nbits)
        drnd = np.rint(d)  # ties to even
        up = drnd + rbits.astype(np.float64) >= 2.0**nbits
    return k + up


def round_float_reference(x: np.ndarray, fmt: FloatFormat, mode: RoundMode, seed: int = 0,
                          sr_bits: int = 32) -> np.ndarray:
    """Round float64 values to ``fmt`` (semantics of ``FloatFormat``), returning float64."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    rbits = random_bits_reference(seed_key(seed), flat.size, sr_bits) if mode == RoundMode.STOCHASTIC else None
    neg = np.signbit(flat)
    a = np.abs(flat)
    finite = np.isfinite(a) & (a > 0)
    safe = np.where(finite, a, 1.0)
    e = np.frexp(safe)[1].astype(np.int64) - 1
    qe = np.where(e >= fmt.emin, e - fmt.man, fmt.emin - fmt.man if fmt.subnormals else fmt.emin)
    y = np.ldexp(safe, -qe)
    k = np.floor(y)
    with np.errstate(over="ignore"):
        mag = np.ldexp(_round_magnitude(k, y - k, neg, mode, rbits, sr_bits), qe)
    mag = np.where(finite, mag, a)

    over = mag > fmt.max
    to_max = np.full_like(over, fmt.overflow == Overflow.SATURATE)
    if mode in (RoundMode.TOWARD_ZERO, RoundMode.ODD):
        to_max |= np.isfinite(a)
    elif mode == RoundMode.UP:
        to_max |= np.isfinite(a) & neg
    elif mode == RoundMode.DOWN:
        to_max |= np.isfinite(a) & ~neg
    beyond = np.inf if fmt.overflow == Overflow.INF else np.nan
    mag = np.where(over, np.where(to_max, fmt.max, beyond), mag)
    out = np.where(neg, -mag, mag)
    if not fmt.has_negative_zero:
        out = np.where(out == 0, 0.0, out)
    return out.reshape(x.shape)


def round_fixed_reference(x: np.ndarray, fmt: FixedFormat, mode: RoundMode, seed: int = 0,
                          sr_bits: int = 32) -> np.ndarray:
    """Round float64 values to fixed point ``fmt`` (semantics of ``FixedFormat``), returning float64."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    rbits = random_bits_reference(seed_key(seed), flat.size, sr_bits) if mode == RoundMode.STOCHASTIC else None
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.ldexp(flat, fmt.frac_bits)
        neg = y < 0
        a = np.where(np.isfinite(y), np.abs(y), 0.0)
        k = np.floor(a)
        kk = _round_magnitude(k, a - k, neg, mode, rbits, sr_bits)
        v = np.where(neg, -kk, kk) + 0.0
        lo, hi = float(fmt.code_min), float(fmt.code_max)
        if fmt.saturate:
            v = np.clip(v, lo, hi)
        else:
            span = hi - lo + 1.0
            v = np.mod(v - lo, span) + lo
        v = np.where(np.isinf(y), np.where(y > 0, hi, lo), v)
        v = np.where(np.isnan(flat), np.nan, v)
    return np.ldexp(v, -fmt.frac_bits).reshape(x.shape)


def quantize_reference(x: torch.Tensor, fmt: Format, rounding=RoundMode.NEAREST, seed: int = 0,
                       sr_bits: int = 32) -> torch.Tensor:
    """Torch-in, torch-out wrapper: same dtype, shape and device as ``x``; computed in float64 on the host."""
    mode = RoundMode.parse(rounding)
    v = x.detach().to("cpu", torch.float64).contiguous().numpy()
    if isinstance(fmt, FloatFormat):
        r = round_float_reference(v, fmt, mode, seed, sr_bits)
    else:
        r = round_fixed_reference(v, fmt, mode, seed, sr_bits)
    return torch.from_numpy(r).to(device=x.device, dtype=x.dtype)
