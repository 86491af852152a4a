"""Format specs: derived limits against ml_dtypes/numpy finfo, gfloat and known values; the value set and
the bit codes against ml_dtypes' bit patterns; frozen and hashable; validation messages."""
from __future__ import annotations

import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest

from emunum import FixedFormat, FloatFormat, RoundMode, Special
from emunum.formats import PRESETS
from emunum.formats import Overflow

# preset -> the ml_dtypes / numpy type with the same value set and special values
ML_TYPES = {
    "fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16,
    "fp8_152": ml_dtypes.float8_e5m2, "fp8_143": ml_dtypes.float8_e4m3, "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp6_e2m3": ml_dtypes.float6_e2m3fn, "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}
SMALL_ML = {k: v for k, v in ML_TYPES.items() if k not in ("fp32", "fp16", "bf16")}


@pytest.mark.parametrize("name", list(ML_TYPES))
def test_derived_limits_match_finfo(name):
    fmt, fi = PRESETS[name], ml_dtypes.finfo(ML_TYPES[name])
    assert fmt.bits == fi.bits
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)


KNOWN = {  # name: (bits, max, min_normal, min_subnormal, eps), from the formats' definitions
    "tf32": (19, (2 - 2.0**-10) * 2.0**127, 2.0**-126, 2.0**-136, 2.0**-10),
    "fp16_169": (16, (2 - 2.0**-9) * 2.0**31, 2.0**-30, 2.0**-39, 2.0**-9),  # e6m9, bias 31: emax 62-31
    "int8": (8, 127.0, 1.0, 1.0, 1.0),
    "int4": (4, 7.0, 1.0, 1.0, 1.0),
    "uint8": (8, 255.0, 1.0, 1.0, 1.0),
    "fixed16_12": (16, 32767 / 4096, 2.0**-12, 2.0**-12, 2.0**-12),
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_derived_limits_match_known_values(name):
    fmt = PRESETS[name]
    assert (fmt.bits, fmt.max, fmt.min_normal, fmt.min_subnormal, fmt.eps) == KNOWN[name]


def test_every_preset_has_a_limit_test():
    assert set(PRESETS) == set(ML_TYPES) | set(KNOWN)


def test_fixed_limits():
    assert (PRESETS["int8"].min, PRESETS["uint8"].min, PRESETS["fixed16_12"].min) == (-128.0, 0.0, -8.0)
    f = FixedFormat(6, 2, signed=False)
    assert (f.code_min, f.code_max, f.max, f.eps) == (0, 63, 15.75, 0.25)
    g = FixedFormat(5, -2)
    assert (g.code_min, g.code_max, g.max, g.min, g.eps) == (-16, 15, 60.0, -64.0, 4.0)


def test_limits_match_gfloat(gfloat_float_case, oracles):
    fmt, fi = gfloat_float_case, oracles.gfloat_info(gfloat_float_case)
    assert (fmt.max, fmt.min_normal, fmt.min_subnormal, fmt.eps) == (
        fi.max, fi.smallest_normal, fi.smallest_subnormal, fi.eps)


def _ml_decoded(ml, bits: int) -> np.ndarray:
    """Every bit pattern of an ml_dtypes/numpy type of <= 16 bits, decoded to float64."""
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        return np.arange(2**bits, dtype=np.uint16 if bits > 8 else np.uint8).view(ml).astype(np.float64)


@pytest.mark.parametrize("name", [n for n in ML_TYPES if n != "fp32"])
def test_values_equal_ml_dtypes_value_set(name):
    fmt = PRESETS[name]
    dec = _ml_decoded(ML_TYPES[name], fmt.bits)
    want = np.unique(dec[np.isfinite(dec)])
    got = fmt.values()
    assert np.array_equal(got, want)
    assert got.size == np.isfinite(dec).sum() - (1 if fmt.has_negative_zero else 0)  # one zero
    assert not np.signbit(got[got == 0]).any()  # the zero is +0


@pytest.mark.parametrize("name", list(SMALL_ML))
def test_decode_and_encode_match_ml_dtypes_bit_patterns(name):
    fmt, ml = PRESETS[name], SMALL_ML[name]
    codes = np.arange(2**fmt.bits)
    want = _ml_decoded(ml, fmt.bits)
    got = fmt.decode(codes)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin], want[fin]) and np.array_equal(np.signbit(got[fin]), np.signbit(want[fin]))
    # encode: every non-NaN value back to its own code, NaN to ml_dtypes' NaN code
    assert np.array_equal(fmt.encode(want[fin]), codes[fin])
    if fmt.has_nan:
        assert fmt.encode([np.nan])[0] == np.array([np.nan], dtype=ml).view(np.uint8)[0] == fmt.nan_code
    # encode rounds (nearest even) exactly as ml_dtypes' cast: random float32 values within range
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(5000) * fmt.max / 4).astype(np.float32)
    x = x[np.abs(x) <= fmt.max]
    assert np.array_equal(fmt.encode(x), x.astype(ml).view(np.uint8).astype(np.int64))


