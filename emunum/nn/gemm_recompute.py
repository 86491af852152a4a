"""Code that torch runs again, or for the first time, in backward, outside the model's forward: ``follow(mode)``
makes it run with ``mode`` entered, as the forward did. Two kinds: the recomputation of an activation checkpoint
whose function runs functional GEMMs in its own body, and the hand-written ``backward`` of a custom
``torch.autograd.Function`` whose ``forward`` runs them (YOSO's attention computes its gradients with
``torch.matmul``): its GEMMs are emulated as the mode emulates any functional GEMM (same roles: the incoming
gradient is an ``input`` operand, the product an ``output``).

``patch`` enters the mode around the model's forward and around each module that ran emulated functional GEMMs
(``functional_patch``), so a checkpointed submodule recomputes emulated. A function checkpointed in a forward's
body (``checkpoint(self._attend, x)``) is not a module: torch calls it again in backward, outside the model's
forward, and without this its GEMMs would run unemulated (the non-reentrant checkpoint then raises
``CheckpointError``, the reentrant one gives other gradients). ``GemmMode`` calls ``follow`` when it emulates a
GEMM under grad mode or inside a reentrant checkpoint's forward; it wraps the recomputation that torch keeps:
- non-reentrant (``use_reentrant=False``): the ``recompute_fn`` of the checkpoint frame whose saved-tensor hooks
  are innermost;
- reentrant: ``ctx.run_function`` of the innermost ``CheckpointFunction.forward`` on the Python stack (it runs
  the function under ``no_grad``);
- a custom Function (``forward(ctx, ...)`` runs under ``no_grad`` too): the innermost such ``forward`` on the
  Python stack, if no checkpoint's is inside it, gets an ``apply`` of its own on its ``ctx`` (torch's autograd
  engine calls ``ctx.apply(*grads)`` to run the node's backward), which enters the mode around the class's.

All three are torch internals (torch 2.13); where their shape differs, ``follow`` does nothing and the code runs
as before (``emunum.coverage`` then reports its GEMMs as unemulated backward GEMMs). Cost per emulated GEMM: one
look at the saved-tensor hooks under grad mode (~0.3 us), a walk of the Python stack under ``no_grad`` (~4 us
for 30 frames).
"""
from __future__ import annotations

import sys
import weakref

import torch

try:
    from torch.utils.checkpoint import CheckpointFunction, _checkpoint_hook
    _REENTRANT_FORWARD = CheckpointFunction.forward.__code__
    _PACK = next(c for c in _checkpoint_hook.__init__.__code__.co_consts
                 if getattr(c, "co_name", None) == "pack_hook" and "frame" in c.co_freevars)
except (ImportError, AttributeError, StopIteration):  # another torch: nothing to follow
    _REENTRANT_FORWARD = _PACK = None
try:
    from torch.autograd.function import BackwardCFunction
except ImportError:  # another torch: custom Functions are not followed
    BackwardCFunction = None

_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_MAX_DEPTH = 64  # Python frames searched for a reentrant checkpoint's or a custom Function's forward


def follow(mode) -> None:
    """If the innermost activation checkpoint or custom Function (above) has not been wrapped for ``mode``, make
    its recomputation or backward enter ``mode`` (``mode.push()`` / ``mode.pop()``)."""
    if _PACK is None or torch.compiler.is_compiling():
        return
    if torch.is_grad_enabled():
        hooks = _top_hooks(False)
        if hooks is not None and getattr(hooks[0], "__code__", None) is _PACK:
            frame = hooks[0].__closure__[_PACK.co_freevars.index("frame")].cell_contents
            _wrap(frame, "recompute_fn", mode)
        return
    f, depth = sys._getframe(2), 0
    while f is not None and depth < _MAX_DEPTH:
        code = f.f_code
        if code is _REENTRANT_FORWARD:
            _wrap(f.f_locals["ctx"], "run_function", mode)
            return
        if (code.co_name == "forward" and code.co_argcount and code.co_varnames[0] != "self"  # not a Module's
                and BackwardCFunction is not None):
            ctx = f.f_locals.get(code.co_varnames[0])
            if isinstance(ctx, BackwardCFunction):  # the innermost Function: wrapped unless it is emunum's
                if hand_written(ctx):
                    _wrap_backward(ctx, mode)
                return
        f, depth = f.f_back, depth + 1


def hand_written(node) -> bool:
    """Whether ``node`` (an autograd graph node or a Function's ``ctx``) runs the Python ``backward`` of a custom
    autograd Function other than emunum's own (whose GEMMs are their own)."""
    return (BackwardCFunction is not None and isinstance(node, BackwardCFunction)
            and not node._forward_cls.__module__.startswith("emunum."))


def _wrap_backward(ctx, mode) -> None:
    """Make the autograd engine run ``ctx``'s backward with ``mode`` entered (once per node)."""
    if getattr(ctx.__dict__.get("apply"), "_emunum_mode", None) is mode:
        return
    cls_apply, ref = type(ctx).apply, weakref.ref(ctx)  # a weak reference: no cycle through the node's dict
    ctx.apply = _entering(mode, lambda *grads: cls_apply(ref(), *grads))


def _wrap(owner, attr: str, mode) -> None:
    fn = getattr(owner, attr)
    if getattr(fn, "_emunum_mode", None) is not mode:
        setattr(owner, attr, _entering(mode, fn))


def _entering(mode, fn):
    """``fn`` run with ``mode`` entered, marked with it (so that it is wrapped once)."""

    def run(*args, **kwargs):
        mode.push()
        try:
            return fn(*args, **kwargs)
        finally:
            mode.pop()

    run._emunum_mode = mode
    return run
