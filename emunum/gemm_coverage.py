"""``emunum.coverage(model, *inputs)``: which GEMM FLOPs of one forward and backward ran on the format.

Every GEMM that torch executes is counted where it executes, at the aten level (``TorchDispatchMode``):
``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``addbmm``, ``mv``, ``addmv``, ``dot``, ``convolution`` and its
backward, and the fused attention kernels (``_scaled_dot_product_*``); GEMMs in emunum's own MAD kernels report
themselves (``emunum.gemm_listener``) with the count torch gives the same op (not the padding a MAD unit's
convolution gradient runs over, nor its bias-gradient sums), so a patched model's total equals the unpatched
one's. FLOPs are 2 per multiply-add (a fused attention kernel: its two
products forward, four backward).

Each GEMM is attributed to the innermost module running it (forward) or to the module whose forward created
the autograd node running it (backward), and classified by what emunum was doing there (``nn.gemm_context``):
- emulated: inside an emulated layer whose input and weight roles hold formats (or a MAD unit or block
  formats), or a functional GEMM that ``gemm_mode`` emulated; its backward GEMMs run on gradients rounded to
  the gradient roles;
- not emulated, with the reason: a module the filter or ``keep_first_last`` excludes, an op or dtype that
  emunum does not emulate, a GEMM below torch's Python API (nothing to intercept), no patched model around, or
  the hand-written ``backward`` of a custom autograd Function that ran without the mode (``nn.gemm_recompute``
  enters it where the Function's forward ran emulated GEMMs; the module that consumed the Function's output
  does not vouch for it).
"""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import gemm_listener
from .nn import gemm_context
from .nn.gemm_recompute import hand_written
from .nn.gemm_suspend import active as active_modes

_OUTSIDE = "no patched model around it (emunum.patch the model)"
_BELOW = "runs below torch's Python API (no torch function call to intercept)"
_UNTAGGED = "backward of an operation whose forward emunum did not see"


@dataclass(frozen=True)
class GemmRecord:
    """GEMM FLOPs of one (module, op, phase) that were or were not on the format, and why not."""

    module: str  # qualified name ("" for the model itself)
    op: str  # the emulated layer's type, the torch function or the aten op
    phase: str  # "forward" | "backward"
    emulated: bool
    reason: Optional[str]
    flops: int
    calls: int


@dataclass
class Coverage:
    """The result of ``emunum.coverage``: records and their FLOP totals."""

    records: list = field(default_factory=list)

    @property
    def total_flops(self) -> int:
        return sum(r.flops for r in self.records)

    @property
    def emulated_flops(self) -> int:
        return sum(r.flops for r in self.records if r.emulated)

    @property
    def fraction(self) -> float:
        """Emulated share of the GEMM FLOPs (1.0 when there were none)."""
        total = self.total_flops
        return 1.0 if total == 0 else self.emulated_flops / total

    def unemulated(self) -> list:
        return [r for r in self.records if not r.emulated]

    def to_dict(self) -> dict:
        return {"emulated_flops": self.emulated_flops, "total_flops": self.total_flops, "fraction": self.fraction,
                "records": [r.__dict__ for r in self.records]}

    def __str__(self) -> str:
        lines = [f"GEMM FLOPs emulated: {self.emulated_flops:,} of {self.total_flops:,} ({100 * self.fraction:.2f}%)"]
        for r in sorted(self.records, key=lambda r: (r.emulated, -r.flops)):
            what = "emulated" if r.emulated else f"NOT emulated: {r.reason}"
            lines.append(f"  {r.module or '<model>'} {r.op} ({r.phase}): {r.flops:,} FLOPs, {r.calls} calls, {what}")
        return "\n".join(lines)


# ---- FLOPs of the aten GEMMs ------------------------------------------------------------------------------
def _mm_flops(args, out) -> int:
    a = args[-2] if len(args) >= 3 and isinstance(args[-2], Tensor) and isinstance(args[-1], Tensor) else args[0]
    return 2 * out.numel() * a.shape[-1]


def _addbmm_flops(args, out) -> int:
    b1 = args[1]
    return 2 * out.numel() * b1.shape[0] * b1.shape[-1]


def _dot_flops(args, out) -> int:
    return 2 * args[0].numel()


