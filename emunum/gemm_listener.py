"""Hooks for ``emunum.coverage``: GEMMs that run in emunum's own kernels (MAD units), which torch's dispatcher
never sees, report their FLOPs to every active listener, and the functional-GEMM mode hands each emulated
product to them while its context is current. Imports nothing but contextlib; costs one list read."""
from __future__ import annotations

import contextlib

LISTENERS: list = []  # objects with .native(op: str, flops: int) -> context manager


def native(op: str, flops: int):
    """``with native(op, flops):`` around a GEMM computed outside torch's GEMM ops (a no-op without listeners)."""
    if not LISTENERS:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for listener in list(LISTENERS):
        stack.enter_context(listener.native(op, flops))
    return stack


def emulated(out) -> None:
    """``out``, a functional GEMM's result, was computed in the current emulating context: listeners attribute its
    autograd nodes (and their backward GEMMs) to it."""
    for listener in list(LISTENERS):
        listener.tag(out)
