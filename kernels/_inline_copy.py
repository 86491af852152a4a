"""Compile ``inline="always"`` kernels in half the time, with the same machine code.

Every kernel here inlines its scalar cores (``njit(inline="always")``). numba inlines a callee by copying its IR
(``InlineWorker.inline_ir``), block by block, each block with a ``copy.deepcopy`` of its own: every block then
copies the whole variable scope again (each ``ir.Var`` holds the scope), so a copy costs blocks x variables, and
copying was about half of a kernel's compile time (a ``gemm_vec`` variant 23 CPU-s, an element-wise kernel 17).

``install()`` makes that copy take one memo for all the blocks of one copy: the scope and every object shared
between blocks are copied once and stay shared in the copy, as they are in the IR being copied (one scope per
function is numba's own invariant). Nothing else changes: a second copy still gets fresh objects, and the
compiled code is the same bit for bit (``tests/reliability/test_inline_copy.py`` compares the assembly).

It edits numba's own source text of that method at run time and installs the result only where the text is
exactly the one expected; with another numba it does nothing. It is opt-in: ``EMUNUM_NUMBA_INLINE_COPY=1``
installs it when a kernel module is imported. The test suite sets it (tests/conftest.py), so ``make test``
compiles faster; a user's process keeps numba's own copy unless it asks, because patching a dependency's
internals is not a library's call to make for its users.
"""
from __future__ import annotations

import inspect
import os
import textwrap

from numba.core import inline_closurecall as _icc

_OLD = """        kernel_copy.blocks = {}
        for block_label, block in the_ir.blocks.items():
            new_block = copy.deepcopy(the_ir.blocks[block_label])"""
_NEW = """        kernel_copy.blocks = {}
        memo = {}
        for block_label, block in the_ir.blocks.items():
            new_block = copy.deepcopy(the_ir.blocks[block_label], memo)"""

installed = False


def install() -> bool:
    """Install the one-memo copy into numba's ``InlineWorker.inline_ir`` once; whether it is installed."""
    global installed
    if installed or os.environ.get("EMUNUM_NUMBA_INLINE_COPY", "0") != "1":
        return installed
    try:
        src = textwrap.dedent(inspect.getsource(_icc.InlineWorker.inline_ir))
    except (OSError, TypeError):  # no source (a frozen install): numba's own copy
        return False
    if src.count(_OLD) != 1:
        return False
    ns: dict = {}
    exec(compile(src.replace(_OLD, _NEW), _icc.__file__, "exec"), _icc.__dict__, ns)
    ns["inline_ir"].__wrapped_numba__ = _icc.InlineWorker.inline_ir
    _icc.InlineWorker.inline_ir = ns["inline_ir"]
    installed = True
    return True
