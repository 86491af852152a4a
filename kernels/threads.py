"""Data-parallel launches of one serial kernel on Python threads.

``launch(fn, n, *args)`` runs ``fn(lo, hi, *args)`` over the work items [0, n) in contiguous shares, one per
thread, on ``numba.get_num_threads()`` threads (the calling thread runs the first share), and returns when all
are done; an exception in any share is raised in the caller. ``fn`` is a ``nogil=True`` kernel whose items are
independent (each item's operations do not depend on the share that runs it), so the bits equal one serial
``fn(0, n, *args)`` call whatever the thread count.

Why not ``prange``: a ``parallel=True`` kernel compiles its body twice (the function and the outlined parfor
body), and kernels with many compile-time variants pay that per variant; a range-taking serial kernel compiles
once and is both the serial and the parallel loop. The threads are plain Python threads, so no numba threading
layer is entered and ``parallel.py``'s lock is not needed. A forked child starts a fresh pool.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading

import numba

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _reset_in_child() -> None:
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


os.register_at_fork(after_in_child=_reset_in_child)


def _executor(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """A pool with at least ``workers`` threads, kept for the process (grown, never shrunk)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="emunum-kernel")
            _pool_size = workers
        return _pool


def shares(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) cut into ``parts`` contiguous (lo, hi) shares whose sizes differ by at most one (none empty
    where n >= parts)."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    out, lo = [], 0
    for p in range(parts):
        hi = lo + q + (1 if p < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def launch(fn, n: int, *args, threads: int | None = None) -> None:
    """``fn(lo, hi, *args)`` over [0, n) on ``threads`` threads (default ``numba.get_num_threads()``)."""
    parts = shares(n, numba.get_num_threads() if threads is None else threads)
    if len(parts) == 1:
        fn(parts[0][0], parts[0][1], *args)
        return
    pool = _executor(len(parts) - 1)
    futures = [pool.submit(fn, lo, hi, *args) for lo, hi in parts[1:]]
    try:
        fn(parts[0][0], parts[0][1], *args)
    finally:
        concurrent.futures.wait(futures)  # no share may still run when the caller's arrays are released
    for f in futures:
        f.result()
