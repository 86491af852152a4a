"""Fixed point: ``FixedFormat`` (a two's-complement or unsigned integer code scaled by 2**-frac_bits)."""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass

import numpy as np
import torch

from ..kernels.abi import FixedArgs
from .base import NumberFormat, RoundMode, as_codes, check_bool, check_int
from .exact import round_fixed_torch


@dataclass(frozen=True)
class FixedFormat(NumberFormat):
    """Fixed point: value = integer code * 2**-frac_bits.

    Codes lie in [-2**(bits-1), 2**(bits-1)-1] (signed) or [0, 2**bits-1]. Overflow saturates to the end
    of the range, or with ``saturate=False`` wraps modulo 2**bits as two's-complement hardware does.
    Infinite inputs saturate either way; NaN passes through as NaN (there is no NaN code). Zero is +0.
    bits 1..32; results are exact in float64 and, for float32 tensors, whenever bits <= 24.
    """

    bits: int
    frac_bits: int
    _: KW_ONLY
    signed: bool = True
    saturate: bool = True

    def __post_init__(self):
        check_int("FixedFormat.bits", self.bits, 1, 32)
        check_int("FixedFormat.frac_bits", self.frac_bits, -64, 64)
        check_bool("FixedFormat.signed", self.signed)
        check_bool("FixedFormat.saturate", self.saturate)

    @property
    def code_min(self) -> int:
        return -(2 ** (self.bits - 1)) if self.signed else 0

    @property
    def code_max(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.signed else 2**self.bits - 1

    @property
    def max(self) -> float:
        return math.ldexp(self.code_max, -self.frac_bits)

    @property
    def min(self) -> float:
        return math.ldexp(self.code_min, -self.frac_bits)

    @property
    def eps(self) -> float:
        """The step between neighbouring values, 2**-frac_bits."""
        return math.ldexp(1.0, -self.frac_bits)

    min_normal = eps
    min_subnormal = eps

    @property
    def name(self) -> str:
        base = f"{'fixed' if self.signed else 'ufixed'}{self.bits}_{self.frac_bits}"
        return base + ("" if self.saturate else "[wrap]")

    def __str__(self) -> str:
        return self.name

    def to_kernel_args(self) -> FixedArgs:
        """The kernels' record (``kernels.abi.FixedArgs``)."""
        return FixedArgs(frac=self.frac_bits, code_min=self.code_min, code_max=self.code_max,
                         saturate=int(self.saturate))

    def decode(self, codes) -> np.ndarray:
        """Bit patterns (unsigned ints < 2**bits, two's complement when signed) -> float64 values."""
        c = as_codes(codes, 2**self.bits, self.name)
        if self.signed:
            c = np.where(c >= 2 ** (self.bits - 1), c - 2**self.bits, c)
        return np.ldexp(c.astype(np.float64), -self.frac_bits)

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> bit patterns (int64 in [0, 2**bits)), after rounding with ``rounding``."""
        v = torch.from_numpy(np.array(values, dtype=np.float64))
        q = round_fixed_torch(v, self, RoundMode.parse(rounding), seed=0).numpy()
        if np.any(np.isnan(q)):
            raise ValueError(f"{self.name} has no code for NaN")
        k = np.rint(np.ldexp(q, self.frac_bits)).astype(np.int64)
        return np.where(k < 0, k + 2**self.bits, k)

    def values(self) -> np.ndarray:
        if self.bits > 16:
            raise ValueError(f"values() lists formats of at most 16 bits; {self.name} has {self.bits}")
        return np.ldexp(np.arange(self.code_min, self.code_max + 1, dtype=np.float64), -self.frac_bits)
