"""``quantize()``: validate once, then hand flat memory to the kernel for the tensor's device."""
from __future__ import annotations

import os
import threading
import warnings

import torch

from . import backends, buffers, kernel_backends
from .block_quantize import quantize_block_checked
from .formats import (BlockFormat, CustomFormat, FixedFormat, FloatFormat, Format, HiFloat8Format, LogFormat,
                      P3109Format, PositFormat, RoundMode, TableFormat, get_format)
from .formats.interned import intern as _intern
from .kernels.abi import Kind
from .rng import seed_key
from .reference import quantize_reference, quantize_torch

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DEFAULT_SR_BITS = 32

_warned_devices: set[str] = set()

# torch.compile calls this at trace time and bakes the id in as a constant (its lock cannot be traced). The mark
# is what torch.compiler.assume_constant_result sets on the function itself; set here directly, because calling
# that function imports torch._dynamo, which made ``import emunum`` cost about 2 s
intern = _intern
intern._dynamo_marked_constant = True

_STOCHASTIC = RoundMode.STOCHASTIC
_KEY0 = seed_key(0)  # the key of seed 0, which every non-stochastic rounding passes
# dtypes the CPU kernels read in place, and their numpy twins
_NUMPY_DTYPES = kernel_backends.NUMPY_DTYPES
_cpu_runner = backends.cpu_runner  # the registered CPU kernel of (fmt, dtype), cached
_cpu = kernel_backends.cpu_module
custom_runner = kernel_backends.custom_runner


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


def check_seed(seed, field: str = "seed"):
    """None, or an int that fits int64 (the custom ops' schema; every entry point takes the same range)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{field} must be an int or None, got {seed!r}")
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"{field}={seed} is out of range; allowed: -2**63 .. 2**63-1")
    return seed


_seed_buffers = threading.local()  # per thread: an int64 scalar to draw seeds into, and a numpy view of it


def resolve_seed(seed) -> int:
    """The stochastic-rounding seed: given (checked by ``check_seed``), or drawn from torch's default generator.

    The draw is ``torch.randint(0, 2**62, (1,))``'s (randint is ``random_(0, 2**62)`` on a fresh tensor: the same
    generator call), made into a per-thread buffer and read back through a numpy view of that buffer (no
    dispatcher trip for ``item``): the same values."""
    if seed is None:
        pair = getattr(_seed_buffers, "pair", None)
        if pair is None:
            with torch.inference_mode(False):  # a normal tensor: writable inside and outside inference mode
                buf = torch.empty(1, dtype=torch.int64)
            pair = _seed_buffers.pair = (buf, buf.numpy())
        pair[0].random_(0, 2**62)
        return pair[1].item()
    return check_seed(seed)


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses that t's elements occupy (t non-empty)."""
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    lo = t.data_ptr() + min(0, sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st < 0)) * t.element_size()
    return lo, lo + span * t.element_size()


