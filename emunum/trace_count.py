"""The counters of one rounding for ``emunum.trace`` (which re-exports these names): ``accumulate`` (count a
rounding x -> q into a float64[6] accumulator), ``stats_torch`` (the same counters with torch ops, any device) and
``round_observed`` (round and count in one pass where a fused CPU kernel exists). The counters are defined in
``emunum.trace``'s module doc; their order of summation and error bounds in ``kernels/counters.py``.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import buffers
from .formats import CustomFormat, FixedFormat, FloatFormat, LogFormat, RoundMode, TableFormat
from .quantize import _KEY0, _NUMPY_DTYPES, quantize_checked, resolve_seed
from .rng import seed_key

STATS = ("values", "overflow", "underflow", "nan", "signal", "noise")
_CPU_SERIAL_MAX = 1 << 20  # the parallel kernel won nothing below this on 2 cores (memory-bound pass)


def _range(fmt) -> tuple:
    """The format's finite range [lo, hi]."""
    if isinstance(fmt, (FixedFormat, TableFormat, LogFormat, CustomFormat)):
        return float(fmt.min), float(fmt.max)
    return -float(fmt.max), float(fmt.max)


# ---- the counters of one rounding -------------------------------------------------------------------------
def stats_torch(x: Tensor, q: Tensor, lo: float, hi: float, sqnr: bool = True) -> Tensor:
    """float64 [values, overflow, underflow, nan, signal, noise] of rounding x -> q (any device)."""
    x, q = x.detach().reshape(-1), q.detach().reshape(-1)
    fin_x = torch.isfinite(x)
    over = ((x > hi) | (x < lo)) & fin_x
    under = (q == 0) & (x != 0)
    parts = [torch.count_nonzero(over), torch.count_nonzero(under), torch.count_nonzero(torch.isnan(q))]
    out = torch.empty(6, dtype=torch.float64, device=x.device)
    out[0] = x.numel()
    out[1:4] = torch.stack(parts)
    if sqnr:
        both = fin_x & torch.isfinite(q)
        xd = torch.where(both, x, 0).double()
        d = torch.where(both, q, 0).double() - xd
        out[4] = torch.dot(xd, xd)
        out[5] = torch.dot(d, d)
    else:
        out[4:] = 0
    return out


