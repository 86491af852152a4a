"""``quantize()``: validate once, then hand flat memory to the kernel for the tensor's device."""
from __future__ import annotations

import warnings

import torch

from .formats import get_format
from .reference import quantize_reference, quantize_torch, seed_key
from .spec import FixedFormat, FloatFormat, Format, RoundMode

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DEFAULT_SR_BITS = 32

_warned_devices: set[str] = set()


def check_tensor(x, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name}.dtype={x.dtype} is not supported; allowed: float32, float64, float16, bfloat16"
        )


def check_sr_bits(sr_bits) -> int:
    if sr_bits is None:
        return DEFAULT_SR_BITS
    if isinstance(sr_bits, bool) or not isinstance(sr_bits, int):
        raise TypeError(f"sr_bits must be an int in 1..32, got {sr_bits!r}")
    if not 1 <= sr_bits <= 32:
        raise ValueError(f"sr_bits={sr_bits} is out of range; allowed: 1..32")
    return sr_bits


def resolve_seed(seed) -> int:
    """The stochastic-rounding seed: given, or drawn from torch's default generator."""
    if seed is None:
        return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    return seed


def _check_out(out, x: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must match x in shape, dtype and device: out is {tuple(out.shape)} {out.dtype} {out.device}, "
            f"x is {tuple(x.shape)} {x.dtype} {x.device}"
        )


def _run_kernel(src: torch.Tensor, dst: torch.Tensor, fmt: Format, mode: RoundMode, key: int, nbits: int):
    """src, dst: flat contiguous float32/float64 tensors on one device (dst may be src)."""
    if src.device.type == "cuda":
        _run_cuda_kernel(src, dst, fmt, mode, key, nbits)
        return
    from .kernels import cpu as backend
    s, d = src.numpy(), dst.numpy()
    if isinstance(fmt, FloatFormat):
        _, man, emin, sub, mx, ovf, negzero = fmt.to_kernel_args()
        backend.quantize_float(s, d, man, emin, sub, mx, ovf, negzero, int(mode), key, nbits)
    else:
        _, frac, cmin, cmax, sat = fmt.to_kernel_args()
        backend.quantize_fixed(s, d, frac, cmin, cmax, sat, int(mode), key, nbits)


# ---- CUDA ------------------------------------------------------------------------------------------------

# CUDA tensors with at most this many elements take the pure-torch path (``reference.quantize_torch``: the
# same bits, from ~40 small elementwise torch ops on the device) instead of one numba-cuda launch.
# UNMEASURED ESTIMATE (no GPU was available when it was written). Both paths cost host time, not GPU time, at
# this size: ~40 torch launches (a few us each) against one numba launch with ~30-60 us of Python-side
# argument marshalling, so the torch path mostly buys skipping numba's first-call JIT (about a second per
# dtype) in programs that round only scalars and small scale/bias tensors. Measure by timing quantize with
# this set to 0 and to 2**62, and move it.
CUDA_TORCH_PATH_MAX_NUMEL = 256

_LAYOUT16 = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _cuda_backend():
    """The CUDA kernel module; a clear ImportError naming the package when numba-cuda is missing."""
    from .kernels import cuda as backend  # lazy: numba.cuda is imported on the first CUDA tensor only
    return backend


def _run_cuda_kernel(src: torch.Tensor, dst: torch.Tensor, fmt: Format, mode: RoundMode, key: int, nbits: int):
    """src, dst: flat contiguous CUDA tensors of one dtype (float32/float64/float16/bfloat16; dst may be src).

    Zero-copy views, launched on torch's current stream of src's device; 16-bit dtypes round in-kernel.
    """
    backend = _cuda_backend()
    layout = _LAYOUT16.get(src.dtype)
    with backend.device_of(src):
        s, d = backend.as_device_array(src), backend.as_device_array(dst)
        stream = backend.torch_stream(src.device)
        if isinstance(fmt, FloatFormat):
            _, man, emin, sub, mx, ovf, negzero = fmt.to_kernel_args()
            backend.quantize_float(s, d, man, emin, sub, mx, ovf, negzero, int(mode), key, nbits,
                                   layout=layout, stream=stream)
        else:
            _, frac, cmin, cmax, sat = fmt.to_kernel_args()
            backend.quantize_fixed(s, d, frac, cmin, cmax, sat, int(mode), key, nbits, layout=layout,
                                   stream=stream)


