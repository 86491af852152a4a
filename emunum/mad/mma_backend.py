"""Dispatch of ``scaled_mm`` to the matrix-instruction kernels, on checked operands; kernels load on first use.

CPU: the vectorised exact paths of ``kernels/mma_vec`` where their conditions hold (mxf4nvf4 on E2M1 elements;
NVIDIA fused steps on elements of <= 8 bits, F <= 25, scales constant over a step, finite elements and
scales), else the integer fast path of ``kernels/mma_fast`` (other NVIDIA fused steps with finite operands and
scales constant over a step), else the scalar cores (``kernels/mma_cpu``). CUDA: ``kernels/mma_cuda``. Every
path gives the scalar cores' bits (tests/kernels/test_mma_vec.py)."""
from __future__ import annotations

import numpy as np
import torch

from ..kernels import abi
from .mma import MMAKind, MMAUnit

GROUP = 16  # mxf4nvf4's exactly summed group
NAN_EXP = 1 << 20  # kernels/mma_vec.py's exponent of a NaN scale


def _scales_t(s, rows: int) -> torch.Tensor:
    """Scales as (rows, nblocks) float32 (ones (rows, 1) for units without scales)."""
    return torch.ones(rows, 1, dtype=torch.float32) if s is None else s.to(torch.float32)


def gemm(a: torch.Tensor, sa, b: torch.Tensor, sb, c: torch.Tensor, unit: MMAUnit) -> torch.Tensor:
    """out (M, N) float32 = the instruction chain of ``unit`` on checked a (M, K), b (K, N), scales sa (M, K/block)
    and sb (K/block, N) (None without scales) and c (M, N) fp32 values."""
    M, N = a.shape[0], b.shape[1]
    device = a.device
    if device.type == "cuda":
        from ..kernels import cuda as kcuda, mma_cuda

        A, BT, SA, SBT, C = _scalar_operands(a, sa, b, sb, c, unit)
        out = torch.empty(M, N, dtype=torch.float64, device=device)
        args = [kcuda.as_device_array(t.to(device)) for t in (A, BT, SA, SBT, C)]
        with kcuda.device_of(out):
            mma_cuda.gemm(*args, kcuda.as_device_array(out), unit.params())
        return out.to(torch.float32)
    from ..kernels import parallel

    a32 = a.to(torch.float32).cpu().contiguous()
    b32 = b.to(torch.float32).cpu().contiguous()
    c32 = c.to(torch.float32).cpu().contiguous()
    out = c32.numpy().astype(np.float64)
    if unit.kind == MMAKind.NV_GROUPS and _groups_vec(a32, sa, b32, sb, unit, out):
        pass
    elif unit.kind == MMAKind.NV_FUSED and (_fused8(a32, sa, b32, sb, unit, out)
                                            or _fused_fast(a32, sa, b32, sb, c32, unit, out)):
        pass
    else:
        from ..kernels import mma_cpu

        A, BT, SA, SBT, C = (t.numpy() for t in _scalar_operands(a32, sa, b32, sb, c32, unit))
        with parallel.exclusive():
            mma_cpu.gemm(A, BT, SA, SBT, C, out, unit.params())
    return torch.from_numpy(out.astype(np.float32)).to(device)


def _scalar_operands(a, sa, b, sb, c, unit: MMAUnit):
    """(A, BT, SA, SBT, C) float32 contiguous: the scalar kernels' layout (B and its scales transposed)."""
    M, N = a.shape[0], b.shape[1]
    return (a.to(torch.float32).contiguous(), b.to(torch.float32).t().contiguous(), _scales_t(sa, M).contiguous(),
            _scales_t(None if sb is None else sb.t(), N).contiguous(), c.to(torch.float32).contiguous())


def _exponents(x, emin: int, nan: int) -> np.ndarray:
    """exp(x) of every value (int64) as the datapaths take it: max(floor(log2|x|), emin), zeros -126; NaN: ``nan``."""
    x64 = np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x, np.float64)
    with np.errstate(invalid="ignore"):
        e = np.maximum(np.frexp(x64)[1].astype(np.int64) - 1, emin)
    return np.where(np.isnan(x64), nan, np.where(x64 == 0, -126, e))


