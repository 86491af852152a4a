"""Rounding elision for emulated layers: a straight-through rounding that skips the roundings of tensors already
on the format's grid (``emunum.grid``), with the same values, gradients and seed draws (``docs/elision.md``).

``round_eliding(plan, x)`` is ``plan(x)`` (``autograd._Plan``, identity straight-through estimator) where:
- the forward rounding is skipped when x is on the forward format's grid (the result is then a fresh copy of x,
  laid out as the rounding's result would be; with ``keep=True``, for a GEMM operand that only the layer reads,
  x itself, or an alias of it, where x is laid out so);
- the backward rounding is skipped when the incoming gradient is on the backward format's grid (it is passed on);
- a skipped stochastic rounding with a fresh seed still draws that seed from torch's generator, so every
  rounding that remains, and everything else that draws from the generator, sees the same stream.
Results of the roundings that do run are tagged with their format.

Tags also cross ops that keep the grid: views (``grid.grid_of``); in the forward pass a max-pool whose input was
on the grid (its outputs are input elements); in the backward pass the nodes listed in ``_KEEP_GRID`` (views,
copies, ReLU's mask, non-overlapping max-pool), whose gradients for their input are the incoming gradient's
elements moved, or +0. Each rounding site registers a hook on those nodes of its input's history, up to the
previous rounding, that tags their gradient for the input when all their incoming gradients are on one grid.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import buffers, grid
from .autograd import _round_cpu, _unwrap_if_dead
from .formats import RoundMode
from .ops import eager_ok, ste_gradient
from .quantize import check_tensor, resolve_seed

_STOCHASTIC = RoundMode.STOCHASTIC

# backward nodes whose gradients for their input hold only elements of their incoming gradients, or +0
_MOVE_NODES = frozenset({
    "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "AliasBackward0", "CloneBackward0",
    "TransposeBackward0", "TransposeBackward1", "TBackward0", "PermuteBackward0", "UnsqueezeBackward0",
    "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2", "SliceBackward0", "SelectBackward0",
    "SplitBackward0", "SplitWithSizesBackward0", "UnbindBackward0", "ReluBackward0",
})
_POOL_NODES = frozenset({"MaxPool2DWithIndicesBackward0", "MaxPool3DWithIndicesBackward0"})
_WALK_DEPTH = 8  # nodes looked at above a rounding site's input


def _own_layout(x: Tensor) -> bool:
    """Whether the rounding of x would be laid out as x is (``quantize_checked``: x's strides if contiguous, C
    order if not or if huge)."""
    if not x.is_contiguous():
        return False
    if x.is_cpu and x.numel() * x.element_size() >= buffers.HUGE_MIN_BYTES:
        return x.stride() == torch.empty(x.shape, device="meta").stride()
    return True


def _fresh_copy(x: Tensor) -> Tensor:
    """A copy of x in the layout ``quantize_checked`` gives its result."""
    return x.clone() if _own_layout(x) else x.clone(memory_format=torch.contiguous_format)


def _in_rounding_layout(g: Tensor) -> Tensor:
    """g, or a copy of it laid out as its rounding would be (later ops see the strides they saw before)."""
    return g if _own_layout(g) else g.clone(memory_format=torch.contiguous_format)


def _non_overlapping(node) -> bool:
    """Whether a max-pool node's windows share no input element (each gets at most one gradient)."""
    k, s, d = node._saved_kernel_size, node._saved_stride, node._saved_dilation
    s = s or k
    return all(si >= di * (ki - 1) + 1 for ki, si, di in zip(k, s, d))


def _pooled_grid(x: Tensor):
    """The grid of x (or its base) when it is the untouched output of a max-pool over a tensor on a grid."""
    b = x._base if x._base is not None else x
    node = b.grad_fn
    if node is None or type(node).__name__ not in _POOL_NODES or b._version != 0:
        return None
    try:  # raises if the pooled tensor was written in place after the pool read it
        src = node._saved_self
    except RuntimeError:
        return None
    f = grid.grid_of(src)
    if f is not None:
        grid.mark(b, f)
    return f


def input_grid(x: Tensor):
    f = grid.grid_of(x)
    if f is None and x.grad_fn is not None:
        f = _pooled_grid(x)
    return f


