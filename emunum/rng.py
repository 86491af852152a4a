"""The counter-based random bits behind stochastic rounding, on the host and in torch.

Element i of a call keyed on ``key = seed_key(seed)`` gets splitmix64's finaliser of
``(i + 1) * 0x9E3779B97F4A7C15 + key``, shifted to its top ``nbits`` bits. The kernels (``kernels/scalar``)
compute the same bits; these twins let references and the pure-torch path agree with them bit for bit.

Why 64-bit: a counter-based 32-bit design (two keyed rounds of Wellons' lowbias32) was tried for speed and
measured slower in the CPU kernels, with AVX-512 (LLVM drops the masks that would let it use 32-bit vector
multiplies and emits vpmullq) and with AVX2 alike; the generator is ~25% of a stochastic float32 loop, the
stochastic decision more (benchmarks/RESULTS.md). ``benchmarks/rng_battery.py`` runs a NIST SP 800-22
subset on these bits.
"""
from __future__ import annotations

import numpy as np
import torch

_M64 = (1 << 64) - 1


def mix64_int(z: int) -> int:
    """splitmix64's finaliser on a Python int (the seed key: ``key = mix64_int(seed)``)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def seed_key(seed: int) -> int:
    return mix64_int(int(seed))


def random_bits_int(key: int, index: int, nbits: int) -> int:
    """The kernels' ``nbits`` (1..32) random bits for element ``index`` under ``key`` (Python ints)."""
    return mix64_int((key + (index + 1) * 0x9E3779B97F4A7C15) & _M64) >> (64 - nbits)


def random_bits_reference(key: int, n: int, nbits: int) -> np.ndarray:
    """The kernels' random bits for elements 0..n-1, as uint64."""
    return random_bits_torch(key, n, nbits).numpy().astype(np.uint64)


def _i64(c: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def random_bits_torch(key: int, n: int, nbits: int, device=None, start: int = 0, step: int = 1) -> torch.Tensor:
    """The kernels' bits (int64 tensor on ``device``) for the n elements start, start + step, ... (default
    0..n-1; indices below 2**63)."""
    z = (torch.arange(n, dtype=torch.int64, device=device) * step + (start + 1)) * _i64(0x9E3779B97F4A7C15) + _i64(key & _M64)
    z = (z ^ _shr(z, 30)) * _i64(0xBF58476D1CE4E5B9)  # int64 products wrap modulo 2**64
    z = (z ^ _shr(z, 27)) * _i64(0x94D049BB133111EB)
    z = z ^ _shr(z, 31)
    return _shr(z, 64 - nbits)
