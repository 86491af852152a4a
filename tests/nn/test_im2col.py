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