def _propagate(grad_inputs, grad_outputs):
    f = dtype = None
    for g in grad_outputs:
        if g is None:
            continue
        fg = grid.grid_of(g)
        if fg is None or (f is not None and (fg != f or g.dtype != dtype)):
            return None
        f, dtype = fg, g.dtype
    if f is not None:
        for g in grad_inputs:
            if g is not None and g.dtype == dtype:  # (autograd casts a gradient to its input's dtype after the node)
                grid.mark(g, f)
    return None


# nodes whose gradients for their inputs are always new tensors: a grid tag on what they receive reaches no rounding
_SINK_NODES = frozenset({
    "MmBackward0", "BmmBackward0", "MulBackward0", "DivBackward0", "SoftmaxBackward0", "NativeLayerNormBackward0",
    "NativeBatchNormBackward0", "GeluBackward0", "SiluBackward0", "EmbeddingBackward0", "MeanBackward0",
    "MeanBackward1", "MaskedFillBackward0",
})


def _addmm_passes_on(node) -> bool:
    """Whether an ``addmm(self, mat1, mat2)`` node can hand its incoming gradient to ``self`` as it is: beta is 1
    (else it is scaled into a new tensor) and ``self`` has the result's shape (a broadcast ``self``, a Linear's
    bias, gets the engine's sum of the gradient: a new tensor). Its other gradients are matrix products."""
    nxt, nr = node.next_functions[0]
    return nxt is not None and node._saved_beta == 1 \
        and tuple(nxt._input_metadata[nr].shape) == tuple(node._input_metadata[0].shape)


def _sink(node) -> bool:
    """Whether ``node`` (the first node past a chain of grid-keeping nodes) drops every grid tag it receives:
    it is None, in ``_SINK_NODES``, an expand whose backward sums (a no-op expand passes its gradient on), or an
    addmm that cannot pass its gradient on to ``self`` (``_addmm_passes_on``)."""
    if node is None:
        return True
    name = type(node).__name__
    if name == "ExpandBackward0":
        return tuple(node._saved_self_sym_sizes) != tuple(node._input_metadata[0].shape)
    if name == "AddmmBackward0":
        return not _addmm_passes_on(node)
    return name in _SINK_NODES


def _hook_history(x: Tensor) -> None:
    """Register ``_propagate`` on the grid-keeping nodes that produced x, up to the previous rounding; not where
    the chain ends in a node that drops the tags (``_sink``): there the tags would reach no rounding."""
    node, chain, ends = x.grad_fn, [], None
    for _ in range(_WALK_DEPTH):
        name = type(node).__name__
        if node is None or not (name in _MOVE_NODES or (name in _POOL_NODES and _non_overlapping(node))):
            ends = (node,)
            break
        chain.append(node)
        nxt = node.next_functions
        if len(nxt) != 1:
            ends = tuple(n for n, _ in nxt)
            break
        node = nxt[0][0]
    # ends None: the walk stopped at its depth, and what lies beyond is unknown
    if not chain or (ends is not None and all(_sink(n) for n in ends)):
        return
    for n in chain:
        n.register_hook(_propagate)


def forward_eliding(x: Tensor, plan, keep: bool = False) -> Tensor:
    """``plan``'s forward value of x (``_ElideSTE``'s forward): skipped where x is on its grid; the result tagged.
    With ``keep``, a skipped rounding returns x itself where x is laid out as the rounding's result would be (the
    caller reads it and hands it to no one: a GEMM operand), else a fresh copy."""
    f = plan.forward
    have = input_grid(x)
    if f is None:
        y = x.clone(memory_format=torch.contiguous_format)
        if have is not None:
            grid.mark(y, have)
        return y
    if grid.nests(have, f):
        if plan.forward_mode is _STOCHASTIC and plan.seed is None:
            resolve_seed(None)  # the draw the rounding would have made
        grid.elided["forward"] += 1
        if keep and _own_layout(x):
            return x  # its own tag (or its base's) stays: it is on ``have``'s grid, which nests in f's
        y = _fresh_copy(x)
    else:
        y = plan.forward_value(x)
    if grid.taggable(f, y):
        grid.mark(y, f)
    return y


class _ElideSTE(torch.autograd.Function):
    """``autograd._EagerSTE`` for an identity estimator, with the roundings of on-grid tensors skipped."""

    @staticmethod
    def forward(ctx, x: Tensor, plan, keep: bool) -> Tensor:
        ctx.plan = plan
        return forward_eliding(x, plan, keep)  # x itself comes out as an alias: autograd makes it a view

    @staticmethod
    def backward(ctx, grad: Tensor):
        return backward_eliding(ctx.plan, grad), None, None


