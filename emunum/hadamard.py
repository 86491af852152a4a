"""The random Hadamard transform (RHT) of NVIDIA's NVFP4 training recipe, applied to the weight-gradient GEMM.

Source: NVIDIA, "Pretraining Large Language Models with NVFP4" (arXiv:2509.25149, 2025), section 4: a 16x16
random Hadamard transform is applied to both inputs of the weight-gradient GEMM (Wgrad), along its reduction
dimension (the tokens), before they are quantised to NVFP4; forward (Fprop) and input-gradient (Dgrad) GEMMs
are not transformed. Transformer Engine (``transformer_engine/pytorch/tensor/nvfp4_tensor.py``,
``get_rht_matrix``) builds the matrix as M = diag(s) @ H / sqrt(16), H the Sylvester Hadamard matrix
(``scipy.linalg.hadamard`` order) and s one fixed sign vector, used by every layer at every step, and
transforms each run of 16 consecutive reduction-dimension elements u (a row vector) as u @ M.

Here: ``rht_matrix(n, seed)`` is that M for n in ``SIZES`` (powers of 4, so 1/sqrt(n) is a power of two and
M's entries +-2**-k are exact); s[i] = +1 or -1 from bit i of the counter-based generator keyed on
``seed_key(seed)`` (``emunum.rng``): one vector per run, fixed by the seed. M is orthogonal (M M^T = I exactly),
so transforming both operands of a dot product along its reduction dimension leaves it unchanged:
(u M) . (v M) = u M M^T v^T = u . v; only the quantisation in between sees the transformed values.
``rht(x, n, seed, dim)`` pads ``dim`` with zeros to a multiple of n (zeros contribute nothing to the product),
and transforms each run of n along it; the sums are computed in float64 and rounded once to x's dtype. Each
output's sum is taken in index order, 0 + u_0 M_0i + u_1 M_1i + ... + u_(n-1) M_(n-1)i: where a run's float64
sums are exact (its values span fewer than about 53 - 24 - log2 n binades: nearly every run of real data), any
order gives these bits, and a float32 CPU tensor takes the butterfly kernel (``kernels/hadamard_cpu.py``); a run
whose sums are inexact takes the index order in that kernel too, and every other path (float64 or 16-bit x,
autograd, CUDA, a run holding an infinity or NaN) runs that order as element-wise torch ops, so that no device,
thread count or BLAS changes a bit. (Before 2026-11-29 an inexact run took torch's float64 matrix product,
whose order is its BLAS's.)
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .rng import random_bits_int, random_bits_torch, seed_key

SIZES = (4, 16, 64, 256)


def check_size(n, field: str = "hadamard") -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) not in SIZES:
        raise ValueError(f"{field}={n!r}: the transform size must be one of {', '.join(map(str, SIZES))} "
                         "(a power of 4, so that the normalised matrix is exact)")
    return int(n)


def hadamard_matrix(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix of +-1 (int64): H_1 = [1], H_2m = [[H, H], [H, -H]]."""
    h = np.ones((1, 1), dtype=np.int64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def sign_vector(n: int, seed: int) -> np.ndarray:
    """n signs +-1 (int64): s[i] = 1 - 2 * (top bit of the generator's element i under seed_key(seed))."""
    bits = random_bits_torch(seed_key(seed), n, 1).numpy()
    return 1 - 2 * bits.astype(np.int64)


@functools.lru_cache(maxsize=16)
def rht_matrix(n: int, seed: int) -> np.ndarray:
    """M = diag(s) @ H / sqrt(n) in float64 (every entry +-1/sqrt(n), exact for n in SIZES)."""
    check_size(n)
    m = (sign_vector(n, seed)[:, None] * hadamard_matrix(n)).astype(np.float64) / np.sqrt(n)
    m.setflags(write=False)
    return m


def rht(x: torch.Tensor, n: int, seed: int, dim: int) -> torch.Tensor:
    """x with ``dim`` zero-padded to a multiple of n and each run u of n along it replaced by u @ M. x needs at
    least one dimension, and dim must be one of them (-x.dim() .. x.dim()-1); ValueError otherwise."""
    return rht_scanned(x, n, seed, dim, scan=False)[0]


def rht_scanned(x: torch.Tensor, n: int, seed: int, dim: int, scan: bool = True):
    """(``rht(x, n, seed, dim)``, its scan): where ``scan`` and the butterfly kernel ran, the scan is
    (amaxes, amax): each run's largest |v| of the result (a float64 ndarray of one element per run, in the order
    of the result's runs with ``dim`` moved last: the scales of a 1-D block quantisation along ``dim`` in blocks
    of n) and the result's largest finite |v| (0.0 if none), what the block quantiser's amax pass
    (``kernels.block_cpu.block_amaxes``) finds; None otherwise."""
    if x.dim() == 0:
        raise ValueError("rht: x is a 0-dim tensor; the transform runs along a dimension (x needs at least one)")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"rht: dim={dim!r} is out of range for a {x.dim()}-dim tensor; allowed: "
                         f"{-x.dim()}..{x.dim() - 1}")
    d = dim % x.dim()
    length = x.shape[d]
    pad = -length % n
    fast = _butterfly(x, n, seed, d, length + pad, scan)
    if fast is not None:
        return fast
    w = x.to(torch.float64).movedim(d, -1)
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    m = _matrix(n, seed).to(w.device)
    out = _index_order_product(w.reshape(*w.shape[:-1], -1, n), m).reshape(w.shape)
    return out.movedim(-1, d).to(x.dtype), None


