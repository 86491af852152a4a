"""Preset catalogue and name parsing: presets, aliases, fp<N>_<s><e><m>, e<E>m<M>[fn|fnuz|none],
fixed<bits>_<frac>, int<N>/uint<N>; case and whitespace; errors naming the bad name."""
from __future__ import annotations

import pytest

import emunum
from emunum import FixedFormat, FloatFormat, get_format
from emunum.formats import ALIASES, PRESETS, known_names


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_resolves_to_itself(name):
    assert get_format(name) is PRESETS[name]
    assert get_format(name.upper()) is PRESETS[name]


@pytest.mark.parametrize("alias", list(ALIASES))
def test_aliases_resolve_to_their_preset(alias):
    assert get_format(alias) is PRESETS[ALIASES[alias]]


def test_documented_presets_and_aliases():
    """The contract's preset list (docs/formats.md, "Presets")."""
    assert get_format("fp32") == FloatFormat(8, 23) and get_format("tf32") == FloatFormat(8, 10)
    assert get_format("bf16") == FloatFormat(8, 7) and get_format("fp16") == FloatFormat(5, 10)
    assert get_format("fp16_169") == FloatFormat(6, 9)
    assert get_format("fp8_152") is get_format("fp8_e5m2") is get_format("e5m2") is PRESETS["fp8_152"]
    assert get_format("fp8_143") == FloatFormat(4, 3)
    assert get_format("e4m3fn") is get_format("fp8_e4m3fn") and get_format("e4m3fn").max == 448.0
    assert get_format("e4m3fnuz") == FloatFormat(4, 3, special="fnuz")
    assert get_format("e5m2fnuz") == FloatFormat(5, 2, special="fnuz")
    assert get_format("fp6_e3m2") == FloatFormat(3, 2, special="none")
    assert get_format("fp6_e2m3") == FloatFormat(2, 3, special="none")
    assert get_format("fp4_e2m1") == FloatFormat(2, 1, special="none")
    assert get_format("int8") == FixedFormat(8, 0) and get_format("int4") == FixedFormat(4, 0)
    assert get_format("uint8") == FixedFormat(8, 0, signed=False)
    assert get_format("fixed16_12") == FixedFormat(16, 12)


@pytest.mark.parametrize("name,fmt", [
    ("fp16_1510", FloatFormat(5, 10)),  # N=16 decides the split 1-5-10
    ("fp19_1810", FloatFormat(8, 10)),
    ("fp32_1823", FloatFormat(8, 23)),
    ("fp6_123", FloatFormat(2, 3)),
    ("fp8_152fnuz", FloatFormat(5, 2, special="fnuz")),
    ("fp8_143fn", FloatFormat(4, 3, special="fn")),
    ("fp4_121none", FloatFormat(2, 1, special="none")),
    ("e3m4", FloatFormat(3, 4)),
    ("E4M3FNUZ", FloatFormat(4, 3, special="fnuz")),
    ("e2m1none", FloatFormat(2, 1, special="none")),
    ("fp8_e3m4", FloatFormat(3, 4)),
    ("  Fp8_E4M3fn ", FloatFormat(4, 3, special="fn")),
    ("fixed8_3", FixedFormat(8, 3)),
    ("FIXED12_-2", FixedFormat(12, -2)),
    ("ufixed6_2", FixedFormat(6, 2, signed=False)),
    ("int16", FixedFormat(16, 0)),
    ("uint4", FixedFormat(4, 0, signed=False)),
])
def test_name_grammar(name, fmt):
    got = get_format(name)
    assert got == fmt and hash(got) == hash(fmt)


@pytest.mark.parametrize("fmt", [FloatFormat(5, 2), FloatFormat(4, 3, special="fn"), FloatFormat(2, 1, special="none"),
                                 FixedFormat(8, 3), FixedFormat(6, 2, signed=False)], ids=str)
def test_names_round_trip(fmt):
    assert get_format(fmt.name) == fmt


def test_specs_pass_through():
    f = FloatFormat(3, 4, bias=5)
    assert get_format(f) is f
    g = FixedFormat(8, 3, saturate=False)
    assert get_format(g) is g


@pytest.mark.parametrize("name,msg", [
    ("fp9_152", r"format name 'fp9_152': the digits 152 split into sign-exponent-mantissa summing to 9 in 0 ways"),
    ("fp13_1111", r"the digits 1111 split into sign-exponent-mantissa summing to 13 in 2 ways; write e<E>m<M>"),
    ("fp9_e4m3", r"format name 'fp9_e4m3': fp9 does not match 1\+4\+3=8 bits"),
    ("e9m3", r"FloatFormat\.exp=9 is out of range; allowed: 1\.\.8"),
    ("e4m30", r"FloatFormat\.man=30 is out of range; allowed: 0\.\.23"),
    ("int0", r"FixedFormat\.bits=0 is out of range; allowed: 1\.\.32"),
    ("fixed40_3", r"FixedFormat\.bits=40 is out of range"),
])
def test_bad_names_raise_naming_the_problem(name, msg):
    with pytest.raises(ValueError, match=msg):
        get_format(name)


@pytest.mark.parametrize("name", ["banana", "fp8", "e4m", "fixed8", "fp8_e5m2x", ""])
def test_unknown_name_lists_the_presets(name):
    with pytest.raises(ValueError, match=rf"fmt={name!r} is not a known format; presets: ") as e:
        get_format(name)
    for known in ("fp8_152", "e4m3fn", "fixed16_12", "fp8_e5m2"):
        assert known in str(e.value)
    assert "fp<N>_<s><e><m>" in str(e.value)


@pytest.mark.parametrize("bad", [8, None, 1.5, ("e", 4)])
def test_non_string_raises_type_error(bad):
    with pytest.raises(TypeError, match=rf"fmt must be a FloatFormat, FixedFormat or a format name, got "
                                        rf"{type(bad).__name__}"):
        get_format(bad)


def test_known_names_cover_presets_and_aliases():
    from emunum.formats import POSIT_PRESETS

    names = known_names()
    assert set(names) == set(PRESETS) | set(ALIASES) | set(POSIT_PRESETS)
    assert emunum.PRESETS is PRESETS
