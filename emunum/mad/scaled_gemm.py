"""``scaled_mm``: a GEMM on a matrix instruction (``emunum.mad.mma``), block scales taken as given.

D (M, N) = the instruction applied along K in steps of its K (``MMAUnit.terms`` products per step), each
step's D the next step's C: for output (i, j), the dot product of a[i, :] and b[:, j] with scales
a_scale[i, k // block] and b_scale[k // block, j] and first C = c[i, j]. A last step shorter than the
instruction takes the remaining products only (the same as zero elements with scales that never reach the
step exponent). The datapaths, bit for bit, are in ``emunum.mad.mma``; the kernels in ``kernels/mma_*``.

Validation (before any arithmetic): a, b, c are float tensors; a float8 dtype must be the unit's element
type; element values must lie on the element format's grid (quantise first), c's on fp32's; scales must be
values of the unit's scale format (E8M0: 2**-127 .. 2**127 or NaN; UE4M3: non-negative E4M3 values or NaN)
with shapes (M, K/block) and (K/block, N), and K a multiple of the block. Units without scales take
a_scale = b_scale = None.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .. import gemm_listener
from ..quantize import check_tensor, quantize
from . import mma_backend
from .mma import MMAUnit, mma_preset

_F8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e4m3fnuz": torch.float8_e4m3fnuz,
       "e5m2fnuz": torch.float8_e5m2fnuz}


def _check_dtype(x, name: str, unit: MMAUnit) -> torch.Tensor:
    """x as a checked float tensor (a float8 tensor of the unit's element type widened to float32)."""
    if isinstance(x, torch.Tensor) and (not x.is_floating_point() or x.element_size() == 1):
        f8 = _F8.get(unit.element)
        if x.dtype != f8:
            raise TypeError(f"{name}.dtype={x.dtype}: {unit.name} takes {unit.element} elements; allowed: "
                            f"{f8 or 'no float8 dtype'} or a wider float dtype (float32, ...) holding their values")
        x = x.to(torch.float32)
    check_tensor(x, name)
    return x


def _first_bad(x: torch.Tensor, ok: torch.Tensor) -> str:
    idx = (~ok).nonzero()[0].tolist()
    return f"{_name_index(idx)}={x[tuple(idx)].item()!r}"


def _name_index(idx) -> str:
    return "[" + ", ".join(str(i) for i in idx) + "]"


@functools.lru_cache(maxsize=None)
def _value_set(fmt) -> tuple:
    """(finite values as a float64 tensor, whether NaN and +-inf are values) of a format of <= 8 bits."""
    special = quantize(torch.tensor([math.nan, math.inf], dtype=torch.float64), fmt, "nearest")
    return torch.from_numpy(fmt.values().astype(np.float64)), bool(special[0].isnan()), bool(special[1].isinf())


def _on_grid(x: torch.Tensor, fmt) -> torch.Tensor:
    """Whether each value of x is a value of fmt (NaN counts where fmt has NaN)."""
    x64 = x.detach().to(torch.float64)
    if fmt.bits <= 8:  # a set lookup: much cheaper than rounding
        vals, nan, inf = _value_set(fmt)
        return torch.isin(x64, vals) | (torch.isnan(x64) & nan) | (torch.isinf(x64) & inf)
    q = quantize(x64, fmt, "nearest")
    return (q == x64) | (torch.isnan(q) & torch.isnan(x64))


@functools.lru_cache(maxsize=None)
def _arithmetic_grid(fmt):
    """(man, emin, largest value) when fmt's finite values are exactly {m * 2**(e - man): integers m, emin <= e <=
    emax} up to its largest value (``kernels.mma_check.count_off_grid`` tests those), else None."""
    vals = fmt.values().astype(np.float64)
    vals = np.unique(vals[np.isfinite(vals)])
    vmax = float(vals.max())
    powers = np.exp2(np.arange(fmt.emin, fmt.emax + 1) - fmt.man)
    grid = (np.arange(2 ** (fmt.man + 1))[None, :] * powers[:, None]).ravel()
    grid = grid[grid <= vmax]
    return (fmt.man, fmt.emin, vmax) if np.array_equal(np.unique(np.concatenate([grid, -grid])), vals) else None


def _all_on_grid(x: torch.Tensor, fmt) -> bool:
    """Whether every value of x is a value of fmt (as ``_on_grid``), in one parallel pass; False also where the
    fast test does not apply (then ``_on_grid`` decides)."""
    grid = _arithmetic_grid(fmt) if fmt.bits <= 8 else None
    if grid is None:
        return False
    from ..kernels import parallel
    from ..kernels.mma_check import count_off_grid

    flat = x.detach().cpu().contiguous().reshape(-1)
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.to(torch.float64)
    _, nan, inf = _value_set(fmt)
    with parallel.exclusive():
        return count_off_grid(flat.numpy(), *grid, nan, inf) == 0


def check_elements(x: torch.Tensor, name: str, unit: MMAUnit) -> None:
    fmt = unit.element_format
    if _all_on_grid(x, fmt):
        return
    ok = _on_grid(x, fmt)
    if not bool(ok.all()):
        raise ValueError(f"{name}{_first_bad(x, ok)} is not a {unit.element} value; allowed: values of "
                         f"{unit.element} (quantise first: emunum.quantize(x, {unit.element!r}))")


def check_scales(s, name: str, unit: MMAUnit, shape: tuple) -> torch.Tensor:
    if unit.scale is None:
        if s is not None:
            raise ValueError(f"{name} given for {unit.name}, which takes no block scales; allowed: None")
        return None
    if s is None:
        raise ValueError(f"{name}=None: {unit.name} takes {unit.scale} scales of shape {shape}")
    check_tensor(s, name)
    if tuple(s.shape) != shape:
        raise ValueError(f"{name}.shape={tuple(s.shape)}: allowed: {shape} (one scale per block of {unit.block})")
    s64 = s.detach().to(torch.float64)
    if unit.scale == "e8m0":
        m, e = torch.frexp(s64)
        ok = ((m == 0.5) & (e >= -126) & (e <= 128)) | torch.isnan(s64)
        allowed = "E8M0 values: powers of two 2**-127 .. 2**127, or NaN"
    elif _all_on_grid(s, unit.scale_format) and not bool(torch.signbit(s).any()):
        return s64
    else:
        ok = _on_grid(s64, unit.scale_format) & ~torch.signbit(s64)
        allowed = "UE4M3 values: non-negative E4M3 values (0 .. 448), or NaN"
    if not bool(ok.all()):
        raise ValueError(f"{name}{_first_bad(s64, ok)} is not a {unit.scale} scale of {unit.name}; allowed: {allowed}")
    return s64


def scaled_mm(a: torch.Tensor, a_scale, b: torch.Tensor, b_scale, c, unit) -> torch.Tensor:
    """D = a @ b on a matrix instruction (module docstring), a float32 tensor (M, N) on a's device.

    a (M, K), b (K, N): element values of ``unit.element``; a_scale (M, K/block), b_scale (K/block, N): scale
    values (``unit.scale``), or None for units without scales; c: None (zeros) or fp32 values broadcastable to
    (M, N); unit: an ``MMAUnit`` or a preset name (``emunum.mad.mma.MMA_PRESETS``). Not differentiable."""
    unit = mma_preset(unit)
    a = _check_dtype(a, "a", unit)
    b = _check_dtype(b, "b", unit)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"scaled_mm needs a (M, K) and b (K, N), got a {tuple(a.shape)}, b {tuple(b.shape)}")
    M, K = a.shape
    N = b.shape[1]
    if unit.block and K % unit.block:
        raise ValueError(f"K={K} is not a multiple of {unit.name}'s block={unit.block}; allowed: K = n * {unit.block}")
    check_elements(a, "a", unit)
    check_elements(b, "b", unit)
    nb = K // unit.block if unit.block else 0
    sa = check_scales(a_scale, "a_scale", unit, (M, nb))
    sb = check_scales(b_scale, "b_scale", unit, (nb, N))
    if c is None:
        c32 = torch.from_numpy(np.zeros((M, N), np.float32))
    else:
        check_tensor(c, "c")
        c64 = c.detach().to(torch.float64)
        ok = (c64.to(torch.float32).to(torch.float64) == c64) | torch.isnan(c64)
        if not bool(ok.all()):
            raise ValueError(f"c{_first_bad(c64, ok)} is not an fp32 value; allowed: fp32 values (C is fp32)")
        try:
            c32 = torch.broadcast_to(c64.to(torch.float32), (M, N)).cpu()
        except RuntimeError:
            raise ValueError(f"c.shape={tuple(c.shape)} does not broadcast to (M, N)={(M, N)}") from None
    with torch.no_grad(), gemm_listener.native("mma_gemm", 2 * M * N * K):  # emunum.coverage counts it
        return mma_backend.gemm(a.detach(), sa, b.detach(), sb, c32, unit)
