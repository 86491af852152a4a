"""Fresh output buffers for the CPU kernels: large ones are backed by transparent huge pages where the platform
offers them.

A new 64 MB tensor comes straight from ``mmap``: its first write page-faults once per 4 KiB page, which costs
more than the rounding itself. ``empty_like(x)`` returns ``torch.empty_like(x, memory_format=contiguous)``
and, on Linux, for CPU tensors of at least ``HUGE_MIN_BYTES``, advises the kernel (``madvise(MADV_HUGEPAGE)``,
as torch's own allocator does under ``THP_MEM_ALLOC_ENABLE=1``) to back the 2 MiB-aligned inside of the buffer
with huge pages: 512 times fewer faults. The advice changes no value and no other allocation; where
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``never``, or off Linux, it does nothing.

``retain_freed_memory()`` is the allocator setting that removes most of those faults in a loop: by default glibc
returns large freed blocks to the system (``munmap``, heap trimming), so the next tensor of that size faults
all its pages in again. The training loop (experiments/loop.py) calls it; benchmarks/RESULTS.md measures both.
"""
from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
HUGE_MIN_BYTES = 8 << 20
_MADV_HUGEPAGE = 14
_madvise = None  # resolved on first use: False where unavailable
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
RETAIN_BYTES = 1 << 30


def _resolve_madvise():
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _madvise = fn
            except (OSError, AttributeError):
                pass
    return _madvise


def advise_huge_pages(t: torch.Tensor) -> None:
    """Ask for huge pages behind ``t``'s storage (2 MiB-aligned inside only); a no-op where unsupported."""
    nbytes = t.untyped_storage().nbytes()
    if not t.is_cpu or nbytes < HUGE_MIN_BYTES:
        return
    madvise = _resolve_madvise()
    if not madvise:
        return
    p = t.untyped_storage().data_ptr()
    lo = (p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    hi = (p + nbytes) & ~(HUGE_PAGE - 1)
    if hi > lo:
        madvise(lo, hi - lo, _MADV_HUGEPAGE)  # advice: failure (EINVAL where THP is off) changes nothing


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor like ``x``, huge-page backed when large (see module doc)."""
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    advise_huge_pages(y)
    return y


def retain_freed_memory(limit_bytes: int = RETAIN_BYTES) -> bool:
    """Ask glibc's malloc to serve blocks below ``limit_bytes`` from its heap and to keep up to ``limit_bytes`` of
    freed memory there (``mallopt(M_MMAP_THRESHOLD)`` and ``mallopt(M_TRIM_THRESHOLD)``, what the environment
    variables ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` set at start-up), so that a tensor freed
    and allocated again each step reuses pages already mapped instead of faulting them in. Process-wide; the
    price is that up to ``limit_bytes`` of freed memory stays with the process. Returns whether glibc took both
    settings (False off Linux/glibc: nothing changes)."""
    if not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or not 0 < limit_bytes < 2**31:
        raise ValueError(f"limit_bytes={limit_bytes!r}: expected an int in [1, 2**31 - 1]")
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, limit_bytes)) & bool(mallopt(_M_TRIM_THRESHOLD, limit_bytes))
