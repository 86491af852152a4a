"""The one-pass im2col of the block convolutions (emunum/nn/im2col.py) gives the bits of F.unfold followed by
the transposing reshape, forward and backward (torch's col2im, whose order of addition it keeps), zero
tolerance: kernel sizes, strides, paddings, dilations, 1-row inputs, NaN and -0.0 values, and gradients of
mixed magnitudes, where another order of addition would change the sums."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from emunum.nn.im2col import im2col_rows

GEOMETRIES = [  # (kernel, stride, padding, dilation, (H, W))
    ((3, 3), (1, 1), (1, 1), (1, 1), (9, 11)),
    ((3, 3), (2, 2), (1, 1), (1, 1), (9, 11)),
    ((5, 3), (2, 1), (2, 0), (1, 2), (12, 10)),
    ((2, 2), (1, 1), (0, 0), (2, 2), (7, 8)),
    ((1, 1), (1, 1), (0, 0), (1, 1), (5, 6)),
    ((1, 5), (1, 3), (0, 2), (1, 1), (1, 17)),  # a Conv1d's height-1 image
    ((4, 4), (3, 2), (3, 1), (1, 1), (6, 7)),  # padding as large as the kernel reaches
]


def old_path(x, k, st, p, d):
    cols = F.unfold(x, k, dilation=d, padding=p, stride=st)
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@pytest.mark.parametrize("k,st,p,d,hw", GEOMETRIES)
def test_im2col_rows_forward_and_backward_equal_unfold_and_col2im(k, st, p, d, hw):
    gen = torch.Generator().manual_seed(hash((k, st, p, d)) % 1000)
    x = torch.randn(3, 4, *hw, generator=gen) * 2.0 ** torch.randint(-20, 20, (3, 4, 1, 1), generator=gen)
    x[0, 1, 0, 0], x[1, 2, -1, -1], x[2, 0, 0, 1] = float("nan"), -0.0, float("-inf")
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = old_path(x1, k, st, p, d), im2col_rows(x2, k, st, p, d)
    assert got is not None and same_bits(got, want)
    g = torch.randn(want.shape, generator=gen) * 2.0 ** torch.randint(-24, 24, want.shape, generator=gen)
    g[g.abs() < 0.05] = -0.0  # pixels whose terms are all -0.0 sum to +0.0 in col2im
    g[0, 0] = float("nan")
    want.backward(g)
    got.backward(g)
    assert same_bits(x2.grad, x1.grad)


def test_im2col_rows_backward_takes_a_non_contiguous_gradient():
    x = torch.randn(2, 3, 6, 6)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    k, st, p, d = (3, 3), (1, 1), (1, 1), (1, 1)
    want, got = old_path(x1, k, st, p, d), im2col_rows(x2, k, st, p, d)
    g = torch.randn(want.shape[1], want.shape[0]).t()  # strides (1, rows)
    (want * 1).backward(g)
    (got * 1).backward(g)
    assert same_bits(x2.grad, x1.grad)


def test_im2col_rows_declines_what_it_does_not_handle():
    k = s = p = d = (1, 1)
    assert im2col_rows(torch.randn(1, 2, 3, 3, dtype=torch.float64), k, s, p, d) is None
    assert im2col_rows(torch.randn(1, 2, 3), k, s, p, d) is None
    assert im2col_rows(torch.randn(0, 2, 3, 3), k, s, p, d) is None
    assert im2col_rows(torch.randn(1, 2, 3, 3), (5, 5), s, (0, 0), d) is None  # kernel beyond the image


@pytest.mark.parametrize("tc", [16, 32, 7])
@pytest.mark.parametrize("k,st,p,d,hw", GEOMETRIES)
def test_the_scan_is_the_amax_pass_of_the_rows(k, st, p, d, hw, tc):
    """Each block's largest |v| (NaN where one is NaN) and the largest finite |v|, as block_amaxes finds them."""
    import numpy as np

    from emunum.kernels import block_cpu
    from emunum.nn.im2col import im2col_rows_scanned

    gen = torch.Generator().manual_seed(hash((k, st, p, d, tc)) % 1000)
    x = torch.randn(3, 4, *hw, generator=gen) * 2.0 ** torch.randint(-20, 20, (3, 4, 1, 1), generator=gen)
    x[0, 1, 0, 0], x[1, 2, -1, -1], x[2, 0, 0, 1] = float("nan"), -0.0, float("-inf")
    x[2, 3] = x[2, 3].abs() * 1e30  # the largest finite |v| is not the first block's
    cols, scan = im2col_rows_scanned(x, k, st, p, d, tc)
    assert same_bits(cols, old_path(x, k, st, p, d))
    want = np.empty(cols.shape[0] * -(-cols.shape[1] // tc))
    amax = block_cpu.block_amaxes(cols.numpy().reshape(1, *cols.shape), want, tc)
    assert np.array_equal(scan[0].view(np.uint64), want.view(np.uint64)) and scan[1] == amax


@pytest.mark.parametrize("kind", ["conv2d", "conv1d"])
def test_a_layer_keeps_every_bit_with_the_scan_handed_to_the_quantiser(kind, monkeypatch):
    import emunum
    from emunum.nn import block_gemm
    from torch import nn

    def run(scan: bool):
        with monkeypatch.context() as m:
            if not scan:
                m.setattr(block_gemm, "_scan_block", lambda spec, groups: 0)
            torch.manual_seed(4)
            net = nn.Conv2d(5, 12, 3, padding=1) if kind == "conv2d" else nn.Conv1d(5, 12, 5, padding=2)
            x = torch.randn((3, 5, 7, 20) if kind == "conv2d" else (3, 5, 33)) * 4
            x[0, 0, 0] = float("inf")
            x.requires_grad_()
            emu = emunum.patch(nn.Sequential(net), policy=emunum.Policy.make(
                "nvfp4", weight="nvfp4_2d", grad_rounding="stochastic", hadamard=16), functional=False)
            y = emu(x)
            y.backward(torch.randn_like(y))
            return [y.detach(), x.grad, *(q.grad for q in net.parameters()), torch.randint(0, 2**62, (1,))]

    calls = []
    real = block_gemm.BlockPlan.q

    def q(self, t, role, axis, trace=None, scan=None):
        if (role, axis) == (block_gemm._I, -1):
            calls.append(scan is not None)
        return real(self, t, role, axis, trace, scan)

    monkeypatch.setattr(block_gemm.BlockPlan, "q", q)
    want = run(False)
    assert calls == [False]
    calls.clear()
    got = run(True)
    assert calls == [True]  # the forward's x2 quantisation took the scan
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.view(torch.int32) if g.is_floating_point() else g,
                           w.view(torch.int32) if w.is_floating_point() else w)