def accumulate(acc: Tensor, x: Tensor, q: Tensor, lo: float, hi: float, sqnr: bool = True) -> None:
    """acc (float64 [6], on x's device) += the counters of rounding x -> q."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and q.dtype == x.dtype:
        xa = x.detach().contiguous().view(-1).numpy()
        qa = q.detach().contiguous().view(-1).numpy()
        counters = _counters()
        lo, hi = counters.thresholds(lo, hi, xa.dtype)
        if xa.size < _CPU_SERIAL_MAX:
            counters.counters_serial(xa, qa, lo, hi, sqnr, acc.numpy())
        else:  # both loops sum chunk by chunk in one order (kernels/counters.py): the same counts and sums
            with _try_parallel(True) as par:
                (counters.counters_parallel if par else counters.counters_serial)(xa, qa, lo, hi, sqnr, acc.numpy())
    else:
        acc += stats_torch(x, q, lo, hi, sqnr)


_counters_mod = None


def _counters():
    """kernels.counters, imported on first use (not at ``import emunum``)."""
    global _counters_mod
    if _counters_mod is None:
        from .kernels import counters
        _counters_mod = counters
    return _counters_mod


def _try_parallel(wanted: bool):
    from .kernels.parallel import try_parallel
    return try_parallel(wanted)


@functools.lru_cache(maxsize=512)
def _counted_runner(fmt, dtype: torch.dtype):
    """The fused round-and-count CPU kernel of (fmt, dtype) with its arguments bound, or None (other formats)."""
    if dtype not in _NUMPY_DTYPES or not isinstance(fmt, (FloatFormat, FixedFormat)):
        return None
    args = fmt.to_kernel_args()  # a kernels.abi record, fields in the runners' parameter order
    c = _counters()
    make = c.float_counted_runner if isinstance(fmt, FloatFormat) else c.fixed_counted_runner
    return make(_NUMPY_DTYPES[dtype], *args)


def round_observed(x: Tensor, fmt, mode: RoundMode, seed, nbits: int, acc: Tensor, lo: float, hi: float,
                   sqnr: bool) -> Tensor:
    """``quantize_checked(x, fmt, mode, seed, nbits)``, and ``accumulate(acc, x, result, lo, hi, sqnr)``.

    On CPU, for float32/float64 x and a Float/FixedFormat, both happen in one pass (``kernels/counters.py``:
    the same rounding loop, the same chunked counters, so the same bits and the same counts and sums as the
    two calls); anywhere else, the two calls. The same seed draw as ``quantize_checked`` (one, for stochastic
    rounding with seed None). x is not modified."""
    runner = _counted_runner(fmt, x.dtype) if x.is_cpu and acc.is_cpu else None
    n = x.numel()
    if runner is None or n == 0 or x.is_neg():
        q = quantize_checked(x, fmt, mode, seed, nbits)
        accumulate(acc, x, q, lo, hi, sqnr)
        return q
    key = seed_key(resolve_seed(seed)) if mode == RoundMode.STOCHASTIC else _KEY0
    src = x if x.is_contiguous() else x.detach().contiguous()
    q = buffers.empty_like(src) if n * src.element_size() >= buffers.HUGE_MIN_BYTES else torch.empty_like(src)
    runner(src.data_ptr(), q.data_ptr(), n, int(mode), key, nbits, lo, hi, sqnr, acc.data_ptr())
    return q


# ---- block-format operands (the GEMM operands of ``emunum.nn.block_gemm``) --------------------------------
def round_block_observed(x: Tensor, fmt, mode: RoundMode, nbits: int, axis: int, acc: Tensor, sqnr: bool,
                         key: int | None = None) -> Tensor:
    """``emunum.quantize(x, fmt, mode, axis=axis, sr_bits=nbits)`` for a BlockFormat (the same seed draw: one,
    for stochastic rounding; ``key`` given: that key instead), and its counters added to acc: as
    ``accumulate``'s, except that ``overflow`` counts the finite elements whose block-scaled value x / (S*T)
    lay beyond the element format's range (they saturated to its limits times S*T), or that became +-inf (the
    rounded value times S*T beyond x's dtype)."""
    from .block_quantize import quantize_block_checked

    if key is None:
        key = seed_key(resolve_seed(None)) if mode == RoundMode.STOCHASTIC else _KEY0
    q, scales = quantize_block_checked(x, fmt, mode, key, nbits, axis, return_scales=True)
    with torch.no_grad():
        acc += block_stats(x, q, scales, fmt, axis, sqnr)
    return q


def block_stats(x: Tensor, q: Tensor, scales: Tensor, fmt, axis: int, sqnr: bool = True) -> Tensor:
    """float64 [values, overflow, underflow, nan, signal, noise] of the block rounding x -> q whose block scales
    (``quantize_block_checked(..., return_scales=True)``) are ``scales`` (see ``round_block_observed``)."""
    from .block_quantize import tensor_scale, working_layout

    out = stats_torch(x, q, -float("inf"), float("inf"), sqnr)  # every counter but overflow
    if x.numel() == 0:
        return out
    work, tile, restore = working_layout(x, fmt, axis)
    P, R, C = work.shape
    full = scales.repeat_interleave(tile[0], 1)[:, :R].repeat_interleave(tile[1], 2)[:, :, :C]
    full = restore(full * tensor_scale(work, fmt))  # S * T per element, exact in float64, in x's layout
    lo, hi = _range(fmt.element)
    xd = x.detach().to(torch.float64)
    # S*T is a power of two (or an e4m3 scale times an fp32 T), so lo*S*T and hi*S*T are exact in float64
    over = torch.isfinite(xd) & ((xd > hi * full) | (xd < lo * full) | torch.isinf(q))
    out[1] = torch.count_nonzero(over)
    return out
