"""``quantize`` for the MX+ block formats (``MXPlusFormat``, emunum/formats/mxplus.py): the kernels'
arguments, and the kernel for the tensor's device (kernels/mxplus_cpu.py, kernels/mxplus_cuda.py), on the
(P, R, C) working layout of emunum/block_quantize.py."""
from __future__ import annotations

import math

import torch

from .formats import RoundMode
from .formats.mxplus import MXPlusFormat


def mxplus_args(fmt: MXPlusFormat) -> tuple:
    """The plain ints and floats the MX+ core takes (kernels/mxplus_scalar.py), in its order."""
    el = fmt.element
    lo, hi = fmt.scale_exp_range
    man, emin, sub = el.man, el.emin, int(el.subnormals)
    split = math.ldexp(1.0, 52 - man) + 1.0  # round_nearest_value's constants (kernels/scalar/float.py)
    magic = 1.5 * math.ldexp(1.0, 52 + (emin - man if sub else emin))
    return (man, emin, sub, fmt.element_emax, float(el.max), int(el.has_negative_zero), lo, hi, fmt.bm_bits, split,
            magic, math.ldexp(1.0, emin))


def quantize_mxplus(work: torch.Tensor, dst: torch.Tensor, scales: torch.Tensor, fmt: MXPlusFormat, tile,
                    mode: RoundMode, key: int, nbits: int) -> None:
    """Quantise ``work`` (P, R, C) into ``dst``, each block's scale into ``scales`` (P, nbr, nbc)."""
    args = mxplus_args(fmt)
    if work.device.type == "cuda":
        from .kernels import cuda as kc, mxplus_cuda
        with kc.device_of(work):
            mxplus_cuda.quantize_mxplus(kc.as_device_array(work), kc.as_device_array(dst), kc.as_device_array(scales),
                                        tile, args, int(mode), key, nbits, stream=kc.torch_stream(work.device))
    elif work.device.type == "cpu":
        from .kernels import mxplus_cpu
        mxplus_cpu.quantize_mxplus(work.numpy(), dst.numpy(), scales.numpy(), tile, args, int(mode), key, nbits)
    else:
        raise ValueError(f"block formats have kernels for cpu and cuda tensors; x is on {work.device}")
