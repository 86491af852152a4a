"""One autograd node per call of an element-wise Linear or Conv layer (``_FusedGemm``): the roundings of input,
weight, bias and output and the GEMM in its forward; the rounding of grad_output, the GEMM's gradients and the
roundings of grad_bias, grad_weight and grad_input in its backward. Same values, gradients, layouts, grid tags
and seed draws as the separate rounding nodes around torch's GEMM (docs/elision.md, "One node per layer").

Why the seed order is the same: the autograd engine runs the ready node with the highest sequence number first,
and a layer's separate nodes are created in one run (input, weight, bias roundings, the GEMM and its views, the
output rounding), so their backward runs output rounding, GEMM, then bias, weight and input roundings, with no
other node between them. The fused backward draws in that order, and only for the gradients that the engine
would compute (``torch._C._will_engine_execute_node``: ``autograd.grad`` with ``inputs`` skips some).

The GEMM's gradients are torch's own formulas for the graph ``F.linear`` / ``F.conv*d`` record (``addmm`` or
``mm`` on the operand flattened to 2-D, then the engine's sum of the bias gradient; ``convolution_backward``),
so they are the same tensors, bit for bit and stride for stride. ``fused_linear``/``fused_conv`` return None
wherever the node is not known to be the same (the layer then rounds role by role): a traced call, a
per-tensor-scaled role, a tracer or mode (``ops.eager_ok``), saved-tensor hooks, hooks on the parameters, DDP,
a non-CPU or non-contiguous operand, other layouts. Double backward through the node raises.

Off by default, because double backward through the node raises (the role-by-role path supports it) and it
saved 4% of a transformer step and nothing measurable on conv nets (benchmarks/RESULTS.md). The switch:
``EMUNUM_FUSED=1`` in the environment, or ``set_fused(True)`` / ``with fused(True):``.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as _module
from torch.nn.parallel import DistributedDataParallel as _DDP

from .. import grid
from ..autograd import Quantizer, eager_ste_gradient
from ..elide import _hook_history, backward_eliding, can_elide, forward_eliding
from ..ops import eager_ok
from ..policy import Role

ENV = "EMUNUM_FUSED"


def _env_default() -> bool:
    v = os.environ.get(ENV, "0").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{ENV}={v!r}: allowed: 1/true/yes/on or 0/false/no/off")


_enabled = [_env_default()]


def set_fused(on: bool) -> bool:
    """Turn the fused node on or off for the process; returns the previous setting."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be a bool, got {on!r}")
    prev, _enabled[0] = _enabled[0], on
    return prev


class fused:
    """``with fused(False):`` run emulated layers with one rounding node per role, then restore the setting."""

    def __init__(self, on: bool):
        if not isinstance(on, bool):
            raise TypeError(f"on must be a bool, got {on!r}")
        self.on = on

    def __enter__(self):
        self.prev = set_fused(self.on)
        return self

    def __exit__(self, *exc):
        set_fused(self.prev)
        return False


# ---- per-role rounding, as EmuLayer._emu_round does it --------------------------------------------------
_NONE, _PLAIN, _ELIDE = 0, 1, 2  # no rounding; _EagerSTE (plan(x)); _ElideSTE (round_eliding)


def _role_plans(layer):
    """((plan or None, single-quantiser module or None) per role INPUT, WEIGHT, OUTPUT), or None where a role is
    rounded otherwise (per-tensor scaling); cached on the layer."""
    cached = layer.__dict__.get("_emunum_fused")
    if cached is not None:
        return cached or None
    out = []
    for role in (Role.INPUT, Role.WEIGHT, Role.OUTPUT):
        merged = layer.__dict__.get("_emunum_q1", {}).get(role)
        fq, bq = layer._emunum_q[role]
        if merged is not None:
            out.append((merged._plan, None))
        elif fq is None and bq is None:
            out.append((None, None))
        elif (fq is None or bq is None) and type(fq if bq is None else bq) is Quantizer:
            q = fq if bq is None else bq
            out.append((q._plan, q))
        else:
            layer.__dict__["_emunum_fused"] = ()
            return None
    layer.__dict__["_emunum_fused"] = out = tuple(out)
    return out


def _modes(plans, elide: bool):
    """The path ``_emu_round`` takes per role; None where a module call could run hooks that the node skips."""
    modes = []
    for plan, q in plans:
        if plan is None:
            modes.append(_NONE)
        elif elide and can_elide(plan):
            modes.append(_ELIDE)
        else:
            if q is not None and (q._forward_hooks or q._forward_pre_hooks or q._backward_hooks
                                  or q._backward_pre_hooks or _module._global_forward_hooks
                                  or _module._global_forward_pre_hooks or _module._global_backward_hooks
                                  or _module._global_backward_pre_hooks):
                return None
            modes.append(_PLAIN)
    return modes


