"""Interned format specs: a process-level list giving every spec that has no plain-int encoding of its own
(``TableFormat``, ``LogFormat``, ...) a small int id, so that custom ops (``int[]`` arguments) can carry it
as ``[3, id]``. ``intern(fmt)`` returns the same id for equal specs; ``lookup(id)`` gives the spec back.
Ids are valid within one process only (a compiled graph that bakes one in is too)."""
from __future__ import annotations

import threading

from .base import FormatSpec

_FORMATS: list = []
_IDS: dict = {}
_LOCK = threading.Lock()


def intern(fmt: FormatSpec) -> int:
    """The id of ``fmt`` (a hashable spec), assigned on first sight."""
    if not isinstance(fmt, FormatSpec):
        raise TypeError(f"intern: fmt must be a format spec (FormatSpec), got {type(fmt).__name__}")
    i = _IDS.get(fmt)
    if i is None:
        with _LOCK:
            i = _IDS.get(fmt)
            if i is None:
                i = len(_FORMATS)
                _FORMATS.append(fmt)
                _IDS[fmt] = i
    return i


def lookup(id: int) -> FormatSpec:
    """The spec interned as ``id``; ValueError for an id never handed out in this process."""
    if isinstance(id, bool) or not isinstance(id, int) or not 0 <= id < len(_FORMATS):
        raise ValueError(f"interned format id={id!r} is unknown in this process; ids 0..{len(_FORMATS) - 1} exist")
    return _FORMATS[id]
