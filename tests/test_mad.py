"""Emulated MAD units (emunum.mad): mad, matmul, linear, conv1d/conv2d and their gradients.

Every result is compared with zero tolerance (equal values, equal sign bits, NaN where NaN) against a slow
scalar reference written here from the datapath in ``emunum/mad/unit.py``'s docstring: plain Python loops
over exact rationals (``fractions.Fraction``), a rounding function of its own, and its own splitmix64
counters. It shares no code with emunum. Deterministic modes round the exact value; stochastic rounding
and fixed-point wrap round the exact value's binary64 round-to-odd, as documented.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum import FixedFormat, FloatFormat, MADUnit, RoundMode
from emunum.formats import Overflow

# ---------------------------------------------------------------------------------------------------------
# exact reference
# ---------------------------------------------------------------------------------------------------------
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def stream_key(seed: int, stream: int) -> int:
    return mix64(mix64(seed) + stream)


def rbits(key: int, index: int, nbits: int) -> int:
    return mix64(key + (index + 1) * GOLDEN) >> (64 - nbits)


def floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return e


def ro53(x: Fraction) -> Fraction:
    """Round-to-odd to 53 significant bits."""
    a = abs(x)
    q = floor_log2(a) - 52
    y = a / Fraction(2) ** q
    k = y.numerator // y.denominator
    if y != k and k % 2 == 0:
        k += 1
    r = k * Fraction(2) ** q
    return -r if x < 0 else r


def round_half_even(y: Fraction) -> int:
    k = y.numerator // y.denominator
    r = y - k
    return k + (r > Fraction(1, 2) or (r == Fraction(1, 2) and k % 2 == 1))


def away(k: int, r: Fraction, neg: bool, mode: RoundMode, rnd: int, nbits: int) -> bool:
    """Whether |x| = k + r (0 <= r < 1, in quanta) rounds up to k + 1."""
    if r == 0:
        return False
    if mode == RoundMode.NEAREST:
        return r > Fraction(1, 2) or (r == Fraction(1, 2) and k % 2 == 1)
    if mode == RoundMode.NEAREST_AWAY:
        return r >= Fraction(1, 2)
    if mode == RoundMode.TOWARD_ZERO:
        return False
    if mode == RoundMode.UP:
        return not neg
    if mode == RoundMode.DOWN:
        return neg
    if mode == RoundMode.ODD:
        return k % 2 == 0
    return round_half_even(r * 2**nbits) + rnd >= 2**nbits


def round_to(v, fmt, mode: RoundMode, rnd: int = 0, nbits: int = 32) -> float:
    """Round an exact value (Fraction: nonzero finite; float: a zero, an infinity or NaN) to fmt."""
    if isinstance(fmt, FloatFormat):
        if isinstance(v, float):
            if math.isnan(v):
                return math.nan
            if math.isinf(v):
                return {Overflow.SATURATE: math.copysign(fmt.max, v), Overflow.INF: v,
                        Overflow.NAN: math.nan}[fmt.overflow]
            return -0.0 if (math.copysign(1.0, v) < 0 and fmt.has_negative_zero) else 0.0
        if mode == RoundMode.STOCHASTIC:
            v = ro53(v)
        neg, a = v < 0, abs(v)
        e = floor_log2(a)
        qe = e - fmt.man if e >= fmt.emin else (fmt.emin - fmt.man if fmt.subnormals else fmt.emin)
        y = a / Fraction(2) ** qe
        k = y.numerator // y.denominator
        mag = (k + away(k, y - k, neg, mode, rnd, nbits)) * Fraction(2) ** qe
        if mag > Fraction(fmt.max):
            to_max = (fmt.overflow == Overflow.SATURATE or mode in (RoundMode.TOWARD_ZERO, RoundMode.ODD)
                      or (mode == RoundMode.UP and neg) or (mode == RoundMode.DOWN and not neg))
            if to_max:
                mag = Fraction(fmt.max)
            else:
                return -math.inf if (neg and fmt.overflow == Overflow.INF) else (
                    math.inf if fmt.overflow == Overflow.INF else math.nan)
        if mag == 0:
            return -0.0 if (neg and fmt.has_negative_zero) else 0.0
        return -float(mag) if neg else float(mag)
    # fixed point
    if isinstance(v, float):
        if math.isnan(v):
            return math.nan
        if math.isinf(v):
            return math.ldexp(fmt.code_max if v > 0 else fmt.code_min, -fmt.frac_bits)
        return 0.0
    if mode == RoundMode.STOCHASTIC or not fmt.saturate:
        v = ro53(v)
    y = v * Fraction(2) ** fmt.frac_bits
    neg, a = y < 0, abs(y)
    k = a.numerator // a.denominator
    k += away(k, a - k, neg, mode, rnd, nbits)
    code = -k if neg else k
    if not fmt.code_min <= code <= fmt.code_max:
        code = (min(max(code, fmt.code_min), fmt.code_max) if fmt.saturate
                else (code - fmt.code_min) % 2**fmt.bits + fmt.code_min)
    return math.ldexp(float(code), -fmt.frac_bits) + 0.0


def exact(v: float):
    return v if (v == 0 or not math.isfinite(v)) else Fraction(v)


def emul(a: float, b: float):
    a, b = float(a), float(b)
    if a == 0 or b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return float(a) * float(b)  # signed zero, inf or NaN by IEEE rules
    return Fraction(a) * Fraction(b)


def eadd(x, y):
    """Exact sum of exact values; a zero sum is +0 unless both addends are -0."""
    if isinstance(x, float) and isinstance(y, float):
        return float(x) + float(y)  # Python floats: IEEE results without numpy's warnings
    if isinstance(x, float):
        x, y = y, x
    if isinstance(y, float):  # x is a Fraction
        return x if y == 0 else y
    s = x + y
    return s if s != 0 else 0.0


class Ref:
    """The datapath of one MADUnit, step by step."""

    def __init__(self, unit: MADUnit, seed: int):
        self.u = unit
        self.keys = [stream_key(seed, s) for s in range(5)]

    def rnd(self, stream: int, index: int, mode: RoundMode) -> int:
        return rbits(self.keys[stream], index, self.u.sr_bits) if mode == RoundMode.STOCHASTIC else 0

    def acc(self, v, stream: int, index: int) -> float:
        u = self.u
        return round_to(v, u.acc_fmt, u.acc_rounding, self.rnd(stream, index, u.acc_rounding), u.sr_bits)

    def mac(self, a: float, b: float, acc: float, index: int) -> float:
        u = self.u
        p = emul(a, b)
        if not u.fused:
            p = exact(round_to(p, u.mul_fmt, u.mul_rounding, self.rnd(0, index, u.mul_rounding), u.sr_bits))
        return self.acc(eadd(p, exact(acc)), 1, index)

    def dot(self, a, b, o: int, bias=None) -> float:
        u = self.u
        K, w, C = len(a), u.lanes, u.chunk
        inner, outer = [0.0] * w, [0.0] * w
        count, first = [0] * w, [0] * w
        for k in range(K):
            lane = k % w
            if count[lane] == 0:
                first[lane] = k
            inner[lane] = self.mac(float(a[k]), float(b[k]), inner[lane], o * K + k)
            count[lane] += 1
            if C is not None and count[lane] == C:
                outer[lane] = self.acc(eadd(exact(outer[lane]), exact(inner[lane])), 2, o * K + first[lane])
                inner[lane], count[lane] = 0.0, 0
        if C is not None:
            for lane in range(w):
                if count[lane]:
                    outer[lane] = self.acc(eadd(exact(outer[lane]), exact(inner[lane])), 2, o * K + first[lane])
            vals = outer
        else:
            vals = inner
        vals, node = list(vals), 0
        while len(vals) > 1:
            nxt = []
            for q in range(len(vals) // 2):
                nxt.append(self.acc(eadd(exact(vals[2 * q]), exact(vals[2 * q + 1])), 3, o * w + node))
                node += 1
            if len(vals) % 2:
                nxt.append(vals[-1])
            vals = nxt
        y = vals[0]
        if bias is not None:
            y = self.acc(eadd(exact(y), exact(float(bias))), 4, o)
        return y


def ref_gemm(A: np.ndarray, B: np.ndarray, unit: MADUnit, seed: int, bias=None) -> np.ndarray:
    """out[b] = A[b % bA] @ B[b % bB] (+ bias[b]) by ``Ref``: A (bA, M, K), B (bB, K, N), bias (nb, M, N)."""
    bA, M, K = A.shape
    bB, _, N = B.shape
    nb = max(bA, bB) if bias is None else bias.shape[0]
    ref = Ref(unit, seed)
    out = np.empty((nb, M, N))
    for b in range(nb):
        for i in range(M):
            for j in range(N):
                o = (b * M + i) * N + j
                out[b, i, j] = ref.dot(A[b % bA, i], B[b % bB, :, j], o,
                                       None if bias is None else bias[b, i, j])
    return out


def assert_values(got, want, what=""):
    """Zero tolerance on values; the sign of a zero is not compared (torch's own sums may give -0)."""
    g = torch.as_tensor(np.asarray(got.detach() if isinstance(got, torch.Tensor) else got, dtype=np.float64))
    w = torch.as_tensor(np.asarray(want.detach() if isinstance(want, torch.Tensor) else want, dtype=np.float64))
    assert torch.equal(g, w), f"{what}: max |diff| {(g - w).abs().max().item()}"


def assert_bits(got, want, what=""):
    """Zero tolerance: same values, same sign bits (so -0 != +0), NaN where NaN."""
    g = np.asarray(got.detach().cpu().double() if isinstance(got, torch.Tensor) else got, dtype=np.float64).ravel()
    w = np.asarray(want, dtype=np.float64).ravel()
    assert g.shape == w.shape, (g.shape, w.shape)
    gn, wn = np.isnan(g), np.isnan(w)
    bad = (gn != wn) | (~gn & ~wn & ((g != w) | (np.signbit(g) != np.signbit(w))))
    if bad.any():
        idx = np.flatnonzero(bad)[:6]
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} differ: " +
                             "; ".join(f"[{i}] got {g[i]!r} want {w[i]!r}" for i in idx))