def _matrix(n: int, seed: int) -> torch.Tensor:
    """``rht_matrix(n, seed)`` as a float64 CPU tensor, made from Python numbers: torch.compile traces this path
    (it cannot trace numpy) and folds them into a constant."""
    return torch.tensor(_matrix_rows(n, seed), dtype=torch.float64)


@functools.lru_cache(maxsize=16)
def _matrix_rows(n: int, seed: int) -> tuple:
    """``rht_matrix(n, seed)``'s rows as tuples of floats: s[j] H[j][i] / sqrt(n), s from the generator's bits
    (``sign_vector``) and H[j][i] = -1 where i & j has an odd number of set bits (Sylvester's order)."""
    key, scale = seed_key(seed), 1.0 / math.sqrt(n)  # exact: n is a power of 4
    signs = [1 - 2 * random_bits_int(key, j, 1) for j in range(n)]
    return tuple(tuple(signs[j] * (-scale if bin(i & j).count("1") % 2 else scale) for i in range(n))
                 for j in range(n))


def _index_order_product(u: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """u @ m for runs u (..., n) of float64, each sum taken in index order from +0: 0 + u_0 m_0i + u_1 m_1i + ...
    (the module doc's definition; every product is exact). Element-wise ops, so every device, thread count and
    BLAS gives these bits, and autograd differentiates it."""
    acc = torch.zeros(u.shape, dtype=u.dtype, device=u.device)
    for j in range(m.shape[0]):
        acc = acc + u[..., j:j + 1] * m[j]
    return acc


def _butterfly(x: torch.Tensor, n: int, seed: int, d: int, padded: int, scan: bool = False):
    """``rht_scanned``'s result by the butterfly kernel (``kernels/hadamard_cpu.py``: the butterfly where a run's
    float64 sums are exact, the index order where not), or None where it does not apply: anything but a float32
    CPU tensor outside autograd and torch.compile's tracing, or a tensor holding an infinity or NaN. The result
    has the tensor-op path's shape and strides: a contiguous tensor with ``d`` moved last, moved back."""
    if torch.compiler.is_compiling() or x.dtype != torch.float32 or not x.is_cpu or type(x) is not torch.Tensor \
            or x.numel() == 0 or (x.requires_grad and torch.is_grad_enabled()):
        return None  # (first: while torch.compile traces, the tensor-op path is what it can trace)
    from .kernels.hadamard_cpu import rht_f32  # noqa: PLC0415  (compiled on first use)

    shape = x.shape
    a, b = math.prod(shape[:d]), math.prod(shape[d + 1:])
    src = x.detach().resolve_neg().contiguous().view(a, shape[d], b).numpy()
    moved = shape[:d] + shape[d + 1:] + (padded,)
    out = torch.empty(moved, dtype=torch.float32)
    amaxes = np.empty(a * b * (padded // n) if scan else 0, dtype=np.float64)
    finite = np.zeros(1, dtype=np.uint32)
    if not rht_f32(src, out.numpy().reshape(a, b, padded), _signs(n, seed), n.bit_length() // 2, amaxes, finite):
        return None
    return out.movedim(-1, d), ((amaxes, float(finite.view(np.float32)[0])) if scan else None)


@functools.lru_cache(maxsize=16)
def _signs(n: int, seed: int) -> np.ndarray:
    s = sign_vector(n, seed).astype(np.float64)
    s.setflags(write=False)
    return s
