"""numba's on-disk kernel cache: keyed by source digest, touches only emunum's files, and optional."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from emunum.kernels import _cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return str(p)


def test_the_cache_directory_is_keyed_by_the_digest_of_the_module_and_its_dependencies(tmp_path):
    dep = _module(tmp_path, "a/dep.py", "x = 1\n")
    m1 = _module(tmp_path, "a/cpu.py", "y = 2\n")
    m2 = _module(tmp_path, "b/cpu.py", "y = 2\n")  # another checkout, same sources
    m3 = _module(tmp_path, "c/cpu.py", "y = 3\n")  # another version
    for m in (m1, m2, m3):
        _cache.guard(m, [dep])
    d1, d2, d3 = (_cache._REGISTERED[os.path.realpath(m)] for m in (m1, m2, m3))
    assert d1 == d2 and d1 != d3 and d1.startswith("emunum-cpu-")
    _module(tmp_path, "a/dep.py", "x = 5\n")  # a dependency changes: a new directory
    _cache.guard(m1, [dep])
    assert _cache._REGISTERED[os.path.realpath(m1)] != d1


def test_unwritable_cache_locations_fall_back_to_a_private_directory_with_one_warning(monkeypatch):
    monkeypatch.setattr(_cache, "_candidates", lambda: ["/proc/emunum-no-such-dir"])
    monkeypatch.setattr(_cache, "_base", None)
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_DIR"):
        base = _cache.cache_base()
    assert os.path.isdir(base) and os.access(base, os.W_OK)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cache.cache_base() == base  # chosen once: no second warning


def test_kernels_cache_under_numba_cache_dir_and_leave_other_files_alone(tmp_path):
    cache = tmp_path / "numba-cache"
    foreign = cache / "other_project" / "cpu.kernel-12.py311.nbi"  # a name the old guard deleted
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"not emunum's")
    code = "import torch, emunum; emunum.quantize(torch.ones(10), 'e5m2'); print('ok')"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": ROOT}
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT,
                           timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
    assert foreign.read_bytes() == b"not emunum's"
    mine = [p.name for p in cache.iterdir() if p.name.startswith("emunum-cpu-")]
    assert len(mine) == 1 and any((cache / mine[0]).glob("*.nbi"))


def _cache_file(tmp_path, name: str):
    """numba's IndexDataCacheFile on a registered emunum cache directory under tmp_path."""
    from numba.core.caching import IndexDataCacheFile

    mod = _module(tmp_path, f"{name}/cpu.py", "y = 2\n")
    _cache.guard(mod, [])
    d = tmp_path / "cache" / _cache._REGISTERED[os.path.realpath(mod)]
    d.mkdir(parents=True, exist_ok=True)
    return IndexDataCacheFile(str(d), "cpu.kernel-1.py311", source_stamp=d.name), d


def test_a_save_waits_for_the_directory_lock_that_another_process_holds(tmp_path):
    """Two processes compiling side by side (pytest -n) must not give two kernels one data file: a save
    takes the directory's lock, so it cannot run while another holds it."""
    import fcntl
    import threading

    cf, d = _cache_file(tmp_path, "a")
    with open(d / ".lock", "a") as held:  # another open file description: flock conflicts with it
        fcntl.flock(held, fcntl.LOCK_EX)
        t = threading.Thread(target=cf.save, args=(("sig-a",), b"kernel a"))
        t.start()
        t.join(1.0)
        assert t.is_alive() and not (d / "cpu.kernel-1.py311.nbi").exists()
    t.join(60)
    assert not t.is_alive() and cf.load(("sig-a",)) == b"kernel a"


def test_checkouts_with_the_same_sources_share_cache_entries_whatever_their_mtimes(tmp_path):
    m1 = _module(tmp_path, "x/cpu.py", "def f():\n    return 1\n")
    m2 = _module(tmp_path, "y/cpu.py", "def f():\n    return 1\n")
    os.utime(m2, (1_000_000, 1_000_000))
    stamps = []
    for m in (m1, m2):
        _cache.guard(m, [])
        ns: dict = {}
        exec(compile(open(m).read(), m, "exec"), ns)
        stamps.append(_cache._DigestLocator(ns["f"], m).get_source_stamp())
    assert stamps[0] == stamps[1]


def _at_signature(witness, *rest):
    from numba import types

    return (types.int64, types.int64, types.int64, types.Array(witness, 1, "C"), types.boolean, *rest)


def _at_cases():
    from numba import types

    i, u, f = types.int64, types.uint64, types.float64
    return {  # factory module, factory, loop factory it calls, signature of its kernel
        "cpu.f32_at": ("cpu", "f32_at", "f32_loop", _at_signature(types.uint32, i, i, i, i, f, i, i, u, i)),
        "cpu.fixed_at": ("cpu", "fixed_at", "fixed_loop", _at_signature(types.float32, i, i, i, i, u, i)),
        "hifloat8_cpu.f32_at": ("hifloat8_cpu", "_f32_at", "_f32_loop", _at_signature(types.uint8, i, u, i)),
    }


@pytest.mark.parametrize("case", ["cpu.f32_at", "cpu.fixed_at", "hifloat8_cpu.f32_at"])
def test_a_kernel_that_calls_the_kernels_it_captured_loads_from_the_cache_in_another_process(case, monkeypatch):
    """A factory's kernel that captures the loops it calls is found on disk by a process whose loop dispatchers
    are other objects (as in every other process): numba keyed it on their pickles, which differ per process,
    so each process compiled it again. Here new loop dispatchers stand in for another process's."""
    import functools
    import importlib

    from emunum.kernels.scalar import TOWARD_ZERO

    module, factory, loops, sig = _at_cases()[case]
    mod = importlib.import_module(f"emunum.kernels.{module}")
    kernel = getattr(mod, factory)(TOWARD_ZERO)
    kernel.compile(sig)  # loaded or compiled, and then on disk
    monkeypatch.setattr(mod, loops, functools.lru_cache(maxsize=None)(getattr(mod, loops).__wrapped__))
    fresh = getattr(mod, factory).__wrapped__(TOWARD_ZERO)
    assert all(c.cell_contents is not k.cell_contents for c, k in zip(fresh.py_func.__closure__,
                                                                       kernel.py_func.__closure__))
    fresh.compile(sig)
    assert not fresh.stats.cache_misses and sum(fresh.stats.cache_hits.values()) == 1
