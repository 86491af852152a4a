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

Cached on disk like the kernels (~0.7 CPU-s a compile otherwise, in every process: numba links ``rng``'s
module into the launcher's and LLVM optimises it again). numba keys a cached closure on the pickle of what it
captures, and a dispatcher's pickle differs per process, so the launcher does not capture ``rng``: it finds it
among its globals (a copy of this module's, one per launcher, ``rng`` bound there), has a qualified name of its
own (from ``rng``'s module and qualified name), and captures ``rng``'s identity instead (``_identity``: that name,
the cache directory of ``rng``'s module, which names the digest of its sources, and the pickle of what ``rng``
captures, as numba keys ``rng`` itself; outside emunum's kernels, the digest of ``rng``'s file, since the
launcher's machine code holds ``rng``'s). The launchers' cache directory is keyed on every kernel source. An
``rng`` that numba does not cache, or that captures anything but plain numbers, strings and tuples of them (whose
pickle could differ per process), gets a launcher compiled per process.
"""
import functools
import glob
import hashlib
import os
import pickle
import re
import types

import numba
import numpy as np
from numba import njit, prange
from numba.core.caching import NullCache

from . import _cache

_cache.guard(__file__, sorted(glob.glob(os.path.join(os.path.dirname(__file__), "**", "*.py"), recursive=True)))

ALIGN = 256  # = elementwise_f32.CHUNK (a test checks it)
rng = None  # the range kernel: each launcher's copy of these globals binds it (``launcher``)


@njit(inline="always")
def share(n, t):
    """Elements per share: ceil(n / t) rounded up to a multiple of ALIGN."""
    return ((n + t - 1) // t + ALIGN - 1) // ALIGN * ALIGN


def _template(identity):
    """The launcher's Python function; ``rng`` is the name of a global that ``launcher`` binds per copy."""

    def par(n, t, *args):
        identity  # captured, so that numba's cache key of the launcher is rng's identity  # noqa: B018
        step = share(n, t)
        for k in prange(t):
            lo = k * step
            hi = min(n, lo + step)
            if lo < hi:
                rng(lo, hi, *args)

    return par


def _plain(v) -> bool:
    """Whether v pickles alike in every process: a number, string, bytes, None, or a tuple of them."""
    if isinstance(v, tuple):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str, bytes, np.integer, np.floating, np.bool_))


def _identity(kernel):
    """What numba's disk cache keys ``kernel`` on, as a string, or None where that could differ per process."""
    f = kernel.py_func
    captured = tuple(c.cell_contents for c in f.__closure__ or ())
    if isinstance(getattr(kernel, "_cache", None), NullCache) or not _plain(captured):
        return None
    path = os.path.realpath(f.__code__.co_filename)
    if path in _cache._REGISTERED:
        where = _cache._REGISTERED[path]  # names the digest of the module and its dependencies
    elif os.path.isfile(path):
        where = f"{path}:{_cache._digest([path])}"  # a kernel of the user's: an edit must not load the old code
    else:
        return None
    return f"{f.__module__}.{f.__qualname__}|{where}|{hashlib.sha256(pickle.dumps(captured)).hexdigest()}"


@functools.lru_cache(maxsize=None)
def launcher(kernel):
    """``run(n, *args)``: ``kernel(lo, hi, *args)`` over [0, n) in shares on numba's threads (module doc)."""
    identity = _identity(kernel)
    par = _template(identity or "")
    fn = types.FunctionType(par.__code__, {**globals(), "rng": kernel}, "par", None, par.__closure__)
    fn.__qualname__ = "par_" + re.sub(r"\W", "_", f"{kernel.py_func.__module__}_{kernel.py_func.__qualname__}")
    compiled = njit(parallel=True, cache=identity is not None)(fn)

    def run(n, *args):
        compiled(n, numba.get_num_threads(), *args)  # numba's get_num_threads in compiled code is not cacheable

    run.compiled = compiled
    return run
