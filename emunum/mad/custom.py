"""GEMM in a user-defined type's own arithmetic: ``custom_matmul(A, B, fmt)`` for a ``CustomFormat`` with
``add`` and ``mul`` (the design paper's Listings 1 and 2: a type with its primitive operations, and a MAD unit
built on them).

The datapath, exactly: A and B are rounded to fmt's codes by ``to_code`` (nearest); each output element is
``from_code(acc)`` where ``acc = to_code(0.0)`` and then, for k = 0, 1, ..., K-1 in order,
``acc = add(acc, mul(a_code[i, k], b_code[k, j]))``, codes as int64. The result has A's dtype (float32 or
float64: from_code's value cast to it, nearest-even). It runs on the CPU (a numba kernel, rows in parallel;
CUDA tensors make a host round-trip) and is not differentiable: it emulates inference or a forward pass.
"""
from __future__ import annotations

import torch

from ..formats import CustomFormat
from .compile_boundary import graph_break

_DTYPES = (torch.float32, torch.float64)


@graph_break
def custom_matmul(A: torch.Tensor, B: torch.Tensor, fmt: CustomFormat) -> torch.Tensor:
    """A (m, K) @ B (K, n) on fmt's codes with fmt.mul and fmt.add (module docstring)."""
    if not isinstance(fmt, CustomFormat):
        raise TypeError(f"fmt must be a CustomFormat, got {type(fmt).__name__}")
    missing = [f for f in ("add", "mul") if getattr(fmt, f) is None]
    if missing:
        raise ValueError(f"fmt={fmt.name} has no {' and '.join(missing)}; custom_matmul needs "
                         "CustomFormat(..., add=..., mul=...)")
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; allowed: float32, float64")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not chain: A is {tuple(A.shape)}, B is {tuple(B.shape)}")
    if A.dtype != B.dtype or A.device != B.device:
        raise ValueError(f"A and B must have one dtype and device: A is {A.dtype} {A.device}, B is {B.dtype} "
                         f"{B.device}")
    if A.is_meta:  # shape propagation, as every other format and GEMM: a meta tensor has no values
        return torch.empty((A.shape[0], B.shape[1]), dtype=A.dtype, device=A.device)
    from ..kernels import custom_cpu
    a = A.detach().cpu().contiguous().numpy()
    b = B.detach().cpu().contiguous().numpy()
    out = torch.empty((A.shape[0], B.shape[1]), dtype=A.dtype)
    if out.numel():
        custom_cpu.custom_matmul_codes(fmt.to_kernel_args(), a, b, out.numpy())
    return out.to(A.device)
