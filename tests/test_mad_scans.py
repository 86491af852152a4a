"""emunum.mad's layers scan each tensor once for the fast kernel's planner (``backend.scan``, ``gemm``'s ``scans``).

A convolution or linear layer hands the scans of x, weight and grad_output to every GEMM whose operand holds their
nonzero values (im2col, the zero-upsampled gradient, transposes). Invariants, zero tolerance:
- every plan made from the layer's scans is at least as cautious as ``fast_plan`` on the operands as laid out
  (work dtype float64 where that one is, each flag set where that one is), and equal to it on these cases;
- outputs and gradients are bit for bit those with the scans switched off (the planner scanning each operand).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum import MADUnit
from emunum.kernels import gemm_cpu, gemm_fast_plan
from emunum.mad import backend

UNIT = MADUnit("fp16_169", "fp16_169", chunk=64)  # the fp8 recipe's unit

# (function, input shape, weight shape, stride, padding)
CASES = {
    "conv1d k5 stride 2 pad 1 (cnn1d conv1)": ("conv1d", (6, 1, 40), (5, 1, 5), 2, 1),
    "conv1d k3 stride 2 pad 1 (cnn1d conv2)": ("conv1d", (5, 7, 19), (7, 7, 3), 2, 1),
    "conv1d wide rows": ("conv1d", (3, 4, 90), (6, 4, 3), 1, 1),
    "conv2d 3x3 pad 1": ("conv2d", (2, 3, 9, 10), (5, 3, 3, 3), 1, 1),
    "linear": ("linear", (2, 9, 30), (11, 30), None, None),
}


def _values(rng, shape, scale, special):
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * scale
    x[rng.random(n) < 0.1] = 0.0
    if special:
        x[rng.integers(0, n, 2)] = [np.inf, np.nan]
    return emunum.quantize(torch.from_numpy(x.reshape(shape)), "fp8_152").float()


def _step(case, special):
    fn, xs, ws, stride, padding = CASES[case]
    rng = np.random.default_rng(list(CASES).index(case))
    # different magnitudes per tensor, so that a scan handed to the wrong operand changes the plan
    x = _values(rng, xs, 2.0**-6, False).requires_grad_()
    w = _values(rng, ws, 1.0, False).requires_grad_()
    b = torch.from_numpy(rng.standard_normal(ws[0])).float().requires_grad_()
    if fn == "linear":
        y = emunum.mad.linear(x, w, b, unit=UNIT)
    else:
        y = getattr(emunum.mad, fn)(x, w, b, stride, padding, unit=UNIT)
    y.backward(_values(rng, tuple(y.shape), 2.0**10, special))
    return [t.detach().clone() for t in (y, x.grad, w.grad, b.grad)]


@pytest.mark.parametrize("special", [False, True], ids=["finite", "inf-nan-grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_plans_from_the_layers_scans_are_the_operands_plans(case, special, monkeypatch):
    calls = []
    plan = gemm_fast_plan.fast_plan

    def spy(A, B, fused, mulp, accp, scans=None, lanes=None, chunk=None):
        got = plan(A, B, fused, mulp, accp, scans, lanes, chunk)
        calls.append((scans, got, plan(A, B, fused, mulp, accp, None, lanes, chunk)))
        return got

    monkeypatch.setattr(gemm_cpu, "fast_plan", spy)
    _step(case, special)
    assert len(calls) >= 4  # forward, grad-input, grad-weight, grad-bias
    for scans, got, want in calls:
        assert scans is not None and (scans[0] is not None or scans[1] is not None)
        assert got == want, (got, want)


@pytest.mark.parametrize("special", [False, True], ids=["finite", "inf-nan-grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_scans_keep_the_bits(case, special, monkeypatch):
    new = _step(case, special)
    monkeypatch.setattr(backend, "scan", lambda t, unit: None)
    old = _step(case, special)
    for a, b in zip(new, old):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