def _trilinear_flops(args, out) -> int:
    """``_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim)`` (F.bilinear and its gradients): a product of
    three tensors, each unsqueezed at its expand dims, summed over sumdim: 2 FLOPs per point of their broadcast."""
    shapes = []
    for t, expand in zip(args[:3], args[3:6]):
        shape = list(t.shape)
        for d in sorted(expand):
            shape.insert(d, 1)
        shapes.append(shape)
    return 2 * math.prod(max(s[d] for s in shapes) for d in range(len(shapes[0])))


def _conv_flops(args, out) -> int:
    x, w, transposed = args[0], args[1], args[6]
    k = math.prod(w.shape[2:])
    if transposed:  # w (C_in, C_out/groups, *k): every input element meets C_out/groups * k weights
        return 2 * x.numel() * w.shape[1] * k
    return 2 * out.numel() * w.shape[1] * k


def _conv_backward_flops(args, out) -> int:
    gy, x, w, transposed, mask = args[0], args[1], args[2], args[7], args[10]
    fwd = _conv_flops((x, w, None, None, None, None, transposed), gy)
    return fwd * (int(bool(mask[0])) + int(bool(mask[1])))


def _sdpa_flops(args, out, backward=False) -> int:
    q, k = args[0 if not backward else 1], args[1 if not backward else 2]
    if q.dim() < 3:
        return 0
    n = 4 * math.prod(q.shape[:-2]) * q.shape[-2] * k.shape[-2] * q.shape[-1]
    return 2 * n if backward else n


def _rnn_flops(args, out, backward=False) -> int:
    """A fused recurrent layer (``mkldnn_rnn_layer``): every step multiplies the input and the hidden state by
    the gate weights (weight0 (gates, in), weight1 (gates, hidden))."""
    x, w_ih, w_hh = args[:3]
    steps = x.numel() // max(1, x.shape[-1])
    return (2 if backward else 1) * 2 * steps * (w_ih.numel() + w_hh.numel())


_A = torch.ops.aten
_FLOPS = {_A.mm.default: _mm_flops, _A.bmm.default: _mm_flops, _A.addmm.default: _mm_flops,
          _A.baddbmm.default: _mm_flops, _A.mv.default: _mm_flops, _A.addmv.default: _mm_flops,
          _A.addbmm.default: _addbmm_flops, _A.dot.default: _dot_flops, _A.vdot.default: _dot_flops,
          _A._trilinear.default: _trilinear_flops, _A.addmm_.default: _mm_flops, _A.baddbmm_.default: _mm_flops,
          _A.addmv_.default: _mm_flops, _A.addbmm_.default: _addbmm_flops,
          _A.convolution.default: _conv_flops, _A.convolution_backward.default: _conv_backward_flops}
for _name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
    if hasattr(_A, _name):
        _FLOPS[getattr(_A, _name).default] = _sdpa_flops
    if hasattr(_A, _name + "_backward"):
        _FLOPS[getattr(_A, _name + "_backward").default] = lambda a, o: _sdpa_flops(a, o, backward=True)
del _name
if hasattr(_A, "mkldnn_rnn_layer"):
    _FLOPS[_A.mkldnn_rnn_layer.default] = _rnn_flops
    _FLOPS[_A.mkldnn_rnn_layer_backward.default] = lambda a, o: _rnn_flops(a, o, backward=True)


