"""The CUDA simulator's block scheduler of the test runs (tests/cuda_sim_scheduler.py) keeps the simulator's
semantics: a barrier releases only when every live thread of the block reached it, threads that returned early do
not hold it, and a thread's exception reaches the launcher."""
from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("the scheduler replaces the CUDA simulator's (NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import cuda_sim_scheduler  # noqa: E402
from numba import cuda  # noqa: E402
from numba.cuda.simulator import kernel as sim  # noqa: E402

THREADS = 64


@cuda.jit
def _reverse_sum(src, out):
    """out[b, t] = sum(src[b]) computed in shared memory by a tree of barriers, then stored reversed."""
    buf = cuda.shared.array(THREADS, dtype=np.float64)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    v = src[b, t]
    if t == THREADS - 1:  # the last thread comes late to the first barrier (a barrier released early misses it)
        for _ in range(200000):
            v = v * 1.0
    buf[t] = v
    cuda.syncthreads()
    step = THREADS // 2
    while step > 0:
        if t < step:
            buf[t] += buf[t + step]
        cuda.syncthreads()
        step //= 2
    out[b, THREADS - 1 - t] = buf[0] + t


@cuda.jit
def _early_exit(out):
    """Odd threads return before the barrier; even ones meet at it and read a neighbour's write."""
    buf = cuda.shared.array(THREADS, dtype=np.int64)
    t = cuda.threadIdx.x
    if t % 2 == 1:
        out[t] = -1
        return
    buf[t] = t * 10
    cuda.syncthreads()
    out[t] = buf[(t + 2) % THREADS]


@cuda.jit
def _raises(out):
    t = cuda.threadIdx.x
    if t == 5:
        out[THREADS + 7] = 1.0  # out of bounds: the simulator raises IndexError in this thread
    cuda.syncthreads()
    out[t] = t


def test_the_scheduler_is_installed_for_the_simulator():
    assert cuda_sim_scheduler.install() and sim.BlockManager.run is cuda_sim_scheduler._run


def test_barriers_release_only_when_every_thread_of_the_block_reached_them():
    src = np.random.default_rng(0).integers(-1000, 1000, size=(3, THREADS)).astype(np.float64)
    out = np.zeros_like(src)
    _reverse_sum[3, THREADS](src, out)
    expect = src.sum(axis=1, keepdims=True) + np.arange(THREADS)[::-1]
    assert np.array_equal(out, expect)


def test_threads_that_returned_do_not_hold_the_barrier():
    out = np.zeros(THREADS, dtype=np.int64)
    _early_exit[1, THREADS](out)
    t = np.arange(THREADS)
    assert np.array_equal(out, np.where(t % 2 == 1, -1, (t + 2) % THREADS * 10))


def test_a_threads_exception_reaches_the_launcher():
    out = np.zeros(THREADS, dtype=np.float64)
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        _raises[1, THREADS](out)