# ---------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------
def operands(rng, shape, fmt="fp8_152", scale_exp=(-3, 3)) -> torch.Tensor:
    """Values of ``fmt``: scaled normals, with zeros, small integers and powers of two (ties, cancellation)."""
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * np.exp2(rng.integers(scale_exp[0], scale_exp[1] + 1, n))
    kind = rng.random(n)
    x = np.where(kind < 0.1, 0.0, x)
    x = np.where((kind >= 0.1) & (kind < 0.25), rng.integers(-6, 7, n).astype(np.float64), x)
    x = np.where((kind >= 0.25) & (kind < 0.35), np.exp2(rng.integers(-8, 4, n)) * rng.choice([-1, 1], n), x)
    return emunum.quantize(torch.from_numpy(x.reshape(shape)), fmt).float()


PAIRS = {  # (mul format, mul mode, acc format, acc mode, sr_bits)
    "e5m2_rne-e6m9_rne": ("fp8_152", "nearest", "fp16_169", "nearest", 32),
    "fp16_rtz-bf16_up": ("fp16", "toward_zero", "bf16", "up", 32),
    "e4m3_sr-e4m3fn_sr": ("fp8_143", "stochastic", "e4m3fn", "stochastic", 8),
    "bf16_odd-fixed16_12_away": ("bf16", "odd", "fixed16_12", "nearest_away", 32),
}


