"""Concurrent callers and forked children. Each scenario runs in a subprocess: before the fix a
race aborted the whole process (numba's workqueue layer, rc 134), which would take pytest down with it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

THREADS = textwrap.dedent("""
    import threading, torch, emunum
    torch.manual_seed(0)
    xs = [torch.randn(1 << 19) * 10 for _ in range(4)]
    unit = emunum.MADUnit("e5m2", "fp16")
    a, b = torch.randn(96, 80), torch.randn(80, 72)
    want_n = [emunum.quantize(x, "e5m2") for x in xs]
    want_s = [emunum.quantize(x, "e4m3fn", "stochastic", seed=i) for i, x in enumerate(xs)]
    want_m = emunum.matmul(a, b, unit)
    got, errors = {}, []
    def work(i):
        try:
            for r in range(3):
                got[("n", i, r)] = emunum.quantize(xs[i], "e5m2")
                got[("s", i, r)] = emunum.quantize(xs[i], "e4m3fn", "stochastic", seed=i)
                got[("m", i, r)] = emunum.matmul(a, b, unit)
        except BaseException as e:
            errors.append(repr(e))
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in ts]; [t.join() for t in ts]
    assert not errors, errors
    for (kind, i, r), v in got.items():
        want = {"n": want_n[i], "s": want_s[i], "m": want_m}[kind]
        assert torch.equal(v.view(torch.int32), want.view(torch.int32)), (kind, i, r)
    print("ok", len(got))
""")

FORK = textwrap.dedent("""
    import os, torch, emunum
    x = torch.randn(1 << 19)
    want = emunum.quantize(x, "e5m2", "stochastic", seed=3)
    pid = os.fork()
    if pid == 0:
        try:
            ok = torch.equal(emunum.quantize(x, "e5m2", "stochastic", seed=3), want)
            ok &= torch.equal(emunum.quantize(x[:1000], "e5m2"), emunum.quantize(x, "e5m2")[:1000])
        except BaseException:
            os._exit(3)
        os._exit(0 if ok else 4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("ok")
""")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)


def test_four_threads_quantizing_and_multiplying_at_once_get_the_serial_bits():
    r = _run(THREADS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().startswith("ok")


def test_a_forked_child_quantizes_after_its_parent_did():
    r = _run(FORK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"
