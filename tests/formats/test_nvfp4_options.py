"""The NVFP4 family's options on BlockFormat (emunum/formats/nvfp4.py): presets, UE5M3 against its PTX
definition, and named errors for options a format cannot take."""
from __future__ import annotations

import math

import numpy as np
import pytest

import emunum
from emunum.formats import BLOCK_PRESETS, UE5M3, BlockFormat, FourOverSix, OuterScale


def ue5m3_value(code: int) -> float:
    """PTX ISA 13.4 UE5M3: unsigned, 5 exponent bits (bias 15), 3 mantissa bits, subnormals, no infinity, 0xff
    the only NaN."""
    if code == 0xFF:
        return math.nan
    e, m = code >> 3, code & 7
    return math.ldexp(m, -14 - 3) if e == 0 else math.ldexp(1 + m / 8, e - 15)


def test_ue5m3_values_are_the_ptx_definition_code_for_code():
    want = np.array([ue5m3_value(c) for c in range(256)])
    got = UE5M3.decode(np.arange(256))  # the sign bit 0: codes 0..255 are UE5M3's
    assert np.array_equal(got, want, equal_nan=True)
    assert UE5M3.max == 114688.0 and UE5M3.min_subnormal == 2.0 ** -17
    assert np.array_equal(UE5M3.encode(want[:255]), np.arange(255))


def test_ue5m3_block_scales_are_amax_over_6_rounded_to_nearest_even_ue5m3():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 16)) * np.exp2(rng.integers(-20, 18, (64, 1)))).astype(np.float32)
    import torch
    from emunum.block_quantize import quantize_block_checked
    from emunum.formats import RoundMode
    _, s = quantize_block_checked(torch.from_numpy(x), BLOCK_PRESETS["nvfp4_ue5m3"], RoundMode.NEAREST, 0, 32, -1,
                                  return_scales=True)
    grid = np.array([ue5m3_value(c) for c in range(255)])
    want = []
    for a in np.abs(x.astype(np.float64)).max(axis=1) / 6:
        a = min(a, grid[-1])
        i = np.searchsorted(grid, a)
        lo, hi = grid[max(i - 1, 0)], grid[min(i, 254)]
        pick = lo if (a - lo < hi - a or (a - lo == hi - a and (i - 1) % 2 == 0)) else hi
        want.append(max(pick, grid[1]))  # a zero scale is raised to the smallest (BlockFormat's rule)
    assert np.array_equal(s.numpy().reshape(-1), np.array(want))


@pytest.mark.parametrize("name,outer,fos,block", [
    ("nvfp4_1l", OuterScale.NONE, None, 16), ("nvfp4_row", OuterScale.ROW, None, 16),
    ("nvfp4_b32", OuterScale.TENSOR, None, 32), ("nvfp4_ue5m3", OuterScale.NONE, None, 16),
    ("nvfp4_4over6", OuterScale.TENSOR, FourOverSix("mae", 256), 16),
    ("nvfp4_4over6_mse", OuterScale.TENSOR, FourOverSix("mse", 256), 16),
    ("nvfp4_4over6_2d", OuterScale.TENSOR, FourOverSix("mae", 256), (16, 16))])
def test_family_presets_name_their_options(name, outer, fos, block):
    f = emunum.get_format(name)
    assert f.name == name and f.outer_scale == outer and f.four_over_six == fos and f.block_size == block
    assert f.tensor_scale == (outer == OuterScale.TENSOR)


def test_tensor_scale_true_and_outer_scale_tensor_are_one_format():
    a = BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", tensor_scale=True)
    b = BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", outer_scale="tensor")
    assert a == b == BLOCK_PRESETS["nvfp4"] and hash(a) == hash(b)


@pytest.mark.parametrize("kwargs,match", [
    (dict(element="e4m3fn", four_over_six=FourOverSix()), r"four_over_six needs element e2m1.*got element=e4m3fn"),
    (dict(block_size=32, four_over_six=FourOverSix()), r"four_over_six: block_size=32; allowed: 16 or \(16, 16\)"),
    (dict(scale="e8m0", scale_rule="ocp", tensor_scale=False, four_over_six=FourOverSix()),
     r"four_over_six needs a float scale .*scale_rule='amax'; got scale=e8m0"),
    (dict(outer_scale="diagonal"), r"outer_scale='diagonal'.*tensor.*row"),
    (dict(tensor_scale=True, outer_scale="row"), r"tensor_scale=True and outer_scale='row' conflict"),
    (dict(block_size=(16, 16), tensor_scale=False, outer_scale="row"), r"outer_scale='row' needs 1-D blocks"),
    (dict(element="nf4", tensor_scale=False, outer_scale="row"), r"outer_scale='row' needs a FloatFormat or "
                                                                  r"FixedFormat element; got element=nf4"),
])
def test_bad_family_options_raise_naming_field_value_and_allowed(kwargs, match):
    base = dict(element="fp4_e2m1", block_size=16, scale="e4m3fn", scale_rule="amax", tensor_scale=True)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BlockFormat(base.pop("element"), base.pop("block_size"), base.pop("scale"), **base)


@pytest.mark.parametrize("kwargs,match", [
    (dict(metric="rmse"), r"FourOverSix.metric.*'rmse'.*mae, mse, absmax"),
    (dict(bound=300), r"FourOverSix.bound=300; allowed: 448 or 256"),
    (dict(bound=True), r"FourOverSix.bound=True; allowed: 448 or 256"),
])
def test_bad_four_over_six_options_raise_naming_field_value_and_allowed(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FourOverSix(**kwargs)


def test_four_over_six_must_be_a_spec():
    with pytest.raises(TypeError, match=r"four_over_six='mae': allowed: None or a FourOverSix"):
        BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", four_over_six="mae")
