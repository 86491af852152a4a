"""The per-thread list of active functional-GEMM modes (``gemm_mode.GemmMode``) and ``suspended_modes``, which
switches them off while an emulated layer runs (the layer rounds its own GEMMs)."""
from __future__ import annotations

import threading

import torch

_LOCAL = threading.local()
_len_stack = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_pop = torch._C._pop_torch_function_stack
_push = torch._C._push_on_torch_function_stack


def active() -> list:
    """The GemmModes entered on this thread, innermost last."""
    a = getattr(_LOCAL, "active", None)
    if a is None:
        a = _LOCAL.active = []
    return a


class suspended_modes:
    """``with suspended_modes():`` every active GemmMode passes calls through, and those on top of torch's
    function-mode stack leave it (so that ``ops.eager_ok`` holds inside); all restored on exit."""

    __slots__ = ("modes", "popped")

    def __enter__(self):
        self.modes = modes = getattr(_LOCAL, "active", None)
        self.popped = []
        if modes:
            for m in modes:
                m.off += 1
            while _len_stack() and getattr(_stack_at(_len_stack() - 1), "_emunum_gemm_mode", False):
                self.popped.append(_pop())
        return self

    def __exit__(self, *exc):
        for m in reversed(self.popped):
            _push(m)
        if self.modes:
            for m in self.modes:
                m.off -= 1
        return False