def make_unit(pair: str, fused: bool, chunk, lanes: int) -> MADUnit:
    mf, mm, af, am, sb = PAIRS[pair]
    if fused:
        return MADUnit(None, af, acc_rounding=am, fused=True, chunk=chunk, lanes=lanes, sr_bits=sb)
    return MADUnit(mf, af, mul_rounding=mm, acc_rounding=am, chunk=chunk, lanes=lanes, sr_bits=sb)


# ---------------------------------------------------------------------------------------------------------
# MADUnit spec
# ---------------------------------------------------------------------------------------------------------
def test_unit_is_frozen_hashable_and_parses_names():
    u = MADUnit("fp8_152", "fp16_169", mul_rounding="rne", acc_rounding="sr", chunk=64)
    assert u.mul_fmt == FloatFormat(5, 2) and u.acc_fmt == FloatFormat(6, 9)
    assert u.acc_rounding == RoundMode.STOCHASTIC and u.stochastic
    assert hash(u) == hash(MADUnit(FloatFormat(5, 2), "e6m9", acc_rounding="stochastic", chunk=64))
    with pytest.raises(AttributeError):
        u.chunk = 3
    assert "chunk=64" in str(u)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(mul_fmt="fp8_152", acc_fmt="fp32", fused=True), ValueError, "mul_fmt"),
    (dict(mul_fmt=None, acc_fmt="fp32"), ValueError, "mul_fmt=None"),
    (dict(mul_fmt=None, acc_fmt="fp32", fused=True, mul_rounding="up"), ValueError, "mul_rounding"),
    (dict(mul_fmt="fp32", acc_fmt=None), ValueError, "acc_fmt"),
    (dict(mul_fmt="fp32", acc_fmt="fp99"), ValueError, "MADUnit.acc_fmt"),
    (dict(mul_fmt="fp32", acc_fmt="fp32", chunk=0), ValueError, "chunk=0"),
    (dict(mul_fmt="fp32", acc_fmt="fp32", lanes=65), ValueError, "lanes=65"),
    (dict(mul_fmt="fp32", acc_fmt="fp32", lanes=2.0), TypeError, "lanes"),
    (dict(mul_fmt="fp32", acc_fmt="fp32", sr_bits=33), ValueError, "sr_bits=33"),
    (dict(mul_fmt="fp32", acc_fmt="fp32", acc_rounding="banker"), ValueError, "MADUnit.acc_rounding"),
    (dict(mul_fmt="fp32", acc_fmt="fp32", fused=1), TypeError, "fused"),
    (dict(mul_fmt="bf16", acc_fmt="fp32", order="any"), ValueError, "order='any'"),
    (dict(mul_fmt="fp32", acc_fmt="fp32", order="fastest"), ValueError, "MADUnit.order"),
])
def test_unit_rejects_bad_fields_naming_them(kwargs, exc, words):
    with pytest.raises(exc, match=words.replace("(", r"\(").replace("=", "=")):
        MADUnit(**kwargs)


# ---------------------------------------------------------------------------------------------------------
# mad: element-wise
# ---------------------------------------------------------------------------------------------------------
MAD_ACC = {
    "fp32": FloatFormat(8, 23), "bf16": FloatFormat(8, 7), "e5m2": FloatFormat(5, 2),
    "e4m3fn": FloatFormat(4, 3, special="fn"), "e4m3fnuz_sat": FloatFormat(4, 3, special="fnuz", saturate=True),
    "e4m3_nosub": FloatFormat(4, 3, subnormals=False), "fixed16_12": FixedFormat(16, 12),
    "fixed8_3_wrap": FixedFormat(8, 3, saturate=False),
}
MODES = [m for m in RoundMode]


