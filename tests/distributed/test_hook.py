"""The DDP communication hooks on two real gloo processes, checked bit for bit against the single-process
``reference_allreduce`` (and, for fmt=None, against DDP without a hook).

One ``torch.multiprocessing`` spawn runs every configuration: each rank trains a small DDP model for three
steps with tiny buckets (so there are several buckets, DDP rebuilds them after step 0, and error feedback
carries residuals across steps), records every bucket the hook receives and returns, and the parameters'
gradients. The reference then replays the recorded inputs of all ranks, step by step.
"""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from emunum.distributed import quantized_allreduce_hook, reference_allreduce

STEPS = 3
CONFIGS = {
    "e5m2-stochastic": dict(fmt="e5m2", rounding="stochastic", seed=7),
    "e4m3fn-nearest-scaled": dict(fmt="e4m3fn", rounding="nearest", scaling="per_bucket"),
    "e5m2-stochastic-ring": dict(fmt="e5m2", rounding="stochastic", seed=3, ring=True),
    "e4m3-nearest-ring-scaled": dict(fmt="fp8_143", rounding="nearest", ring=True, scaling="per_bucket"),
    "e5m2-stochastic-feedback": dict(fmt="e5m2", rounding="stochastic", seed=11, error_feedback=True),
    "e4m3fn-ring-feedback-result": dict(fmt="e4m3fn", rounding="stochastic", seed=5, ring=True,
                                        error_feedback=True, scaling="per_bucket", result_fmt="bf16"),
    "fp32-result-bf16": dict(fmt=None, rounding="nearest", result_fmt="bf16"),
    "fp32-ring": dict(fmt=None, rounding="nearest", ring=True),
    "fp32": dict(fmt=None),
    "e5m2-seed-drawn": dict(fmt="e5m2", rounding="stochastic", seed=None),  # rank 0 draws, broadcasts
}
PLAIN = "ddp-without-hook"
# three ranks: the ring's order matters (each chunk's partial sums are rounded in a different rank order);
# fp32 sums are left out (gloo's float32 reduction order is its own)
THREE = ["e5m2-stochastic", "e5m2-stochastic-ring", "e4m3-nearest-ring-scaled", "e4m3fn-ring-feedback-result"]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Tanh(), torch.nn.Linear(40, 30),
                               torch.nn.Tanh(), torch.nn.Linear(30, 3))


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank ``rank`` of 3: the 2-rank runs use the subgroup {0, 1} (passed to the hook as DDP's state), the
    3-rank runs the default group."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    pair = dist.new_group([0, 1])
    record = {}
    try:
        for n, names in ((2, [*CONFIGS, PLAIN]), (3, THREE)):
            if rank >= n:
                continue
            group = pair if n == 2 else None
            for name in names:
                record[(n, name)] = _train(rank, group, CONFIGS.get(name))
        torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _train(rank: int, group, kw) -> dict:
    ddp = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.002, process_group=group)
    calls = []
    torch.manual_seed(100 + rank)  # the ranks' generators differ: a drawn seed must come from rank 0
    if kw is not None:
        hook = quantized_allreduce_hook(**kw)

        def recording(state, bucket, hook=hook, calls=calls):
            step, inp = hook.step, bucket.buffer().clone()
            fut = hook(state, bucket)
            calls.append((step, bucket.index(), inp, fut.value().clone()))
            return fut

        ddp.register_comm_hook(group, recording)
    grads = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own data
        x = torch.randn(16, 12, generator=g) * (1 + 30 * rank ** 2)
        ddp.zero_grad(set_to_none=True)
        (ddp(x) ** 2).mean().backward()
        grads.append([p.grad.clone() for p in ddp.parameters()])
    return {"calls": calls, "grads": grads, "seed": hook.seed if kw is not None else None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("ddp")
    # fork: the workers inherit the imported torch and emunum (spawn would import them again, ~5 s each), and
    # torch._dynamo, which DDP's constructor imports (~1.5 CPU-s a rank)
    import torch._dynamo  # noqa: F401
    mp.start_processes(_worker, args=(3, _free_port(), str(out)), nprocs=3, join=True, start_method="fork")
    return [torch.load(out / f"rank{r}.pt") for r in range(3)]


@pytest.fixture(scope="module")
def runs(spawned):
    """The 2-rank runs: per rank, {name: {"calls", "grads"}}."""
    return [{name: r[(n, name)] for (n, name) in r if n == 2} for r in spawned[:2]]


@pytest.fixture(scope="module")
def runs3(spawned):
    return [{name: r[(n, name)] for (n, name) in r if n == 3} for r in spawned]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _check_against_reference(runs, name):
    kw = dict(CONFIGS[name])
    if "seed" in kw and kw["seed"] is None:  # the ranks' drawn seed: the same on both, then the reference's
        (kw["seed"],) = {r[name]["seed"] for r in runs}
    calls = [r[name]["calls"] for r in runs]
    assert len({len(c) for c in calls}) == 1 and len(calls[0]) > STEPS  # several buckets per step
    assert len({c[1] for c in calls[0]}) > 1
    residuals: dict[int, list] = {}
    for per_rank in zip(*calls):
        (step, index, _, _), = {(c[0], c[1], None, None) for c in per_rank}  # the ranks agree on the bucket
        ref_kw = {k: v for k, v in kw.items() if k != "fmt"}
        want, new_res = reference_allreduce([c[2] for c in per_rank], kw["fmt"], step=step, bucket=index,
                                            residuals=residuals.get(index), **ref_kw)
        if new_res is not None:
            residuals[index] = new_res
        for c in per_rank:
            assert torch.equal(_bits(c[3]), _bits(want)), (name, step, index)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_bucket_of_two_ranks_equals_the_single_process_reference(runs, name):
    _check_against_reference(runs, name)


@pytest.mark.parametrize("name", THREE)
def test_every_bucket_of_three_ranks_equals_the_single_process_reference(runs3, name):
    _check_against_reference(runs3, name)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_replicas_receive_identical_gradients(runs, name):
    for step in range(STEPS):
        for a, b in zip(runs[0][name]["grads"][step], runs[1][name]["grads"][step]):
            assert torch.equal(_bits(a), _bits(b))


def test_the_ring_result_depends_on_the_ring_order(runs3):
    """With three ranks a ring in another order (2 -> 1 -> 0) gives other bits: the stated order is tested."""
    calls = [r["e5m2-stochastic-ring"]["calls"] for r in runs3]
    step, index, _, got = calls[0][0]
    reversed_ranks = [calls[r][0][2] for r in (2, 1, 0)]
    other, _ = reference_allreduce(reversed_ranks, "e5m2", "stochastic", seed=3, ring=True, step=step, bucket=index)
    assert not torch.equal(_bits(other), _bits(got))


@pytest.mark.parametrize("kw, error, words", [
    (dict(fmt="e9m9"), ValueError, "fmt"),
    (dict(fmt="mxfp8_e4m3"), ValueError, "block-scaled"),
    (dict(fmt="e5m2", rounding="round"), ValueError, "rounding='round'"),
    (dict(fmt="e5m2", scaling="per_tensor"), ValueError, "scaling='per_tensor'"),
    (dict(fmt="e5m2", ring="yes"), TypeError, "ring"),
    (dict(fmt="e5m2", error_feedback=1), TypeError, "error_feedback"),
    (dict(fmt="e5m2", seed=-1), ValueError, "seed=-1"),
    (dict(fmt="e5m2", seed=1.5), TypeError, "seed"),
    (dict(fmt=None, error_feedback=True), ValueError, "error_feedback"),
    (dict(fmt=None, scaling="per_bucket"), ValueError, "scaling"),
    (dict(fmt="e5m2", result_fmt="nope"), ValueError, "result_fmt"),
])
def test_bad_arguments_raise_naming_the_argument(kw, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace("[", r"\[")):
        quantized_allreduce_hook(**kw)


def test_fmt_none_hook_equals_ddp_without_a_hook_bit_for_bit(runs):
    for r in runs:
        for step in range(STEPS):
            for a, b in zip(r["fp32"]["grads"][step], r[PLAIN]["grads"][step]):
                assert torch.equal(_bits(a), _bits(b))


def test_the_wire_rounding_changes_the_gradients(runs):
    """The hooks are not silently plain: an e5m2 wire gives other bits than fp32."""
    a, b = runs[0]["e5m2-stochastic"]["grads"][0], runs[0][PLAIN]["grads"][0]
    assert any(not torch.equal(x, y) for x, y in zip(a, b))


def test_error_feedback_residuals_are_carried_to_the_next_step(runs):
    """With feedback, step 1's result differs from the same inputs reduced without residuals."""
    calls = [r["e5m2-stochastic-feedback"]["calls"] for r in runs]
    later = [(a, b) for a, b in zip(*calls) if a[0] >= 1]
    kw = dict(rounding="stochastic", seed=11)
    differs = False
    for a, b in later:
        plain, _ = reference_allreduce([a[2], b[2]], "e5m2", step=a[0], bucket=a[1], **kw)
        differs |= not torch.equal(plain, a[3])
    assert differs
