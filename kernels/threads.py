"""Data-parallel launches of one serial kernel on Python threads.

``launch(fn, n, *args)`` runs ``fn(lo, hi, *args)`` over the work items [0, n) in contiguous shares, one per
thread, on ``numba.get_num_threads()`` threads (the calling thread runs the first share), and returns when all
are done; an exception in any share is raised in the caller once every share has ended. ``parallel=False`` makes
it one call over [0, n), as does a launch while another holds the workers (another Python thread, or a kernel
launched from inside a share). ``fn`` is a ``nogil=True`` kernel whose items are independent (each item's
operations do not depend on the share that runs it), so the bits equal one serial ``fn(0, n, *args)`` call
whatever the thread count.

Why not ``prange``: a ``parallel=True`` kernel compiles its body twice (the function and the outlined parfor
body), and kernels with many compile-time variants pay that per variant; a range-taking serial kernel compiles
once and is both the serial and the parallel loop. The threads are plain Python threads, so no numba threading
layer is entered and ``parallel.py``'s lock is not needed. The cost: a launch hands work to sleeping threads
(~25-30 us on this 2-core VM when quiet, 50-100 us when other processes keep both cores busy, against ~2-3 us
for numba's spinning workqueue), so callers launch only work that takes well beyond that. A forked
child starts with no workers (they are made again on first use).
"""
from __future__ import annotations

import os
import threading

import numba


class _Worker:
    """One daemon thread that runs one job at a time, handed over with two locks (cheaper than a queue)."""

    def __init__(self) -> None:
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._job = None
        self._error: BaseException | None = None
        threading.Thread(target=self._loop, name="emunum-kernel", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            fn, args = self._job
            try:
                fn(*args)
            except BaseException as e:  # handed to the launching thread
                self._error = e
            self._job = None
            self._done.release()

    def start(self, fn, args: tuple) -> None:
        self._job, self._error = (fn, args), None
        self._go.release()

    def wait(self) -> BaseException | None:
        self._done.acquire()
        return self._error


_workers: list[_Worker] = []
_busy = threading.Lock()


def _reset_in_child() -> None:
    global _workers, _busy
    _workers, _busy = [], threading.Lock()


os.register_at_fork(after_in_child=_reset_in_child)


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


def launch(fn, n: int, *args, parallel: bool = True, threads: int | None = None) -> None:
    """``fn(lo, hi, *args)`` over [0, n): one call when not ``parallel``, else on ``threads`` threads (default
    ``numba.get_num_threads()``)."""
    parts = shares(n, 1 if not parallel else numba.get_num_threads() if threads is None else threads)
    if len(parts) == 1 or not _busy.acquire(blocking=False):
        fn(0, n, *args)
        return
    try:
        while len(_workers) < len(parts) - 1:
            _workers.append(_Worker())
        started = []
        try:
            for w, (lo, hi) in zip(_workers, parts[1:]):
                w.start(fn, (lo, hi, *args))
                started.append(w)
            fn(parts[0][0], parts[0][1], *args)
        finally:
            errors = [w.wait() for w in started]  # no share may still run when the caller's arrays are released
        for e in errors:
            if e is not None:
                raise e
    finally:
        _busy.release()
