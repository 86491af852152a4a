"""emunum.mad's layouts for the fast kernel (``backend.fast_layout``) give the bits of the layouts they replace.

Where ``gemm_fast`` runs a unit, a convolution with output rows narrower than a kernel tile runs as one GEMM per
group over every sample's columns (forward and grad-input; rows of TN and more: per sample, each sample's columns
made right before its GEMM reads them, ``kernels/conv_fast.py``), its bias gradient as ones^T @ grad's rows, and
a padded convolution's input gradient over the unpadded positions only (``conv._crops``: where no pad exceeds
dilation * (kernel - 1); one case has pads beyond); elsewhere (and with ``fast_layout`` patched off, the
reference here) it runs one GEMM per sample and group, as before. Each gradient and output is compared bit for
bit (zero tolerance, signs of zeros and NaN payload-free NaN positions included). The im2col view that replaced
``F.unfold`` is compared with ``F.unfold`` on its own.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import emunum
from emunum import FloatFormat, MADUnit
from emunum.mad import backend, conv

UNITS = {
    "e6m9-e6m9_chunk64 (the fp8 recipe's unit: exact products of e5m2 operands)": MADUnit("fp16_169", "fp16_169",
                                                                                         chunk=64),
    "e5m2-e6m9_chunk64 (e5m2 products, rounded)": MADUnit("fp8_152", "fp16_169", chunk=64),
    "e5m2-e6m9_lanes3_chunk4": MADUnit("fp8_152", "fp16_169", chunk=4, lanes=3),
    "e4m3-bf16_sat_chunk3": MADUnit("fp8_143", FloatFormat(8, 7, saturate=True), chunk=3),
}

# (function, input shape, weight shape, stride, padding, dilation, groups)
CASES = {
    "cnn1d conv1 (k5, stride 2, pad 1)": ("conv1d", (6, 1, 40), (5, 1, 5), 2, 1, 1, 1),
    "cnn1d conv2 (k3, stride 2, pad 1)": ("conv1d", (5, 7, 19), (7, 7, 3), 2, 1, 1, 1),
    "conv1d wide rows (L >= 64), same padding": ("conv1d", (3, 4, 90), (6, 4, 3), 1, "same", 1, 1),
    "conv1d dilation 2, groups 2": ("conv1d", (4, 4, 23), (6, 2, 3), 3, 2, 2, 2),
    "conv2d stride (2, 1), groups 2": ("conv2d", (2, 4, 7, 6), (4, 2, 2, 3), (2, 1), (1, 2), (1, 2), 2),
    "conv2d 3x3 pad 1, wide rows": ("conv2d", (2, 3, 9, 10), (5, 3, 3, 3), 1, 1, 1, 1),
    "conv2d 3x3 stride 2 pad (2, 1)": ("conv2d", (2, 3, 9, 10), (4, 3, 3, 3), 2, (2, 1), 1, 1),
    "conv2d pads beyond the kernel's reach": ("conv2d", (2, 3, 6, 7), (4, 3, 1, 3), 1, (1, 3), 1, 1),
    "conv2d rows of 288 (per sample, columns made per sample), groups 2":
        ("conv2d", (3, 4, 16, 18), (6, 2, 3, 3), 1, 1, 1, 2),
    "conv2d rows of 256, stride 2, dilation 2": ("conv2d", (2, 3, 35, 36), (5, 3, 3, 2), 2, (2, 1), (2, 3), 1),
    "conv2d 30 -> 25 channels (weight gradient over two column tiles)": ("conv2d", (2, 30, 7, 8), (25, 30, 3, 3), 1, 1,
                                                                           1, 1),
}


def _operands(rng, shape, fmt="fp8_152", special=False):
    """Values of ``fmt``: scaled normals with zeros of both signs, small integers and far-apart powers of two."""
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * np.exp2(rng.integers(-4, 4, n))
    kind = rng.random(n)
    x = np.where(kind < 0.1, 0.0, x)
    x = np.where((kind >= 0.1) & (kind < 0.15), -0.0, x)
    x = np.where((kind >= 0.15) & (kind < 0.3), rng.integers(-6, 7, n).astype(np.float64), x)
    x = np.where((kind >= 0.3) & (kind < 0.4), np.exp2(rng.integers(-16, 10, n)) * rng.choice([-1, 1], n), x)
    if special:
        x[rng.integers(0, n, 3)] = [np.inf, -np.inf, np.nan]
    return emunum.quantize(torch.from_numpy(x.reshape(shape)), fmt).float()


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _step(case, unit, special, bias_dtype):
    """Output and gradients of one forward and backward of the case's convolution on ``unit``."""
    fn, xs, ws, stride, padding, dilation, groups = CASES[case]
    rng = np.random.default_rng(list(CASES).index(case))
    x = _operands(rng, xs, special=special).requires_grad_()
    w = _operands(rng, ws).requires_grad_()
    b = (torch.from_numpy(rng.standard_normal(ws[0]) * 4).to(bias_dtype).requires_grad_() if bias_dtype
         else None)
    y = getattr(emunum.mad, fn)(x, w, b, stride, padding, dilation, groups, unit=unit)
    y.backward(_operands(rng, tuple(y.shape), special=special))
    return {"output": y, "grad_input": x.grad, "grad_weight": w.grad, **({"grad_bias": b.grad} if b is not None else {})}


