"""A hook for ``emunum.coverage``: GEMMs that run in emunum's own kernels (MAD units), which torch's dispatcher
never sees, report their FLOPs here while a listener is set. Imports nothing; costs one global read."""
from __future__ import annotations

import contextlib

LISTENER = None  # an object with .native(op: str, flops: int) -> context manager, or None


def native(op: str, flops: int):
    """``with native(op, flops):`` around a GEMM computed outside torch's GEMM ops (a no-op without listener)."""
    lst = LISTENER
    return contextlib.nullcontext() if lst is None else lst.native(op, flops)
