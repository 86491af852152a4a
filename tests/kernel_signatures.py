"""The compiled signatures of a numba kernel that differ only in what numba types apart but the kernel does not
use: an array's read-only flag, a literal integer against its plain type, one integer type against another. Each
such pair is one compile too many (seconds each for the GEMM kernels)."""
from __future__ import annotations

from numba.core import types


def _plain(t):
    if isinstance(t, types.Array):
        return t.copy(readonly=False)
    if isinstance(t, types.Literal):
        return _plain(types.unliteral(t))
    if isinstance(t, types.Integer):
        return types.int64
    if isinstance(t, types.BaseTuple):
        return types.Tuple([_plain(v) for v in t])
    return t


def signatures(dispatcher, disk: bool = False) -> set:
    """The argument types ``dispatcher`` has compiled for in this process (compiled or loaded from the cache, for
    a call from Python or a compiled caller typed here); disk: also those in numba's disk index for its current
    source, which holds what any process compiled, also for compiled callers that this process loaded from the
    cache (and so did not type again). Only for kernels whose callers are in their own module: the index keeps
    entries until that module changes, so a caller elsewhere that was fixed since would still show its old
    types."""
    sigs = set(dispatcher.signatures)
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if disk and cache_file is not None:
        sigs |= {key[0] for key in cache_file._load_index()}
    return sigs


def needless_variants(dispatcher, disk: bool = False) -> list[list[str]]:
    """Groups of two or more of ``signatures(dispatcher, disk)`` that are one signature up to the read-only flag,
    integer literals and integer types."""
    groups: dict[tuple, list[str]] = {}
    for sig in signatures(dispatcher, disk):
        groups.setdefault(tuple(_plain(t) for t in sig), []).append(str(sig))
    return [g for g in groups.values() if len(g) > 1]
