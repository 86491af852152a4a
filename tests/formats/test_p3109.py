"""IEEE P3109 formats against gfloat 0.5.2 (Graphcore's reference implementation), zero tolerance: every code's
value (``decode_float``), and the rounding of every code value, every midpoint between neighbours (and past
``max``), infinities, NaN and out-of-range values (``round_float``; codes by ``encode_float``), in each
rounding mode both have, saturating and not, for every K in 3..8 and every precision, signed and unsigned,
finite and extended; float32 and float64 inputs through ``emunum.quantize`` (the CPU kernels)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import emunum
from emunum import P3109Format
from emunum.rng import random_bits_reference, seed_key

gfloat = pytest.importorskip("gfloat")
from gfloat import decode_float, encode_float, round_float  # noqa: E402
from gfloat.formats import format_info_p3109  # noqa: E402
from gfloat.types import Domain, RoundMode as GRound, Signedness  # noqa: E402

MODES = {"nearest": GRound.TiesToEven, "nearest_away": GRound.TiesToAway, "toward_zero": GRound.TowardZero,
         "up": GRound.TowardPositive, "down": GRound.TowardNegative}

FORMATS = [(k, p, s, e) for k in range(3, 9) for s in (True, False) for p in range(1, k + (0 if s else 1))
           for e in (True, False)]


def _id(f):
    k, p, s, e = f
    return f"k{k}p{p}{'s' if s else 'u'}{'e' if e else 'f'}"


def gfi(k, p, signed, extended):
    return format_info_p3109(k, p, Signedness.Signed if signed else Signedness.Unsigned,
                             Domain.Extended if extended else Domain.Finite)


def probes(fmt: P3109Format) -> np.ndarray:
    """Every finite value, every midpoint of neighbours, the midpoint past max and values beyond, tiny values,
    infinities, NaN; both signs."""
    v = fmt.values()
    pos = v[v >= 0]
    mids = (pos[1:] + pos[:-1]) / 2
    ulp_top = pos[-1] - pos[-2] if pos.size > 1 else pos[-1]
    extra = [pos[-1] + ulp_top / 2, pos[-1] + ulp_top, pos[-1] * 4, fmt.min_subnormal / 4, 3 * fmt.min_subnormal / 4,
             np.inf, np.nan]
    # quarter points too: they separate the directed modes from nearest
    quarters = pos[:-1] + (pos[1:] - pos[:-1]) / 4
    a = np.concatenate([pos, mids, quarters, extra])
    return np.concatenate([a, -a])


def run(fmt, x, mode, dtype=torch.float64, seed=None, sr_bits=None):
    t = torch.from_numpy(x).to(dtype)
    return emunum.quantize(t, fmt, mode, seed=seed, sr_bits=sr_bits).to(torch.float64).numpy()


def expected(fi, fmt, x, mode, sat, srbits=None, nbits=0):
    out = np.empty_like(x)
    for i, v in enumerate(x):
        if not fmt.signed and v < 0:
            out[i] = np.nan  # P3109: no negative value exists; gfloat leaves this undefined (module docstring)
            continue
        kw = {} if srbits is None else {"srbits": int(srbits[i]), "srnumbits": nbits}
        out[i] = round_float(fi, float(v), mode, sat, **kw)
    return out


def same(a, b):
    return np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a[~np.isnan(a)]),
                                                                     np.signbit(b[~np.isnan(b)]))


@pytest.mark.parametrize("f", FORMATS, ids=_id)
def test_every_code_decodes_to_gfloats_value(f):
    fmt, fi = P3109Format(*f), gfi(*f)
    got = fmt.decode(np.arange(2 ** fmt.k))
    want = np.array([decode_float(fi, i).fval for i in range(2 ** fmt.k)], dtype=np.float64)
    assert same(got, want)
    assert fmt.max == fi.max and fmt.min == fi.min and fmt.bias == fi.bias
    assert fmt.min_subnormal == fi.smallest_subnormal and fmt.eps == fi.eps


@pytest.mark.parametrize("sat", [False, True], ids=["nosat", "sat"])
@pytest.mark.parametrize("f", FORMATS, ids=_id)
def test_rounding_every_value_and_midpoint_matches_gfloat_in_every_mode(f, sat):
    fmt, fi = P3109Format(*f, saturate=sat), gfi(*f)
    x = probes(fmt)
    for mode, gmode in MODES.items():
        want = expected(fi, fmt, x, gmode, sat)
        assert same(run(fmt, x, mode), want), mode
        with np.errstate(over="ignore"):  # the probes past max of formats near float32's top become inf
            x32 = x.astype(np.float32)
        assert same(run(fmt, x32, mode, torch.float32), expected(fi, fmt, x32.astype(np.float64), gmode, sat)), mode


@pytest.mark.parametrize("sat", [False, True], ids=["nosat", "sat"])
@pytest.mark.parametrize("f", [f for f in FORMATS if f[0] >= 6], ids=_id)
def test_encode_gives_gfloats_codes(f, sat):
    fmt, fi = P3109Format(*f, saturate=sat), gfi(*f)
    x = probes(fmt)
    x = x[(x >= 0) | fmt.signed]  # gfloat raises for the negative inputs of unsigned extended formats
    for mode, gmode in MODES.items():
        want = [encode_float(fi, round_float(fi, float(v), gmode, sat)) for v in x]
        assert np.array_equal(fmt.encode(x, mode), want), mode


@pytest.mark.parametrize("nbits", [3, 8, 32])
@pytest.mark.parametrize("f", [(8, 3, True, True), (8, 4, False, False), (6, 1, True, False), (5, 5, False, True)],
                         ids=_id)
def test_stochastic_rounding_is_gfloats_with_the_same_random_bits(f, nbits):
    fmt, fi = P3109Format(*f), gfi(*f)
    x = probes(fmt)
    x = np.concatenate([x, x * 1.37, x * 0.61])
    rbits = random_bits_reference(seed_key(11), x.size, nbits)
    want = expected(fi, fmt, x, GRound.Stochastic, False, rbits, nbits)
    assert same(run(fmt, x, "stochastic", seed=11, sr_bits=nbits), want)
    assert same(run(fmt, x.astype(np.float32), "stochastic", torch.float32, seed=11, sr_bits=nbits), want)


def test_unsigned_formats_send_negative_inputs_to_nan_in_place_too():
    fmt = P3109Format(8, 3, signed=False)
    x = torch.tensor([-1.0, -1e-30, -0.0, -np.inf, 2.0])
    want = torch.tensor([np.nan, np.nan, 0.0, np.nan, 2.0])
    assert same(emunum.quantize(x, fmt).numpy(), want.numpy())
    y = x.clone()
    emunum.quantize(y, fmt, out=y)
    assert same(y.numpy(), want.numpy())
    assert same(fmt.decode(fmt.encode([-1.0, -0.0])), np.array([np.nan, 0.0]))


@pytest.mark.parametrize("name, want", [("p3109_k8p3", (8, 3, True, True)), ("p3109_k8p4uf", (8, 4, False, False)),
                                        ("p3109_k6p2f", (6, 2, True, False)), ("p3109_k7p7u", (7, 7, False, True)),
                                        ("p3109_k8p3se", (8, 3, True, True)), ("P3109_K8P4UF", (8, 4, False, False))])
def test_names_parse_and_round_trip(name, want):
    fmt = emunum.get_format(name)
    assert fmt == P3109Format(*want)
    assert emunum.get_format(fmt.name) == fmt
    assert fmt.name == gfi(*want).name.replace("se", "").replace("ue", "u").replace("sf", "f")


@pytest.mark.parametrize("args, match", [
    ((2, 1), r"P3109Format.k=2 is out of range; allowed: 3..16"),
    ((17, 8), r"P3109Format.k=17 is out of range; allowed: 3..16"),
    ((8, 0), r"P3109Format.precision=0 is out of range for a signed format with k=8; allowed: 1..7"),
    ((8, 8), r"P3109Format.precision=8 is out of range for a signed format with k=8; allowed: 1..7"),
    ((8, 9, False), r"P3109Format.precision=9 is out of range for a unsigned format with k=8; allowed: 1..8"),
    ((16, 1), r"p3109_k16p1: its values .* do not fit a float32"),
])
def test_out_of_range_k_and_p_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        P3109Format(*args)
    with pytest.raises(TypeError, match="P3109Format.signed must be a bool"):
        P3109Format(8, 3, signed="yes")


def test_specs_are_frozen_and_hashable():
    a, b = P3109Format(8, 3), emunum.get_format("p3109_k8p3")
    assert a == b and hash(a) == hash(b) and a != P3109Format(8, 3, saturate=True)
    with pytest.raises(Exception):
        a.k = 7
    assert math.isinf(a.decode([0x7F])[0]) and a.max == 49152.0