def fused_cases(rng, acc: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a, b (float32 values) and c (float64) where a*b + c is a tie, a near-tie, a cancellation, an overflow,
    an underflow or a plain random value of the accumulator's range."""
    n = 400
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32).astype(np.float64)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32).astype(np.float64)
    c = rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))
    if isinstance(acc, FloatFormat):
        grid = np.array(sorted(set(np.abs(acc.decode(rng.integers(0, 2**acc.bits, 200))).tolist()) - {np.inf}))
        grid = grid[np.isfinite(grid)]
        step = np.maximum(np.abs(grid) * 2.0**-acc.man, acc.min_subnormal)
    else:
        grid = np.ldexp(rng.integers(acc.code_min, acc.code_max + 1, 200).astype(np.float64), -acc.frac_bits)
        step = np.full(grid.shape, acc.eps)
    g = rng.integers(0, grid.size, n)
    mid = grid[g] + step[g] / 2  # a midpoint (exact in float64)
    p = a * b  # exact in float64
    kind = rng.integers(0, 7, n)
    tiny = np.exp2(rng.integers(-60, -30, n)) * p
    c = np.where(kind == 0, mid - p, c)  # exact tie
    c = np.where(kind == 1, mid - p + tiny, c)  # just above / below a tie: double rounding would fail
    c = np.where(kind == 2, -p, c)  # exact cancellation
    c = np.where(kind == 3, -p + tiny, c)  # near cancellation
    top = acc.max if isinstance(acc, FloatFormat) else acc.max
    c = np.where(kind == 4, top * rng.choice([-1.0, 1.0], n) - p + tiny, c)  # near the overflow boundary
    c = np.where(kind == 5, step[g] / 4 * rng.standard_normal(n) - p, c)  # near zero / subnormals
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan])
    a[:10], b[:10], c[:10] = -0.0, 3.0, rng.choice(specials, 10)
    a[10:20], b[10:20], c[10:20] = np.inf, rng.choice([2.0, -2.0, 0.0], 10), rng.choice([1.0, -np.inf], 10)
    return a, b, c


@pytest.mark.parametrize("mode", MODES, ids=[m.name.lower() for m in MODES])
@pytest.mark.parametrize("acc", list(MAD_ACC.values()), ids=list(MAD_ACC))
def test_fused_mad_is_correctly_rounded(acc, mode):
    """One rounding of the exact a*b + c (Fraction), for ties, near ties, cancellation, overflow, specials."""
    rng = np.random.default_rng(abs(hash((str(acc), int(mode)))) % 2**32)
    a, b, c = fused_cases(rng, acc)
    unit = MADUnit(None, acc, acc_rounding=mode, fused=True, sr_bits=32)
    got = emunum.mad.elementwise(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c), unit, seed=11)
    ref = Ref(unit, 11)
    want = [ref.acc(eadd(emul(x, y), exact(z)), 1, i) for i, (x, y, z) in enumerate(zip(a, b, c))]
    assert got.dtype == torch.float64
    assert_bits(got, want, f"fused mad {acc} {mode.name}")


@pytest.mark.parametrize("mode", [RoundMode.NEAREST, RoundMode.DOWN, RoundMode.ODD, RoundMode.STOCHASTIC],
                         ids=["nearest", "down", "odd", "stochastic"])
def test_unfused_mad_rounds_product_then_sum(mode):
    rng = np.random.default_rng(7)
    a, b, c = fused_cases(rng, FloatFormat(8, 7))
    unit = MADUnit("fp8_143", "bf16", mul_rounding=mode, acc_rounding=mode, sr_bits=5)
    got = emunum.mad.elementwise(torch.from_numpy(a).float(), torch.from_numpy(b).float(), torch.from_numpy(c), unit, seed=3)
    ref = Ref(unit, 3)
    want = [ref.mac(x, y, z, i) for i, (x, y, z) in enumerate(zip(a, b, c))]
    assert_bits(got, want, f"unfused mad {mode.name}")


def test_mad_broadcasts_and_promotes_like_torch():
    unit = MADUnit("bf16", "bf16")
    a = torch.tensor([[1.5], [2.0]], dtype=torch.float32)
    b = torch.tensor([3.0, -0.25, 1 / 3], dtype=torch.float32)
    c = torch.tensor(0.1, dtype=torch.float64)
    got = emunum.mad.elementwise(a, b, c, unit)
    assert got.shape == (2, 3) and got.dtype == torch.float64
    ref = Ref(unit, 0)
    want = [ref.mac(float(x), float(y), 0.1, 0) for x in a.ravel() for y in b]
    assert_bits(got, want)
    half = emunum.mad.elementwise(a.half(), b.half(), c.half(), unit)
    assert half.dtype == torch.float16


# ---------------------------------------------------------------------------------------------------------
# matmul: every option combination against the reference
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lanes", [1, 2, 4])
@pytest.mark.parametrize("chunk", [None, 3], ids=["nochunk", "chunk3"])
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_matmul_matches_reference_for_every_option(pair, fused, chunk, lanes):
    rng = np.random.default_rng(abs(hash((pair, fused, chunk, lanes))) % 2**32)
    unit = make_unit(pair, fused, chunk, lanes)
    A = operands(rng, (2, 3, 13))
    B = operands(rng, (13, 5))
    got = emunum.matmul(A, B, unit, seed=1234)
    want = ref_gemm(A.numpy(), B.numpy()[None], unit, 1234)
    assert got.shape == (2, 3, 5) and got.dtype == torch.float32
    assert_bits(got, want, str(unit))