@pytest.mark.parametrize("fmt", [
    FloatFormat(3, 4, bias=5), FloatFormat(4, 3, subnormals=False), FloatFormat(4, 2, special="fnuz"),
    FloatFormat(3, 3, special="fn", bias=2), FloatFormat(2, 2, special="none", subnormals=False),
    FloatFormat(4, 0), FloatFormat(8, 3, bias=140), FloatFormat(5, 10), FloatFormat(6, 2, bias=-40),
], ids=str)
def test_custom_codes_round_trip(fmt):
    codes = np.arange(2**fmt.bits)
    dec = fmt.decode(codes)
    ok = ~np.isnan(dec)
    assert np.array_equal(fmt.encode(dec[ok]), codes[ok])
    vals = fmt.values()
    assert np.array_equal(fmt.decode(fmt.encode(vals)), vals)
    assert vals.max() == fmt.max and vals[vals > 0].min() == fmt.min_subnormal
    n_unused = 0 if fmt.subnormals else 2 * (2**fmt.man - 1)  # subnormal codes of a no-subnormal format
    assert (~ok).sum() == n_unused + {Special.IEEE: 2 * (2**fmt.man - 1), Special.FN: 2, Special.FNUZ: 1,
                                      Special.NONE: 0}[fmt.special]


@pytest.mark.parametrize("fmt", [PRESETS["int8"], PRESETS["uint8"], FixedFormat(8, 3, saturate=False),
                                 FixedFormat(6, 2, signed=False), FixedFormat(5, -2)], ids=str)
def test_fixed_codes_are_twos_complement(fmt):
    codes = np.arange(2**fmt.bits)
    vals = fmt.decode(codes)
    ints = np.where(codes >= 2 ** (fmt.bits - 1), codes - 2**fmt.bits, codes) if fmt.signed else codes
    assert np.array_equal(vals, np.ldexp(ints.astype(np.float64), -fmt.frac_bits))
    assert np.array_equal(fmt.encode(vals), codes)
    assert np.array_equal(fmt.values(), np.sort(vals))


def test_values_refuses_wide_formats():
    with pytest.raises(ValueError, match="values\\(\\) lists formats of at most 16 bits; e8m10 has 19"):
        PRESETS["tf32"].values()


def test_decode_validates_codes():
    with pytest.raises(TypeError, match="codes must be integers, got dtype float64"):
        PRESETS["fp8_152"].decode(np.array([1.0]))
    with pytest.raises(ValueError, match=r"codes must be in \[0, 256\) for e5m2"):
        PRESETS["fp8_152"].decode([256])


# ---------------------------------------------------------------------------------------------------------
# structure: frozen, hashable, names, kernel arguments
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [PRESETS["fp8_152"], PRESETS["int8"]], ids=str)
def test_specs_are_frozen(fmt):
    field = "exp" if isinstance(fmt, FloatFormat) else "bits"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fmt, field, 3)


def test_specs_are_hashable_and_compare_by_value():
    a, b = FloatFormat(5, 2), FloatFormat(5, 2, bias=15, special="ieee")
    assert a == b and hash(a) == hash(b) and a == PRESETS["fp8_152"]
    assert a != FloatFormat(5, 2, saturate=True) and a != FloatFormat(5, 2, special="fnuz")
    assert {a: 1}[PRESETS["fp8_152"]] == 1
    assert len({FixedFormat(8, 0), PRESETS["int8"], FixedFormat(8, 0, saturate=False)}) == 2
    assert FloatFormat(4, 3, special="fn").special is Special.FN  # strings are parsed once


def test_default_bias():
    assert FloatFormat(5, 2).bias == 15 and FloatFormat(4, 3, special="fnuz").bias == 8
    assert FloatFormat(5, 2, special="fnuz").bias == 16 and FloatFormat(2, 1, special="none").bias == 1


