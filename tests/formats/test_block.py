"""BlockFormat and E8M0 specs: presets, properties, names, encode/decode, bad input named."""
from __future__ import annotations

import gfloat
import gfloat.formats as gff
import numpy as np
import pytest

import emunum
from emunum.formats import BLOCK_PRESETS, E8M0, BlockFormat, FixedFormat, FloatFormat, ScaleRule, get_format


def test_e8m0_codes_match_gfloat_decode_on_every_code():
    want = np.array([gfloat.decode_float(gff.format_info_ocp_e8m0, c).fval for c in range(256)])
    got = E8M0.decode(np.arange(256))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[:255], want[:255])
    assert np.array_equal(E8M0.encode(got[:255]), np.arange(255))
    assert E8M0.encode([np.nan])[0] == 255 and E8M0.nan_code == 255


@pytest.mark.parametrize("name,bits,block,scale_bits", [
    ("mxfp8_e4m3", 8.25, 32, 8), ("mxfp8_e5m2", 8.25, 32, 8), ("mxfp6_e3m2", 6.25, 32, 8),
    ("mxfp6_e2m3", 6.25, 32, 8), ("mxfp4_e2m1", 4.25, 32, 8), ("mxint8", 8.25, 32, 8), ("nvfp4", 4.5, 16, 8),
    ("nvfp4_2d", 4 + 8 / 256, (16, 16), 8), ("msfp12", 4.5, 16, 8), ("msfp16", 8.5, 16, 8),
])
def test_preset_bits_per_element_include_the_scale_share(name, bits, block, scale_bits):
    f = get_format(name)
    assert f.bits == bits and f.block_size == block and f.scale.bits == scale_bits and f.name == name


@pytest.mark.parametrize("name,gf", [
    ("mxfp8_e4m3", gff.format_info_mxfp8_e4m3), ("mxfp8_e5m2", gff.format_info_mxfp8_e5m2),
    ("mxfp6_e3m2", gff.format_info_mxfp6_e3m2), ("mxfp6_e2m3", gff.format_info_mxfp6_e2m3),
    ("mxfp4_e2m1", gff.format_info_mxfp4_e2m1), ("mxint8", gff.format_info_mxint8),
])
def test_mx_presets_have_gfloats_element_values_and_emax(name, gf):
    f = get_format(name)
    want = np.array([gfloat.decode_float(gf.etype, c).fval for c in range(2**gf.etype.k)])
    assert np.array_equal(np.unique(want[np.isfinite(want)]) + 0.0, f.element.values())
    assert f.element_emax == gf.etype.emax and f.block_size == gf.k


def test_nvfp4_is_e2m1_blocks_of_16_with_e4m3_scale_and_tensor_scale():
    f = get_format("nvfp4")
    assert f.element == FloatFormat(2, 1, special="none") and f.scale == FloatFormat(4, 3, special="fn")
    assert f.scale_rule == ScaleRule.AMAX and f.tensor_scale


def test_aliases_specs_are_frozen_hashable_and_equal_by_value():
    assert get_format("mxfp4") is BLOCK_PRESETS["mxfp4_e2m1"] and get_format("MXFP8") == get_format("mxfp8_e4m3")
    assert BlockFormat("e4m3fn", 32) == get_format("mxfp8_e4m3")
    assert len({BlockFormat("e4m3fn", 32), get_format("mxfp8_e4m3")}) == 1
    with pytest.raises(AttributeError):
        get_format("mxfp4").block_size = 16
    t = BlockFormat("e4m3fn", (16, 16))
    assert t.tile == (16, 16) and t.block_elements == 256 and t.name == "block[e4m3fn,16x16,e8m0]"
    assert get_format("e8m0") is E8M0


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(element="e4m3fn", block_size=0), ValueError, "block_size=0"),
    (dict(element="e4m3fn", block_size=(16, 0)), ValueError, r"block_size\[1\]=0"),
    (dict(element="e4m3fn", block_size=(16, 16, 1)), ValueError, "pair"),
    (dict(element="e4m3fn", block_size=2.5), TypeError, "block_size"),
    (dict(element="e4m3fn", scale="int8"), TypeError, "scale"),
    (dict(element="e4m3fn", scale="e8m0", scale_rule="amax"), ValueError, "e8m0.*ocp"),
    (dict(element="e4m3fn", scale_rule="max"), ValueError, "scale_rule='max'"),
    (dict(element="e4m3fn", tensor_scale=True), ValueError, "tensor_scale"),
    (dict(element="e4m3fn", tensor_scale=1), TypeError, "tensor_scale"),
    (dict(element=E8M0), TypeError, "element"),
    (dict(element=BLOCK_PRESETS["mxfp4_e2m1"]), TypeError, "another BlockFormat"),
    (dict(element=FloatFormat(3, 0, special="fn")), ValueError, "man >= 1"),
    (dict(element="nope"), ValueError, "element='nope'"),
])
def test_bad_specs_are_named(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        BlockFormat(**kwargs)


def test_float_scale_with_ocp_rule_clips_to_its_powers_of_two():
    f = BlockFormat(FixedFormat(8, 6), 32, FloatFormat(5, 2))
    assert f.scale_exp_range == (-16, 15)


def test_decode_needs_scales_and_tiles_need_2d():
    f = get_format("mxfp4")
    with pytest.raises(TypeError, match="scales"):
        f.decode(np.zeros(32, dtype=np.int64))
    with pytest.raises(ValueError, match="2-D tiles"):
        BlockFormat("e4m3fn", (2, 2)).encode(np.zeros(8))
    with pytest.raises(ValueError, match="axis=3"):
        f.encode(np.zeros((2, 2)), axis=3)


def test_formats_cli_lists_block_presets(capsys):
    from emunum.cli import main
    assert main(["formats"]) == 0
    text = capsys.readouterr().out
    for name in BLOCK_PRESETS:
        assert name in text
    assert "4.25" in text


def test_straight_through_quantizer_rejects_block_formats_by_name():
    with pytest.raises(TypeError, match="mxfp4_e2m1 is not an element format"):
        emunum.Quantizer(forward="mxfp4")


def test_e8m0_encode_rounds_down_or_up_between_powers_of_two_and_refuses_other_modes():
    v = np.array([1.0, 1.5, 2.0, 3.0, 0.75, 2.0**-130, 2.0**200])
    assert np.array_equal(E8M0.decode(E8M0.encode(v)), [1.0, 1.0, 2.0, 2.0, 0.5, 2.0**-127, 2.0**127])
    assert np.array_equal(E8M0.decode(E8M0.encode(v, "toward_zero")), E8M0.decode(E8M0.encode(v)))
    assert np.array_equal(E8M0.decode(E8M0.encode(v, "up")), [1.0, 2.0, 2.0, 4.0, 1.0, 2.0**-127, 2.0**127])
    with pytest.raises(ValueError, match="rounding='nearest': allowed: 'down'"):
        E8M0.encode(v, "nearest")


def test_a_block_format_is_a_format_spec_not_an_element_format():
    from emunum.formats import FormatSpec, NumberFormat, get_format

    f = get_format("mxfp8_e4m3")
    assert isinstance(f, FormatSpec) and not isinstance(f, NumberFormat)
    assert isinstance(f.element, NumberFormat) and get_format(f) is f
    assert not hasattr(f, "values") and not hasattr(f, "to_kernel_args")  # element-format operations only
    assert emunum.Policy.make(f).input.fmt is f
