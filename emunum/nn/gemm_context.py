"""What the running code is doing, GEMM-wise: a per-thread stack of ``GemmContext`` entries.

An emulated layer pushes one for its whole forward call, and ``GemmMode`` pushes one around each functional
GEMM that it sees (emulated or passed through, with the reason). ``emunum.coverage`` reads the top entry to
attribute each GEMM that torch executes; nothing else reads it. Pushing costs a list append.
"""
from __future__ import annotations

import threading
from typing import NamedTuple, Optional


class GemmContext(NamedTuple):
    """emulated: the GEMMs run here have operands on the policy's grid. op: the layer type or torch function.
    reason: why not, when not emulated."""

    emulated: bool
    op: str
    reason: Optional[str] = None


# reasons that the policy chose (a filter, keep_first_last, a role left unrounded): coverage reports them, and
# the first forward's warning (and strict=True) leaves them out
FILTERED = "excluded by the policy's filter"
KEPT = "keep_first_last"
UNROUNDED = "the policy leaves its input or weight unrounded"
CHOSEN = frozenset({FILTERED, KEPT, UNROUNDED})

_LOCAL = threading.local()


def stack() -> list:
    s = getattr(_LOCAL, "stack", None)
    if s is None:
        s = _LOCAL.stack = []
    return s


def current() -> Optional[GemmContext]:
    s = stack()
    return s[-1] if s else None