@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.float64], ids=["no-bias", "bias32", "bias64"])
@pytest.mark.parametrize("special", [False, True], ids=["finite", "inf-nan"])
@pytest.mark.parametrize("unit", list(UNITS))
@pytest.mark.parametrize("case", list(CASES))
def test_conv_as_one_gemm_gives_the_per_sample_gemms_bits(case, unit, special, bias_dtype, monkeypatch):
    u = UNITS[unit]
    assert backend.fast_layout(u, torch.device("cpu"))  # the one-GEMM layout is what runs below
    new = _step(case, u, special, bias_dtype)
    monkeypatch.setattr(backend, "fast_layout", lambda unit, device: False)
    old = _step(case, u, special, bias_dtype)
    assert new.keys() == old.keys()
    for k in new:
        assert new[k].shape == old[k].shape and new[k].dtype == old[k].dtype and new[k].is_contiguous(), k
        assert torch.equal(_bits(new[k]), _bits(old[k])), k


@pytest.mark.parametrize("unit, fast", [
    (MADUnit("fp8_152", "fp16_169", chunk=64), True),
    (MADUnit("fp8_152", "bf16", lanes=2), True),
    (MADUnit("fp8_152", "fp16_169", acc_rounding="stochastic"), False),  # draws counters from the layout
    (MADUnit("fp8_152", "fp16", acc_rounding="toward_zero"), False),  # gemm_general / gemm_vec
    (MADUnit(None, "fp32", fused=True), False),
    (MADUnit("fp16", "fp8_152"), False),  # product format wider than the accumulator
    (MADUnit("fp32", "fp32", order="any"), False),  # torch.matmul (gemm_fast would apply to fp32-fp32)
    (MADUnit("fp8_152", "fp32", terms=4), False),  # multi-term datapath
])
def test_fast_layout_is_claimed_only_where_gemm_fast_runs(unit, fast):
    assert backend.fast_layout(unit, torch.device("cpu")) is fast
    assert backend.fast_layout(unit, torch.device("meta")) is False
    assert backend.fast_layout(unit, torch.device("cpu")) is fast  # the cached answer


@pytest.mark.parametrize("shape, kernel, stride, dilation, view", [
    ((3, 2, 1, 40), (1, 5), (1, 2), (1, 1), "contiguous"),
    ((2, 3, 7, 9), (2, 3), (2, 1), (1, 2), "contiguous"),
    ((2, 3, 7, 9), (3, 3), (1, 1), (2, 1), "transposed"),
    ((2, 4, 8, 6), (2, 2), (3, 2), (1, 1), "sliced"),
])
def test_im2col_view_holds_unfolds_values(shape, kernel, stride, dilation, view):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if view == "transposed":
        x = x.transpose(2, 3).contiguous().transpose(2, 3)
    elif view == "sliced":
        x = torch.randn(shape[0], shape[1] + 2, shape[2] + 1, shape[3])[:, 1:-1, 1:]
    want = F.unfold(x, kernel, dilation=dilation, stride=stride)
    p = conv._patches(x, *kernel, stride, dilation)
    got = p.reshape(shape[0], -1, p.shape[4] * p.shape[5])
    assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("pads, kernel, dilation, crops", [
    (((1, 1), (1, 1)), (3, 3), (1, 1), True), (((0, 1), (1, 0)), (2, 2), (1, 1), True),
    (((2, 2), (0, 0)), (3, 3), (1, 1), True), (((3, 3), (0, 0)), (3, 3), (1, 1), False),
    (((2, 2), (2, 2)), (2, 2), (2, 2), True), (((1, 1), (0, 0)), (1, 1), (1, 1), False),
    (((0, 0), (0, 0)), (3, 3), (1, 1), False)])
def test_the_input_gradient_skips_the_padding_only_where_every_pad_lies_within_the_kernels_reach(
        pads, kernel, dilation, crops):
    cpu = torch.device("cpu")
    fast = UNITS["e6m9-e6m9_chunk64 (the fp8 recipe's unit: exact products of e5m2 operands)"]
    assert conv._crops(pads, kernel, dilation, fast, cpu) is crops
    stochastic = MADUnit("fp8_152", "fp16_169", acc_rounding="stochastic")  # counters: the full gradient's
    assert not conv._crops(pads, kernel, dilation, stochastic, cpu)


def test_per_sample_convolution_bits_do_not_depend_on_the_thread_count(monkeypatch):
    """``kernels/conv_fast.py`` runs each sample's GEMM on ``gemm_fast``'s threads from a serial loop: one thread
    and all of them give the same bits, and the per-sample path is what runs."""
    import numba

    case = "conv2d rows of 288 (per sample, columns made per sample), groups 2"
    u = UNITS["e6m9-e6m9_chunk64 (the fp8 recipe's unit: exact products of e5m2 operands)"]
    ran = []
    real = backend.conv_gemm

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        ran.append(out is not None)
        return out

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread (NUMBA_NUM_THREADS=1): nothing to compare")
    monkeypatch.setattr(backend, "conv_gemm", counted)
    n = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _step(case, u, False, torch.float32)
        numba.set_num_threads(2)
        many = _step(case, u, False, torch.float32)
    finally:
        numba.set_num_threads(n)
    assert ran == [True] * 4  # forward and input gradient, on one thread and on two
    for key in one:
        assert torch.equal(_bits(one[key]), _bits(many[key])), key
