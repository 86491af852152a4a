"""Validation and device dispatch for the MAD kernels: torch tensors in, torch tensors out.

``gemm`` runs out[b] = A[b % bA] @ B[b % bB] (+ bias[b]) on a unit's datapath; ``elementwise`` runs the
one-step MAD. Both compute in binary64 and return float64 tensors (the callers cast); kernels are imported
on first use, so ``import emunum`` compiles nothing.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from .. import gemm_listener
from ..quantize import check_tensor, resolve_seed
from . import approx_backend
from .unit import MADUnit, Order, stream_keys

_warned_devices: set[str] = set()
_UNIT_CACHE: dict[int, tuple] = {}  # id(unit) -> (unit, kernel_params(), fast_applies): few units per run
_ZERO_KEYS: list = []  # stream_keys(0), the keys of every deterministic unit


def _unit_entry(unit: MADUnit) -> tuple:
    """(unit, its kernel parameter vectors, whether gemm_fast runs it), computed once per unit object (the
    arrays are shared between calls and never written)."""
    entry = _UNIT_CACHE.get(id(unit))
    if entry is None or entry[0] is not unit:
        from ..kernels import gemm_fast_plan

        mulp, accp = unit.kernel_params()
        if len(_UNIT_CACHE) >= 64:
            _UNIT_CACHE.clear()
        entry = _UNIT_CACHE[id(unit)] = (unit, (mulp, accp), gemm_fast_plan.fast_applies(int(unit.fused), mulp, accp))
    return entry


def _keys(seed: int):
    if seed != 0:
        return stream_keys(seed)
    if not _ZERO_KEYS:
        _ZERO_KEYS.append(stream_keys(0))
    return _ZERO_KEYS[0]


def fast_layout(unit: MADUnit, device: torch.device) -> bool:
    """Whether ``gemm`` runs ``unit`` on ``device`` with ``kernels.gemm_cpu.gemm_fast`` (a CPU, round-to-nearest
    float unit: ``gemm_fast_plan.fast_applies``). That kernel computes every output element alone, in a fixed
    order of its K terms, and draws no random bits, so callers may lay a GEMM's products out as they like
    (one GEMM over a batch, operands swapped): each output element gets the same bits."""
    if device.type != "cpu" or unit.multiplier is not None or unit.is_multiterm or unit.order == Order.ANY:
        return False
    return _unit_entry(unit)[2]


def kernel_readable(t: torch.Tensor) -> bool:
    """Whether a CPU kernel can read t's memory as its float32 values: a C-contiguous float32 CPU tensor without a
    pending negation (``Tensor.numpy`` refuses one)."""
    return t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and not t.is_neg()


def scan(t: torch.Tensor, unit: MADUnit):
    """``kernels.operand_scan.scan`` of t's values where ``unit`` runs on the fast kernel (``fast_layout``), else
    None. A layer scans each tensor once and hands the scans to every GEMM whose operand holds t's nonzero
    values (``gemm``'s ``scans``); the planner then skips its own passes over the laid-out operands."""
    if not fast_layout(unit, t.device):
        return None
    from ..kernels import operand_scan

    with torch.no_grad():
        return operand_scan.scan(t.detach().to(torch.float32).numpy())


def backward_scans(sx, sw, x, weight, grad, u_in: MADUnit, u_w: MADUnit, needs_input_grad) -> tuple:
    """(scan of x, of weight, of grad) for a layer's backward GEMMs (``scan``): the forward's scans sx, sw where it
    made them (None where its unit does not run the fast kernel), else scanned here for the backward unit that
    uses them (u_in: grad_input, u_w: grad_weight and grad_bias)."""
    sg = scan(grad, u_in if fast_layout(u_in, grad.device) else u_w)
    if sw is None and needs_input_grad[0]:
        sw = scan(weight, u_in)
    if sx is None and needs_input_grad[1]:
        sx = scan(x, u_w)
    return sx, sw, sg


def check_operand(x, name: str) -> None:
    """x must be a float tensor whose values are float32-representable (all FloatFormat values are)."""
    check_tensor(x, name)
    if x.dtype == torch.float64 and not x.is_meta:  # a meta tensor has no values to check
        with torch.no_grad():
            back = x.to(torch.float32).to(torch.float64)
            same = (back == x) | torch.isnan(x)
            if not bool(same.all()):
                bad = x[~same].reshape(-1)[0].item()
                raise ValueError(
                    f"{name} holds float64 values that are not float32 values (e.g. {bad!r}); a MAD unit's "
                    "operands must be values of a format: quantize them first (emunum.quantize)")


def check_same_device(**tensors) -> torch.device:
    devices = {k: t.device for k, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError("tensors must share one device, got " + ", ".join(f"{k} on {d}" for k, d in devices.items()))
    return next(iter(devices.values()))


def output_dtype(unit: MADUnit, *tensors) -> torch.dtype:
    """The promoted dtype of the inputs; float32-or-narrower results need acc_fmt values that fit float32."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    if dtype != torch.float64 and not unit.output_fits_float32():
        raise ValueError(f"MADUnit.acc_fmt={unit.acc_fmt.name} has values that float32 cannot hold exactly; "
                         f"pass float64 tensors (got {dtype})")
    return dtype


def seed_for(unit: MADUnit, seed) -> int:
    return resolve_seed(seed) if unit.stochastic else 0


def _host_fallback(device: torch.device) -> None:
    if device.type not in _warned_devices:
        _warned_devices.add(device.type)
        warnings.warn(f"emunum has no MAD kernel for device {device.type!r}; computing on the CPU",
                      RuntimeWarning, stacklevel=3)


def check_accumulator_input(unit: MADUnit) -> None:
    """Units that can start a dot product from an accumulator value c (addmm/baddbmm): multi-term and exact
    units, and one-product units run as terms=1, lossless steps (lanes=1, chunk=None, float formats,
    deterministic rounding; bit-identical to their matmul with c = 0)."""
    if unit.is_multiterm:
        return
    if unit.multiplier is not None:  # the multiplier kernels start lane 0 from c (lanes=1, chunk=None)
        if unit.lanes != 1 or unit.chunk is not None:
            raise ValueError(f"addmm/baddbmm on {unit}: an accumulator input with a multiplier needs lanes=1 and "
                             "chunk=None")
        return
    from ..formats import FloatFormat, RoundMode

    ok = (unit.lanes == 1 and unit.chunk is None and unit.order == Order.SEQUENTIAL
          and isinstance(unit.acc_fmt, FloatFormat) and unit.acc_rounding != RoundMode.STOCHASTIC
          and (unit.fused or (isinstance(unit.mul_fmt, FloatFormat) and unit.mul_rounding != RoundMode.STOCHASTIC)))
    if not ok:
        raise ValueError(f"addmm/baddbmm on {unit}: the accumulator's initial value needs a multi-term or exact "
                         "unit, or lanes=1, chunk=None, order='sequential', float formats and deterministic "
                         "rounding")


def gemm(A: torch.Tensor, B: torch.Tensor, unit: MADUnit, seed: int, bias: torch.Tensor | None = None,
         nb: int | None = None, c: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
         flops: int | None = None, scans: tuple | None = None) -> torch.Tensor:
    """out (nb, M, N) float64: out[b] = A[b % bA] @ B[b % bB] (+ bias[b]) on ``unit``.

    A: (bA, M, K), B: (bB, K, N), float32-representable values (already checked); bias: None or a tensor
    broadcastable to (nb, M, N), any float values; nb defaults to max(bA, bB). ``seed`` is the resolved
    stochastic-rounding seed. Order.ANY units run torch.matmul in float32 instead (see ``MADUnit``).
    ``flops``: what ``emunum.coverage`` counts for it (default 2 * nb * M * N * K), the count torch gives the op
    this GEMM computes, where the emulation computes more (a bias gradient's sum, a convolution's input
    gradient over the padding). ``scans``: None or (scan for A, scan for B), each None or ``scan`` of a tensor
    holding every nonzero value of that operand (the CPU fast kernel's planner uses them; same bits).
    """
    bA, M, K = A.shape
    bB, K2, N = B.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: A is {tuple(A.shape)}, B is {tuple(B.shape)}")
    nb = max(bA, bB) if nb is None else nb
    if gemm_listener.LISTENERS:  # emunum.coverage counts this GEMM's FLOPs
        with gemm_listener.native("mad_gemm", 2 * nb * M * N * K if flops is None else flops):
            return _gemm(A, B, unit, seed, bias, nb, c, dtype, scans)
    return _gemm(A, B, unit, seed, bias, nb, c, dtype, scans)


def conv_gemm(x: torch.Tensor, A: torch.Tensor, unit: MADUnit, geometry: tuple, bias: torch.Tensor | None = None,
              flops: int | None = None, scans: tuple | None = None) -> torch.Tensor | None:
    """The per-sample GEMMs of a 2-D convolution, out (N*G, O/G, Ho*Wo) float64: out[n*G + g] = A[g] @ the im2col
    columns of sample n's group g (+ bias), as ``gemm`` on the (N*G, K, Ho*Wo) column tensor, without making it
    (``kernels/conv_fast.py``: each sample's columns right before its GEMM). None where that kernel does not run
    (not a C-contiguous float32 CPU x, a unit off the fast kernel, a float64 plan): the caller makes the columns.
    x (N, C, H, W), already padded; A (G, O/G, K); geometry (kh, kw, sh, sw, dh, dw, Ho, Wo); bias (O,) or None;
    flops and scans (A's, x's) as ``gemm``'s."""
    if not (fast_layout(unit, x.device) and kernel_readable(x)):
        return None
    out = _conv_gemm(x, A, unit, geometry, bias, scans)
    if out is not None and gemm_listener.LISTENERS:
        G, Og, K = A.shape
        _count_ran(2 * x.shape[0] * G * Og * out.shape[2] * K if flops is None else flops)
    return out


def _count_ran(flops: int) -> None:
    """Report to ``emunum.coverage`` a GEMM that ran on a kernel here, once it has run (where it did not, the
    fallback's ``gemm`` counts itself)."""
    with gemm_listener.native("mad_gemm", flops):
        pass


def _conv_gemm(x, A, unit, geometry, bias, scans):
    from ..kernels import gemm_cpu

    G, Og, _ = A.shape
    out = np.empty((x.shape[0] * G, Og, geometry[6] * geometry[7]))
    b = None if bias is None else bias.detach().to(torch.float64).numpy()
    mulp, accp = _unit_entry(unit)[1]
    with torch.no_grad():
        ran = gemm_cpu.conv(x.detach().numpy(), _np32(A), b, out, int(unit.fused), mulp, accp, unit.lanes,
                            unit.chunk or 0, geometry, scans or (None, None))
    return torch.from_numpy(out) if ran else None


def conv_wgrad(grad: torch.Tensor, x: torch.Tensor, unit: MADUnit, kernel: tuple, stride: tuple, dilation: tuple,
               scans: tuple | None = None) -> torch.Tensor | None:
    """A convolution's weight gradient (groups=1), out (1, O, C*kh*kw) float64: the dot over (n, oy, ox) in C order
    of grad[n, o, oy, ox] * x's tap (c, i, j) at (n, oy, ox), as ``gemm`` on grad as (O, N*Ho*Wo) and the im2col rows
    (N*Ho*Wo, C*kh*kw), without laying either out (``kernels/conv_fast.wgrad_fast``). None where that kernel does
    not run (``gemm_cpu.conv_wgrad``; x not a C-contiguous float32 CPU tensor; a unit off the fast kernel): the
    caller lays the operands out. x (N, C, H, W), padded; grad (N, O, Ho, Wo), float32-representable values;
    scans (grad's, x's) as ``gemm``'s."""
    if not (fast_layout(unit, x.device) and kernel_readable(x)):
        return None
    out = _conv_wgrad(grad, x, unit, kernel, stride, dilation, scans)
    if out is not None and gemm_listener.LISTENERS:
        _count_ran(2 * grad.numel() * out.shape[2])
    return out


def _conv_wgrad(grad, x, unit, kernel, stride, dilation, scans):
    from ..kernels import gemm_cpu

    N, C, H, W = x.shape
    O, Ho, Wo = grad.shape[1], grad.shape[2], grad.shape[3]
    (kh, kw), (dh, dw) = kernel, dilation
    c, i, j = np.meshgrid(np.arange(C), np.arange(kh), np.arange(kw), indexing="ij")
    taps = np.ascontiguousarray((c * H * W + i * dh * W + j * dw).reshape(-1), dtype=np.int64)
    out = np.empty((1, O, C * kh * kw))
    mulp, accp = _unit_entry(unit)[1]
    with torch.no_grad():
        g = np.ascontiguousarray(grad.detach().resolve_neg().to(torch.float32).numpy()).reshape(N, O, Ho * Wo)
        ran = gemm_cpu.conv_wgrad(g, x.detach().numpy(), taps, out, int(unit.fused), mulp, accp, unit.lanes,
                                  unit.chunk or 0, (stride[0], stride[1], Wo), scans or (None, None))
    return torch.from_numpy(out) if ran else None


def _gemm(A, B, unit, seed, bias, nb, c, dtype, scans=None):
    bA, M, K = A.shape
    bB, _, N = B.shape
    device = A.device
    if device.type == "meta":  # shape propagation: meta tensors have no values to compute with
        return torch.empty((nb, M, N), dtype=torch.float64, device=device)
    if unit.multiplier is not None:
        if device.type not in ("cpu", "cuda"):
            _host_fallback(device)
            return gemm(A.cpu(), B.cpu(), unit, seed, None if bias is None else bias.cpu(), nb,
                        None if c is None else c.cpu(), dtype).to(device)
        return approx_backend.gemm(A, B, unit, seed, bias, nb, c)
    if unit.is_multiterm or c is not None:
        return _gemm_multiterm(A, B, unit, seed, bias, nb, c, dtype)
    if unit.order == Order.ANY:
        idx = torch.arange(nb, device=device)
        out = torch.matmul(A.to(torch.float32)[idx % bA], B.to(torch.float32)[idx % bB])
        if bias is not None:
            out = out + bias.to(torch.float32)
        return out.to(torch.float64)
    with torch.no_grad():
        if device.type == "cuda":
            return _gemm_cuda(A, B, unit, seed, bias, nb)
        if device.type != "cpu":
            _host_fallback(device)
            b = None if bias is None else bias.cpu()
            return gemm(A.cpu(), B.cpu(), unit, seed, b, nb).to(device)
        out = np.empty((nb, M, N), dtype=np.float64)
        if out.size == 0:  # no output element: the kernel would write nothing (and need not be compiled)
            return torch.from_numpy(out)
        from ..kernels import gemm_cpu

        bias_np = None
        if bias is not None:
            bias_np = np.ascontiguousarray(
                np.broadcast_to(bias.detach().to(torch.float64).numpy(), (nb, M, N)))
        mulp, accp = _unit_entry(unit)[1]
        gemm_cpu.gemm(_np32(A), _np32(B), bias_np, out, int(unit.fused), mulp, accp, unit.lanes, unit.chunk or 0,
                      _keys(seed), unit.sr_bits, scans=scans)
        return torch.from_numpy(out)


def _gemm_multiterm(A, B, unit, seed, bias, nb, c, dtype):
    """The multi-term / exact datapath (``kernels.gemm_multiterm``); c: None (+0) or broadcastable to
    (nb, M, N). B is handed over transposed, (bB, N, K)."""
    check_accumulator_input(unit)
    M, N = A.shape[1], B.shape[2]
    device = A.device
    with torch.no_grad():
        if device.type not in ("cpu", "cuda"):
            _host_fallback(device)
            return _gemm_multiterm(A.cpu(), B.cpu(), unit, seed, None if bias is None else bias.cpu(), nb,
                                   None if c is None else c.cpu(), dtype).to(device)
        a32 = A.detach().to(torch.float32).contiguous()
        bt32 = B.detach().to(torch.float32).transpose(1, 2).contiguous()
        c64 = (torch.zeros((nb, M, N), dtype=torch.float64, device=device) if c is None
               else c.detach().to(torch.float64).expand(nb, M, N).contiguous())
        has_bias = bias is not None
        bias64 = (bias.detach().to(torch.float64).expand(nb, M, N).contiguous() if has_bias
                  else torch.zeros((1, 1, 1), dtype=torch.float64, device=device))
        out = torch.empty((nb, M, N), dtype=torch.float64, device=device)
        prm, mulp, accp, outerp = (tuple(int(v) for v in p) for p in unit.multiterm_params(dtype))
        if out.numel() == 0:  # no output element: the kernel would write nothing (and need not be compiled)
            return out
        keys = tuple(np.uint64(k) for k in stream_keys(seed))
        if device.type == "cuda":
            from ..kernels import gemm_multiterm_cuda

            gemm_multiterm_cuda.gemm_torch(a32, bt32, c64, bias64, has_bias, out, prm, mulp, accp, outerp, keys,
                                           unit.sr_bits)
        else:
            from ..kernels import gemm_multiterm

            gemm_multiterm.gemm_auto(a32.numpy(), bt32.numpy(), c64.numpy(), bias64.numpy(), has_bias, out.numpy(),
                                prm, mulp, accp, outerp, keys, unit.sr_bits)
        return out


def _np32(x: torch.Tensor) -> np.ndarray:
    """Exact float32 numpy copy/view of a float32-representable CPU tensor."""
    return np.ascontiguousarray(x.detach().to(torch.float32).numpy())


_NUMPY_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def contiguous(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A C-contiguous copy of t's values (t itself where that is one already), cast to ``dtype`` (default t's)
    as ``Tensor.to`` casts; detached. On the CPU numpy copies: for the small-dimension transposes of the layers'
    GEMM layouts it is several times faster than torch's strided copy."""
    t = t.detach()
    dtype = t.dtype if dtype is None else dtype
    if t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES and dtype in _NUMPY_DTYPES:
        return torch.from_numpy(np.ascontiguousarray(t.numpy(), dtype=_NUMPY_DTYPES[dtype]))
    return torch.empty(t.shape, dtype=dtype, device=t.device).copy_(t)


def _gemm_cuda(A, B, unit, seed, bias, nb):
    from ..kernels import gemm_cuda

    M, N = A.shape[1], B.shape[2]
    out = torch.empty((nb, M, N), dtype=torch.float64, device=A.device)
    a32 = A.detach().to(torch.float32).contiguous()
    b32 = B.detach().to(torch.float32).contiguous()
    has_bias = bias is not None
    bias64 = (bias.detach().to(torch.float64).expand(nb, M, N).contiguous() if has_bias
              else torch.zeros((1, 1, 1), dtype=torch.float64, device=A.device))
    mulp, accp = unit.kernel_params()
    gemm_cuda.gemm_torch(a32, b32, bias64, has_bias, out, int(unit.fused), mulp, accp, unit.lanes, unit.chunk or 0,
                         stream_keys(seed), unit.sr_bits)
    return out


def elementwise(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, unit: MADUnit, seed: int) -> torch.Tensor:
    """round_acc(a*b + c) (fused) or round_acc(round_mul(a*b) + c), element-wise over broadcast shapes;
    float64 result of the broadcast shape. Counters: the flat C-order index of the result."""
    if unit.is_multiterm:
        raise ValueError(f"mad (element-wise) runs one product per output; {unit} is a multi-term or exact unit: "
                         "use matmul, addmm or baddbmm")
    shape = torch.broadcast_shapes(a.shape, b.shape, c.shape)
    device = a.device
    if device.type == "meta":  # shape propagation, as gemm
        return torch.empty(shape, dtype=torch.float64, device=device)
    with torch.no_grad():
        if device.type not in ("cpu", "cuda"):
            _host_fallback(device)
            return elementwise(a.cpu(), b.cpu(), c.cpu(), unit, seed).to(device)
        a32 = a.detach().to(torch.float32).expand(shape).contiguous().reshape(-1)
        b32 = b.detach().to(torch.float32).expand(shape).contiguous().reshape(-1)
        c64 = c.detach().to(torch.float64).expand(shape).contiguous().reshape(-1)
        out = torch.empty(a32.numel(), dtype=torch.float64, device=device)
        mulp, accp = unit.kernel_params()
        if out.numel() and unit.multiplier is not None:
            approx_backend.elementwise(a32, b32, c64, out, unit, seed)
        elif out.numel():
            if device.type == "cuda":
                from ..kernels import gemm_cuda

                gemm_cuda.mad_torch(a32, b32, c64, out, int(unit.fused), mulp, accp, stream_keys(seed),
                                    unit.sr_bits)
            else:
                from ..kernels import gemm_cpu

                gemm_cpu.mad(a32.numpy(), b32.numpy(), c64.numpy(), out.numpy(), int(unit.fused), mulp, accp,
                             stream_keys(seed), unit.sr_bits)
        return out.reshape(shape)