@pytest.mark.parametrize("fmt,name", [
    (FloatFormat(5, 2), "e5m2"), (FloatFormat(4, 3, special="fn"), "e4m3fn"),
    (FloatFormat(4, 3, special="fnuz"), "e4m3fnuz"), (FloatFormat(2, 1, special="none"), "e2m1none"),
    (FloatFormat(3, 4, bias=5), "e3m4[bias=5]"), (FloatFormat(4, 3, subnormals=False, saturate=True), "e4m3[nosub,sat]"),
    (FixedFormat(16, 12), "fixed16_12"), (FixedFormat(6, 2, signed=False), "ufixed6_2"),
    (FixedFormat(8, 3, saturate=False), "fixed8_3[wrap]"),
])
def test_names(fmt, name):
    assert fmt.name == name == str(fmt)


@pytest.mark.parametrize("fmt,args", [
    (PRESETS["e4m3fn"], (0, 3, -6, 1, 448.0, int(Overflow.NAN), 1)),
    (PRESETS["fp8_152"], (0, 2, -14, 1, 57344.0, int(Overflow.INF), 1)),
    (PRESETS["e4m3fnuz"], (0, 3, -7, 1, 240.0, int(Overflow.NAN), 0)),
    (PRESETS["fp4_e2m1"], (0, 1, 0, 1, 6.0, int(Overflow.SATURATE), 1)),
    (FloatFormat(5, 2, saturate=True, subnormals=False), (0, 2, -14, 0, 57344.0, int(Overflow.SATURATE), 1)),
    (PRESETS["int8"], (1, 0, -128, 127, 1)),
    (FixedFormat(6, 2, signed=False, saturate=False), (1, 2, 0, 63, 0)),
], ids=str)
def test_kernel_args(fmt, args):
    got = fmt.to_kernel_args()  # a kernels.abi record: its kind tag, then its fields
    assert (got.KIND, *got) == args and all(type(a) in (int, float) for a in got)


def test_special_value_properties():
    ieee, fn, fnuz, none = (FloatFormat(4, 3, special=s) for s in ("ieee", "fn", "fnuz", "none"))
    assert [f.has_inf for f in (ieee, fn, fnuz, none)] == [True, False, False, False]
    assert [f.has_nan for f in (ieee, fn, fnuz, none)] == [True, True, True, False]
    assert [f.has_negative_zero for f in (ieee, fn, fnuz, none)] == [True, True, False, True]
    assert [f.overflow for f in (ieee, fn, fnuz, none)] == [Overflow.INF, Overflow.NAN, Overflow.NAN,
                                                            Overflow.SATURATE]
    assert FloatFormat(4, 3, saturate=True).overflow == Overflow.SATURATE
    assert [f.max for f in (ieee, fn, fnuz, none)] == [240.0, 448.0, 240.0, 480.0]


# ---------------------------------------------------------------------------------------------------------
# rounding modes
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,mode", [
    ("nearest", RoundMode.NEAREST), ("NEAREST", RoundMode.NEAREST), (" Nearest ", RoundMode.NEAREST),
    ("rne", RoundMode.NEAREST), ("ties_to_even", RoundMode.NEAREST), ("nearest_away", RoundMode.NEAREST_AWAY),
    ("rna", RoundMode.NEAREST_AWAY), ("toward_zero", RoundMode.TOWARD_ZERO), ("rtz", RoundMode.TOWARD_ZERO),
    ("truncate", RoundMode.TOWARD_ZERO), ("up", RoundMode.UP), ("ceil", RoundMode.UP), ("down", RoundMode.DOWN),
    ("floor", RoundMode.DOWN), ("odd", RoundMode.ODD), ("stochastic", RoundMode.STOCHASTIC),
    ("SR", RoundMode.STOCHASTIC), (RoundMode.UP, RoundMode.UP),
])
def test_round_mode_parse(text, mode):
    assert RoundMode.parse(text) is mode


def test_round_mode_codes_are_the_kernel_codes():
    assert [int(m) for m in RoundMode] == list(range(7))
    assert [m.name for m in RoundMode] == ["NEAREST", "NEAREST_AWAY", "TOWARD_ZERO", "UP", "DOWN", "ODD",
                                           "STOCHASTIC"]


