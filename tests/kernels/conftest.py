"""Kernel tests: without a GPU, numba-cuda's kernels run on its CUDA simulator.

``make test`` sets ``NUMBA_ENABLE_CUDASIM=1``; this also sets it for a plain ``pytest`` run. numba.cuda reads
the variable when it is first imported, which happens in the test modules, after this file.
"""
import importlib.util
import os
import sys

import torch

if (importlib.util.find_spec("numba_cuda") is not None and not torch.cuda.is_available()
        and "numba.cuda" not in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "") in ("", "0")):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


import functools  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(params=[2, 3, 5])
def launch_shares(request, monkeypatch):
    """``threads.launch`` cuts a parallel call into this many shares whatever numba's thread count (a serial call,
    ``parallel=False``, stays whole): the kernels' range bounds are exercised on any machine."""
    from emunum.kernels import threads
    monkeypatch.setattr(threads, "launch", functools.partial(threads.launch, threads=request.param))
    return request.param
