"""Per-row outer scales (``outer_scale='row'``) and the other plain NVFP4-family variants through
``emunum.quantize``: a row-scaled tensor equals each row of blocks quantised alone as NVFP4 (whose one tensor
scale is then that row's), along any block axis; single-level equals NVFP4 with T = 1."""
from __future__ import annotations

import pytest
import torch

import emunum
from emunum.formats import BLOCK_PRESETS, RoundMode

Q = emunum.quantize


def sample(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x * torch.exp2(torch.randint(-8, 9, shape[:-1] + (1,), generator=g).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero", "stochastic"])
def test_row_outer_scale_equals_each_row_quantised_alone_as_nvfp4(rounding, dtype):
    x = sample((12, 40)).to(dtype)
    got = Q(x, "nvfp4_row", rounding, seed=3)
    if rounding == "stochastic":  # same seed, same flat index: quantise the rows at their places in a zero tensor
        want = torch.stack([Q(torch.where(torch.arange(12)[:, None] == r, x, 0.0), "nvfp4", rounding, seed=3)[r]
                            for r in range(12)])
    else:
        want = torch.stack([Q(x[r], "nvfp4", rounding) for r in range(12)])
    assert torch.equal(got.view(torch.int64 if dtype == torch.float64 else torch.int32),
                       want.view(torch.int64 if dtype == torch.float64 else torch.int32))
    assert not torch.equal(got, Q(x, "nvfp4", rounding, seed=3))  # one tensor scale gives other numbers


def test_row_outer_scale_along_axis_0_is_one_scale_per_column():
    x = sample((6, 48)).t()  # (48, 6): each column spread in exponent of its own
    got = Q(x, "nvfp4_row", axis=0)
    want = torch.stack([Q(x[:, c], "nvfp4") for c in range(x.shape[1])], dim=1)
    assert torch.equal(got, want)
    assert not torch.equal(got, Q(x, "nvfp4", axis=0))


def test_nan_in_a_row_makes_its_block_nan_and_leaves_the_row_scale_finite():
    x = sample((2, 32))
    x[0, 3] = float("nan")
    x[1, 20] = float("inf")
    got = Q(x, "nvfp4_row")
    assert torch.isnan(got[0, :16]).all() and not torch.isnan(got[0, 16:]).any()
    assert torch.equal(got[0, 16:], Q(x[0].nan_to_num(0.0), "nvfp4")[16:])
    assert not torch.isnan(got[1]).any()


@pytest.mark.parametrize("name,ref", [("nvfp4_1l", dict(tensor_scale=False)), ("nvfp4_b32", dict(block_size=32)),
                                      ("nvfp4_ue5m3", dict(scale="ue5m3", tensor_scale=False))])
def test_plain_variants_equal_blockformat_with_those_fields(name, ref):
    args = dict(block_size=16, scale="e4m3fn", scale_rule="amax", tensor_scale=True)
    args.update(ref)
    fmt = emunum.BlockFormat("fp4_e2m1", args.pop("block_size"), args.pop("scale"), **args)
    assert BLOCK_PRESETS[name] == fmt
    x = sample((8, 64))
    codes, scales, t = fmt.encode(x.double().numpy())
    want = torch.from_numpy(fmt.decode(codes, scales, tensor_scale=t)).float()
    assert torch.equal(Q(x, name), want)
