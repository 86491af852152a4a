"""emunum.torch_cpu: the thread counts a run asks for are the ones it gets, and a process's first parallel vector-math
call is settled by ``import emunum``. Each check that needs a fresh process (numba's pool not yet launched, MKL
not yet called) runs one Python subprocess."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numba
import pytest
import torch

from emunum import torch_cpu


def _run(script: str) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def test_set_threads_in_a_forked_process_leaves_torch_on_n_threads_after_numba_launches_its_pool():
    # torch's count first, then numba's (the order set_threads avoids) left torch on 2 threads here (torch 2.13.0,
    # numba 0.68.1): this assertion failed with that order
    out = _run("""
        import os, torch, numba
        from emunum.torch_cpu import set_threads
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                set_threads(1)
                msg = f"{torch.get_num_threads()},{numba.get_num_threads()}"
            except BaseException as e:  # reported, not raised: the child must not run on as the parent
                msg = repr(e)
            os.write(w, msg.encode()); os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        print(os.read(r, 4096).decode())
    """)
    assert out == "1,1"


def test_import_emunum_makes_a_vector_math_call_and_the_first_parallel_call_after_it_matches_the_next():
    out = _run("""
        import sys, torch
        calls = []
        sys.setprofile(lambda frame, event, arg: calls.append(arg) if event == "c_call" and arg is torch.sqrt else None)
        import emunum
        sys.setprofile(None)
        torch.set_num_threads(2)
        x = torch.rand(4000, generator=torch.Generator().manual_seed(0)) * 1e-9
        first, again = torch.sqrt(x), torch.sqrt(x)
        print(len(calls), int((first != again).sum()))
    """)
    calls, differ = map(int, out.split())
    assert calls >= 1  # the single-element call of warm_vector_math, on the importing thread
    assert differ == 0


@pytest.mark.parametrize("n, error", [(0, ValueError), (-2, ValueError), (1.0, TypeError), (True, TypeError),
                                      ("2", TypeError)])
def test_set_threads_refuses_a_bad_count_naming_it(n, error):
    with pytest.raises(error, match=rf"n={n!r}.*allowed: an int >= 1"):
        torch_cpu.set_threads(n)


def test_set_threads_raises_when_torch_does_not_take_the_count(monkeypatch):
    want = torch.get_num_threads() + 1
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(numba, "set_num_threads", lambda n: None)
    with pytest.raises(RuntimeError, match=rf"torch.set_num_threads\({want}\) left torch on {want - 1} threads"):
        torch_cpu.set_threads(want)
