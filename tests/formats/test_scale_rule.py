"""Power-of-two block-scale rules (floor, ceil, even, rceil) against each rule's definition written here in
exact rational arithmetic (fractions), on every code-point and midpoint style edge of the block maximum, for
every MX element type, float32 and float64 data, the numpy reference (``BlockFormat.encode``) and the kernels
(``emunum.quantize``); names, presets and bad input.

The definitions (docs/scale_rules.md; E is clipped to the scale format's exponents [lo, hi], amax = 0 gives lo,
amax = inf gives hi):
- floor: E = floor(log2 amax) - emax (OCP MX v1.0 section 6.3)
- ceil:  E = ceil(log2 amax) - emax (torchao 0.18 ScaleCalculationMode.CEIL)
- even:  E = floor(log2 RNA_{m+1}(amax)) - emax, RNA: to m + 1 significant bits, ties away (torchao EVEN)
- rceil: E = ceil(log2 RN32(amax / element max)) (cuBLAS UE8M0; RN32: nearest-even float32, saturating to
  inf; float64 data: RN32(RN64(amax / element max)))
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import quantize_block_checked
from emunum.formats import BLOCK_PRESETS, BlockFormat, FixedFormat, FloatFormat, RoundMode, ScaleRule, get_format

MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8"]
RULES = ["floor", "ceil", "even", "rceil"]
POW2_PRESETS = [k for k, f in BLOCK_PRESETS.items() if f.power_of_two_scale]


# ---- the definitions, in fractions --------------------------------------------------------------------------

def floor_log2(q: Fraction) -> int:
    k = q.numerator.bit_length() - q.denominator.bit_length()
    return k - 1 if Fraction(2) ** k > q else k


def ceil_log2(q: Fraction) -> int:
    k = floor_log2(q)
    return k if Fraction(2) ** k == q else k + 1


def round_even(q: Fraction, p: int, emin: int, emax_finite: int | None = None) -> Fraction | float:
    """q > 0 rounded to nearest-even with p significant bits, normal exponents >= emin (subnormals below);
    math.inf past the largest finite value (below 2**(emax_finite + 1)), as IEEE rounding overflows."""
    e = max(floor_log2(q), emin)
    quantum = Fraction(2) ** (e - p + 1)
    n = q / quantum
    k = math.floor(n)
    if n - k > Fraction(1, 2) or (n - k == Fraction(1, 2) and k % 2 == 1):
        k += 1
    r = k * quantum
    if emax_finite is not None and r >= Fraction(2) ** (emax_finite + 1):
        return math.inf
    return r


def rna(q: Fraction, p: int) -> Fraction:
    """q > 0 rounded to p significant bits, ties away from zero."""
    quantum = Fraction(2) ** (floor_log2(q) - p + 1)
    return math.floor(q / quantum + Fraction(1, 2)) * quantum


def rn32(q: Fraction):
    return round_even(q, 24, -126, 127) if q else Fraction(0)


def defined_exponent(amax: float, rule: str, fmt: BlockFormat, data64: bool) -> int:
    lo, hi = fmt.scale_exp_range
    el = fmt.element
    emax = math.frexp(el.max)[1] - 1
    if amax == 0:
        return lo
    if amax == math.inf:
        return hi
    a = Fraction(amax)
    if rule == "rceil":
        q = a / Fraction(el.max)
        r = rn32(round_even(q, 53, -1022) if data64 else q)
        if r == 0:
            return lo
        if r == math.inf:
            return hi
        e = ceil_log2(r)
    elif rule == "floor":
        e = floor_log2(a) - emax
    elif rule == "ceil":
        e = ceil_log2(a) - emax
    else:
        m = el.man if isinstance(el, FloatFormat) else int(el.code_max).bit_length() - 1
        e = floor_log2(rna(a, m + 1)) - emax
    return min(max(e, lo), hi)


# ---- block maxima on every edge -----------------------------------------------------------------------------

def edge_amaxes(fmt: BlockFormat, dtype) -> np.ndarray:
    """Block maxima at and beside every rule's decision points, in ``dtype``: powers of two, powers of two times
    the element max (rceil's ratio an exact power of two), the even rule's carry point (significand
    2 - 2**-(m+1)), each with its dtype neighbours; zero, subnormals, the dtype's extremes and the scale range's
    ends."""
    el = fmt.element
    m = el.man if isinstance(el, FloatFormat) else int(el.code_max).bit_length() - 1
    finfo = np.finfo(dtype)
    ks = list(range(-150, 130, 7)) + [-127, -126, -2, -1, 0, 1, 2, 8, 15, 120, 126, 127]
    base = []
    for k in ks:
        base += [math.ldexp(1.0, k), math.ldexp(el.max, k), math.ldexp(2.0 - math.ldexp(1.0, -(m + 1)), k),
                 math.ldexp(1.5, k)]
    vals = [dtype(0.0), finfo.tiny, finfo.smallest_subnormal, finfo.max, finfo.tiny * dtype(0.75)]
    with np.errstate(over="ignore"):
        for b in base:
            v = dtype(b)
            if not np.isfinite(v) or v == 0:
                continue
            lo, hi = v, v
            vals.append(v)
            for _ in range(3):
                lo, hi = np.nextafter(lo, dtype(0)), np.nextafter(hi, dtype(np.inf))
                vals += [lo, hi]
    vals = np.array(vals, dtype=dtype)
    return np.unique(vals[(vals >= 0) & np.isfinite(vals)])


def blocks_with_amax(amax: np.ndarray, fmt: BlockFormat, seed: int = 0) -> np.ndarray:
    """One block per amax: the amax at a varying position and sign, the rest smaller values."""
    rng = np.random.default_rng(seed)
    n, L = amax.size, fmt.block_size
    x = (rng.uniform(-1, 1, (n, L)) * amax[:, None]).astype(amax.dtype) * amax.dtype.type(0.5)
    pos = np.arange(n) % L
    x[np.arange(n), pos] = np.where(np.arange(n) % 2 == 0, amax, -amax)
    return x


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("name", MX)
def test_scales_equal_the_rules_definition_on_every_edge(name, rule, dtype):
    fmt = get_format(f"{name}_{rule}")
    amax = edge_amaxes(fmt, dtype)
    x = blocks_with_amax(amax, fmt)
    want = np.array([defined_exponent(float(a), rule, fmt, dtype == np.float64) for a in amax])
    _, scodes, _ = fmt.encode(x)  # the numpy reference
    np.testing.assert_array_equal(scodes[:, 0] - 127, want)
    _, scales = quantize_block_checked(torch.from_numpy(x), fmt, RoundMode.NEAREST, 0, 32, -1, None, True)
    got = np.frexp(scales.numpy().reshape(-1))[1] - 1  # the kernels' scales, exact powers of two
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(scales.numpy().reshape(-1), np.ldexp(1.0, want))


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("element", ["e4m3fn", "fp4_e2m1", FixedFormat(8, 6)])
def test_a_narrow_power_of_two_scale_format_saturates_at_both_ends(element, rule):
    """scale = FloatFormat(5, 0) (the powers of two 2**-14 .. 2**15): E clipped there, on the same edges."""
    fmt = BlockFormat(element, 32, FloatFormat(5, 0), scale_rule=rule)
    assert fmt.scale_exp_range == (-14, 15)
    amax = edge_amaxes(fmt, np.float32)
    x = blocks_with_amax(amax, fmt)
    want = np.array([defined_exponent(float(a), rule, fmt, False) for a in amax])
    assert want.min() == -14 and want.max() == 15 and len(set(want)) >= 12  # both ends and much between
    _, scales = quantize_block_checked(torch.from_numpy(x), fmt, RoundMode.NEAREST, 0, 32, -1, None, True)
    np.testing.assert_array_equal(scales.numpy().reshape(-1), np.ldexp(1.0, want))
    np.testing.assert_array_equal(fmt.block_scales(amax.astype(np.float64)), np.ldexp(1.0, want))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("name", MX)
def test_zero_inf_and_nan_blocks(name, rule):
    fmt = get_format(f"{name}_{rule}")
    x = torch.zeros(4, 32)
    x[1, 3] = float("inf")
    x[2, 5] = -float("inf")
    x[2, 6] = 1.0
    x[3, 7] = float("nan")
    q, s = quantize_block_checked(x, fmt, RoundMode.NEAREST, 0, 32, -1, None, True)
    s = s.reshape(-1)
    assert s[0] == 2.0**-127 and s[1] == 2.0**127 and s[2] == 2.0**127 and torch.isnan(s[3])
    assert torch.equal(q[0], torch.zeros(32)) and torch.isnan(q[3]).all()
    assert q[1, 3] == torch.tensor(fmt.element.max * 2.0**127, dtype=torch.float32)  # max * 2**127: inf in float32


@pytest.mark.parametrize("rounding", ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("name", MX)
def test_elements_are_x_over_the_rules_scale_rounded_in_every_mode(name, rule, rounding):
    """value = round(x / S) * S with S the rule's scale (from the definition) and the element's own rounding
    (its numpy encoder), saturated to the element's range."""
    fmt = get_format(f"{name}_{rule}")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 32)) * np.ldexp(1.0, rng.integers(-20, 20, (64, 1)))).astype(np.float32)
    amax = np.abs(x).max(axis=1)
    S = np.ldexp(1.0, [defined_exponent(float(a), rule, fmt, False) for a in amax])[:, None]
    el = fmt.element
    lo_el = el.min if isinstance(el, FixedFormat) else -el.max
    want = (el.decode(el.encode(np.clip(x / S, lo_el, el.max), rounding)) * S).astype(np.float32)
    got = emunum.quantize(torch.from_numpy(x), fmt, rounding).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_rules_differ_where_they_should():
    """Block maxima where the rules part: 150 in e4m3 (pytorch/ao#2035: rceil 2**-1, ceil 2**0), 448 (an exact
    power of two times max: rceil 2**0, ceil 2**1), 496 (significand 1.9375 = 2 - 2**-4: e4m3's even carries;
    480's 1.875 does not), 224 (max / 2: rceil 2**-1)."""
    def exponent(rule, amax):
        x = torch.zeros(1, 32)
        x[0, 0] = amax
        return int(math.log2(quantize_block_checked(x, get_format(f"mxfp8_e4m3_{rule}"), RoundMode.NEAREST, 0, 32,
                                                    -1, None, True)[1].item()))
    assert [exponent(r, 150.0) for r in RULES] == [-1, 0, -1, -1]
    assert [exponent(r, 448.0) for r in RULES] == [0, 1, 0, 0]
    assert [exponent(r, 496.0) for r in RULES] == [0, 1, 1, 1]
    assert [exponent(r, 480.0) for r in RULES] == [0, 1, 0, 1]
    assert [exponent(r, 224.0) for r in RULES] == [-1, 0, -1, -1]


