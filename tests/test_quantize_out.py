"""quantize's out= and views: torch's in-place rules, and the one seed range (int64) of every entry point."""
from __future__ import annotations

import pytest
import torch

import emunum


def test_partial_overlap_of_out_and_x_is_refused():
    b = torch.arange(1.0, 10.0)
    before = b.clone()
    with pytest.raises(ValueError, match="partially overlaps"):
        emunum.quantize(b[:8], "fp8_152", out=b[1:])
    assert torch.equal(b, before)


@pytest.mark.parametrize("view", ["same", "transposed_same"])
def test_out_equal_to_x_is_allowed(view):
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    if view == "transposed_same":
        x = x.t()
    want = emunum.quantize(x, "fp8_152")
    got = emunum.quantize(x, "fp8_152", out=x)
    assert got is x and torch.equal(x, want)


def test_disjoint_views_of_one_storage_are_allowed():
    b = torch.arange(1.0, 11.0)
    emunum.quantize(b[:5], "e4m3fn", out=b[5:])
    assert torch.equal(b[5:], emunum.quantize(torch.arange(1.0, 6.0), "e4m3fn"))


def test_out_leaf_requiring_grad_is_refused_like_torch_inplace():
    out = torch.zeros(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        emunum.quantize(torch.ones(4), "e5m2", out=out)
    with torch.no_grad():
        emunum.quantize(torch.ones(4), "e5m2", out=out)
    assert torch.equal(out.detach(), torch.ones(4))


def test_out_inference_tensor_outside_inference_mode_is_refused():
    with torch.inference_mode():
        out = torch.zeros(4)
    with pytest.raises(RuntimeError, match="inference"):
        emunum.quantize(torch.ones(4), "e5m2", out=out)


@pytest.mark.parametrize("rounding", ["nearest", "up", "stochastic"])
def test_a_negative_view_is_read_as_its_value(rounding):
    x = torch.tensor([1.1, -2.3, 0.7, 3.3])
    got = emunum.quantize(x._neg_view(), "e5m2", rounding, seed=4)
    assert torch.equal(got, emunum.quantize(-x, "e5m2", rounding, seed=4))
    with pytest.raises(ValueError, match="negative view"):
        emunum.quantize(x, "e5m2", out=torch.zeros(4)._neg_view())


@pytest.mark.parametrize("seed", [2**63, 2**64, 2**70, -(2**63) - 1])
def test_seeds_outside_int64_are_refused_by_quantize_and_quantizer_alike(seed):
    with pytest.raises(ValueError, match="seed"):
        emunum.quantize(torch.ones(3), "e5m2", "stochastic", seed=seed)
    with pytest.raises(ValueError, match="seed"):
        emunum.Quantizer("e5m2", seed=seed)
