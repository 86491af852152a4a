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


def test_a_kernel_that_calls_captured_kernels_runs_in_the_next_process_after_one_that_loaded_them(tmp_path):
    """A kernel that calls captured kernels (here ``cpu.f32_many_at``, which calls the mode's ``f32_range``),
    compiled in a process whose callee came from the disk cache, holds references into that process, so it must
    not be served from the cache to another: here the range kernel is cached alone (the ``many`` entries
    removed), a second process compiles ``many`` on the loaded kernel, and a third must round, not crash
    (numba's per-process key on the captured dispatchers guarantees it; a key that let the third process load the
    second's ``many`` segfaulted)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    code = ("import numpy as np, torch, emunum\n"
            "from emunum.kernels import cpu\n"
            "from emunum.formats import get_format\n"
            "x = torch.randn(1 << 12, generator=torch.Generator().manual_seed(0))\n"
            "run = cpu.float_runner(np.float32, *get_format('e4m3fn').to_kernel_args())\n"
            "z = emunum.quantize(x, 'e4m3fn')\n"  # the range kernel first
            "y = x.clone()\n"
            "run.many(np.array([y.data_ptr()], np.int64), np.array([y.numel()], np.int64), 0, 0, 32)\n"
            "print(torch.equal(y, z))\n")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and first.stdout.strip() == "True", first.stderr[-2000:]
    manys = [f for f in tmp_path.rglob("*") if f.is_file() and ".f32_many_at." in f.name]
    assert manys and any(".f32_range." in f.name for f in tmp_path.rglob("*"))
    for f in manys:
        f.unlink()
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and r.stdout.strip() == "True", (r.returncode, r.stderr[-2000:])
