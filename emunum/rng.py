"""The counter-based random bits behind stochastic rounding, on the host and in torch.

Element ``i`` (a flat index, 0 <= i < 2**64) of a call keyed on ``key = seed_key(seed)`` (a 64-bit word) gets
two keyed rounds of Wellons' lowbias32 on 32-bit words (hash-prospector, [16 7feb352d 15 846ca68b 16]):

    k0, k1 = key mod 2**32, key >> 32;   lo, hi = i mod 2**32, i >> 32
    h = lowbias32(lo ^ k0);   h = lowbias32(h ^ k1 ^ hi);   bits = h >> (32 - nbits)   (nbits 1..32)

The kernels (``kernels/scalar/common.random_bits``) compute the same bits; these twins let references, the
pure-torch path and other host code agree with them bit for bit. lowbias32 is a bijection, so for one key
the 2**32 indices sharing ``hi`` get 2**32 distinct words. The seed key itself is splitmix64's finaliser of
the seed (``mix64_int``), which also derives sub-seeds elsewhere.
"""
from __future__ import annotations

import numpy as np
import torch

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_C1, _C2 = 0x7FEB352D, 0x846CA68B


def mix64_int(z: int) -> int:
    """splitmix64's finaliser on a Python int (the seed key: ``key = mix64_int(seed)``)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def seed_key(seed: int) -> int:
    return mix64_int(int(seed))


def lowbias32_int(x: int) -> int:
    """lowbias32 of a 32-bit word (Python int)."""
    x &= _M32
    x ^= x >> 16
    x = (x * _C1) & _M32
    x ^= x >> 15
    x = (x * _C2) & _M32
    return x ^ (x >> 16)


def random_bits_int(key: int, index: int, nbits: int) -> int:
    """The kernels' ``nbits`` random bits for element ``index`` under ``key`` (Python ints, any index < 2**64)."""
    key &= _M64
    index &= _M64
    h = lowbias32_int((index ^ key) & _M32)
    h = lowbias32_int(h ^ (key >> 32) ^ (index >> 32))
    return h >> (32 - nbits)


def random_bits_reference(key: int, n: int, nbits: int) -> np.ndarray:
    """The kernels' random bits for elements 0..n-1, as uint64."""
    return random_bits_torch(key, n, nbits).numpy().astype(np.uint64)


def _i64(c: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _lowbias32_torch(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 tensors holding 32-bit words (products of two words fit 64 bits; masks keep 32)."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _M32
    x = x ^ (x >> 15)
    x = (x * _C2) & _M32
    return x ^ (x >> 16)


def random_bits_torch(key: int, n: int, nbits: int, device=None, start: int = 0, step: int = 1) -> torch.Tensor:
    """The kernels' bits (int64 tensor on ``device``) for elements start, start+step, ..., n of them
    (indices below 2**63)."""
    idx = torch.arange(n, dtype=torch.int64, device=device) * step + start
    key &= _M64
    h = _lowbias32_torch((idx & _M32) ^ (key & _M32))
    h = _lowbias32_torch(h ^ (key >> 32) ^ (idx >> 32))  # idx >= 0: arithmetic and logical shifts agree
    return h >> (32 - nbits)