def test_matmul_odd_lanes_and_partial_chunks_match_reference():
    rng = np.random.default_rng(5)
    for unit in [MADUnit("fp8_152", "fp16", chunk=4, lanes=3), MADUnit(None, "bf16", fused=True, chunk=1, lanes=5),
                 MADUnit("fp8_152", "fp16_169", chunk=64)]:
        A = operands(rng, (4, 23))
        B = operands(rng, (23, 3))
        assert_bits(emunum.matmul(A, B, unit), ref_gemm(A.numpy()[None], B.numpy()[None], unit, 0), str(unit))


def test_matmul_accumulator_overflow_and_specials_follow_the_format():
    """Sums beyond e5m2's max overflow to inf (ieee) or saturate; NaN and inf operands propagate."""
    A = torch.tensor([[30000.0, 30000.0, 0.0], [1.0, float("inf"), -1.0], [float("nan"), 1.0, 1.0]])
    B = torch.tensor([[2.0, -2.0], [2.0, 1.0], [4.0, 0.0]])
    for mul, acc in itertools.product(["fp16", "fp8_152"], ["fp8_152", FloatFormat(5, 2, saturate=True), "e4m3fn"]):
        unit = MADUnit(mul, acc)  # fp8_152 products: the fast kernel, with its overflow checks
        assert_bits(emunum.matmul(A, B, unit), ref_gemm(A.numpy()[None], B.numpy()[None], unit, 0), str(unit))


def test_matmul_batch_broadcast_and_vectors_match_torch_shapes():
    rng = np.random.default_rng(9)
    unit = MADUnit("fp8_152", "bf16", lanes=2)
    A = operands(rng, (2, 1, 3, 6))
    B = operands(rng, (4, 6, 2))
    got = emunum.matmul(A, B, unit)
    assert got.shape == torch.matmul(A, B).shape == (2, 4, 3, 2)
    Ae = A.expand(2, 4, 3, 6).reshape(8, 3, 6).numpy()
    Be = B.expand(2, 4, 6, 2).reshape(8, 6, 2).numpy()
    assert_bits(got, ref_gemm(Ae, Be, unit, 0))
    v = operands(rng, (6,))
    assert emunum.matmul(v, B[0], unit).shape == (2,)
    assert emunum.matmul(A[0, 0], v, unit).shape == (3,)
    assert emunum.matmul(v, v, unit).shape == ()
    assert_bits(emunum.matmul(v, v, unit), ref_gemm(v.numpy()[None, None], v.numpy()[None, :, None], unit, 0))


def test_stochastic_matmul_is_reproducible_and_seed_dependent():
    rng = np.random.default_rng(2)
    unit = MADUnit("fp8_152", "bf16", mul_rounding="stochastic", acc_rounding="stochastic", chunk=4)
    A, B = operands(rng, (8, 40)), operands(rng, (40, 8))
    r1, r2 = emunum.matmul(A, B, unit, seed=1), emunum.matmul(A, B, unit, seed=1)
    assert torch.equal(r1, r2)
    assert not torch.equal(r1, emunum.matmul(A, B, unit, seed=2))
    torch.manual_seed(0)
    d1 = emunum.matmul(A, B, unit)
    torch.manual_seed(0)
    assert torch.equal(d1, emunum.matmul(A, B, unit))


def test_order_any_runs_torch_float32_matmul():
    rng = np.random.default_rng(3)
    A, B = operands(rng, (5, 7), "bf16").double(), operands(rng, (7, 4), "bf16").double()
    unit = MADUnit("fp32", "fp32", order="any")
    got = emunum.matmul(A, B, unit)
    assert got.dtype == torch.float64
    assert torch.equal(got, torch.matmul(A.float()[None], B.float()[None])[0].double())  # what it calls


def test_inputs_are_validated_and_never_modified():
    unit = MADUnit("fp8_152", "bf16")
    A = torch.tensor([[0.1, 1.0]], dtype=torch.float64)  # 0.1 is not a float32
    with pytest.raises(ValueError, match="A holds float64 values"):
        emunum.matmul(A, torch.ones(2, 1, dtype=torch.float64), unit)
    with pytest.raises(TypeError, match="A.dtype=torch.int64"):
        emunum.matmul(torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2), unit)
    with pytest.raises(ValueError, match="last dim 2 differs"):
        emunum.matmul(torch.ones(3, 2), torch.ones(3, 2), unit)
    with pytest.raises(TypeError, match="emunum.MADUnit"):
        emunum.matmul(torch.ones(2, 2), torch.ones(2, 2), "fp32")
    with pytest.raises(ValueError, match="float32 cannot hold"):
        emunum.matmul(torch.ones(2, 2), torch.ones(2, 2), MADUnit("fp32", FixedFormat(32, 8)))
    with pytest.raises(TypeError, match="backward_units"):
        emunum.linear(torch.ones(2, 2), torch.ones(2, 2), unit=unit, backward_units=(unit,))
    x = torch.tensor([[1.0, 2.0]])
    w = torch.tensor([[3.0, 5.0]])
    x0, w0 = x.clone(), w.clone()
    emunum.linear(x, w, torch.tensor([0.3]), unit=unit)
    assert torch.equal(x, x0) and torch.equal(w, w0)


