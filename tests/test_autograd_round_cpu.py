"""``autograd._round_cpu``, the eager roundings' short path: the bits, seed draws and fresh results of
``quantize_checked`` wherever it rounds, and None (the caller's general path) wherever it must not."""
from __future__ import annotations

import pytest
import torch

from emunum import backends, buffers
from emunum.autograd import _round_cpu
from emunum.formats import FixedFormat, RoundMode, get_format
from emunum.quantize import quantize_checked

_FORMATS = {"e5m2": get_format("e5m2"), "e4m3fn": get_format("e4m3fn"), "fixed_q4.3": FixedFormat(8, 3)}
_MODES = [RoundMode.NEAREST, RoundMode.STOCHASTIC, RoundMode.TOWARD_ZERO, RoundMode.UP]
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def _source(n: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 40).to(dtype)


@pytest.mark.parametrize("fmt", sorted(_FORMATS))
@pytest.mark.parametrize("mode", _MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [1, 17, 4099])
def test_rounds_as_quantize_checked_with_the_same_seed_draws(fmt, mode, dtype, n):
    x = _source(n, dtype)
    for seed in (None, 12345):
        torch.manual_seed(8)
        want = quantize_checked(x, _FORMATS[fmt], mode, seed, 32)
        after_want = torch.rand(1)
        torch.manual_seed(8)
        got = _round_cpu(x, _FORMATS[fmt], mode, seed, 32)
        after_got = torch.rand(1)
        assert got is not None and got.data_ptr() != x.data_ptr()
        assert torch.equal(got.view(_BITS[dtype]), want.view(_BITS[dtype]))
        assert torch.equal(after_got, after_want)  # the generator is where quantize_checked leaves it


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_rounds_below_the_huge_buffer_size_and_declines_from_it_on(dtype):
    fmt, size = _FORMATS["e5m2"], torch.empty(0, dtype=dtype).element_size()
    limit = -(-buffers.HUGE_MIN_BYTES // size)  # the first element count quantize_checked takes huge pages for
    below = _source(limit - 1, dtype)
    got = _round_cpu(below, fmt, RoundMode.NEAREST, None, 32)
    assert got is not None
    assert torch.equal(got.view(_BITS[dtype]), quantize_checked(below, fmt, RoundMode.NEAREST, None, 32).view(_BITS[dtype]))
    assert _round_cpu(_source(limit, dtype), fmt, RoundMode.NEAREST, None, 32) is None


@pytest.mark.parametrize("case", ["empty", "transposed", "negative view", "float16", "bfloat16"])
def test_declines_what_the_general_path_must_round(case):
    x = _source(12, torch.float32)
    x = {"empty": x[:0], "transposed": x.view(3, 4).t(), "negative view": torch._neg_view(x), "float16": x.half(),
         "bfloat16": x.bfloat16()}[case]
    torch.manual_seed(2)
    before = torch.get_rng_state()
    assert _round_cpu(x, _FORMATS["e5m2"], RoundMode.STOCHASTIC, None, 32) is None
    assert torch.equal(torch.get_rng_state(), before)  # declined before any draw


def test_a_new_kernel_registration_is_used_from_the_next_call_on():
    fmt = _FORMATS["e5m2"]
    x = _source(33, torch.float32)
    _round_cpu(x, fmt, RoundMode.NEAREST, None, 32)  # cached
    calls = []
    original = backends.cpu_runner(fmt, torch.float32)

    def counting(src, dst, n, mode, key, nbits, parallel=None):
        calls.append(n)
        original(src, dst, n, mode, key, nbits, parallel)

    factory = backends._FACTORIES["cpu"][type(fmt)]
    backends.register(type(fmt), "cpu", lambda f, dtype: counting, replace=True)
    try:
        got = _round_cpu(x, fmt, RoundMode.NEAREST, None, 32)
    finally:
        backends.register(type(fmt), "cpu", factory, replace=True)
    assert calls == [33]
    assert torch.equal(got, quantize_checked(x, fmt, RoundMode.NEAREST, None, 32))
