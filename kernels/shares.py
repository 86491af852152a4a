"""``launcher(rng)``: numba's thread pool running a range-taking serial kernel over contiguous shares.

``launcher(rng)(n, *args)`` runs ``rng(lo, hi, *args)`` on the ``numba.get_num_threads()`` shares of [0, n), each
share's start a multiple of ``ALIGN`` (the element-wise kernels make random words and prefetch hints per chunk of
``elementwise_f32.CHUNK`` elements from a multiple of it), and returns when all are done. ``rng`` is a ``nogil``
serial kernel whose elements are independent (element i's operations and random bits depend on i alone), so the
bits equal one serial ``rng(0, n, *args)`` call whatever the thread count. Callers hold ``parallel.py``'s lock.

Why: a ``prange`` twin of a loop compiles its body twice (the function and the outlined parfor body), and a
``*_at`` wrapper that calls both the serial and the parallel loop links them and has LLVM optimise them again;
this launcher is a few lines around one call of the serial kernel, which is also the serial entry point. It
keeps numba's workqueue launch (~2-3 us on this VM), where ``threads.launch``'s Python threads take ~25-30 us.

The launcher captures the dispatcher ``rng``, whose pickled form (numba's cache key of a closure) differs per
process, so it could never be loaded from numba's disk cache: it is compiled per process (``cache=False``; it is
small, and saving it would only grow the cache index).
"""
import functools

import numba
from numba import njit, prange

ALIGN = 256  # = elementwise_f32.CHUNK (a test checks it)


@njit(inline="always")
def share(n, t):
    """Elements per share: ceil(n / t) rounded up to a multiple of ALIGN."""
    return ((n + t - 1) // t + ALIGN - 1) // ALIGN * ALIGN


@functools.lru_cache(maxsize=None)
def launcher(rng):
    """``par(n, *args)``: ``rng(lo, hi, *args)`` over [0, n) in shares on numba's threads (module doc)."""

    @njit(parallel=True)
    def par(n, *args):
        t = numba.get_num_threads()
        step = share(n, t)
        for k in prange(t):
            lo = k * step
            hi = min(n, lo + step)
            if lo < hi:
                rng(lo, hi, *args)

    return par
