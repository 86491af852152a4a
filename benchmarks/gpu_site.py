"""What a lent GPU machine's own Python needs before ``benchmarks/gpu_check.py`` runs, made in one directory.

    python3 benchmarks/gpu_site.py        # prints the directory to put first on PYTHONPATH, or nothing

``benchmarks/gpu_check.sh`` runs it first and prepends what it prints to PYTHONPATH. It makes, in a fresh
temporary directory:
- the wheels in this checkout's ``.whl/`` (``benchmarks/gpu_wheels.sh`` downloads them where the package
  registries can be reached; the device tool carries the git-ignored ``.whl`` with ``carry=[".whl"]``) whose
  distribution this Python lacks, installed with ``pip install --no-index --no-deps --target``: the oracles and
  the experiment stack the image lacks (a distribution it has, in any version, is left as it is);
- a ``sitecustomize.py`` that restores ``numpy.row_stack`` (as ``numpy.vstack``, which it was) where numpy no
  longer has it and numba-cuda is installed: numba-cuda 0.30 overloads ``numpy.row_stack`` when it loads its
  array functions, and on numpy 2.5 every CUDA kernel failed to compile without it (the first GPU run,
  benchmarks/RESULTS.md). The shim replaces any other ``sitecustomize`` on the path (the images seen have none).

Nothing is made, and nothing printed, when there are no wheels and numpy has ``row_stack``. It changes no file of
the checkout. Exit status 2 when the wheels do not install (pip's message on stderr).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIM = 'import numpy\nif not hasattr(numpy, "row_stack"):\n    numpy.row_stack = numpy.vstack\n'


def missing_wheels(root: str = ROOT) -> list:
    """The wheel files in ``root/.whl`` whose distribution is not installed, sorted."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, ".whl", "*.whl"))):
        try:
            metadata.distribution(os.path.basename(path).split("-")[0])
        except metadata.PackageNotFoundError:
            out.append(path)
    return out


def shim_needed(numpy_module, numba_cuda_installed: bool) -> bool:
    """Whether the ``row_stack`` shim is needed: numba-cuda is installed and numpy lacks ``row_stack``."""
    return numba_cuda_installed and not hasattr(numpy_module, "row_stack")


def prepare(root: str = ROOT, python: str = sys.executable, numpy_module=None, numba_cuda_installed=None,
            parent=None):
    """The directory made for PYTHONPATH (module doc; a new one under ``parent``, default the system's temporary
    directory), or None when nothing is needed."""
    if numba_cuda_installed is None:
        numba_cuda_installed = importlib.util.find_spec("numba_cuda") is not None
    if numpy_module is None and numba_cuda_installed:  # numpy is read only where numba-cuda (which needs it) is
        import numpy as numpy_module
    found, shim = missing_wheels(root), shim_needed(numpy_module, numba_cuda_installed)
    if not found and not shim:
        return None
    site = tempfile.mkdtemp(prefix="emunum_gpu_site_", dir=parent)
    if found:
        try:
            subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--target", site, *found], check=True, stdout=sys.stderr)
        except subprocess.CalledProcessError:
            shutil.rmtree(site, ignore_errors=True)
            raise
    if shim:
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(SHIM)
    return site


def main() -> int:
    try:
        site = prepare()
    except subprocess.CalledProcessError as e:
        print(f"gpu_site: installing the wheels of .whl failed ({e})", file=sys.stderr)
        return 2
    if site is not None:
        print(site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