def tensors_in(x):
    """Every tensor in x: a tensor, or tuples, lists and dicts (model outputs) holding them, depth first."""
    if isinstance(x, Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from tensors_in(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from tensors_in(y)


class GemmCounter:
    """Counts GEMM FLOPs while active (``with counter:``), attributed as the module docstring says."""

    def __init__(self, model: nn.Module):
        self.names = {}
        for name, m in model.named_modules(remove_duplicate=False):
            self.names.setdefault(id(m), name)
        self.modules: list = []  # names of the modules whose forward is running
        self.totals: dict = {}  # (module, op, phase, emulated, reason) -> [flops, calls]
        self.native_depth = 0
        self._stack = contextlib.ExitStack()

    # the context of what runs now: (module name, GemmContext or None)
    def _where(self):
        return (self.modules[-1] if self.modules else ""), gemm_context.current()

    def add(self, op: str, flops: int, module: str, ctx, phase: str) -> None:
        if ctx is None:
            emulated, reason = False, (_BELOW if any(not m.off for m in active_modes()) else _OUTSIDE)
        else:
            emulated, reason, op = ctx.emulated, ctx.reason, ctx.op
        key = (module, op, phase, emulated, reason)
        t = self.totals.setdefault(key, [0, 0])
        t[0] += flops
        t[1] += 1

    def count(self, op: str, flops: int) -> None:
        node = torch._C._current_autograd_node()
        if node is None:
            module, ctx = self._where()
            self.add(op, flops, module, ctx, "forward")
            return
        if gemm_context.current() is not None:  # a forward recomputed in backward (a reentrant checkpoint)
            module, ctx = self._where()
            self.add(op, flops, module, ctx, "backward")
            return
        tag = node.metadata.get("emunum_cov")
        if hand_written(node) and (tag is None or tag[1] is None or tag[1].emulated):
            # the Function's own backward code, run without the mode: the tag only says where its output went
            why = f"the backward of autograd Function {node._forward_cls.__qualname__}, run without emunum's mode"
            self.add(op, flops, "?" if tag is None else tag[0], gemm_context.GemmContext(False, op, why), "backward")
        elif tag is None:
            self.add(op, flops, "?", gemm_context.GemmContext(False, op, _UNTAGGED), "backward")
        else:
            self.add(op, flops, tag[0], tag[1], "backward")

    @contextlib.contextmanager
    def native(self, op: str, flops: int):
        if self.native_depth == 0:
            self.count(op, flops)
        self.native_depth += 1
        try:
            yield
        finally:
            self.native_depth -= 1

    def tag(self, out) -> None:
        """Give every autograd node reachable from ``out`` and not yet tagged the current context."""
        where = None
        for t in tensors_in(out):
            todo = [t.grad_fn]
            while todo:
                n = todo.pop()
                if n is None or "emunum_cov" in n.metadata:
                    continue
                if where is None:
                    where = self._where()
                n.metadata["emunum_cov"] = where
                todo.extend(f for f, _ in n.next_functions)

    def records(self) -> list:
        return [GemmRecord(m, op, ph, em, why, f, c) for (m, op, ph, em, why), (f, c) in self.totals.items()]

    # ---- activation -----------------------------------------------------------------------------------
    def __enter__(self):
        s = self._stack
        hooks = torch.nn.modules.module
        s.enter_context(hooks.register_module_forward_pre_hook(self._pre))
        s.enter_context(hooks.register_module_forward_hook(self._post, always_call=True))
        s.enter_context(_Tagger(self))
        s.enter_context(_Dispatch(self))
        gemm_listener.LISTENERS.append(self)
        s.callback(gemm_listener.LISTENERS.remove, self)
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    def _pre(self, module, args):
        self.modules.append(self.names.get(id(module), type(module).__name__))

    def _post(self, module, args, out):
        if torch.is_grad_enabled():
            self.tag(out)
        if self.modules:
            self.modules.pop()


class _Tagger(TorchFunctionMode):
    def __init__(self, counter: GemmCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            self.counter.tag(out)
        return out


class _Dispatch(TorchDispatchMode):
    def __init__(self, counter: GemmCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fl = _FLOPS.get(func)
        if fl is not None and not self.counter.native_depth:
            self.counter.count(str(func.overloadpacket.__name__), int(fl(args, out)))
        return out


def _loss(out) -> Tensor:
    """The sum of every floating tensor in the output that requires grad (0-dim)."""
    terms = [t.float().sum() for t in tensors_in(out) if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise ValueError("emunum.coverage: the model's output holds no floating tensor that requires grad; "
                         "pass loss_fn=callable(output) -> scalar tensor, or backward=False")
    return torch.stack(terms).sum()


def coverage(model: nn.Module, *inputs, loss_fn=None, backward: bool = True, **kwargs) -> Coverage:
    """Run ``model(*inputs, **kwargs)`` once and backward through ``loss_fn(output)`` (default: the sum of the
    output's floating tensors), and return the GEMM FLOPs that ran on the model's formats and those that did not,
    per module and op, with the reason (module docstring). Parameter gradients are accumulated as in any
    backward pass (call ``zero_grad`` after it if that matters). backward=False: the forward only."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(output) -> Tensor, got {loss_fn!r}")
    counter = GemmCounter(model)
    with counter, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the first forward's own coverage warning
        with torch.enable_grad():
            out = model(*inputs, **kwargs)
            if backward:
                loss = loss_fn(out) if loss_fn is not None else _loss(out)
                if not isinstance(loss, Tensor) or loss.numel() != 1:
                    raise ValueError(f"emunum.coverage: loss_fn returned {type(loss).__name__}"
                                     f"{tuple(loss.shape) if isinstance(loss, Tensor) else ''}; allowed: a "
                                     "one-element tensor")
                loss.backward()
    return Coverage(counter.records())