def _quantize_cuda(x: torch.Tensor, result: torch.Tensor, fmt: Format, mode: RoundMode, seed: int, key: int,
                   nbits: int) -> None:
    """Round CUDA tensor x into result (x's shape, dtype and device); tiny tensors take the torch path."""
    _cuda_backend()  # the same error for every size when numba-cuda is missing
    if x.numel() <= CUDA_TORCH_PATH_MAX_NUMEL:
        result.copy_(quantize_torch(x, fmt, mode, seed=seed, sr_bits=nbits))
        return
    src = x.detach().contiguous().view(-1)
    if result.is_contiguous():
        _run_cuda_kernel(src, result.view(-1), fmt, mode, key, nbits)
    else:
        tmp = torch.empty_like(src)
        _run_cuda_kernel(src, tmp, fmt, mode, key, nbits)
        result.copy_(tmp.view(x.shape))


def quantize(x: torch.Tensor, fmt, rounding="nearest", *, seed: int | None = None,
             out: torch.Tensor | None = None, sr_bits: int | None = None) -> torch.Tensor:
    """Round every element of ``x`` to the nearest-by-``rounding`` value of ``fmt``.

    fmt: a FloatFormat / FixedFormat or a name (``get_format``). rounding: nearest (ties to even),
    nearest_away, toward_zero, up, down, odd, stochastic. The result has x's dtype and shape; float64 is
    rounded from its own value, float32 likewise, and float16/bfloat16 through float32 (exact), with the
    result cast back round-to-nearest-even (exact whenever fmt's values are representable in that dtype).
    Stochastic: rounds away from zero when frac(|x|/quantum), rounded to ``sr_bits`` bits (default 32),
    plus ``sr_bits`` random bits carries; the bits come from a counter-based generator keyed on
    (seed, flat element index in C order), so they are the same on any device and thread count.
    seed=None draws one from torch's default generator. x is never modified unless passed as ``out``.
    Not differentiable: see ``emunum.Quantizer`` for straight-through gradients.
    """
    check_tensor(x)
    fmt = get_format(fmt)
    mode = RoundMode.parse(rounding)
    nbits = check_sr_bits(sr_bits)
    seed = resolve_seed(seed) if mode == RoundMode.STOCHASTIC else 0
    key = seed_key(seed)
    if out is not None:
        _check_out(out, x)
    result = out if out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return result

    with torch.no_grad():
        dev = x.device.type
        if dev not in ("cpu", "cuda"):
            if dev not in _warned_devices:
                _warned_devices.add(dev)
                warnings.warn(f"emunum has no kernel for device {dev!r}; using the slow reference path",
                              RuntimeWarning, stacklevel=2)
            result.copy_(quantize_reference(x, fmt, mode, seed=seed, sr_bits=nbits))
            return result
        if dev == "cuda":
            _quantize_cuda(x, result, fmt, mode, seed, key, nbits)
            return result
        if x.dtype in (torch.float16, torch.bfloat16):
            work = x.detach().reshape(-1).float()
            _run_kernel(work, work, fmt, mode, key, nbits)
            result.copy_(work.view(x.shape))
            return result
        src = x.detach().contiguous().view(-1)
        if result.is_contiguous():
            _run_kernel(src, result.view(-1), fmt, mode, key, nbits)
        else:
            tmp = torch.empty_like(src)
            _run_kernel(src, tmp, fmt, mode, key, nbits)
            result.copy_(tmp.view(x.shape))
    return result

