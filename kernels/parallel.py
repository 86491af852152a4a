"""One process-wide lock around numba's parallel sections.

numba's workqueue threading layer (chosen beside torch's OpenMP, see ``cpu.py``) aborts the whole process
when two Python threads enter parallel code at once ("Concurrent access has been detected"). Every
``parallel=True`` (``prange``) kernel launch in this package goes through this lock: the float, fixed and
hifloat8 kernels (cpu.py, elementwise_f32.py, p3109_cpu.py), the counters, CustomFormat's nearest loop and
code GEMM, block_cpu.py's float64 loops and the GEMMs. Kernels that run a range-taking serial kernel on Python
threads instead (``threads.launch``: posit, log, codebook and CustomFormat's derived modes, the block fast paths
of block_fast.py, block_sr.py and MX+, the NVFP4 family's kernels) enter no numba threading layer and take no
lock:

- ``try_parallel()``: a caller that wants the parallel loop gets it if the lock is free; if another thread
  holds it, the caller runs its serial twin instead. Both loops visit every element with the same arguments,
  so the bits are the same either way (stochastic rounding included: its bits depend on the element index).
- ``exclusive()``: for kernels without a serial twin (the GEMMs): wait for the lock.

A forked child gets a fresh, free lock (``os.register_at_fork``), whatever a parent thread held at the fork.
"""
from __future__ import annotations

import contextlib
import os
import threading

_lock = threading.Lock()


def _reset_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_in_child)


@contextlib.contextmanager
def try_parallel(wanted: bool):
    """Yields whether the caller may run its parallel loop now (``wanted`` and the lock was free)."""
    lock = _lock
    if wanted and lock.acquire(blocking=False):
        try:
            yield True
        finally:
            lock.release()
    else:
        yield False


@contextlib.contextmanager
def exclusive():
    """Holds the lock for a parallel-only kernel (waits while another thread runs one)."""
    lock = _lock
    with lock:
        yield
