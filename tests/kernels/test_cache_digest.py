"""The cache digest of a kernel module (kernels/_cache.py ``sources``) covers every kernels file the module imports,
transitively: a kernel freezes the globals it reads and the code it calls when it compiles, so a change in any of
them must give the module a new cache directory."""
from __future__ import annotations

import os

from emunum.kernels import _cache, gemm_approx, gemm_cpu, gemm_fast


def test_the_general_and_approximate_gemms_digests_cover_the_tile_they_read_from_gemm_fast():
    """gemm_approx's and gemm_cpu's kernels tile by gemm_fast's TM x TN (through gemm_cpu); their hand-kept deps
    lacked gemm_fast.py, so a new tile width left their cached kernels on the old one (a training run with the
    Mitchell multiplier diverged: the host counted tiles the new way)."""
    tile = os.path.realpath(gemm_fast.__file__)
    for module in (gemm_approx, gemm_cpu):
        assert tile in _cache.sources(module.__file__), module.__name__


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_sources_follow_every_form_of_relative_import_transitively_and_stay_inside_the_tree(tmp_path):
    root = tmp_path / "kernels"
    a = _write(root / "a.py", "import numpy as np\nfrom .b import X  # a constant\n")
    b = _write(root / "b.py", "from . import (c,  # a comment, then the next name\n    d as dee)\nX = 1\n")
    c = _write(root / "c.py", "Y = 2\n")
    d = _write(root / "d" / "__init__.py", "from .e import Z\n")
    e = _write(root / "d" / "e.py", "from ..c import Y\nfrom ..outside import W\nZ = 3\n")
    _write(tmp_path / "outside.py", "W = 4\n")
    _write(root / "unrelated.py", "V = 5\n")
    got = _cache.sources(a, root=os.path.realpath(root))
    assert got == [os.path.realpath(a), *sorted(os.path.realpath(p) for p in (b, c, d, e))]
    before = _cache._digest(got)
    _write(root / "d" / "e.py", "from ..c import Y\nZ = 30\n")
    _cache._IMPORTS.clear()
    assert _cache._digest(_cache.sources(a, root=os.path.realpath(root))) != before