# ---------------------------------------------------------------------------------------------------------
# linear and convolutions: forward
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pair", ["e5m2_rne-e6m9_rne", "e4m3_sr-e4m3fn_sr"])
def test_linear_matches_reference_with_bias_added_last(pair):
    rng = np.random.default_rng(4)
    unit = make_unit(pair, False, 4, 2)
    x, w = operands(rng, (2, 3, 9)), operands(rng, (5, 9))
    b = torch.from_numpy(rng.standard_normal(5)).float()
    got = emunum.linear(x, w, b, unit=unit, seed=8)
    assert got.shape == (2, 3, 5)
    want = ref_gemm(x.reshape(1, 6, 9).numpy(), w.t().numpy()[None], unit, 8,
                    bias=np.broadcast_to(b.double().numpy(), (1, 6, 5)))
    assert_bits(got, want)


def ref_conv2d(x, w, bias, stride, padding, dilation, groups, unit, seed):
    """Direct loops: out[n, o, y, x] = dot over (c, i, j) of the zero-padded input and w (+ bias)."""
    x, w = x.numpy().astype(np.float64), w.numpy().astype(np.float64)
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    xp[:, :, ph:ph + H, pw:pw + W] = x
    Ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    Wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    Og = O // groups
    ref = Ref(unit, seed)
    out = np.empty((N, O, Ho, Wo))
    for n, o, yy, xx in itertools.product(range(N), range(O), range(Ho), range(Wo)):
        g = o // Og
        a = [xp[n, g * Cg + c, yy * sh + i * dh, xx * sw + j * dw]
             for c in range(Cg) for i in range(kh) for j in range(kw)]
        bvec = [w[o, c, i, j] for c in range(Cg) for i in range(kh) for j in range(kw)]
        idx = ((n * O + o) * Ho + yy) * Wo + xx
        out[n, o, yy, xx] = ref.dot(a, bvec, idx, None if bias is None else float(bias[o]))
    return out


