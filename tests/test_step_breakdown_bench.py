"""benchmarks/step_breakdown.py's kernel swaps (``Kernels``) reach every CPU rounding the element-wise paths run,
also after those paths cached their runners, and put the real kernels back on exit: its "kernels -> ..." rows
time what they say."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import emunum

from benchmark_script import load

step_breakdown = load("step_breakdown")


def _layer():
    torch.manual_seed(0)
    plain = nn.Linear(32, 16)
    emu = emunum.patch(copy.deepcopy(plain), fmt="e4m3fn", grad="e5m2")
    return plain, emu


def _forward_backward(layer, x):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(torch.linspace(-1, 1, y.numel()).view_as(y) / 3)
    return y.detach(), x.grad, layer.weight.grad


def test_a_copying_kernel_turns_every_warm_rounding_into_a_copy_and_the_real_ones_come_back():
    plain, emu = _layer()
    x = torch.randn(8, 32)
    rounded = _forward_backward(emu, x)  # fills the runner caches
    emu.zero_grad(set_to_none=True)
    exact = _forward_backward(plain, x)
    assert not torch.equal(rounded[0], exact[0])
    with step_breakdown.Kernels(step_breakdown.memmove_kernel):
        emu.zero_grad(set_to_none=True)
        copied = _forward_backward(emu, x)
    for c, e in zip(copied, exact):  # output, input gradient, weight gradient: nothing rounded
        assert torch.equal(c, e)
    emu.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    again = _forward_backward(emu, x)
    assert torch.equal(again[0], rounded[0])  # nearest: the same bits as before the swap
    assert torch.equal(again[0], emunum.quantize(F.linear(emunum.quantize(x, "e4m3fn"),
                                                          emunum.quantize(plain.weight, "e4m3fn"),
                                                          emunum.quantize(plain.bias, "e4m3fn")), "e4m3fn"))


def test_the_swap_reaches_the_huge_tensor_path_and_counts_each_kernel_call():
    big = torch.randn(2 << 20)  # 8 MiB of float32: quantize's huge-buffer path
    small = torch.randn(100)
    seen = []

    def counting(run, size):
        def call(src, dst, n, mode, key, nbits, parallel=None):
            seen.append((n, size))
            run(src, dst, n, mode, key, nbits, parallel)
        return call

    want = [emunum.quantize(t, "e5m2") for t in (big, small)]
    with step_breakdown.Kernels(counting):
        got = [emunum.quantize(t, "e5m2") for t in (big, small)]
    assert seen == [(big.numel(), 4), (small.numel(), 4)]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    with step_breakdown.Kernels(step_breakdown.memmove_kernel):
        assert torch.equal(emunum.quantize(big, "e5m2"), big)
    assert torch.equal(emunum.quantize(big, "e5m2"), want[0])