# ---- names, presets, bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("preset", POW2_PRESETS)
def test_rule_suffixed_preset_names_parse_and_round_trip(preset, rule):
    f = get_format(f"{preset}_{rule}")
    assert f.scale_rule == ScaleRule.parse(rule) and f == BLOCK_PRESETS[preset].with_scale_rule(rule)
    assert f.name == (preset if rule == "floor" else f"{preset}_{rule}") and get_format(f.name) == f
    assert get_format(f"{preset}_{rule}".upper()) == f


def test_existing_names_and_the_ocp_alias_are_unchanged():
    for key, f in BLOCK_PRESETS.items():
        assert f.name == key and str(f) == key
    assert ScaleRule.OCP is ScaleRule.FLOOR and ScaleRule.parse("ocp") is ScaleRule.FLOOR
    assert BlockFormat("e4m3fn", 32, scale_rule="ocp") == get_format("mxfp8_e4m3") == get_format("mxfp8_ocp")
    assert get_format("mxfp8_rceil") == get_format("mxfp8_e4m3_rceil")
    assert get_format("mxfp4_even").name == "mxfp4_e2m1_even"
    assert BlockFormat("e4m3fn", 64, scale_rule="rceil").name == "block[e4m3fn,64,e8m0,rceil]"
    # a float scale with man = 0 holds powers of two only: every rule applies
    assert BlockFormat("e4m3fn", 32, FloatFormat(5, 0), scale_rule="ceil").scale_exp_range == (-14, 15)


@pytest.mark.parametrize("rule", ["ceil", "even", "rceil"])
@pytest.mark.parametrize("scale", ["e4m3fn", FloatFormat(5, 2)])
def test_a_power_of_two_rule_on_a_float_scale_is_refused_naming_field_value_and_allowed(rule, scale):
    with pytest.raises(ValueError, match=rf"scale_rule='{rule}'.*power-of-two.*allowed.*'floor'.*'amax'"):
        BlockFormat("e4m3fn", 32, scale, scale_rule=rule)


def test_bad_rule_names_and_suffixes_are_named():
    with pytest.raises(ValueError, match=r"scale_rule='round'.*allowed: floor, ceil, even, rceil, amax"):
        BlockFormat("e4m3fn", 32, scale_rule="round")
    with pytest.raises(ValueError, match=r"scale_rule='rceil'.*power-of-two"):
        get_format("nvfp4_rceil")
    with pytest.raises(ValueError, match="mxfp8_e4m3_round"):
        get_format("mxfp8_e4m3_round")
