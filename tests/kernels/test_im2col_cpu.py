"""``im2col_cpu.im2col_cols`` (through ``emunum.mad.conv._patch_cols``, as the MAD convolutions call it) gives the
bits of torch's copy of the strided im2col view, in both column layouts (one matrix per sample, and every
sample side by side), zero tolerance: kernel sizes, strides, dilations, groups' channel counts, 1-row images,
NaN payloads, infinities and -0.0."""
from __future__ import annotations

import pytest
import torch

from emunum.mad.conv import _patch_cols, _patches

GEOMETRIES = [  # (kernel, stride, dilation, (H, W)) of an already padded image
    ((3, 3), (1, 1), (1, 1), (9, 11)),
    ((3, 3), (2, 2), (1, 1), (9, 11)),
    ((5, 3), (2, 1), (1, 2), (12, 10)),
    ((2, 2), (1, 3), (2, 2), (7, 8)),
    ((1, 1), (1, 1), (1, 1), (5, 6)),
    ((1, 5), (1, 3), (1, 1), (1, 17)),  # a Conv1d's height-1 image
]


def _torch_cols(x, k, st, d, side_by_side):
    p = _patches(x, k[0], k[1], st, d)
    N, C, kh, kw, Ho, Wo = p.shape
    if side_by_side:
        return p.permute(1, 2, 3, 0, 4, 5).reshape(C * kh * kw, N * Ho * Wo)
    return p.reshape(N, C * kh * kw, Ho * Wo)


@pytest.mark.parametrize("side_by_side", [False, True], ids=["per-sample", "side-by-side"])
@pytest.mark.parametrize("k,st,d,hw", GEOMETRIES)
def test_patch_columns_copy_the_strided_views_bits(k, st, d, hw, side_by_side):
    gen = torch.Generator().manual_seed(hash((k, st, d, hw)) % 1000)
    x = torch.randn(3, 5, *hw, generator=gen)
    bits = x.view(torch.int32)
    bits[0, 1, 0, 0] = 0x7FC01234  # a NaN payload, kept
    bits[1, 2, -1, -1] = 0xFF800001 - 2**32  # a signalling NaN with the sign set
    x[2, 0, 0, -1], x[1, 4, -1, 0], x[0, 3, hw[0] // 2, hw[1] // 2] = -0.0, float("-inf"), float("inf")
    got = _patch_cols(x, k[0], k[1], st, d, side_by_side)
    want = _torch_cols(x, k, st, d, side_by_side)
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got.view(torch.int32), want.contiguous().view(torch.int32))


def test_patch_columns_of_a_strided_or_float64_image_take_torchs_copy():
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    for img in (x, x.float().transpose(2, 3)):
        got = _patch_cols(img, 3, 2, (1, 1), (1, 1), False)
        assert got.dtype == img.dtype and torch.equal(got, _torch_cols(img, (3, 2), (1, 1), (1, 1), False))
