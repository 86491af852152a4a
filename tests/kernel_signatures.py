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


def signatures(dispatcher) -> set:
    """The argument types ``dispatcher`` has compiled for: in this process, and in numba's disk cache for its
    current source (what any process compiled, also a kernel that called it from compiled code: a caller loaded
    from the cache does not type its calls again)."""
    sigs = set(dispatcher.signatures)
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is not None:
        sigs |= {key[0] for key in cache_file._load_index()}
    return sigs


def needless_variants(dispatcher) -> list[list[str]]:
    """Groups of two or more of ``signatures(dispatcher)`` that are one signature up to the read-only flag,
    integer literals and integer types."""
    groups: dict[tuple, list[str]] = {}
    for sig in signatures(dispatcher):
        groups.setdefault(tuple(_plain(t) for t in sig), []).append(str(sig))
    return [g for g in groups.values() if len(g) > 1]