@pytest.mark.parametrize("bad", ["banana", "", 3, None])
def test_round_mode_parse_rejects(bad):
    msg = (f"backward={bad!r} is not a rounding mode; "
           "allowed: nearest, nearest_away, toward_zero, up, down, odd, stochastic")
    with pytest.raises(ValueError, match=re.escape(msg)):
        RoundMode.parse(bad, field="backward")


# ---------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------
BAD_FLOAT = [
    (dict(exp=0, man=3), ValueError, r"FloatFormat\.exp=0 is out of range; allowed: 1\.\.8"),
    (dict(exp=12, man=3), ValueError, r"FloatFormat\.exp=12 is out of range; allowed: 1\.\.8"),
    (dict(exp=4, man=-1), ValueError, r"FloatFormat\.man=-1 is out of range; allowed: 0\.\.23"),
    (dict(exp=4, man=24), ValueError, r"FloatFormat\.man=24 is out of range; allowed: 0\.\.23"),
    (dict(exp=4.0, man=3), TypeError, r"FloatFormat\.exp must be an int in \[1, 8\], got 4\.0 \(float\)"),
    (dict(exp=True, man=3), TypeError, r"FloatFormat\.exp must be an int in \[1, 8\], got True \(bool\)"),
    (dict(exp=4, man="3"), TypeError, r"FloatFormat\.man must be an int in \[0, 23\], got '3' \(str\)"),
    (dict(exp=4, man=3, bias=1.5), TypeError, r"FloatFormat\.bias must be an int .* got 1\.5"),
    (dict(exp=4, man=3, special="ibm"), ValueError,
     r"special='ibm' is not a special-value policy; allowed: ieee, fn, fnuz, none"),
    (dict(exp=4, man=3, subnormals="yes"), TypeError, r"FloatFormat\.subnormals must be a bool, got 'yes'"),
    (dict(exp=4, man=3, saturate=1), TypeError, r"FloatFormat\.saturate must be a bool, got 1"),
    (dict(exp=8, man=23, bias=100), ValueError, r"e8m23\[bias=100\]: max=.* does not fit a float32 .*bias=100"),
    (dict(exp=8, man=23, bias=130), ValueError,
     r"smallest value 2\*\*-152 is below float32's 2\*\*-149; lower bias=130 or man=23"),
    (dict(exp=1, man=2), ValueError, r"FloatFormat\.exp=1 with special='ieee' leaves no normal numbers"),
]


@pytest.mark.parametrize("kwargs,exc,msg", BAD_FLOAT, ids=[m[:40] for _, _, m in BAD_FLOAT])
def test_bad_float_format_raises_naming_field_and_value(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        FloatFormat(**kwargs)


BAD_FIXED = [
    (dict(bits=0, frac_bits=0), ValueError, r"FixedFormat\.bits=0 is out of range; allowed: 1\.\.32"),
    (dict(bits=33, frac_bits=0), ValueError, r"FixedFormat\.bits=33 is out of range; allowed: 1\.\.32"),
    (dict(bits=8, frac_bits=100), ValueError, r"FixedFormat\.frac_bits=100 is out of range; allowed: -64\.\.64"),
    (dict(bits=8.0, frac_bits=0), TypeError, r"FixedFormat\.bits must be an int in \[1, 32\], got 8\.0"),
    (dict(bits=8, frac_bits=0, signed="no"), TypeError, r"FixedFormat\.signed must be a bool, got 'no'"),
    (dict(bits=8, frac_bits=0, saturate=None), TypeError, r"FixedFormat\.saturate must be a bool, got None"),
]


@pytest.mark.parametrize("kwargs,exc,msg", BAD_FIXED, ids=[m[:40] for _, _, m in BAD_FIXED])
def test_bad_fixed_format_raises_naming_field_and_value(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        FixedFormat(**kwargs)


def test_widest_formats_that_fit_float32_are_accepted():
    f = FloatFormat(8, 23, bias=127)
    assert f.max == float(np.finfo(np.float32).max) and f.min_subnormal == 2.0**-149
    g = FloatFormat(8, 3, bias=146)  # smallest subnormal 2**-148
    assert g.min_subnormal == 2.0**-148


@pytest.mark.parametrize("make", [lambda: FloatFormat(5, 2, 15), lambda: FixedFormat(8, 3, False)])
def test_options_after_the_widths_are_keyword_only_as_in_the_contract(make):
    with pytest.raises(TypeError):
        make()
