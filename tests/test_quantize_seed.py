"""``quantize.resolve_seed(None)`` draws the seeds of stochastic rounding: the same values, in the same order, as
``torch.randint(0, 2**62, (1,))`` on torch's default generator, however other draws interleave with them."""
from __future__ import annotations

import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from emunum.quantize import resolve_seed


def _reference(n: int, between) -> list:
    out = []
    for _ in range(n):
        out.append(torch.randint(0, 2**62, (1,)).item())
        between()
    return out


def _drawn(n: int, between) -> list:
    out = []
    for _ in range(n):
        out.append(resolve_seed(None))
        between()
    return out


_BETWEEN = {
    "nothing": lambda: None,
    "rand": lambda: torch.rand(3),  # another user of the generator between two seeds
    "randint": lambda: torch.randint(0, 7, (5,)),
}


@pytest.mark.parametrize("between", sorted(_BETWEEN))
@pytest.mark.parametrize("n", [1, 2, 17])
def test_drawn_seeds_are_torch_randints_values_in_stream_order(between, n):
    torch.manual_seed(1234)
    want = _reference(n, _BETWEEN[between])
    torch.manual_seed(1234)
    assert _drawn(n, _BETWEEN[between]) == want


@pytest.mark.parametrize("ctx", ["inference_mode", "no_grad"])
def test_drawn_seeds_are_the_same_inside_inference_mode_and_no_grad(ctx):
    torch.manual_seed(7)
    want = _reference(4, _BETWEEN["rand"])
    torch.manual_seed(7)
    with getattr(torch, ctx)():
        assert _drawn(4, _BETWEEN["rand"]) == want


def test_each_thread_draws_into_its_own_buffer_from_the_shared_generator():
    torch.manual_seed(99)
    want = sorted(_reference(8, _BETWEEN["nothing"]))
    torch.manual_seed(99)
    got, lock = [], threading.Lock()

    def work():
        for _ in range(4):
            with lock:  # one draw at a time: the generator is shared, the buffers are per thread
                got.append(resolve_seed(None))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == want


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that runs every op as it is (as ``emunum.coverage``'s listener does)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_drawn_seeds_are_the_same_under_a_dispatch_mode():
    torch.manual_seed(5)
    want = _reference(3, _BETWEEN["rand"])
    torch.manual_seed(5)
    with _PassThrough():
        assert _drawn(3, _BETWEEN["rand"]) == want


@pytest.mark.parametrize("seed", [0, 1, 2**62, -(2**63), 2**63 - 1])
def test_a_given_seed_is_returned_as_it_is_without_a_draw(seed):
    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert resolve_seed(seed) == seed
    assert torch.equal(torch.get_rng_state(), before)
