"""Smaller promises: named errors for absurd table values and block operands of a multiplier table, negative
views read by value by every block format, meta tensors propagate shapes through every format and GEMM, and
``hadamard.rht`` names a 0-dim input and an out-of-range dim."""
import numpy as np
import pytest
import torch
from numba import njit

import emunum
import emunum.mad as mad
from emunum import hadamard
from emunum.formats import BLOCK_PRESETS, CustomFormat, TableFormat
from emunum.mad import MADUnit, Multiplier
from emunum.mad.block import block_matmul


@pytest.mark.parametrize("values,words", [([0, 2**1024], r"values\[1\]=2\*\*1024"),
                                          ([-(10**400), 0], r"values\[0\]=2\*\*1328"),
                                          ([0.0, 1.0, 2**2000], r"values\[2\]=2\*\*2000")])
def test_table_values_beyond_float64_are_named(values, words):
    with pytest.raises(ValueError, match=f"TableFormat: {words}.*beyond the float64 range"):
        TableFormat(values)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", "mxint8"])
def test_a_multiplier_table_refuses_a_block_format_naming_it(name):
    with pytest.raises(ValueError, match=f"operand_fmt={name} is a block format"):
        Multiplier.table(np.zeros((256, 256)), name)


@pytest.mark.parametrize("name", [n for n, f in BLOCK_PRESETS.items()])
@pytest.mark.parametrize("axis", [-1, 0])
def test_a_negative_view_into_a_block_format_is_read_by_value(name, axis):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    neg = x._neg_view()
    kw = {} if isinstance(BLOCK_PRESETS[name].block_size, tuple) else {"axis": axis}
    got = emunum.quantize(neg, name, **kw)
    assert torch.equal(got, emunum.quantize(-x, name, **kw)) and neg.is_neg()
    assert torch.equal(neg, -x)  # the input is untouched


@njit
def _to_code(x):
    return np.int64(min(max(round(x * 8.0), 0), 31))


@njit
def _from_code(c):
    return c / 8.0


CUSTOM = CustomFormat(_to_code, _from_code, 5, name="meta5", add=njit(lambda a, b: min(a + b, 31)),
                      mul=njit(lambda a, b: min(a * b // 8, 31)))


@pytest.mark.parametrize("fmt", [*BLOCK_PRESETS, "fp8_152", "e4m3fn", "fixed8_4", "posit8", "nf4", "lns4_3",
                                 CUSTOM], ids=str)
def test_meta_tensors_propagate_shapes_through_every_format(fmt):
    x = torch.empty(8, 32, device="meta")
    y = emunum.quantize(x, fmt)
    assert y.is_meta and y.shape == x.shape and y.dtype == x.dtype


@pytest.mark.parametrize("unit", [MADUnit("fp32", "fp32"), MADUnit.preset("h100_fp8_e4m3"),
                                  MADUnit("fp8_152", "fp16")], ids=["fp32", "h100_fp8", "e5m2_fp16"])
def test_meta_tensors_propagate_shapes_through_every_gemm(unit):
    meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    assert emunum.addmm(meta(2, 3), meta(2, 4), meta(4, 3), unit).shape == (2, 3)
    assert emunum.baddbmm(meta(5, 2, 3), meta(5, 2, 4), meta(5, 4, 3), unit).shape == (5, 2, 3)
    assert mad.matmul(meta(2, 4), meta(4, 3), unit).is_meta
    assert mad.linear(meta(7, 4), meta(3, 4), meta(3), unit).shape == (7, 3)
    assert block_matmul(meta(2, 64), meta(64, 3), "mxfp8_e4m3", "mxfp8_e4m3", MADUnit("fp32", "fp32")).is_meta
    assert mad.custom_matmul(meta(2, 4), meta(4, 3), CUSTOM).shape == (2, 3)


def test_rht_names_a_0_dim_input_and_an_out_of_range_dim():
    with pytest.raises(ValueError, match="0-dim"):
        hadamard.rht(torch.tensor(1.0), 16, 0, 0)
    for dim in (2, -3, 5):
        with pytest.raises(ValueError, match=f"dim={dim} is out of range for a 2-dim tensor; allowed: -2..1"):
            hadamard.rht(torch.randn(4, 8), 16, 0, dim)