def backward_eliding(p, grad: Tensor) -> Tensor:
    """The gradient ``_ElideSTE`` passes to its input: ``grad`` rounded to ``p.backward``, or passed on (laid out
    as the rounding's result, its seed drawn) where it is on that grid; the rounded result is tagged."""
    if p.backward is None:
        return grad
    if grid.nests(grid.grid_of(grad), p.backward):
        if p.backward_mode is _STOCHASTIC and p.backward_seed is None:
            resolve_seed(None)
        grid.elided["backward"] += 1
        return _in_rounding_layout(grad)
    g = None
    if not (grad.requires_grad and torch.is_grad_enabled()) and eager_ok(grad):
        g = _round_cpu(grad, p.backward, p.backward_mode, p.backward_seed, p.sr_bits)
    if g is None:
        g = ste_gradient(grad, None, p.forward, p.backward, p.args[2], p.backward_mode, p.backward_seed,
                         p.sr_bits)
    if grid.taggable(p.backward, g):
        grid.mark(g, p.backward)
    return g


_elide_apply = super(torch.autograd.Function, _ElideSTE).apply  # as autograd._eager_ste_apply


def can_elide(plan) -> bool:
    """Whether ``round_eliding`` applies to the plan (an identity straight-through estimator)."""
    return not plan.clipped


def round_eliding(plan, x: Tensor, keep: bool = False) -> Tensor:
    """``plan(x)`` with the roundings of on-grid tensors skipped (module doc); plan must pass ``can_elide``.
    ``keep``: the result is a GEMM operand that only the caller reads (``forward_eliding``)."""
    check_tensor(x)
    if not eager_ok(x):
        return plan(x)
    if x.requires_grad and torch.is_grad_enabled():
        if plan.backward is not None:
            _hook_history(x)
        return _elide_apply(_unwrap_if_dead(x), plan, keep)
    return forward_eliding(x, plan, keep)


class _ReluEliding(torch.autograd.Function):
    """``torch.relu`` (or ``relu_``) and the rounding of its result to ``plan`` in one node, for an x on a grid
    that nests in the plan's forward format (so the forward rounding is skipped and the result is relu's own
    tensor, saved as ReluBackward0 saves it); backward: the gradient rounded (``backward_eliding``), then relu's
    gradient (``threshold_backward``, ReluBackward0's formula), tagged as ReluBackward0's hook would tag it."""

    @staticmethod
    def forward(ctx, x: Tensor, plan, have, inplace: bool) -> Tensor:
        ctx.plan = plan
        if inplace:
            y = x.relu_()
            ctx.mark_dirty(x)
        else:
            y = torch.relu(x)
        grid.mark(y, have)
        y = forward_eliding(y, plan, keep=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        (y,) = ctx.saved_tensors
        g = backward_eliding(ctx.plan, grad)
        gx = torch.ops.aten.threshold_backward(g, y, 0)
        _propagate((gx,), (g,))
        return gx, None, None, None


_relu_apply = super(torch.autograd.Function, _ReluEliding).apply


def relu_eliding(plan, x: Tensor, have, inplace: bool = False):
    """``round_eliding(plan, torch.relu(x))`` (``x.relu_()`` with ``inplace``) for an x on ``have``'s grid
    (``input_grid``) as one node, the same values, gradients, tags and seed draws; None where it does not apply
    (then the caller takes the two steps): x not a float32/float64 tensor in eager mode that requires grad, of
    fewer elements than elision starts at (``grid.set_min_elements``), ``have`` not nested in the plan's format,
    or, in place, x a leaf, a view or not laid out as a rounding's result (``relu_`` must return x itself). The
    history above x is hooked as ``round_eliding`` hooks it above relu's result (the node tags its own gradient)."""
    if not (x.requires_grad and torch.is_grad_enabled() and eager_ok(x) and x.dtype in grid._DTYPES
            and x.numel() >= grid._min_elements[0] and plan.forward is not None and grid.nests(have, plan.forward)):
        return None
    if inplace and (x.is_leaf or x._base is not None or not _own_layout(x)):
        return None
    if plan.backward is not None:
        _hook_history(x)
    # tagged again: autograd bumps a dirty input's version after the node's forward, which voids the tag inside
    return grid.mark(_relu_apply(_unwrap_if_dead(x), plan, have, inplace), have)