CONV_CASES = {  # stride, padding, dilation, groups
    "plain": ((1, 1), (0, 0), (1, 1), 1),
    "stride2_pad1": ((2, 2), (1, 1), (1, 1), 1),
    "dilation2_groups2": ((1, 2), (1, 0), (2, 1), 2),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv2d_matches_direct_loops(case):
    stride, padding, dilation, groups = CONV_CASES[case]
    rng = np.random.default_rng(6)
    unit = MADUnit("fp8_152", "fp16", acc_rounding="stochastic", chunk=5, lanes=2)
    x, w = operands(rng, (2, 4, 6, 5)), operands(rng, (4, 4 // groups, 3, 2))
    b = torch.from_numpy(rng.standard_normal(4))
    got = emunum.conv2d(x, w, b, stride, padding, dilation, groups, unit=unit, seed=5)
    assert got.shape == torch.nn.functional.conv2d(x, w, b.float(), stride, padding, dilation, groups).shape
    assert got.dtype == torch.float64  # float32 operands, float64 bias
    assert_bits(got, ref_conv2d(x, w, b, stride, padding, dilation, groups, unit, 5))


UNFOLD_GEOMETRIES = [  # (kernel, stride, dilation, (H, W)) of an already padded image
    ((3, 3), (1, 1), (1, 1), (9, 11)), ((3, 3), (2, 2), (1, 1), (9, 11)), ((5, 3), (2, 1), (1, 2), (12, 10)),
    ((2, 2), (1, 3), (2, 2), (7, 8)), ((1, 1), (1, 1), (1, 1), (5, 6)), ((1, 5), (1, 3), (1, 1), (1, 17)),
]


@pytest.mark.parametrize("k, st, d, hw", UNFOLD_GEOMETRIES)
def test_weight_gradient_rows_copied_by_the_kernel_are_the_strided_views_bits(k, st, d, hw):
    """The weight gradient's im2col rows (``conv._patch_rows``: kernels/im2col_cpu.py for a contiguous float32
    image) hold the bits of torch's copy of the strided view, NaN payloads and -0.0 included; a non-contiguous
    or float64 image takes torch's copy."""
    from emunum.mad import conv

    g = torch.Generator().manual_seed(sum(k) + sum(hw))
    x = torch.randn(3, 4, *hw, generator=g) * 2.0 ** torch.randint(-20, 20, (3, 4, 1, 1), generator=g)
    x.view(-1)[::13] = -0.0
    x.view(torch.int32).view(-1)[5] = 0x7FC01234  # a NaN with a payload
    p = conv._patches(x, *k, st, d)
    N, _, _, _, Ho, Wo = p.shape
    want = p.permute(0, 4, 5, 1, 2, 3).reshape(N * Ho * Wo, -1)
    for image in (x, x.transpose(2, 3).contiguous().transpose(2, 3), x.double()):
        got = conv._patch_rows(image, *k, st, d)
        assert got.dtype == image.dtype and got.shape == want.shape
        assert torch.equal(got.float().view(torch.int32), want.view(torch.int32))


def test_conv1d_and_same_padding_match_direct_loops():
    rng = np.random.default_rng(10)
    unit = MADUnit("fp8_152", "bf16", lanes=2)
    x, w = operands(rng, (2, 3, 9)), operands(rng, (4, 3, 3))
    got = emunum.conv1d(x, w, None, 2, 1, unit=unit)
    assert_bits(got, ref_conv2d(x[:, :, None], w[:, :, None], None, (1, 2), (0, 1), (1, 1), 1, unit, 0)[:, :, 0])
    same = emunum.conv2d(x[:, :, None], w[:, :, None], None, padding="same", unit=unit)
    assert same.shape == (2, 4, 1, 9)
    assert_bits(same, ref_conv2d(x[:, :, None], w[:, :, None], None, (1, 1), (0, 1), (1, 1), 1, unit, 0))


# ---------------------------------------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------------------------------------
def integers(rng, shape, lo=-4, hi=5, dtype=torch.float64):
    return torch.from_numpy(rng.integers(lo, hi, shape).astype(np.float64)).to(dtype)


EXACT = MADUnit("fp32", "fp32", chunk=3, lanes=2)  # every sum below is an integer < 2**24: no rounding


def test_gradients_equal_exact_float64_gradients_when_the_unit_is_exact():
    """Integer inputs (|x| <= 4) and integer grad_output: every product and partial sum is an integer well
    below 2**24, so each fp32 rounding is exact and the emulated gradients are the exact gradients, which
    torch's float64 autograd also computes exactly (any summation order)."""
    rng = np.random.default_rng(12)
    cases = [
        ("linear", lambda f, x, w, b: f.linear(x, w, b, **kw(f)), (3, 2, 7), (5, 7), (5,)),
        ("matmul", lambda f, x, w, b: f.matmul(x, w, **kw(f)), (2, 1, 3, 6), (4, 6, 2), None),
        ("conv2d", lambda f, x, w, b: f.conv2d(x, w, b, (2, 1), (1, 2), (1, 2), 2, **kw(f)), (2, 4, 7, 6),
         (6, 2, 3, 2), (6,)),
        ("conv1d", lambda f, x, w, b: f.conv1d(x, w, b, 2, 1, 1, 1, **kw(f)), (2, 3, 9), (4, 3, 3), (4,)),
    ]

    def kw(f):
        return {"unit": EXACT, "backward_units": (EXACT, EXACT)} if f is emunum else {}

    for name, fn, xs, ws, bs in cases:
        inputs = [integers(rng, s).requires_grad_() if s else None for s in (xs, ws, bs)]
        ref_inputs = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
        y = fn(emunum, *inputs)
        y_ref = fn(torch.nn.functional if name != "matmul" else torch, *ref_inputs)
        assert_values(y, y_ref, f"{name} forward")
        r = integers(rng, tuple(y.shape), -3, 4)
        (y * r).sum().backward()
        (y_ref * r).sum().backward()
        for t, t_ref, what in zip(inputs, ref_inputs, ["input", "weight", "bias"]):
            if t is not None:
                assert_values(t.grad, t_ref.grad, f"{name} grad {what}")


def test_linear_backward_gemms_run_on_their_own_units():
    rng = np.random.default_rng(13)
    fwd = MADUnit("fp32", "fp32")
    u_in = MADUnit("fp8_152", "bf16", acc_rounding="stochastic", chunk=2)
    u_w = MADUnit(None, "fp8_143", fused=True, lanes=2)
    x, w = operands(rng, (2, 3, 5)).requires_grad_(), operands(rng, (4, 5)).requires_grad_()
    b = torch.zeros(4, requires_grad=True)
    y = emunum.linear(x, w, b, unit=fwd, backward_units=(u_in, u_w), seed=21)
    g = operands(rng, (2, 3, 4), "bf16")
    y.backward(g)
    G = g.reshape(1, 6, 4).numpy()
    seeds = {r: emunum.mad.derived_seed(21, r) for r in (1, 2, 3)}
    assert_bits(x.grad.reshape(1, 6, 5), ref_gemm(G, w.detach().numpy()[None], u_in, seeds[1]), "grad input")
    assert_bits(w.grad[None], ref_gemm(G.transpose(0, 2, 1), x.detach().reshape(1, 6, 5).numpy(), u_w, seeds[2]),
                "grad weight")
    assert_bits(b.grad[None, None], ref_gemm(np.ones((1, 1, 6)), G, u_w, seeds[3]), "grad bias")


def test_matmul_backward_sums_broadcast_batches_inside_the_gemm():
    rng = np.random.default_rng(14)
    unit = MADUnit("fp8_152", "bf16", chunk=3)
    A = operands(rng, (3, 2, 4)).requires_grad_()
    B = operands(rng, (4, 5)).requires_grad_()  # broadcast over A's batch
    y = emunum.matmul(A, B, unit)
    g = operands(rng, (3, 2, 5), "bf16")
    y.backward(g)
    # grad_B = sum over (batch, m) of A[b, m, k] g[b, m, n]: one GEMM with K = 3*2, in (batch, m) order
    At = A.detach().permute(2, 0, 1).reshape(1, 4, 6).numpy()
    assert_bits(B.grad[None], ref_gemm(At, g.reshape(1, 6, 5).numpy(), unit, 0), "grad B")
    assert_bits(A.grad, ref_gemm(g.numpy(), B.detach().t().numpy()[None], unit, 0), "grad A")


def test_conv2d_backward_matches_the_documented_gemms():
    rng = np.random.default_rng(15)
    unit = MADUnit("fp8_152", "fp16", acc_rounding="toward_zero", lanes=2, chunk=4)
    stride, padding, dilation, groups = (2, 1), (1, 0), (1, 2), 2
    x = operands(rng, (2, 4, 5, 6)).requires_grad_()
    w = operands(rng, (4, 2, 2, 3)).requires_grad_()
    b = torch.zeros(4, requires_grad=True)
    y = emunum.conv2d(x, w, b, stride, padding, dilation, groups, unit=unit)
    g = operands(rng, tuple(y.shape), "bf16")
    y.backward(g)
    N, O, Ho, Wo = y.shape
    Og, Cg, kh, kw = 2, 2, 2, 3
    # grad weight: dot over (n, y, x) of g[n, o, y, x] * padded input at the tap
    xp = np.pad(x.detach().numpy().astype(np.float64), ((0, 0), (0, 0), (1, 1), (0, 0)))
    ref = Ref(unit, 0)
    gw = np.empty((4, Cg, kh, kw))
    gn = g.numpy().astype(np.float64)
    for o, c, i, j in itertools.product(range(4), range(Cg), range(kh), range(kw)):
        ch = (o // Og) * Cg + c
        av = [gn[n, o, yy, xx] for n in range(N) for yy in range(Ho) for xx in range(Wo)]
        bv = [xp[n, ch, yy * stride[0] + i * dilation[0], xx * stride[1] + j * dilation[1]]
              for n in range(N) for yy in range(Ho) for xx in range(Wo)]
        gw[o, c, i, j] = ref.dot(av, bv, ((o * Cg + c) * kh + i) * kw + j)
    assert_bits(w.grad, gw, "grad weight")
    gb = [ref.dot([gn[n, o, yy, xx] for n in range(N) for yy in range(Ho) for xx in range(Wo)],
                  [1.0] * (N * Ho * Wo), o) for o in range(4)]
    assert_bits(b.grad, gb, "grad bias")
    # grad input: stride-1 conv of the zero-upsampled, padded grad with the flipped kernel
    H, W = 5 + 2, 6  # padded input size
    up = np.zeros((N, 4, (Ho - 1) * stride[0] + 1, (Wo - 1) * stride[1] + 1))
    up[:, :, ::stride[0], ::stride[1]] = gn
    ph, pw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
    eh, ew = H - (up.shape[2] + ph), W - (up.shape[3] + pw)
    up = np.pad(up, ((0, 0), (0, 0), (ph, ph + eh), (pw, pw + ew)))
    wf = w.detach().numpy().reshape(2, Og, Cg, kh, kw).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    wf = torch.from_numpy(np.ascontiguousarray(wf.reshape(4, Og, kh, kw)))
    gx = ref_conv2d(torch.from_numpy(up), wf, None, (1, 1), (0, 0), dilation, groups, unit, 0)
    assert_bits(x.grad, gx[:, :, 1:6, :], "grad input")  # the forward's padding rows are cropped


# ---------------------------------------------------------------------------------------------------------
# packaging
# ---------------------------------------------------------------------------------------------------------
def test_import_emunum_loads_no_mad_kernel():
    import subprocess
    import sys

    # the kernel ABI (plain records and codes, no numba) is the one part of emunum.kernels that specs import
    code = ("import sys, emunum; bad = [m for m in sys.modules if m.startswith(('numba', 'emunum.kernels'))"
            " and m not in ('_numba_cuda_redirector', 'emunum.kernels', 'emunum.kernels.abi')]; assert not bad, bad;"
            " print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_emunum_mad_is_a_plain_package_and_elementwise_is_the_function():
    import types

    from emunum import mad
    from emunum.mad import functional

    assert type(mad) is types.ModuleType and not callable(mad)
    assert mad.linear is emunum.linear and mad.conv2d is emunum.conv2d
    assert mad.elementwise is mad.mad is functional.mad


@pytest.mark.parametrize("layer", [torch.nn.Conv3d(2, 4, 3), torch.nn.ConvTranspose1d(4, 4, 2),
                                   torch.nn.ConvTranspose2d(4, 4, 2), torch.nn.ConvTranspose3d(4, 4, 2)], ids=repr)
def test_a_layer_without_a_mad_gemm_is_refused_naming_the_unit_the_layer_the_allowed_ones_and_the_filter(layer):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), layer)
    kind = type(layer).__name__
    with pytest.raises(ValueError, match=rf"Policy.mad='MAD\[.*\]': a {kind} layer has no GEMM emulated on MAD units "
                                         r"\(emunum.mad runs Linear, Conv1d, Conv2d and attention layers\).*"
                                         rf"filter=lambda m, name: not isinstance\(m, {kind}\)"):
        emunum.patch(model, fmt="e4m3fn", mad="h100_fp8_e4m3")
    assert type(model[1]) is type(layer)  # nothing swapped
    keep = type(layer)
    patched = emunum.patch(model, fmt="e4m3fn", mad="h100_fp8_e4m3", filter=lambda m, name: not isinstance(m, keep))
    assert type(patched[1]) is type(layer) and type(patched[0]).__name__ == "EmuLinear"