def _round_forward(mode: int, plan, x: Tensor) -> Tensor:
    if mode == _NONE:
        return x
    if mode == _ELIDE:  # the node's operands and its result are no one else's: an on-grid one is kept as it is
        return forward_eliding(x, plan, keep=True)
    return plan.forward_value(x)


def _round_backward(mode: int, plan, g: Tensor, x) -> Tensor:
    if mode == _NONE:
        return g
    if mode == _ELIDE:
        return backward_eliding(plan, g)
    return eager_ste_gradient(plan, g, x)


# ---- torch's gradient formulas for the GEMMs that F.linear records -------------------------------------
def _mm_mat1_backward(grad: Tensor, mat2: Tensor, mat1: Tensor) -> Tensor:
    """autograd's gradient of ``mat1`` in ``mat1 @ mat2`` (column-major mat1 gets a column-major gradient)."""
    s, st = mat1.shape, mat1.stride()
    if st[0] == 1 and st[1] == s[0]:
        return mat2.mm(grad.t()).t()
    return grad.mm(mat2.t())


def _mm_mat2_backward(grad: Tensor, mat1: Tensor, mat2: Tensor) -> Tensor:
    """autograd's gradient of ``mat2`` in ``mat1 @ mat2``."""
    s, st = mat2.shape, mat2.stride()
    if st[0] == 1 and st[1] == s[0]:
        return grad.t().mm(mat1).t()
    return mat1.t().mm(grad)


def _linear_backward(g: Tensor, xr: Tensor, wr: Tensor, has_bias: bool, nx: bool, nw: bool, nb: bool):
    """The gradients of ``F.linear(xr, wr, b)`` for a contiguous xr of 2 or more dims: ``addmm``/``mm`` of xr
    flattened to 2-D (viewed back), ``t`` of the weight, the engine's ``sum_to`` of the bias gradient."""
    mat2 = wr.t()
    if xr.dim() == 2:
        x2, g2 = xr, g
    else:
        x2, g2 = xr.reshape(-1, xr.shape[-1]), g.reshape(-1, g.shape[-1])
    gx = gw = gb = None
    if nx:
        gx = _mm_mat1_backward(g2, mat2, x2)
        if xr.dim() != 2:
            gx = gx.reshape(xr.shape)
    if nw:
        gw = _mm_mat2_backward(g2, x2, mat2).t()
    if nb and has_bias:
        gb = g2.sum_to_size(wr.shape[0])
    return gx, gw, gb


_conv_backward = torch.ops.aten.convolution_backward.default


