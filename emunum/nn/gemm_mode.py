"""``GemmMode``: while a patched model's forward runs, torch's functional GEMMs are routed to ``GemmEmulator``.

A ``torch.overrides.TorchFunctionMode`` sees every call of torch's Python API (``torch.*``, ``Tensor``
methods and operators, ``torch.nn.functional``), so it catches the GEMMs of modules that ``patch`` did not
swap: attention products (``q @ k.transpose(-1, -2)``, ``torch.matmul``, ``bmm``, ``baddbmm``, ``einsum``,
``F.scaled_dot_product_attention``; torch's other products in ``products.py``), foreign layers that call
``F.linear``, ``torch.addmm`` or ``F.conv*d`` themselves (transformers' ``Conv1D``, weight-standardised
convolutions), and the recurrent layers' fused ``torch.lstm``/``gru``/``rnn_tanh``/``rnn_relu`` and their
``*_cell`` steps, run as their recurrences over emulated GEMMs (``recurrent.py``). Emulated layers switch it off
while they run (their GEMMs are their own), and so do modules that the policy's ``filter`` or
``keep_first_last`` excludes; a functional GEMM belongs to the innermost module that runs it.

What it cannot see: GEMMs that torch runs below its Python API for a single call (those in ``UNSUPPORTED`` are
named: ``linalg.vecdot`` and the backward GEMMs of linear solves), a C++/CUDA extension, or ``torch.ops.aten``
calls made from a compiled kernel. ``emunum.coverage`` counts those from the executed aten ops and names them.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode

from .. import gemm_listener
from . import products
from .functional import GemmEmulator, Unsupported, no_out
from .gemm_context import UNROUNDED, GemmContext, stack as ctx_stack
from .gemm_recompute import follow
from .gemm_suspend import active
from .recurrent import RECURRENT_KINDS, cell_handler, recurrent_handler


# Each handler takes the torch function's own parameter names (torch has checked them before a mode sees the
# call), so keyword calls such as BLOOM's ``torch.baddbmm(input=c, batch1=a, batch2=b)`` bind.
def _matmul(emu, input, other, *, out=None):
    no_out(out)
    return emu.matmul(input, other)


def _mm(emu, input, mat2, *, out=None):
    no_out(out)
    return emu.matmul(input, mat2)


def _mv(emu, input, vec, *, out=None):
    no_out(out)
    return emu.matmul(input, vec)


def _rmatmul(emu, self, other):
    return emu.matmul(other, self)


def _addmm(emu, input, mat1, mat2, *, beta=1, alpha=1, out=None):
    no_out(out)
    return emu.addmm(input, mat1, mat2, beta, alpha)


def _baddbmm(emu, input, batch1, batch2, *, beta=1, alpha=1, out=None):
    no_out(out)
    return emu.addmm(input, batch1, batch2, beta, alpha)


def _linear(emu, input, weight, bias=None):
    return emu.linear(input, weight, bias)


def _bilinear(emu, input1, input2, weight, bias=None):
    return emu.bilinear(input1, input2, weight, bias)


def _conv_transpose(nd):
    def run(emu, input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        return emu.conv_transpose(nd, input, weight, bias, stride, padding, output_padding, groups, dilation)
    return run


def _einsum(emu, equation, *operands):
    return emu.einsum(equation, *operands)


def _sdpa(emu, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return emu.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _conv(nd):
    def run(emu, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return emu.conv(nd, input, weight, bias, stride, padding, dilation, groups)
    return run


# torch function -> (the name reports use, handler(emu, *args, **kwargs))
HANDLERS: dict = {}
for _name, _fns, _h in (
        ("matmul", (torch.matmul, Tensor.matmul, Tensor.__matmul__, torch.linalg.matmul), _matmul),
        ("matmul", (Tensor.__rmatmul__,), _rmatmul),
        ("mm", (torch.mm, Tensor.mm), _mm), ("bmm", (torch.bmm, Tensor.bmm), _mm),
        ("mv", (torch.mv, Tensor.mv), _mv),
        ("addmm", (torch.addmm, Tensor.addmm), _addmm), ("baddbmm", (torch.baddbmm, Tensor.baddbmm), _baddbmm),
        ("linear", (F.linear,), _linear), ("bilinear", (F.bilinear,), _bilinear), ("einsum", (torch.einsum,), _einsum),
        ("scaled_dot_product_attention", (F.scaled_dot_product_attention,), _sdpa),
        ("conv1d", (F.conv1d,), _conv(1)), ("conv2d", (F.conv2d,), _conv(2)), ("conv3d", (F.conv3d,), _conv(3)),
        ("conv_transpose1d", (F.conv_transpose1d,), _conv_transpose(1)),
        ("conv_transpose2d", (F.conv_transpose2d,), _conv_transpose(2)),
        ("conv_transpose3d", (F.conv_transpose3d,), _conv_transpose(3)),
        *((kind, (getattr(torch, kind),), recurrent_handler(kind)) for kind in RECURRENT_KINDS),
        *((kind + "_cell", (getattr(torch, kind + "_cell"),), cell_handler(kind)) for kind in RECURRENT_KINDS),
        ("dot", (torch.dot, Tensor.dot, torch.vdot, Tensor.vdot), products.dot),
        ("inner", (torch.inner, Tensor.inner), products.inner), ("tensordot", (torch.tensordot,), products.tensordot),
        ("addmv", (torch.addmv, Tensor.addmv), products.addmv),
        ("addbmm", (torch.addbmm, Tensor.addbmm), products.addbmm),
        ("multi_dot", (torch.linalg.multi_dot,), products.multi_dot),
        ("chain_matmul", (torch.chain_matmul,), products.chain),
        ("addmm_", (Tensor.addmm_,), products.in_place(_addmm)),
        ("baddbmm_", (Tensor.baddbmm_,), products.in_place(_baddbmm)),
        ("addbmm_", (Tensor.addbmm_,), products.in_place(products.addbmm)),
        ("addmv_", (Tensor.addmv_,), products.in_place(products.addmv))):
    for _f in _fns:
        HANDLERS[_f] = (_name, _h)

def _transparent(fn):
    """A copy of the Python function ``fn`` (same code, defaults and closure) whose own torch-function check is
    off, so that, run with the mode on torch's stack, the mode sees the torch calls of its body. torch hands a
    mode such a function whole and pops the mode while the mode handles it: its GEMMs would run unseen."""
    code = getattr(fn, "__code__", None)
    if code is None or "has_torch_function" not in code.co_names:  # not the shape this relies on: leave it whole
        return None
    scope = dict(fn.__globals__)
    scope["has_torch_function"] = lambda *args: False
    body = types.FunctionType(code, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    body.__kwdefaults__ = fn.__kwdefaults__
    return body


# Python functions of torch's API whose bodies make GEMMs through calls the mode handles (F.linear, bmm,
# baddbmm, scaled_dot_product_attention): the mode runs their body with itself on the stack (transformers'
# WavLM calls F.multi_head_attention_forward itself; nn.MultiheadAttention is an emulated layer instead).
COMPOSITES: dict = {f: body for f in (F.multi_head_attention_forward,) if (body := _transparent(f)) is not None}

# the names GEMMs run by the mode report (``GemmContext.op``)
FUNCTIONAL_OPS = frozenset(name for name, _ in HANDLERS.values())

# GEMMs that the mode sees but does not emulate: they run as they are, and coverage names them (name, reason).
# Linear solves are no GEMMs to coverage, but their backward runs GEMMs inside torch's autograd formula (a
# triangular solve's grad_A = -tril(grad_B X^T)), where no torch function call is left to intercept: their
# outputs carry this context, so that coverage names those backward GEMMs for the solve (Qwen3-Next's gated
# delta rule) rather than as GEMMs outside a patched model.
_SOLVE = "a linear solve: the GEMMs of its backward run in torch's autograd formula, not emulated by emunum"
UNSUPPORTED: dict = {torch.linalg.vecdot: ("vecdot", "not emulated by emunum")}
for _f in (torch.linalg.solve_triangular, torch.triangular_solve, torch.linalg.solve, torch.linalg.inv,
           torch.cholesky_solve):
    UNSUPPORTED[_f] = (_f.__name__, _SOLVE)
del _name, _fns, _h, _f


class GemmModeError(ValueError):
    """A GEMM that a ``strict=True`` patch cannot emulate."""


class GemmMode(TorchFunctionMode):
    """Routes the functional GEMMs in ``HANDLERS`` to ``emu`` while ``off`` is 0 (``suspended_modes`` and
    excluded modules raise it). ``strict``: a GEMM it cannot emulate raises ``GemmModeError`` instead of
    running unemulated."""

    _emunum_gemm_mode = True

    def __init__(self, emu: GemmEmulator, strict: bool = False):
        super().__init__()
        self.emu, self.strict, self.off, self.depth = emu, strict, 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = HANDLERS.get(func)
        if entry is None:
            body = COMPOSITES.get(func)
            if body is not None and not self.off:
                _push_mode(self)
                try:
                    return body(*args, **kwargs)
                finally:
                    _pop_mode()
            if func in UNSUPPORTED and not self.off:
                return self._passed(func, *UNSUPPORTED[func], args, kwargs)
            return func(*args, **kwargs)
        if self.off:
            return func(*args, **kwargs)
        name, handler = entry
        if not self.emu.operands_rounded:
            return self._passed(func, name, UNROUNDED, args, kwargs, chosen=True)
        follow(self)
        stack = ctx_stack()
        stack.append(GemmContext(True, name))
        try:
            self.emu._emu_begin()  # a tracer samples functional GEMM calls as it samples a layer's forwards
            out = handler(self.emu, *args, **kwargs)
            if gemm_listener.LISTENERS:  # coverage tags the product here, whatever modes are on the stack
                gemm_listener.emulated(out)
            return out
        except Unsupported as e:
            stack[-1] = GemmContext(False, name, str(e))
            if self.strict:
                raise GemmModeError(f"emunum.patch(strict=True): {name} cannot be emulated: {e}") from None
            return func(*args, **kwargs)
        finally:
            stack.pop()

    def _passed(self, func, name: str, reason: str, args, kwargs, chosen: bool = False):
        if self.strict and not chosen:
            raise GemmModeError(f"emunum.patch(strict=True): {name} cannot be emulated: {reason}")
        stack = ctx_stack()
        stack.append(GemmContext(False, name, reason))
        try:
            return func(*args, **kwargs)
        finally:
            stack.pop()

    def __enter__(self):
        active().append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        active().remove(self)
        return super().__exit__(*exc)

    def push(self) -> None:
        """Enter the mode unless it is entered already (``depth`` counts the nested pushes)."""
        if self.depth == 0:
            self.__enter__()
        self.depth += 1

    def pop(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.__exit__(None, None, None)


class ModelHooks:
    """The forward hooks ``patch`` puts on a model: the root enters ``mode`` around its forward (re-entrant
    calls nest), and each excluded module switches it off around its own (with the reason for coverage)."""

    def __init__(self, mode: GemmMode):
        self.mode, self.handles = mode, []

    def attach_root(self, model) -> None:
        self.handles.append(model.register_forward_pre_hook(self._enter))
        self.handles.append(model.register_forward_hook(self._exit, always_call=True))

    def attach_excluded(self, module, reason: str) -> None:
        ctx = GemmContext(False, type(module).__name__, reason)
        mode = self.mode

        def pre(mod, args):
            mode.off += 1
            ctx_stack().append(ctx)

        def post(mod, args, out):
            ctx_stack().pop()
            mode.off -= 1

        self.handles.append(module.register_forward_pre_hook(pre))
        self.handles.append(module.register_forward_hook(post, always_call=True))

    def attach_nested(self, module) -> None:
        """Enter the mode around ``module``'s forward as well: nested (a no-op) inside the model's forward, and
        on its own where ``module`` runs outside it, as when an activation checkpoint recomputes it in backward."""
        self.handles.append(module.register_forward_pre_hook(lambda mod, args: self._push()))
        self.handles.append(module.register_forward_hook(lambda mod, args, out: self._pop(), always_call=True))

    def _enter(self, mod, args):
        self._push()

    def _exit(self, mod, args, out):
        self._pop()

    def _push(self) -> None:
        self.mode.push()

    def _pop(self) -> None:
        self.mode.pop()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