def _step_scales(sa, sb, unit: MMAUnit, M: int, N: int, nsteps: int):
    """(ESA (M, nsteps), ESB (nsteps, N)) int64 scale exponents of each step (zeros without scales), or None
    when a scale is NaN or the scales change within a step."""
    if unit.scale is None:
        return np.zeros((M, nsteps), np.int64), np.zeros((nsteps, N), np.int64)
    if unit.block != unit.terms:
        return None
    emin = int(unit.params()[abi.X_SC_EMIN])
    ESA, ESB = _exponents(sa, emin, NAN_EXP), _exponents(sb, emin, NAN_EXP)
    if (ESA == NAN_EXP).any() or (ESB == NAN_EXP).any():
        return None
    return np.ascontiguousarray(ESA), np.ascontiguousarray(ESB)


def _fused8(a32, sa, b32, sb, unit: MMAUnit, out: np.ndarray) -> bool:
    """``kernels.mma_vec.fused8_gemm`` into out; False (nothing run) where its conditions do not hold."""
    fmt = unit.element_format
    if fmt.bits > 8 or fmt.emin <= -127 or unit.frac_bits > 25:
        return False
    M, K = a32.shape
    N = b32.shape[1]
    sc = _step_scales(sa, sb, unit, M, N, -(-K // unit.terms))
    if sc is None:
        return False
    from ..kernels import mma_vec, parallel

    EA, EB = np.empty((M, K), np.int16), np.empty((K, N), np.int16)
    with parallel.exclusive():
        if mma_vec.exponents(a32.numpy(), fmt.emin, EA) or mma_vec.exponents(b32.numpy(), fmt.emin, EB):
            return False  # a NaN or infinite element
        mma_vec.fused8_gemm(a32.numpy(), EA, b32.numpy(), EB, *sc, out, unit.terms, unit.frac_bits, unit.out_man)
    return True


def _fused_fast(a32, sa, b32, sb, c32, unit: MMAUnit, out: np.ndarray) -> bool:
    """``kernels.mma_fast.fused_gemm`` into out; False (nothing run) when an element or scale is not finite or
    the scales change within a step."""
    from ..kernels import mma_fast, parallel

    fmt = unit.element_format
    M, K = a32.shape
    N = b32.shape[1]
    sc = _step_scales(sa, sb, unit, M, N, max(-(-K // unit.terms), 1))
    if sc is None:
        return False
    A, BT, SA, SBT, C = (t.numpy() for t in _scalar_operands(a32, sa, b32, sb, c32, unit))
    MA, EA = np.empty((M, K), np.int32), np.empty((M, K), np.int32)
    MB, EB = np.empty((K, N), np.int32), np.empty((K, N), np.int32)
    with parallel.exclusive():
        if not (mma_fast.split(A, fmt.emin, fmt.man, MA, EA)
                and mma_fast.split(b32.numpy(), fmt.emin, fmt.man, MB, EB)):
            return False
        mma_fast.fused_gemm(A, BT, SA, SBT, C, MA, EA, MB, EB, *sc, fmt.man, out, unit.params())
    return True


def _groups_vec(a32, sa, b32, sb, unit: MMAUnit, out: np.ndarray) -> bool:
    """``kernels.mma_vec.groups_vec`` into out; False (nothing run) unless the elements are E2M1, groups and
    steps whole groups of 16 and F <= 36."""
    M, K = a32.shape
    if (unit.element != "fp4_e2m1" or K % GROUP or unit.block % GROUP or unit.terms % GROUP
            or unit.frac_bits > 36):
        return False
    from ..kernels import mma_vec, parallel

    ng = K // GROUP
    gidx = np.arange(ng) * GROUP // unit.block
    emin = int(unit.params()[abi.X_SC_EMIN])
    EA, SA = _group_scales(sa.numpy()[:, gidx], emin)
    EB, SB = _group_scales(sb.numpy()[gidx, :], emin)
    with parallel.exclusive():
        mma_vec.groups_vec(a32.numpy(), b32.numpy(), EA, SA, EB, SB, out, unit.terms // GROUP, unit.frac_bits,
                           unit.out_man)
    return True


def _group_scales(s: np.ndarray, emin: int):
    """(exponents int32 (NaN: NAN_EXP), 8 * significands float32 (NaN: 0)) of scale values s (float64)."""
    e = _exponents(s, emin, NAN_EXP)
    with np.errstate(invalid="ignore"):
        sig8 = np.where(np.isnan(s), 0.0, np.ldexp(s, np.where(np.isnan(s), 0, 3 - e).astype(np.int32)))
    return np.ascontiguousarray(e, np.int32), np.ascontiguousarray(sig8, np.float32)
