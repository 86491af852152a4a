"""benchmarks/gpu_site.py: what a lent GPU machine's Python gets before gpu_check runs: the carried wheels of the
distributions it lacks, and the numpy.row_stack shim where its numba-cuda needs one; nothing otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
import types
import zipfile

from benchmark_script import load

gpu_site = load("gpu_site")


def _wheel(directory, dist: str, module: str) -> str:
    """A minimal pure-Python wheel of ``dist`` 0.1 holding ``module`` (``VALUE = 7``)."""
    info = f"{dist}-0.1.dist-info"
    path = os.path.join(directory, f"{dist}-0.1-py3-none-any.whl")
    files = {f"{module}.py": "VALUE = 7\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_the_shim_is_needed_only_where_numba_cuda_meets_a_numpy_without_row_stack():
    old, new = types.SimpleNamespace(row_stack=1, vstack=2), types.SimpleNamespace(vstack=2)
    assert gpu_site.shim_needed(new, True)
    assert not gpu_site.shim_needed(new, False)
    assert not gpu_site.shim_needed(old, True)


def test_nothing_is_made_where_nothing_is_needed(tmp_path):
    assert gpu_site.prepare(str(tmp_path), numpy_module=types.SimpleNamespace(row_stack=1),
                            numba_cuda_installed=True, parent=str(tmp_path)) is None
    assert os.listdir(tmp_path) == []


def test_only_the_wheels_of_missing_distributions_are_installed_and_the_shim_restores_row_stack(tmp_path):
    whl = tmp_path / ".whl"
    whl.mkdir()
    _wheel(str(whl), "emunum_gpu_site_probe", "emunum_gpu_site_probe")
    _wheel(str(whl), "numpy", "numpy_stand_in")  # numpy is installed: its wheel is left out
    assert [os.path.basename(p) for p in gpu_site.missing_wheels(str(tmp_path))] == [
        "emunum_gpu_site_probe-0.1-py3-none-any.whl"]
    site = gpu_site.prepare(str(tmp_path), numpy_module=types.SimpleNamespace(vstack=2), numba_cuda_installed=True,
                            parent=str(tmp_path))
    assert sorted(os.listdir(site)) == ["emunum_gpu_site_probe-0.1.dist-info", "emunum_gpu_site_probe.py",
                                        "sitecustomize.py"]
    # a numpy without row_stack ahead of the real one: the shim, run at start-up, gives it vstack's
    fake = tmp_path / "fake" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def vstack(*a):\n    return 'vstack'\n")
    probe = ("import numpy, emunum_gpu_site_probe as p; "
             "print(numpy.__file__, numpy.row_stack is numpy.vstack, p.VALUE)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), site])})
    assert r.returncode == 0, r.stderr[-2000:]
    where, same, value = r.stdout.split()
    assert where == str(fake / "__init__.py") and same == "True" and value == "7"
