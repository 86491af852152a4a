"""The all-reduce hook compares the ranks' settings once, at the first bucket: replicas registered with
different settings raise ValueError on every rank, naming each rank's settings, instead of drifting apart.
Each case is a pair of gloo processes (its own port); the pairs of all cases are forked in turn from one
subprocess (one import of torch), under one timeout (a rank that raised alone would leave the other waiting)."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import multiprocessing, os, socket, sys, threading, torch, torch.distributed as dist
    import torch.multiprocessing as mp
    from emunum.distributed import quantized_allreduce_hook
    CASES = {cases}

    def say(case, text):
        print("\\n".join(f"[{{case}}] {{line}}" for line in text.split("\\n")), flush=True)

    def worker(rank, case, port, done):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=2)
        torch.manual_seed(0)
        m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
        m.register_comm_hook(None, quantized_allreduce_hook(**CASES[case][rank]))
        try:
            (m(torch.randn(8, 4)) ** 2).mean().backward()
            m.zero_grad()
            (m(torch.randn(8, 4)) ** 2).mean().backward()
            say(case, f"rank {{rank}} OK")
        except ValueError as e:
            say(case, f"rank {{rank}} RAISED {{e}}")
        # leave without gloo's teardown, which can wait forever after a comm hook raised mid-backward, or deadlock
        # freeing DDP's reducer against a gloo thread waiting for the GIL (torch's, not the hook's): once the peer is
        # done too (it has then finished the same collectives), or after a wait long enough for it to be (a peer
        # that never is fails the test anyway)
        try:
            done.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass
        os._exit(0)

    def port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    import torch._dynamo  # DDP's constructor imports it (~1.5 CPU-s): once here, not in every forked rank
    for case in CASES:
        done = multiprocessing.get_context("fork").Barrier(2)  # the ranks that are done, inherited by the fork
        mp.start_processes(worker, args=(case, port(), done), nprocs=2, join=True, start_method="fork")
""")

BASE = dict(fmt="e5m2", rounding="stochastic", seed=7)
TIMEOUT = 180
DIFFERENT = [dict(result_fmt="bf16"), dict(seed=8), dict(rounding="nearest"), dict(fmt="e4m3fn"), dict(ring=True),
             dict(scaling="per_bucket"), dict(error_feedback=True)]
CASES = {"same": [BASE, BASE], **{next(iter(d)): [BASE, {**BASE, **d}] for d in DIFFERENT}}


@pytest.fixture(scope="module")
def ranks() -> dict[str, str]:
    """Each case's output of its two ranks (stdout lines tagged with the case); on a hang the whole process group
    (every rank too) is killed and the tests fail."""
    p = subprocess.Popen([sys.executable, "-c", SCRIPT.format(cases=repr(CASES))], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"the ranks hung for {TIMEOUT} s (killed): {out}{err[-2000:]}")
    lines = out.splitlines()
    return {case: "\n".join(ln[len(f"[{case}] "):] for ln in lines if ln.startswith(f"[{case}] ")) + err[-3000:]
            for case in CASES}


@pytest.mark.parametrize("other", DIFFERENT, ids=lambda d: next(iter(d)))
def test_ranks_with_different_settings_raise_on_every_rank_naming_them(other, ranks):
    key = next(iter(other))
    out = ranks[key]
    for r in (0, 1):
        assert f"rank {r} RAISED quantized_allreduce_hook: the ranks' settings differ" in out, out
    assert "rank 1: " in out and f"{key}=" in out


def test_ranks_with_the_same_settings_train(ranks):
    out = ranks["same"]
    assert "rank 0 OK" in out and "rank 1 OK" in out, out