def _check_out(out, x: torch.Tensor) -> None:
    """out must match x, be writable as torch's in-place ops require, and overlap x fully or not at all."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.is_neg():
        raise ValueError("out is a negative view (x._neg_view()); pass a tensor without the negative bit")
    if out.is_inference() and not torch.is_inference_mode_enabled():
        raise RuntimeError("out is an inference tensor: an in-place update outside InferenceMode is not allowed "
                           "(as for torch's in-place ops)")
    if out.requires_grad and out.is_leaf and torch.is_grad_enabled():
        raise RuntimeError("out is a leaf tensor that requires grad: it cannot be written in place "
                           "(as for torch's in-place ops); use torch.no_grad() or a tensor without requires_grad")
    if out.numel() and x.numel() and out.device == x.device and out.device.type != "meta" \
            and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        same = out.data_ptr() == x.data_ptr() and out.stride() == x.stride() and out.shape == x.shape
        (a0, a1), (b0, b1) = _extent(out), _extent(x)
        if not same and a0 < b1 and b0 < a1:
            raise ValueError("out partially overlaps x: some elements of the input tensor and the written-to "
                             "tensor refer to a single memory location (out=x itself is allowed)")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must match x in shape, dtype and device: out is {tuple(out.shape)} {out.dtype} {out.device}, "
            f"x is {tuple(x.shape)} {x.dtype} {x.device}"
        )


def _run_cpu(src: torch.Tensor, dst: torch.Tensor, fmt: Format, mode: int, key: int, nbits: int) -> None:
    """src, dst: contiguous CPU float32/float64 tensors of one dtype and numel (dst may be src), any shape.

    The kernels get their addresses (``data_ptr``), not numpy views; both tensors stay referenced here for
    the duration of the call."""
    _cpu_runner(fmt, src.dtype)(src.data_ptr(), dst.data_ptr(), src.numel(), int(mode), key, nbits)


def _run_cuda_kernel(src: torch.Tensor, dst: torch.Tensor, fmt: Format, mode: RoundMode, key: int, nbits: int):
    """src, dst: flat contiguous CUDA tensors of one dtype (dst may be src): the registered CUDA kernel."""
    backends.runner(fmt, "cuda", src.dtype)(src, dst, mode, key, nbits)


# CUDA tensors with at most this many elements take the pure-torch path (``reference.quantize_torch``: the
# same bits, from ~40 small elementwise torch ops on the device) instead of one numba-cuda launch.
# Measured on one H100 (benchmarks/gpu_check.sh, 2026-11-26, benchmarks/RESULTS.md): the numba launch took
# 236-275 us at every size from 1 to 2**18 elements and the torch path 679-952 us, so the torch path never
# wins there: 0. Measure again on other GPUs and hosts (benchmarks/gpu_check.sh). Overridable without an edit: the
# environment variable EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL (read at import), or assign this module attribute.
# Either path gives the same bits, so the value changes speed only.
def _env_numel(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"environment variable {name}={raw!r}: expected an element count, an integer >= 0")
    return value


CUDA_TORCH_PATH_MAX_NUMEL = _env_numel("EMUNUM_CUDA_TORCH_PATH_MAX_NUMEL", 0)


def _quantize_cuda(x: torch.Tensor, result: torch.Tensor, fmt: Format, mode: RoundMode, seed: int, key: int,
                   nbits: int) -> None:
    """Round CUDA tensor x into result (x's shape, dtype and device); tiny tensors take the torch path."""
    kernel_backends.cuda_module()  # the same error for every size when numba-cuda is missing
    if x.numel() <= CUDA_TORCH_PATH_MAX_NUMEL and isinstance(fmt, (FloatFormat, FixedFormat)):  # no torch path for the others
        result.copy_(quantize_torch(x, fmt, mode, seed=seed, sr_bits=nbits))
        return
    src = x.detach().contiguous().view(-1)
    if result.is_contiguous():
        _run_cuda_kernel(src, result.view(-1), fmt, mode, key, nbits)
    else:
        tmp = torch.empty_like(src)
        _run_cuda_kernel(src, tmp, fmt, mode, key, nbits)
        result.copy_(tmp.view(x.shape))


def format_to_args(fmt) -> list[int]:
    """A format as plain ints for a custom op: float ``[0, exp, man, bias, subnormals, special, saturate]``,
    fixed ``[1, bits, frac_bits, signed, saturate]``, posit ``[2, nbits, es]``, any other element spec
    (TableFormat, LogFormat, CustomFormat, P3109Format, HiFloat8Format) ``[3, id]`` with
    ``id = formats.interned.intern(fmt)``. ``None`` gives ``[]`` (no rounding)."""
    if fmt is None:
        return []
    fmt = get_format(fmt)
    if isinstance(fmt, PositFormat):
        return [int(Kind.POSIT), fmt.nbits, fmt.es]
    if isinstance(fmt, (TableFormat, LogFormat, CustomFormat, P3109Format, HiFloat8Format)):
        return [int(Kind.INTERNED), intern(fmt)]
    if not isinstance(fmt, (FloatFormat, FixedFormat)):
        raise TypeError(f"{fmt.name} is not an element format (FloatFormat/FixedFormat); block formats apply to "
                        "GEMM operands (emunum.patch) or through emunum.quantize(x, fmt, axis=...)")
    if isinstance(fmt, FloatFormat):
        return [int(Kind.FLOAT), fmt.exp, fmt.man, fmt.bias, int(fmt.subnormals), int(fmt.special), int(fmt.saturate)]
    return [int(Kind.FIXED), fmt.bits, fmt.frac_bits, int(fmt.signed), int(fmt.saturate)]


def _traced(x: torch.Tensor) -> bool:
    """Whether x has no memory to hand to a kernel: Dynamo is tracing, or x is a FakeTensor (export, meta
    propagation). Such calls go through the ``emunum::quantize`` custom op, whose kernel runs at execution."""
    return torch.compiler.is_compiling() or type(x).__name__ == "FakeTensor"


def quantize(x: torch.Tensor, fmt, rounding="nearest", *, seed: int | None = None,
             out: torch.Tensor | None = None, sr_bits: int | None = None, axis: int = -1) -> torch.Tensor:
    """Round every element of ``x`` to the nearest-by-``rounding`` value of ``fmt``.

    fmt: a Float/Fixed/Posit/Table/Log/CustomFormat or a name (``get_format``). rounding:
    nearest (ties to even),
    nearest_away, toward_zero, up, down, odd, stochastic. The result has x's dtype and shape; float64 is
    rounded from its own value, float32 likewise, and float16/bfloat16 through float32 (exact), with the
    result cast back round-to-nearest-even (exact whenever fmt's values are representable in that dtype).
    Stochastic: rounds away from zero when frac(|x|/quantum), rounded to ``sr_bits`` bits (default 32),
    plus ``sr_bits`` random bits carries; the bits come from a counter-based generator keyed on
    (seed, flat element index in C order), so they are the same on any device and thread count.
    seed=None draws one from torch's default generator. x is never modified unless passed as ``out``.
    Not differentiable: see ``emunum.Quantizer`` for straight-through gradients.
    Block formats (``emunum.BlockFormat``, e.g. "mxfp8_e4m3", "nvfp4"): blocks run along ``axis`` (tiles over
    the last two dimensions ignore it); ``rounding`` applies to the elements; see BlockFormat for the scale.
    """
    check_tensor(x)
    fmt = get_format(fmt)
    mode = RoundMode.parse(rounding)
    nbits = check_sr_bits(sr_bits)
    if isinstance(fmt, CustomFormat):
        fmt.check_mode(mode)
    if not isinstance(fmt, BlockFormat) and _traced(x):
        q = torch.ops.emunum.quantize(x, format_to_args(fmt), int(mode), check_seed(seed), nbits)
        return q if out is None else out.copy_(q)
    if out is not None:
        _check_out(out, x)
    if isinstance(fmt, BlockFormat):
        key = seed_key(resolve_seed(seed)) if mode is _STOCHASTIC else _KEY0
        return quantize_block_checked(x, fmt, mode, key, nbits, axis, out)
    return quantize_checked(x, fmt, mode, seed, nbits, out)


def quantize_checked(x: torch.Tensor, fmt: Format, mode: RoundMode, seed: int | None, nbits: int,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """``quantize`` for arguments already checked and parsed (a float tensor, a Format, a RoundMode, sr_bits
    as an int, ``out`` matching x or None): callers that validate once, at construction, use it per call."""
    if x.is_neg():  # a lazily negated view: the kernels read memory, so resolve the sign first
        x = x.resolve_neg()
    if mode is _STOCHASTIC:
        seed = resolve_seed(seed)
        key = seed_key(seed)
    else:
        seed, key = 0, _KEY0
    if out is not None:
        result = out
    elif x.is_cpu and x.numel() * x.element_size() >= buffers.HUGE_MIN_BYTES:
        result = buffers.empty_like(x)  # first-touch page faults would cost more than the rounding
    elif x.is_contiguous():
        result = torch.empty_like(x)  # contiguous like x (preserve_format), and faster to ask for
    else:
        result = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.is_cpu and x.dtype in _NUMPY_DTYPES:  # the hot path: no autograd bookkeeping, no views
        if x.numel() == 0:
            return result
        src = x if x.is_contiguous() else x.detach().contiguous()
        if result.is_contiguous():
            _run_cpu(src, result, fmt, mode, key, nbits)
        else:
            tmp = torch.empty_like(src, memory_format=torch.contiguous_format)
            _run_cpu(src, tmp, fmt, mode, key, nbits)
            with torch.no_grad():
                result.copy_(tmp)
        if out is not None:  # written behind autograd's back: let it see the in-place change
            torch.autograd.graph.increment_version(out)
        return result
    if x.numel() == 0 or x.is_meta:  # a meta tensor: shape propagation (it has no values to round)
        return result

    with torch.no_grad():
        dev = x.device.type
        if dev not in ("cpu", "cuda") and isinstance(fmt, (TableFormat, LogFormat, CustomFormat, P3109Format,
                                                           HiFloat8Format)):
            result.copy_(quantize_checked(x.detach().cpu(), fmt, mode, seed, nbits).to(x.device))
            return result
        if dev not in ("cpu", "cuda"):
            if dev not in _warned_devices:
                _warned_devices.add(dev)
                warnings.warn(f"emunum has no kernel for device {dev!r}; using the slow reference path",
                              RuntimeWarning, stacklevel=2)
            if isinstance(fmt, PositFormat):  # no torch implementation: the CPU kernel, on a host copy
                result.copy_(quantize_checked(x.detach().cpu(), fmt, mode, seed, nbits).to(x.device))
            else:
                result.copy_(quantize_reference(x, fmt, mode, seed=seed, sr_bits=nbits))
            return result
        if dev == "cuda":
            _quantize_cuda(x, result, fmt, mode, seed, key, nbits)
            return result
        # CPU float16/bfloat16: round their (exact) float32 values, cast back
        work = x.detach().reshape(-1).float()
        _run_cpu(work, work, fmt, mode, key, nbits)
        result.copy_(work.view(x.shape))
        _restore_nans16(x, result)
    return result


_QUIET16 = {torch.float16: 1 << 9, torch.bfloat16: 1 << 6}
_POSITIVE_NAN16 = {torch.float16: 0x7E00, torch.bfloat16: 0x7FC0}


def _restore_nans16(x: torch.Tensor, result: torch.Tensor) -> None:
    """torch's CPU float32 -> bfloat16 cast writes every NaN as 0xFFFF (sign set). Restore the rule of every
    other path: a NaN made by the rounding (overflow in an fn/fnuz format) is the positive quiet NaN, and an
    input NaN keeps its sign and payload, quietened."""
    made = torch.isnan(result)
    if made.any():
        bits = result.view(torch.int16)
        bits[made] = _POSITIVE_NAN16[x.dtype]
        nan = torch.isnan(x)
        bits[nan] = x.detach().view(torch.int16)[nan] | _QUIET16[x.dtype]
