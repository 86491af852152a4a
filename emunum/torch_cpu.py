"""Two behaviours of torch's CPU runtime that change bits from one process to the next, and their guards.

**Thread counts.** torch's intra-op pool and numba's ``omp`` threading layer share one libgomp, and
``torch.get_num_threads()`` is the calling thread's OpenMP thread count. Launching numba's thread pool (its first
``numba.set_num_threads``, ``numba.get_num_threads`` or parallel kernel) can set that count to
``NUMBA_NUM_THREADS``: measured (torch 2.13.0+cpu, numba 0.68.1), in a forked process ``torch.set_num_threads(1)``
then ``numba.set_num_threads(1)`` leaves torch on 2 threads every time, in a fresh process now and then. A run
meant to be single-threaded then splits its large element-wise ops across two threads. ``set_threads`` sets
numba's count first and checks torch's.

**MKL's vector math, first call.** torch hands ``sqrt``, ``exp``, ``log``, ``sin``, ``tanh``, ``erf`` (and the other
functions ATen routes to MKL's VML) of contiguous float32/float64 CPU tensors to VML in its high-accuracy mode, and
VML splits a large call across its OpenMP threads (torch's count). When a process's first VML call is split, one
thread's share can take a less accurate path for that call: measured (same versions, MKL 2024.2, 2 threads),
``torch.sqrt`` of 4,000 float32 values came out wrong by up to 3,839 ulps in one half in about one fresh
process in four, the calls after it right; ``emunum.arithmetic("fp16")`` sqrt of every fp16 value gave 3,912 wrong
results in 2 processes of 12; the first Adam step of a two-rank run updated one replica differently.
``warm_vector_math`` makes one single-element call on the calling thread, after which 0 processes of 30 went wrong;
``import emunum`` calls it.
"""
from __future__ import annotations

import torch


def warm_vector_math() -> None:
    """Make MKL's vector math library settle its code paths with one single-threaded call (``torch.sqrt`` of one
    float32 element, on the CPU whatever torch's default device). Idempotent; costs under a millisecond the first
    time."""
    torch.sqrt(torch.ones(1, dtype=torch.float32, device="cpu"))


def set_threads(n: int) -> None:
    """Run torch's intra-op pool on ``n`` threads and numba's parallel kernels on ``min(n, NUMBA_NUM_THREADS)``.
    numba's count is set first: launching its pool may change the OpenMP thread count torch reads (module
    docstring). Launching it also fixes numba's threading layer for the process: numba's default (``omp`` with
    torch's libgomp) unless emunum's kernel modules, which pick ``workqueue``, were imported before. The training
    loop calls this first, so its runs use ``omp``, which measured faster on whole training steps at 2 threads
    (benchmarks/RESULTS.md, stop 60). Raises TypeError for a non-integer ``n``, ValueError for ``n < 1``, and
    RuntimeError if torch still reports another count."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_threads: n={n!r} is a {type(n).__name__}; allowed: an int >= 1")
    if n < 1:
        raise ValueError(f"set_threads: n={n} is out of range; allowed: an int >= 1")
    import numba

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(n)
    if torch.get_num_threads() != n:
        raise RuntimeError(f"set_threads: torch.set_num_threads({n}) left torch on {torch.get_num_threads()} threads")
