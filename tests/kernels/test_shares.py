"""The element-wise range kernels give the bits of one serial call however the elements are split: at any
boundary (element i's random bits depend on i alone, not on the chunk it falls in) and in ``shares.launcher``'s
shares on numba's threads."""
from __future__ import annotations

import os

import numpy as np
import pytest

numba = pytest.importorskip("numba")
from emunum.formats import get_format  # noqa: E402
from emunum.kernels import cpu, elementwise_f32 as ew, hifloat8_cpu, p3109_cpu, shares  # noqa: E402
from emunum.kernels.scalar import NEAREST, STOCHASTIC, UP  # noqa: E402
from numba.core.caching import NullCache  # noqa: E402

N = 3 * ew.CHUNK + 77
KEY = np.uint64(0x1234_5678_9ABC_DEF0)


def _args(name, mode):
    """(range kernel, float32 memory?, the arguments after (lo, hi, src, dst))."""
    if name == "f32":
        man, emin, sub, mx, ovf, negzero = get_format("e5m2").to_kernel_args()
        mb = np.int64(cpu.max_bits(mx, np.float32))
        return cpu.f32_range(mode), (0, man, emin, sub, mb, float(mx), ovf, negzero, KEY, 32)
    if name == "fixed":
        frac, cmin, cmax, sat = get_format("int8").to_kernel_args()
        return cpu.fixed_range(mode), (cpu._VALUE_WITNESS[np.dtype(np.float32)], 0, frac, np.int64(cmin),
                                       np.int64(cmax), sat, KEY, 32)
    if name == "float":
        man, emin, sub, mx, ovf, negzero = get_format("e5m2").to_kernel_args()
        return cpu.float_range, (cpu._BITS_WITNESS[np.dtype(np.float32)], 0, 31, 23, 127, man, emin, sub,
                                 np.uint64(cpu.max_bits(mx, np.float32)), ovf, negzero, mode, KEY, 32)
    if name == "hifloat8":
        return hifloat8_cpu.f32_range(mode), (0, KEY, 32)
    if name == "p3109":
        return (p3109_cpu.sr_range, (3, -14, np.int64(0x47600000), 0, KEY, 32)) if mode == STOCHASTIC else \
            (p3109_cpu.nearest_range, (3, -14, np.int64(0x47600000), 0))
    raise AssertionError(name)


CASES = [(name, mode) for name in ("f32", "fixed", "float", "hifloat8", "p3109") for mode in (NEAREST, STOCHASTIC)]
CASES.append(("f32", UP))


def _data():
    x = np.random.default_rng(7).standard_normal(N).astype(np.float32) * np.float32(100.0)
    x[::97] = -x[::97]
    return x


@pytest.mark.parametrize("name,mode", CASES)
@pytest.mark.parametrize("cut", [1, ew.CHUNK - 3, ew.CHUNK, 2 * ew.CHUNK + 5])
def test_a_range_kernel_split_anywhere_gives_the_bits_of_one_call(name, mode, cut):
    rng, args = _args(name, mode)
    x = _data()
    whole, parts = np.empty_like(x), np.empty_like(x)
    rng(0, N, x.ctypes.data, whole.ctypes.data, *args)
    rng(cut, N, x.ctypes.data, parts.ctypes.data, *args)  # the later part first: no element depends on another
    rng(0, cut, x.ctypes.data, parts.ctypes.data, *args)
    assert np.array_equal(whole.view(np.uint32), parts.view(np.uint32))
    inplace = x.copy()
    rng(0, cut, inplace.ctypes.data, inplace.ctypes.data, *args)
    rng(cut, N, inplace.ctypes.data, inplace.ctypes.data, *args)
    assert np.array_equal(whole.view(np.uint32), inplace.view(np.uint32))


