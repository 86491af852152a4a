"""Slow, obviously-right rounding for the tests, and the fallback for devices without a kernel.

Two twins with the same semantics: numpy (``round_float_reference``, ``round_fixed_reference``,
``quantize_reference``: computed on the host) and torch (``round_float_torch``, ``round_fixed_torch``,
``quantize_torch``: computed on the tensor's own device, which is how tiny CUDA tensors skip a kernel launch).
Both rest on ``emunum.formats.exact`` (float64-exact steps), so both give the kernels' bits. They share no
code with the kernels except the counter-based random bits (``emunum.rng``), re-derived there, so that
stochastic rounding can be compared bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

from ..formats import FixedFormat, FloatFormat, Format, RoundMode
from ..formats.exact import round_fixed_torch, round_float_torch
from ..rng import _i64, mix64_int, random_bits_reference, random_bits_torch, seed_key

__all__ = [
    "mix64_int", "seed_key", "random_bits_reference", "random_bits_torch", "round_float_reference",
    "round_fixed_reference", "quantize_reference", "round_float_torch", "round_fixed_torch", "quantize_torch",
]


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
