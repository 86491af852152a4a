"""Emulated multiply-accumulate units: ``MADUnit`` and the functions that run on one.

- ``unit``: the ``MADUnit`` spec and the datapath, stated precisely (order of operations, roundings,
  accumulator start, bias, chunk and lanes, stochastic counters);
- ``functional``: ``mad`` (element-wise), ``matmul``, ``linear``, with autograd on per-GEMM units;
- ``conv``: ``conv1d`` / ``conv2d`` through unfold and the GEMM;
- ``block``: ``block_matmul``, a GEMM on block-scaled operands (MX, NVFP4): exact block-pair sums, scaled,
  accumulated on the unit;
- ``custom``: ``custom_matmul``, a GEMM in a user-defined type's own ``add`` / ``mul`` (``CustomFormat``);
- ``mma``, ``scaled_mm``: ``MMAUnit`` matrix instructions after MMA-Sim (tcgen05 block-scaled MMA, wgmma, MFMA)
  and ``scaled_mm``, a GEMM on one with block scales as the instruction takes them;
- ``lns``: ``lns_matmul``, a GEMM on a logarithmic-number unit (exact products, exact or Mitchell addition);
- ``multiplier``: ``Multiplier``, the product step (exact, lookup table, Mitchell, truncated, DRUM, user function);
- ``backend``: validation and dispatch to ``kernels.gemm_cpu`` / ``kernels.gemm_cuda`` (loaded on first use).

``emunum.mad`` is a plain package; the element-wise MAD is ``emunum.mad.elementwise(a, b, c, unit)`` (also
``emunum.mad.mad``).
"""
from .block import block_matmul
from .conv import conv1d, conv2d
from .custom import custom_matmul
from .functional import addmm, baddbmm, derived_seed, linear, mad, matmul
from .lns import LNSAdd, lns_matmul
from .multiplier import Multiplier, MultiplierKind
from .unit import MADUnit, Order

elementwise = mad


def __getattr__(name):
    """The matrix-instruction names, loaded on first use (they are not needed to import emunum)."""
    if name == "scaled_mm":
        from .scaled_gemm import scaled_mm as fn  # noqa: PLC0415

        return fn
    if name in ("MMAUnit", "MMA_PRESETS"):
        from . import mma  # noqa: PLC0415

        return getattr(mma, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MADUnit", "Order", "Multiplier", "MultiplierKind", "mad", "elementwise", "matmul", "linear", "addmm", "baddbmm", "conv1d",
           "conv2d", "derived_seed", "block_matmul", "custom_matmul",
           "lns_matmul", "LNSAdd", "scaled_mm", "MMAUnit", "MMA_PRESETS"]