class _FusedGemm(torch.autograd.Function):
    """The node (module doc). ``spec``: (modes, plans, gemm) with modes = (input, weight, output, bias), plans =
    (input, weight, output) and gemm = ("linear",) or ("conv", stride,
    padding, dilation, groups)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b, spec) -> Tensor:
        modes, plans, gemm = spec
        (mi, mw, mo, mb), (pi, pw, po) = modes, plans
        xr = _round_forward(mi, pi, x)
        wr = _round_forward(mw, pw, w)
        br = None if b is None else _round_forward(mb, pw, b)
        if gemm[0] == "linear":
            y = F.linear(xr, wr, br)
        else:
            y = torch.convolution(xr, wr, br, gemm[1], gemm[2], gemm[3], False, gemm[5], gemm[4])
        yr = _round_forward(mo, po, y)
        ctx.spec, ctx.has_bias = spec, b is not None
        clip = [t if p is not None and p.clipped and m == _PLAIN else None
                for t, p, m in ((x, pi, mi), (w, pw, mw), (b, pw, mb), (y, po, mo))]
        ctx.save_for_backward(xr, wr, *clip)
        return yr

    @staticmethod
    def backward(ctx, g: Tensor):
        if torch.is_grad_enabled():
            raise RuntimeError("double backward (create_graph=True) through an emulated layer's fused rounding "
                               "node is not supported; turn the node off first: emunum.nn.fused.set_fused(False) "
                               "or EMUNUM_FUSED=0")
        modes, plans, gemm = ctx.spec
        (mi, mw, mo, mb), (pi, pw, po) = modes, plans
        xr, wr, cx, cw, cb, cy = ctx.saved_tensors
        need = ctx.needs_input_grad
        nx, nw, nb = (need[i] and _runs(ctx.next_functions[i][0]) for i in range(3))
        g = _round_backward(mo, po, g, cy)
        if gemm[0] == "linear":
            gx, gw, gb = _linear_backward(g, xr, wr, ctx.has_bias, nx, nw, nb)
        else:
            bias = [wr.shape[0]] if ctx.has_bias else None
            gx, gw, gb = _conv_backward(g, xr, wr, bias, gemm[1], gemm[2], gemm[3], False, gemm[5], gemm[4],
                                        [nx, nw, nb and ctx.has_bias])
        if gb is not None:
            gb = _round_backward(mb, pw, gb, cb)
        if gw is not None:
            gw = _round_backward(mw, pw, gw, cw)
        if gx is not None:
            gx = _round_backward(mi, pi, gx, cx)
        return gx, gw, gb, None


_will_execute = torch._C._will_engine_execute_node


def _runs(node) -> bool:
    """Whether the engine runs ``node`` in this backward pass (a captured leaf of ``autograd.grad`` raises: it is
    one the pass computes a gradient for)."""
    if node is None:
        return False
    try:
        return _will_execute(node)
    except RuntimeError:
        return True


_apply = super(torch.autograd.Function, _FusedGemm).apply  # as autograd._eager_ste_apply
_saved_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_DTYPES = (torch.float32, torch.float64)


def _operand_ok(t: Tensor, dtype) -> bool:
    return (eager_ok(t) and t.is_cpu and t.dtype is dtype and t.is_contiguous()
            and not t._backward_hooks and not t._post_accumulate_grad_hooks)


def _spec(layer, x: Tensor, w: Tensor, b, gemm):
    """The node's spec for this call, or None where the layer must round role by role (module doc)."""
    if not torch.is_grad_enabled() or layer._emunum_policy.mad is not None:  # (the switch: the callers)
        return None
    trace = layer._emunum_trace
    if trace is not None and trace.active:
        return None
    if not (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return None
    dtype = x.dtype
    if dtype not in _DTYPES or not _operand_ok(x, dtype) or not _operand_ok(w, dtype) \
            or (b is not None and not _operand_ok(b, dtype)):
        return None
    if _saved_hooks(False) is not None or _DDP._active_ddp_module is not None:
        return None
    plans = _role_plans(layer)
    if plans is None:
        return None
    elide = grid._enabled[0] and layer.__dict__.get("_emunum_elide", True)
    modes = _modes(plans, elide)
    if modes is None:
        return None
    modes.append(modes[1])  # the bias: the weight's role
    lo = grid._min_elements[0]
    if elide and lo and _ELIDE in modes:  # tensors below the size elision starts at: as _emu_round, plainly
        small = (x.numel() < lo, w.numel() < lo, _out_numel(x, w, gemm) < lo, b is not None and b.numel() < lo)
        if any(m == _ELIDE and s for m, s in zip(modes, small)):
            plain = _modes(plans, False)
            if plain is None:
                return None
            plain.append(plain[1])
            modes = [p if s else m for m, p, s in zip(modes, plain, small)]
    return tuple(modes), tuple(p for p, _ in plans), gemm


def _out_numel(x: Tensor, w: Tensor, gemm) -> int:
    """Elements of the GEMM's result: ``F.linear``'s, or the convolution's (torch's output-size formula)."""
    if gemm[0] == "linear":
        return x.numel() // x.shape[-1] * w.shape[0] if x.shape[-1] else 0
    n = x.shape[0] * w.shape[0]
    for size, k, s, p, d in zip(x.shape[2:], w.shape[2:], gemm[1], gemm[2], gemm[3]):
        n *= max(0, (size + 2 * p - d * (k - 1) - 1) // s + 1)
    return n


def _call(x: Tensor, w: Tensor, b, spec) -> Tensor:
    mi, pi = spec[0][0], spec[1][0]
    if mi == _ELIDE and x.requires_grad and pi.backward is not None:
        _hook_history(x)  # as round_eliding does for the input
    return _apply(x, w, b, spec)


_LINEAR = ("linear",)


def fused_linear(layer, x: Tensor):
    """``layer``'s element-wise forward through one node, or None (then the caller rounds role by role)."""
    if not _enabled[0]:
        return None
    w, b = layer.weight, layer.bias
    if x.dim() < 2 or w.dim() != 2:
        return None
    spec = _spec(layer, x, w, b, _LINEAR)
    return None if spec is None else _call(x, w, b, spec)


# torch's convolutions (F.conv*d of the layer's own geometry); a registered class with its own stays role by role
_TORCH_CONV = frozenset({torch.nn.Conv1d._conv_forward, torch.nn.Conv2d._conv_forward, torch.nn.Conv3d._conv_forward})


def fused_conv(layer, x: Tensor):
    """The same for a Conv1d/2d/3d layer with zeros padding given as numbers and a batched input."""
    if not _enabled[0]:
        return None
    nd = len(layer.kernel_size)
    if type(layer)._conv_forward not in _TORCH_CONV or layer.padding_mode != "zeros" \
            or isinstance(layer.padding, str) or x.dim() != nd + 2:
        return None
    gemm = ("conv", list(layer.stride), list(layer.padding), list(layer.dilation), layer.groups, [0] * nd)
    w, b = layer.weight, layer.bias
    spec = _spec(layer, x, w, b, gemm)
    return None if spec is None else _call(x, w, b, spec)