@pytest.mark.parametrize("name,mode", CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_the_launcher_gives_the_bits_of_one_call(name, mode, threads):
    rng, args = _args(name, mode)
    x = _data()
    whole, par = np.empty_like(x), np.empty_like(x)
    rng(0, N, x.ctypes.data, whole.ctypes.data, *args)
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        shares.launcher(rng)(N, x.ctypes.data, par.ctypes.data, *args)
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(whole.view(np.uint32), par.view(np.uint32))


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 5000, 1 << 18])
@pytest.mark.parametrize("t", [1, 2, 3, 16])
def test_shares_cover_every_element_once_from_multiples_of_the_chunk(n, t):
    assert shares.ALIGN == ew.CHUNK
    step = shares.share.py_func(n, t)
    bounds = [(k * step, min(n, k * step + step)) for k in range(t) if k * step < n]
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(bounds, bounds[1:]))
    assert sum(hi - lo for lo, hi in bounds) == n and all(lo % ew.CHUNK == 0 for lo, _ in bounds)


def _adder(c):
    """A cached range kernel closure; every one has the same qualified name, and c is what it captures."""

    def add(lo, hi, src, dst):
        for i in range(lo, hi):
            dst[i] = src[i] + c

    return numba.njit(cache=True, nogil=True)(add)


def test_a_launcher_is_cached_and_loads_in_a_fresh_dispatcher_with_the_same_bits():
    rng, args = _args("f32", STOCHASTIC)
    x = _data()
    first, again = np.empty_like(x), np.empty_like(x)
    shares.launcher(rng)(N, x.ctypes.data, first.ctypes.data, *args)
    fresh = shares.launcher.__wrapped__(rng)  # a new dispatcher: what the next process builds
    fresh(N, x.ctypes.data, again.ctypes.data, *args)
    assert sum(fresh.compiled.stats.cache_hits.values()) == 1 and not fresh.compiled.stats.cache_misses
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


def test_launchers_of_kernels_with_one_name_and_different_captures_stay_apart():
    x = np.arange(1000, dtype=np.float64)
    for c in (1.0, 2.0, 1.0):  # each launcher saved beside the other's, then loaded by a fresh dispatcher
        for make in (shares.launcher, shares.launcher.__wrapped__):
            out = np.empty_like(x)
            make(_adder(c))(x.size, x, out)
            assert np.array_equal(out, x + c), (c, make)


def test_a_kernel_that_captures_a_compiled_function_gets_a_launcher_compiled_per_process():
    """A dispatcher pickles differently in every process, so no cache key would ever match again."""
    inner = numba.njit(lambda v: v * 3.0)

    def triple(lo, hi, src, dst):
        for i in range(lo, hi):
            dst[i] = inner(src[i])

    kernel = numba.njit(cache=True)(triple)
    x = np.arange(700, dtype=np.float64)
    out = np.empty_like(x)
    run = shares.launcher(kernel)
    run(x.size, x, out)
    assert np.array_equal(out, 3.0 * x)
    assert shares._identity(kernel) is None and isinstance(run.compiled._cache, NullCache)
    assert shares._identity(_adder(1.0)) is not None and all(
        shares._identity(_args(name, mode)[0]) is not None for name, mode in CASES)


def test_an_edited_kernel_of_the_users_gets_a_new_launcher_not_the_cached_one(tmp_path):
    """The launcher's machine code holds its kernel's: outside emunum's kernels, the kernel file's digest keys it."""
    import importlib.util

    path = tmp_path / "user_kernel.py"
    x = np.arange(500, dtype=np.float64)
    for k, c in enumerate((1.0, 2.0)):
        path.write_text("from numba import njit\n\n\n@njit(cache=True)\ndef add(lo, hi, src, dst):\n"
                        f"    for i in range(lo, hi):\n        dst[i] = src[i] + {c}\n")
        # numba keys its own cache of ``add`` on the file's mtime and size: two writes of one size within a clock
        # tick of the file system would load the first ``add`` whatever the launcher does
        os.utime(path, ns=(10**18 + k * 10**10,) * 2)
        spec = importlib.util.spec_from_file_location("user_kernel", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out = np.empty_like(x)
        shares.launcher.__wrapped__(mod.add)(x.size, x, out)  # a fresh dispatcher, as in the next process
        assert np.array_equal(out, x + c), c
