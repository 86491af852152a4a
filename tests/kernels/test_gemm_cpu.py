"""CPU MAD kernels (kernels/gemm_cpu.py, kernels/gemm_scalar.py).

- ``round_nearest_fast`` (Veltkamp / magic-constant rounding, float64 and float32 arithmetic) against
  ``emunum.quantize`` (itself checked against gfloat), on every code, midpoint and neighbour;
- ``two_sum`` + ``round_odd`` against exact rationals;
- ``gemm_fast`` under every plan it may take against ``gemm_general`` (checked against the exact reference
  in tests/test_mad.py), bit for bit, on adversarial operands and awkward shapes;
- ``fast_plan`` picks the cheap variants only where they cannot change a result;
- results do not depend on the thread count.
"""
from __future__ import annotations

import zlib
from fractions import Fraction

import numba
import numpy as np
import pytest
import torch
from numba import njit

import emunum
from emunum import FixedFormat, FloatFormat, MADUnit
from emunum.kernels import gemm_cpu, gemm_fast_plan, gemm_vec
from emunum.kernels.gemm_scalar import P_CMIN, round_odd, two_sum
from emunum.mad.unit import stream_keys


@njit
def _round_all(x, out, f):
    """gemm_fast's rounding of a sum: round_nearest_fast, then quantize's sign of a zero result."""
    for i in range(x.size):
        out[i] = gemm_cpu._round_acc(x[i], f, True, True)


@njit
def _two_sum_odd(a, b, out):
    for i in range(a.size):
        s, e = two_sum(a[i], b[i])
        out[i] = round_odd(s, e)


@njit
def _vec_sum_odd(a, b, out):
    for i in range(a.size):
        out[i] = gemm_vec._sum_odd(a[i], b[i])


FAST_FORMATS = {
    "e5m2": FloatFormat(5, 2), "e4m3fn": FloatFormat(4, 3, special="fn"),
    "e4m3fnuz_sat": FloatFormat(4, 3, special="fnuz", saturate=True), "e4m3_nosub": FloatFormat(4, 3, subnormals=False),
    "fp4_e2m1": FloatFormat(2, 1, special="none"), "e6m9": FloatFormat(6, 9), "fp16": FloatFormat(5, 10),
    "bf16": FloatFormat(8, 7), "tf32": FloatFormat(8, 10), "fp32": FloatFormat(8, 23),
    "e3m2_bias-1": FloatFormat(3, 2, bias=-1),
}


def _params(fmt):
    return MADUnit(fmt, fmt).kernel_params()[1]


# the float32 variant is only planned for man <= 10 and emin >= -100 (gemm_cpu.fast_plan)
ROUND_CASES = [(name, np.float64) for name in FAST_FORMATS] + [
    (name, np.float32) for name, f in FAST_FORMATS.items() if f.man <= 10 and f.emin >= -100]


@pytest.mark.parametrize("name, dtype", ROUND_CASES, ids=[f"{n}-{np.dtype(d).name}" for n, d in ROUND_CASES])
def test_round_nearest_fast_equals_quantize(name, dtype, oracles):
    fmt = FAST_FORMATS[name]
    x = np.array(oracles.float_probes(fmt, dtype))
    if dtype == np.float32:  # the float32 kernel only meets values with <= 24 - man - 2 bits below the quantum
        with np.errstate(invalid="ignore"):
            x = x[np.abs(x.astype(np.float64)) < 2.0**100]
    want = emunum.quantize(torch.from_numpy(x), fmt, "nearest").numpy()
    got = np.empty_like(x)
    _round_all(x, got, gemm_cpu.fast_params(_params(fmt), dtype))
    oracles.assert_same_values(got, want, x, f"{name} {dtype}")  # signs of zeros included


@pytest.mark.parametrize("impl", [_two_sum_odd, _vec_sum_odd], ids=["gemm_scalar", "gemm_vec"])
def test_round_odd_of_two_sum_is_the_exact_round_to_odd(impl):
    rng = np.random.default_rng(1)
    n = 20000
    a = rng.standard_normal(n) * np.exp2(rng.integers(-300, 300, n))
    b = rng.standard_normal(n) * np.exp2(rng.integers(-300, 300, n))
    b[:2000] = -a[:2000] * (1 + np.exp2(-rng.integers(1, 60, 2000)))  # cancellation
    b[2000:4000] = np.ldexp(np.floor(np.ldexp(a[2000:4000], -30)), 30) - a[2000:4000]  # exact sums
    b[4000:5000] = a[4000:5000] * np.exp2(-rng.integers(53, 60, 1000))  # e alone below s's last place
    a[5000:5500] = np.where(rng.random(500) < 0.5, 5e-324, -5e-324) * rng.integers(1, 2**20, 500)  # subnormal
    got = np.empty(n)
    impl(a, b, got)
    for i in range(n):
        x = Fraction(a[i]) + Fraction(b[i])
        if x == 0:
            assert got[i] == 0
            continue
        m, e = abs(x), 0
        e = m.numerator.bit_length() - m.denominator.bit_length()
        if Fraction(2) ** e > m:
            e -= 1
        y = m / Fraction(2) ** (e - 52)
        k = y.numerator // y.denominator
        if y != k and k % 2 == 0:
            k += 1
        want = float(k * Fraction(2) ** (e - 52)) * (1 if x > 0 else -1)
        assert got[i] == want, (a[i], b[i], got[i], want)


def test_vec_sum_odd_keeps_the_scalar_cores_non_finite_and_zero_results():
    """Invariant: gemm_vec's round-to-odd sum (bit tests on s and e) gives two_sum + round_odd's bits where
    the exact reference above has none: infinities, NaN, overflow to inf, signed zeros."""
    v = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.7976931348623157e308, -1.7976931348623157e308, 1.0, -3.5,
                  5e-324, -5e-324, 2.0**-1022, 1e300])
    a, b = np.repeat(v, v.size), np.tile(v, v.size)
    want, got = np.empty_like(a), np.empty_like(a)
    _two_sum_odd(a, b, want)
    _vec_sum_odd(a, b, got)
    assert np.array_equal(want.view(np.int64), got.view(np.int64))


# ---- GEMM kernels ----------------------------------------------------------------------------------------

def _operands(rng, shape, fmt, special=False):
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))
    kind = rng.random(n)
    x = np.where(kind < 0.1, 0.0, x)
    x = np.where((kind > 0.1) & (kind < 0.2), np.exp2(rng.integers(-20, 12, n)), x)  # products far apart
    x = np.where((kind > 0.2) & (kind < 0.25), -x, x)
    if special:
        x[rng.integers(0, n, 3)] = [np.inf, -np.inf, np.nan]
    return emunum.quantize(torch.from_numpy(x.reshape(shape)), fmt).float().numpy()


def _run(A, B, bias, unit, fast, seed=0):
    nb = max(A.shape[0], B.shape[0])
    out = np.empty((nb, A.shape[1], B.shape[2]))
    mulp, accp = unit.kernel_params()
    gemm_cpu.gemm(A, B, bias, out, int(unit.fused), mulp, accp, unit.lanes, unit.chunk or 0, stream_keys(seed),
                  unit.sr_bits, fast=fast)
    return out


FAST_UNITS = {
    "e5m2-e6m9_chunk8": MADUnit("fp8_152", "fp16_169", chunk=8),
    "e5m2-e6m9_lanes3_chunk2": MADUnit("fp8_152", "fp16_169", chunk=2, lanes=3),
    "e4m3fn-e4m3fn": MADUnit("e4m3fn", "e4m3fn", lanes=2),
    "e5m2-fp16_nosub": MADUnit("fp8_152", FloatFormat(5, 10, subnormals=False)),
    "bf16-fp32": MADUnit("bf16", "fp32", lanes=4),
    "e4m3-bf16_sat": MADUnit("fp8_143", FloatFormat(8, 7, saturate=True), chunk=3),
}
PLANS = [(np.float64, True, True, True), (np.float64, False, False, False), (np.float64, True, False, True),
         (np.float32, True, True, True), (np.float32, True, False, False)]


@pytest.mark.parametrize("name", list(FAST_UNITS))
def test_fast_kernel_equals_general_kernel(name):
    """gemm_fast (every variant, where fast_plan could pick it for these operands) == gemm_general, on two column
    tiles (the second ragged) and three row tiles (the last ragged)."""
    unit = FAST_UNITS[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    op = "fp8_152" if unit.mul_fmt.man <= 3 else "bf16"
    N = gemm_cpu.TN + 46
    A = _operands(rng, (2, 2 * gemm_cpu.TM + 1, 70), op, special=True)
    B = _operands(rng, (1, 70, N), op)
    bias = rng.standard_normal((2, 2 * gemm_cpu.TM + 1, N)) * 1e3
    want = _run(A, B, bias, unit, fast=False)
    mulp, accp = unit.kernel_params()
    safe = gemm_cpu.fast_plan(A, B, 0, mulp, accp)
    assert safe is not None and safe[3]  # non-finite operands: checks stay on
    tried = 0
    for plan in PLANS:
        # a variant may drop work only where the plan for these operands allows it
        if (plan[0] == np.float32 and safe[0] != np.float32) or (not plan[1] and safe[1]) \
                or (not plan[2] and safe[2]) or (not plan[3] and safe[3]):
            continue
        tried += 1
        _same_bits(_run(A, B, bias, unit, fast=plan), want, plan)
    assert tried >= 1
    # finite, well-scaled operands: the cheap variants are allowed and must agree as well
    A2 = np.nan_to_num(A, nan=0.0, posinf=0.0, neginf=0.0)
    plan = gemm_cpu.fast_plan(A2, B, 0, mulp, accp)
    _same_bits(_run(A2, B, bias, unit, fast=plan), _run(A2, B, bias, unit, fast=False), plan)


LAYOUTS = {  # (A shape, B shape): the layouts _run_fast rewrites, and one it leaves alone
    "one A over a batch of narrow B (conv im2col)": ((1, 25, 75), (9, 75, 21)),
    "a batch of A over one B": ((4, 9, 40), (1, 40, 70)),
    "narrow output (bias-gradient GEMM)": ((1, 25, 190), (1, 190, 1)),
    "batched narrow output": ((3, 33, 20), (3, 20, 5)),
    "both rewrites (batch of narrow B, then narrow)": ((1, 40, 30), (5, 30, 3)),
    "wide output (no rewrite)": ((2, 5, 20), (2, 20, 70)),
}


@pytest.mark.parametrize("unit", ["e5m2-e6m9_lanes3_chunk2", "e4m3-bf16_sat"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_kernel_layouts_give_the_general_kernels_bits(layout, unit, with_bias):
    """The batch-merged and transposed layouts of gemm_fast give gemm_general's bits, bias included."""
    u = FAST_UNITS[unit]
    rng = np.random.default_rng(7)
    (sa, sb) = LAYOUTS[layout]
    A, B = _operands(rng, sa, "fp8_152"), _operands(rng, sb, "fp8_152")
    nb = max(sa[0], sb[0])
    bias = rng.standard_normal((nb, sa[1], sb[2])) * 10 if with_bias else None
    mulp, accp = u.kernel_params()
    assert gemm_cpu.fast_plan(A, B, 0, mulp, accp) is not None  # the fast kernel is what runs
    got, want = _run(A, B, bias, u, fast=None), _run(A, B, bias, u, fast=False)
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def _nearest_even(v: Fraction, bits: int) -> Fraction:
    """v rounded to ``bits`` significant bits, ties to even (normal range, no overflow)."""
    if v == 0:
        return v
    e = 0
    while abs(v) >= Fraction(2) ** (e + 1):
        e += 1
    while abs(v) < Fraction(2) ** e:
        e -= 1
    q = Fraction(2) ** (e + 1 - bits)
    n, r = divmod(v / q, 1)
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2 == 1):
        n += 1
    return n * q


@pytest.mark.parametrize("fast", [None, False])
def test_fast_kernel_bias_rounds_once_at_the_accumulators_midpoints(fast):
    """out = round_acc(y + bias) rounded once: biases at y's midpoints of the accumulator's grid, exactly, one
    binary64 ulp off on either side, and one ulp of y beyond less 2**-62 |y| (sums that binary64 cannot hold,
    settled by round-to-odd, whose binary64 sum is even or odd), in a tile row wider than a vector and a ragged
    last tile; against exact rationals."""
    unit = MADUnit("fp8_152", "fp16_169", chunk=64)  # the fp8 recipe's unit: 10 significant bits
    ys = np.array([1.0, 1.5, -1.25, 0.875, 3.0, -40.0, 0.0625, -0.75], dtype=np.float32)
    N = 70
    A, B = ys.reshape(1, -1, 1), np.ones((1, 1, N), dtype=np.float32)
    half = np.exp2(np.floor(np.log2(np.abs(ys.astype(np.float64)))) - 10)[:, None]  # half the grid's spacing
    kind = np.arange(N)[None, :] % 8
    h = np.where(kind % 2 == 0, half, -half) * np.ones((1, N))
    beyond = h + np.sign(h) * (np.exp2(-42) * half - np.exp2(-52) * half)  # 53 bits: exact in binary64
    bias = np.where(kind < 2, h, np.nextafter(h, np.where(kind < 4, np.inf, -np.inf)))
    bias = np.where(kind < 6, bias, beyond)[None]
    got = _run(A, B, bias, unit, fast=fast)
    want = np.array([[float(_nearest_even(Fraction(float(y)) + Fraction(b), 10)) for b in row]
                     for y, row in zip(ys, bias[0])])
    twice = np.array([[float(_nearest_even(Fraction(float(np.float64(y) + b)), 10)) for b in row]
                      for y, row in zip(ys, bias[0])])
    assert (twice != want).any()  # rounding binary64's sum again would differ
    _same_bits(got[0], want, ("bias", fast))
    if fast is None:
        assert gemm_cpu.kernel_choice(A, B, 0, *unit.kernel_params()) == "fast"


def test_fast_plan_drops_only_what_cannot_matter():
    unit = MADUnit("fp8_152", "fp16_169", chunk=64)
    mulp, accp = unit.kernel_params()
    A = emunum.quantize(torch.randn(1, 8, 512, generator=torch.Generator().manual_seed(0)) * 8, "fp8_152").numpy()
    B = emunum.quantize(torch.randn(1, 512, 8, generator=torch.Generator().manual_seed(1)), "fp8_152").numpy()
    dtype, mul_sub, acc_sub, checks, mul_exact = gemm_cpu.fast_plan(A, B, 0, mulp, accp)
    # e5m2 values have <= 3 significant bits: binary32 products are exact; e6m9 sums are multiples of
    # 2**-16 (e5m2's quantum) >= e6m9's min normal 2**-30: no accumulator subnormals
    assert dtype == np.float32 and not acc_sub
    assert mul_sub  # the smallest |a| * |b| is below e5m2's min normal 2**-14
    assert not checks  # |a*b| <= 40 * 5 and 512 such terms cannot reach e6m9's max (~2**32)
    assert np.abs(A).max() * np.abs(B).max() < 2.0**8 and np.abs(A[A != 0]).min() * np.abs(B[B != 0]).min() < 2.0**-14
    # 13 significant bits per operand: binary32 cannot hold the products exactly
    A13 = np.full((1, 2, 3), 1 + 2.0**-12, np.float32)
    B13 = np.full((1, 3, 2), 1 + 2.0**-12, np.float32)
    assert gemm_cpu._significant_bits(A13) == 13
    assert gemm_cpu.fast_plan(A13, B13, 0, *MADUnit("fp8_152", "fp16_169").kernel_params())[0] == np.float64
    # sums that may overflow the accumulator keep the checks
    big = np.full((1, 2, 4096), 57344.0, np.float32)
    assert gemm_cpu.fast_plan(big, big.transpose(0, 2, 1).copy(), 0, mulp, accp)[3]
    # a wider product format than the accumulator, a fused unit or a directed mode: no fast kernel
    for u in [MADUnit("fp16", "fp8_152"), MADUnit(None, "fp32", fused=True),
              MADUnit("bf16", "fp32", acc_rounding="up")]:
        assert gemm_cpu.fast_plan(A, B, int(u.fused), *u.kernel_params()) is None


def _depth_by_replay(K: int, lanes: int, chunk) -> int:
    """The most accumulator roundings between a product and the result, found by replaying the datapath of
    ``emunum.mad.unit``'s docstring: terms k to lane k % lanes, the chunks of all lanes closing together after
    every chunk * lanes terms and after the last, pairwise lane sums, then the bias. Each accumulator holds the
    longest path of the products in it (None: no product yet); a rounding adds one to each path through it."""
    def rounded(*held):
        paths = [h for h in held if h is not None]
        return max(paths) + 1 if paths else None

    inner, outer = [None] * lanes, [None] * lanes
    for k in range(K):
        inner[k % lanes] = rounded(inner[k % lanes], 0)
        if chunk and ((k + 1) % (chunk * lanes) == 0 or k == K - 1):
            outer = [rounded(o, i) for o, i in zip(outer, inner)]
            inner = [None] * lanes
    v = outer if chunk else inner
    while len(v) > 1:
        v = [rounded(v[2 * q], v[2 * q + 1]) for q in range(len(v) // 2)] + ([v[-1]] if len(v) % 2 else [])
    return rounded(v[0])


def test_accumulator_depth_is_the_longest_path_of_the_datapath():
    """``accumulator_depth`` (the rounding count behind fast_plan's overflow bound) equals the longest path of
    a replay of the datapath for every K up to 70 and awkward lane counts and chunks; without the datapath it
    bounds every one."""
    for lanes in (1, 2, 3, 4, 5, 8, 64):
        for chunk in (None, 1, 2, 3, 8, 64):
            for K in range(1, 71):
                want = _depth_by_replay(K, lanes, chunk)
                assert gemm_fast_plan.accumulator_depth(K, lanes, chunk or 0) == want, (K, lanes, chunk)
                assert gemm_fast_plan.accumulator_depth(K) >= want, (K, lanes, chunk)


@pytest.mark.parametrize("unit", [MADUnit("fp16_169", "fp16_169", chunk=64),
                                  MADUnit("fp16_169", "fp16_169", chunk=8, lanes=4)],
                         ids=["the fp8 recipe's unit", "lanes4 chunk8"])
@pytest.mark.parametrize("signs", ["positive", "mixed"])
def test_long_chunked_sums_near_the_accumulators_max_run_unchecked_with_the_general_kernels_bits(unit, signs):
    """A GEMM with K = 4096 whose sums come within a factor 4 of the accumulator's max (e6m9, ~2**32): the
    unit's datapath bounds them below the max (``accumulator_depth``), so fast_plan drops the overflow checks
    and takes binary32 work, which the datapath-blind bound (2K + 8 roundings) did not; the result is
    gemm_general's, bit for bit. Twice the operands' magnitude keeps the checks."""
    rng = np.random.default_rng(11)
    K = 4096
    A = emunum.quantize(torch.from_numpy(rng.uniform(2.0**9, 2.0**10, (1, 3, K))), "fp8_152").float().numpy()
    B = emunum.quantize(torch.from_numpy(rng.uniform(2.0**8, 2.0**9, (1, K, 70))), "fp8_152").float().numpy()
    if signs == "mixed":
        A[:, 1:, :] *= np.where(rng.random((1, 2, K)) < 0.3, -1, 1).astype(np.float32)
    mulp, accp = unit.kernel_params()
    lc = dict(lanes=unit.lanes, chunk=unit.chunk or 0)
    plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp, **lc)
    assert plan[0] == np.float32 and not plan[3], plan
    assert gemm_cpu.fast_plan(A, B, 0, mulp, accp)[3]  # the bound for any datapath keeps them
    assert gemm_cpu.kernel_choice(A, B, 0, mulp, accp, **lc) == "fast"
    got, want = _run(A, B, None, unit, fast=None), _run(A, B, None, unit, fast=False)
    assert np.abs(want).max() > 2.0**30  # within a factor 4 of the max
    _same_bits(got, want, plan)
    assert gemm_cpu.fast_plan(A * 2, B, 0, mulp, accp, **lc)[3]


SUBNORMAL_SUM_UNITS = {  # name: (unit, whether fast_plan may drop the accumulator's subnormal rounding)
    "e6m9-e6m9_chunk64 (fp8 recipe)": (MADUnit("fp16_169", "fp16_169", chunk=64), True),
    "e4m3fn-e4m3fn_lanes2": (MADUnit("e4m3fn", "e4m3fn", lanes=2), True),
    "e6m9-e6m9_nosub": (MADUnit(FloatFormat(6, 9, subnormals=False), FloatFormat(6, 9, subnormals=False)), False),
    "e6m9-fp16 (finer product quantum)": (MADUnit("fp16_169", "fp16", chunk=4), False),
}


def _tiny_operands(rng, shape, fmt, emin, emax):
    """Values m * 2**e (m of 3 significant bits, both signs): products and partial sums across the
    accumulator's subnormal range, with cancellation."""
    n = int(np.prod(shape))
    x = rng.choice([1.0, -1.0, 1.25, -1.5, 1.75], n) * np.exp2(rng.integers(emin, emax, n))
    x[rng.random(n) < 0.05] = 0.0
    return emunum.quantize(torch.from_numpy(x.reshape(shape)), fmt).float().numpy()


@pytest.mark.parametrize("name", list(SUBNORMAL_SUM_UNITS))
def test_fast_plan_drops_subnormal_sums_only_on_the_accumulators_grid(name):
    """Where every product is a multiple of the accumulator's smallest subnormal, fast_plan drops the
    subnormal rounding of the sums (acc_sub): gemm_fast with that plan == gemm_general, bit for bit, on sums
    that land in the subnormal range; elsewhere it keeps it, and dropping it there changes bits."""
    unit, drops = SUBNORMAL_SUM_UNITS[name]
    rng = np.random.default_rng(11)
    acc = unit.acc_fmt
    e = acc.emin // 2  # products near 2**emin, the bottom of the accumulator's normal range
    A = _tiny_operands(rng, (1, 23, 150), unit.mul_fmt, e - acc.man // 2 - 2, e + 1)
    B = _tiny_operands(rng, (1, 150, 70), unit.mul_fmt, e - acc.man // 2 - 2, e + 1)
    mulp, accp = unit.kernel_params()
    plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp)
    assert plan is not None and plan[2] == (not drops)
    want = _run(A, B, None, unit, fast=False)
    sub = (want != 0) & (np.abs(want) < 2.0**acc.emin)
    assert sub.sum() >= 20 or not acc.subnormals  # the operands reach the accumulator's subnormal range
    for dtype in {plan[0], np.float64}:
        _same_bits(_run(A, B, None, unit, fast=(dtype, *plan[1:])), want, (name, dtype))
    if not drops:  # the flag is needed here: without it the bits differ
        forced = (plan[0], plan[1], False, plan[3])
        assert not np.array_equal(_run(A, B, None, unit, fast=forced), want)


FLUSH_UNITS = {  # units whose sums (and products) round to zero from below: quantize gives -0 where the format has one
    "e5m2-fp16_nosub_lanes2_chunk3": MADUnit("fp8_152", FloatFormat(5, 10, subnormals=False), lanes=2, chunk=3),
    "e6m9_nosub-e6m9_nosub": MADUnit(FloatFormat(6, 9, subnormals=False), FloatFormat(6, 9, subnormals=False)),
    "e6m9-fp16_lanes3 (below half the smallest subnormal)": MADUnit("fp16_169", "fp16", lanes=3),
    "e5m2-e4m3fnuz (no -0)": MADUnit("fp8_152", FloatFormat(4, 3, special="fnuz"), chunk=4),
    "e5m2fnuz-fp16_nosub (-0 accumulator, products without -0)": MADUnit(
        FloatFormat(5, 2, special="fnuz"), FloatFormat(5, 10, subnormals=False), lanes=2),
    "bf16-fp32_nosub": MADUnit("bf16", FloatFormat(8, 23, subnormals=False), chunk=5),
}
FLUSH_FUSED_UNITS = {  # gemm_fast declines fused units; the dispatcher's kernel must keep the zeros' signs too
    "fused_fp16_nosub_lanes2": MADUnit(None, FloatFormat(5, 10, subnormals=False), fused=True, lanes=2),
}


def _flush_operands(rng, unit):
    """Products and partial sums around the accumulator's min normal (both signs, cancellation), products a*0
    with a < 0 (-0), a zero row of A and column of B, and a bias of signed zeros and tiny values: sums that
    flush or underflow to zero."""
    acc = unit.acc_fmt
    op = unit.mul_fmt or acc
    e = (acc.emin - (acc.man if acc.subnormals else 0)) // 2
    A = _tiny_operands(rng, (2, 9, 40), op, e - acc.man // 2 - 3, e + 1)
    B = _tiny_operands(rng, (1, 40, 70), op, e - acc.man // 2 - 3, e + 1)
    A[0, :, 5] = -np.abs(A[0, :, 5])  # a negative operand times a zero: a -0 product
    B[0, 5, :] = 0.0
    A[1, 8, :], B[0, :, 69] = -0.0, 0.0  # a zero row and a zero column: zero results without a flush
    tiny = 2.0 ** (acc.emin - (acc.man if acc.subnormals else 0) - 2)
    bias = rng.choice([-0.0, 0.0, -tiny, tiny, -3 * tiny], (2, 9, 70))
    return A, B, bias


@pytest.mark.parametrize("name", list(FLUSH_UNITS) + list(FLUSH_FUSED_UNITS))
@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_kernel_keeps_quantizes_sign_of_zero_results(name, with_bias):
    """Invariant: a negative sum or product that rounds to zero (flush without subnormals, or below half the
    smallest subnormal) is -0 where the format has -0 and +0 where it has none, as emunum.quantize gives and
    gemm_general computes; gemm_fast gives the same bits under every plan the operands allow (both work
    dtypes, with and without the subnormal and overflow checks, products rounded or exact)."""
    unit = FLUSH_UNITS.get(name) or FLUSH_FUSED_UNITS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    A, B, bias = _flush_operands(rng, unit)
    bias = bias if with_bias else None
    want = _run(A, B, bias, unit, fast=False)
    zeros = want == 0
    if unit.acc_fmt.to_kernel_args().negzero:
        assert (zeros & np.signbit(want)).sum() >= 5 and (zeros & ~np.signbit(want)).sum() >= 5
    else:
        assert zeros.sum() >= 5 and not np.signbit(want[zeros]).any()
    mulp, accp = unit.kernel_params()
    if unit.fused:
        for fast in (None, "vec"):
            _same_bits(_run(A, B, bias, unit, fast=fast), want, (name, fast))
        return
    plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp)
    assert plan is not None and plan[2]  # sums may round to zero: acc_sub is planned
    assert gemm_cpu.kernel_choice(A, B, 0, mulp, accp) == "fast"
    _same_bits(_run(A, B, bias, unit, fast=None), want, (name, "dispatcher"))
    for dtype in {plan[0], np.float64}:
        for variant in {(dtype, *plan[1:]), (dtype, True, True, True, False), (dtype, plan[1], True, False, False)}:
            _same_bits(_run(A, B, bias, unit, fast=variant), want, (name, variant))


EXACT_FLUSH_UNITS = {  # products of powers of two are exact (mul_exact) and sums of them flush to zero
    "e5m2fnuz-fp16_nosub": MADUnit(FloatFormat(5, 2, special="fnuz"), FloatFormat(5, 10, subnormals=False)),
    "e6m2-fp16_nosub": MADUnit(FloatFormat(6, 2), FloatFormat(5, 10, subnormals=False)),
}


@pytest.mark.parametrize("name", list(EXACT_FLUSH_UNITS))
def test_fast_kernel_without_product_rounding_keeps_quantizes_sign_of_zero_results(name):
    """Invariant: with mul_exact (the products' rounding skipped), a product a*0 with a < 0 is still the product
    format's zero (+0 where it has no -0) and sums that flush keep quantize's sign: gemm_general's bits."""
    unit = EXACT_FLUSH_UNITS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    lo = unit.mul_fmt.emin // 2  # products of 2**ea * 2**eb from the product format's min normal up
    A = rng.choice([-1.0, 1.0], (1, 11, 60)) * np.exp2(rng.integers(unit.mul_fmt.emin - lo, unit.mul_fmt.emin - lo + 3,
                                                                        (1, 11, 60)))
    B = rng.choice([-1.0, 1.0], (1, 60, 70)) * np.exp2(rng.integers(lo, lo + 2, (1, 60, 70)))
    A[0, :, 4], B[0, 4, :] = -np.abs(A[0, :, 4]), 0.0
    # and a GEMM whose first product, -2**emin of mul, flushes to -0 and whose second is a*0 with a < 0: the
    # accumulator stays -0 only where the product format has -0
    A2 = np.array([[[-(2.0 ** (unit.mul_fmt.emin - lo)), -1.0]] * 3])
    B2 = np.stack([np.full(70, 2.0**lo), np.zeros(70)])[None]
    negzero = unit.mul_fmt.to_kernel_args().negzero
    mulp, accp = unit.kernel_params()
    for a, b, case in ((A, B, "random"), (A2, B2, "flush + a*0")):
        a, b = a.astype(np.float32), b.astype(np.float32)
        plan = gemm_cpu.fast_plan(a, b, 0, mulp, accp)
        assert plan is not None and plan[4] and plan[2]  # mul_exact, and sums may flush
        want = _run(a, b, None, unit, fast=False)
        assert (want == 0).sum() >= 5
        if case != "random":
            assert (want == 0).all() and (np.signbit(want) == bool(negzero)).all()
        for dtype in {plan[0], np.float64}:
            _same_bits(_run(a, b, None, unit, fast=(dtype, *plan[1:])), want, (name, case, dtype))


EXACT_PRODUCT_UNITS = {
    "e6m9-e6m9_chunk64 (fp8 recipe)": MADUnit("fp16_169", "fp16_169", chunk=64),
    "e5m2-e6m9_lanes3_chunk2": MADUnit("fp8_152", "fp16_169", chunk=2, lanes=3),
    "bf16-fp32": MADUnit("bf16", "fp32", lanes=4),
}


@pytest.mark.parametrize("bits", [3, 6], ids=["e5m2-operands", "6-bit-operands"])
@pytest.mark.parametrize("name", list(EXACT_PRODUCT_UNITS))
def test_fast_plan_skips_the_product_rounding_only_where_products_are_exact(name, bits):
    """mul_exact (no rounding of the products) is planned only where every product has at most the product
    format's significant bits and lies in its normal range; there gemm_fast == gemm_general bit for bit, and
    where it is not planned, forcing it changes bits."""
    unit = EXACT_PRODUCT_UNITS[name]
    rng = np.random.default_rng(bits)
    n1, n2 = 23 * 130, 130 * 70
    A = (rng.integers(2 ** (bits - 1), 2**bits, n1) * rng.choice([-1, 1], n1) * np.exp2(rng.integers(-8, 1, n1)))
    B = (rng.integers(2 ** (bits - 1), 2**bits, n2) * rng.choice([-1, 1], n2) * np.exp2(rng.integers(-8, 1, n2)))
    A, B = A.reshape(1, 23, 130).astype(np.float32), B.reshape(1, 130, 70).astype(np.float32)
    A[0, :, ::9] = 0.0
    mulp, accp = unit.kernel_params()
    plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp)
    exact = 2 * bits <= unit.mul_fmt.man + 1
    assert plan is not None and plan[4] == exact and not plan[1] and not plan[3]
    want = _run(A, B, None, unit, fast=False)
    for dtype in {plan[0], np.float64}:
        _same_bits(_run(A, B, None, unit, fast=(dtype, *plan[1:])), want, (name, dtype))
    if not exact:
        assert not np.array_equal(_run(A, B, None, unit, fast=(*plan[:4], True)), want)


ROW_TILE_UNITS = {"chunk64": MADUnit("fp16_169", "fp16_169", chunk=64),
                  "lanes3_chunk5": MADUnit("fp16_169", "fp16_169", chunk=5, lanes=3)}


@pytest.mark.parametrize("name", list(ROW_TILE_UNITS))
@pytest.mark.parametrize("tm", [gemm_cpu.TM, 2 * gemm_cpu.TM, gemm_cpu.MAX_TM])
def test_fast_kernel_bits_do_not_depend_on_its_row_tile(name, tm):
    """gemm_fast with tm rows per tile (``row_tile``'s choices) gives gemm_general's bits, on exact products (the
    path that takes four terms on two rows per pass): an odd row count that no tile height divides, and lanes
    whose term counts leave one to three terms after the fours."""
    unit = ROW_TILE_UNITS[name]
    rng = np.random.default_rng(tm)
    M, K, N = 37, 263, gemm_cpu.TN + 21
    A = (rng.integers(4, 8, (1, M, K)) * rng.choice([-1, 1], (1, M, K)) * np.exp2(rng.integers(-8, 1, (1, M, K))))
    B = (rng.integers(4, 8, (1, K, N)) * rng.choice([-1, 1], (1, K, N)) * np.exp2(rng.integers(-8, 1, (1, K, N))))
    A, B = A.astype(np.float32), B.astype(np.float32)
    mulp, accp = unit.kernel_params()
    plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp, None, unit.lanes, unit.chunk)
    assert plan is not None and plan[4] and not plan[2] and not plan[3]  # exact products, no subnormal sums
    out = np.empty((1, M, N))
    dtype = plan[0]
    no_bias = gemm_cpu.read_only(np.zeros((1, 1, 1)))  # as gemm_cpu passes it: the kernel compiled for it
    consts = gemm_fast_plan.fast_consts(mulp, accp, dtype)
    gemm_cpu.gemm_fast(A.astype(dtype), B.astype(dtype), no_bias, False, out, *consts, unit.lanes, unit.chunk, False,
                       False, False, True, tm)
    _same_bits(out, _run(A, B, None, unit, fast=False), (unit, tm))


@pytest.mark.parametrize("nb, M, N, threads", [(1, 32, 144, 1), (1, 32, 144, 2), (1, 17, 300, 2), (64, 16, 1024, 2),
                                               (1, 5, 10, 1), (1, 100, 1, 4), (3, 64, 256, 8)])
def test_row_tile_grows_only_while_every_thread_keeps_a_tile(nb, M, N, threads):
    tm = gemm_cpu.row_tile(nb, M, N, threads)
    tiles = lambda h: nb * -(-M // h) * -(-N // gemm_cpu.TN)  # noqa: E731
    assert tm % gemm_cpu.TM == 0 and gemm_cpu.TM <= tm <= gemm_cpu.MAX_TM
    assert tm == gemm_cpu.TM or tiles(tm) >= threads
    assert tm >= min(gemm_cpu.MAX_TM, M) or tiles(2 * tm) < threads


SUBNORMAL_PRODUCT_UNITS = {  # name: (unit, whether every product below min_normal is one of its subnormals)
    "e6m9 products (the fp8 recipe's unit)": (MADUnit("fp16_169", "fp16_169", chunk=64), True),
    "e5m2 products": (MADUnit("fp8_152", "fp16_169", chunk=64), False),
    "e6m9 products without subnormals": (MADUnit(FloatFormat(6, 9, subnormals=False), "fp16_169"), False),
}


def _lowest_set_bit(v: float) -> int:
    """The exponent of the last set bit of a nonzero binary value, from its exact rational."""
    f = Fraction(abs(v))
    if f.denominator > 1:
        return -(f.denominator.bit_length() - 1)
    n = f.numerator
    return (n & -n).bit_length() - 1


@pytest.mark.parametrize("fmt", ["fp8_152", "e4m3fn", "bf16"])
def test_last_bit_bound_is_exact_for_one_value_and_a_bound_for_many(fmt):
    """``_last_bit(min |x|, bits)`` is each value's own last set bit when x is that one value, and at most every
    value's when x is a set (every positive value of the format, or its values from one binade up)."""
    codes = emunum.quantize(torch.linspace(0, 60000, 200001), fmt).unique().double().numpy()
    codes = codes[codes > 0]
    if fmt == "bf16":
        codes = codes[::37]
    for v in codes:
        assert gemm_fast_plan._last_bit(v, gemm_cpu._significant_bits(np.array([v]))) == _lowest_set_bit(v), v
    for lo in (0, len(codes) // 3):
        part = codes[lo:]
        bound = gemm_fast_plan._last_bit(part.min(), gemm_cpu._significant_bits(part))
        assert bound <= min(_lowest_set_bit(v) for v in part)


SUBNORMAL_PRODUCT_CASES = [(name, bits) for name in SUBNORMAL_PRODUCT_UNITS for bits in (1, 3)
                           if bits == 1 or SUBNORMAL_PRODUCT_UNITS[name][0].mul_fmt.man >= 5]


@pytest.mark.parametrize("name, bits", SUBNORMAL_PRODUCT_CASES,
                         ids=[f"{n}-{'powers of two' if b == 1 else 'e5m2 values'}" for n, b in SUBNORMAL_PRODUCT_CASES])
def test_products_below_min_normal_skip_their_rounding_only_on_the_formats_subnormal_grid(name, bits):
    """e5m2 operands down to its smallest subnormal 2**-16 make products down to 2**-32, below e6m9's min normal
    2**-30: on e6m9's subnormal grid (multiples of 2**-39) they are values of the format, so fast_plan skips
    their rounding (mul_exact with mul_sub) and gemm_fast gives gemm_general's bits; below e5m2's grid, or in
    a format that flushes them, they are not, and forcing the skip changes bits."""
    unit, exact = SUBNORMAL_PRODUCT_UNITS[name]  # (3-bit operands make 6-bit products: wider than e5m2's)
    rng = np.random.default_rng(bits)

    def operand(shape):
        n = int(np.prod(shape))
        x = rng.integers(2 ** (bits - 1), 2**bits, n) * rng.choice([-1, 1], n) * np.exp2(rng.integers(-16, 2, n))
        x[::7] = 2.0**-16 * rng.integers(1, 4, x[::7].size)  # e5m2 subnormals
        x[::11] = 0.0
        return emunum.quantize(torch.from_numpy(x.reshape(shape)), "fp8_152").float().numpy()

    A, B = operand((1, 19, 150)), operand((1, 150, 70))
    A[0, 0, :], B[0, :, 0] = 2.0**-16, -3 * 2.0**-16  # an output of products below min normal alone
    mulp, accp = unit.kernel_params()
    plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp, lanes=unit.lanes, chunk=unit.chunk or 0)
    assert plan[1] and not plan[3] and plan[4] == exact, plan  # products below min normal, no overflow
    want = _run(A, B, None, unit, fast=False)
    if exact:
        _same_bits(_run(A, B, None, unit, fast=None), want, plan)
    else:
        assert not np.array_equal(_run(A, B, None, unit, fast=(*plan[:4], True)), want)


NAN_UNITS = {  # units whose results include NaN from inf - inf, inf * 0, NaN operands and overflow to NaN
    "e5m2-e6m9_lanes2 (inf accumulator)": MADUnit("fp8_152", "fp16_169", lanes=2),
    "e4m3fn-e4m3fn (overflow to NaN)": MADUnit("e4m3fn", "e4m3fn"),
    "e5m2fnuz-e4m3fnuz_chunk2 (NaN, no inf, no -0)": MADUnit(FloatFormat(5, 2, special="fnuz"),
                                                             FloatFormat(4, 3, special="fnuz"), chunk=2),
    "e5m2-fp16_nosub_lanes3": MADUnit("fp8_152", FloatFormat(5, 10, subnormals=False), lanes=3),
    "bf16-fp32": MADUnit("bf16", "fp32"),
}
CANONICAL_NAN64 = 0x7FF8000000000000
NEG_NAN32 = np.array([0xFFC00001], np.uint32).view(np.float32)[0]  # a negative NaN with a payload


def _nan_operands(rng, shape):
    """Operands from +-inf, NaNs of both signs (one with a payload), +-0, values whose products and sums
    overflow every unit above (49152 = 1.5 * 2**15, an e5m2 value) and ordinary values."""
    v = np.array([np.inf, -np.inf, np.nan, NEG_NAN32, 0.0, -0.0, 49152.0, -49152.0, 1.0, -1.5, 0.25], np.float32)
    p = np.array([2, 2, 1, 1, 4, 2, 4, 4, 8, 8, 8], np.float64)
    return rng.choice(v, shape, p=p / p.sum())


@pytest.mark.parametrize("name", list(NAN_UNITS))
def test_nan_results_are_the_positive_quiet_nan_on_every_path(name):
    """Invariant: a NaN result is binary64 0x7FF8000000000000 (emunum.mad: the positive quiet NaN without
    payload), whatever NaN the hardware makes of inf - inf or inf * 0, an overflow to NaN or a negative NaN
    operand or bias; gemm_general, gemm_fast (every plan these operands allow), gemm_vec and the element-wise
    mad give the same raw bits everywhere (no NaN-aware comparison)."""
    unit = NAN_UNITS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    A, B = _nan_operands(rng, (2, 17, 5)), _nan_operands(rng, (1, 5, 70))
    bias = rng.choice([0.0, np.inf, float(NEG_NAN32), 3.0], (2, 17, 70), p=[0.7, 0.1, 0.1, 0.1])
    mulp, accp = unit.kernel_params()
    plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp)
    assert plan is not None and plan[3]  # checks on: the fast kernel's overflow and NaN branch runs
    for b in (None, bias):
        want = _run(A, B, b, unit, fast=False)
        nan = np.isnan(want)
        assert nan.sum() >= 50 and (~nan).sum() >= 50, nan.sum()
        assert (want.view(np.int64)[nan] == CANONICAL_NAN64).all()
        for fast in (None, "vec", tuple(plan), (np.float64, True, True, True, False)):
            got = _run(A, B, b, unit, fast=fast)
            assert np.array_equal(got.view(np.int64), want.view(np.int64)), (fast, np.argwhere(got.view(
                np.int64) != want.view(np.int64))[:5])
    a, bb, c = A[0, :, 0].copy(), B[0, 0, :17].copy(), bias[0, 0, :17].copy()
    out = np.empty(17)
    gemm_cpu.mad(a, bb, c, out, 0, mulp, accp, stream_keys(0), 32)
    assert np.isnan(out).any() and (out.view(np.int64)[np.isnan(out)] == CANONICAL_NAN64).all()


@pytest.mark.parametrize("dtype, bits", [(torch.float32, 0x7FC00000), (torch.float64, CANONICAL_NAN64)])
def test_matmul_nan_results_have_the_canonical_bits(dtype, bits):
    """Invariant: through emunum.matmul, NaN results are the output dtype's positive quiet NaN (raw bits), on
    the kernel the dispatcher picks (gemm_fast) and on gemm_general's unit (a directed mode)."""
    rng = np.random.default_rng(2)
    A = torch.from_numpy(_nan_operands(rng, (9, 6))).to(dtype)
    B = torch.from_numpy(_nan_operands(rng, (6, 70))).to(dtype)
    itype = torch.int32 if dtype == torch.float32 else torch.int64
    for unit in (NAN_UNITS["e4m3fn-e4m3fn (overflow to NaN)"], MADUnit("fp8_152", "e4m3fn", acc_rounding="up")):
        y = emunum.matmul(A, B, unit)
        assert y.dtype == dtype and y.isnan().sum() >= 20
        assert (y.view(itype)[y.isnan()] == bits).all(), unit


def test_results_do_not_depend_on_thread_count():
    rng = np.random.default_rng(4)
    A = _operands(rng, (1, 40, 33), "fp8_152")
    B = _operands(rng, (1, 33, 70), "fp8_152")
    for unit in [MADUnit("fp8_152", "fp16_169", chunk=4), MADUnit("fp8_152", "bf16", acc_rounding="stochastic",
                                                                    lanes=2)]:
        n = numba.get_num_threads()
        try:
            numba.set_num_threads(1)
            one = _run(A, B, None, unit, fast=None, seed=9)
        finally:
            numba.set_num_threads(n)
        np.testing.assert_array_equal(one, _run(A, B, None, unit, fast=None, seed=9))


def test_empty_and_degenerate_shapes():
    unit = MADUnit("fp8_152", "fp16_169", chunk=4, lanes=2)
    A, B = np.zeros((1, 3, 0), np.float32), np.zeros((1, 0, 2), np.float32)
    rounded = float(emunum.quantize(torch.tensor(0.3, dtype=torch.float64), "fp16_169"))
    for fast in (None, False):
        z = _run(A, B, None, unit, fast)
        assert z.shape == (1, 3, 2) and not z.any() and not np.signbit(z).any()  # an empty sum is +0
        assert np.array_equal(_run(A, B, np.full((1, 3, 2), 0.3), unit, fast), np.full((1, 3, 2), rounded))


def test_fast_kernel_declines_formats_without_mantissa_bits():
    """man=0 ties go to the even code (the even exponent), which Veltkamp's split cannot see."""
    e8m0, bf16 = _params(FloatFormat(8, 0)), _params(FloatFormat(8, 7))
    assert not gemm_cpu.fast_applies(0, e8m0, bf16)
    assert gemm_cpu.fast_applies(0, bf16, bf16)


# ---- gemm_vec: the general datapath, vectorised (kernels/gemm_vec.py) --------------------------------------

VEC_UNITS = {
    "e5m2-e6m9_sr_chunk64": MADUnit("fp8_152", "fp16_169", acc_rounding="stochastic", chunk=64),
    "e5m2_sr3-bf16_sr3_lanes2": MADUnit("fp8_152", "bf16", mul_rounding="stochastic", acc_rounding="stochastic",
                                        sr_bits=3, lanes=2),
    "e4m3-fp16_sr13_chunk5_lanes3": MADUnit("fp8_143", "fp16", acc_rounding="stochastic", sr_bits=13, chunk=5,
                                            lanes=3),
    "e5m2_tz-e6m9_tz_chunk7_lanes3": MADUnit("fp8_152", "fp16_169", mul_rounding="toward_zero",
                                             acc_rounding="toward_zero", chunk=7, lanes=3),
    "e5m2_up-e4m3_sat_down": MADUnit("fp8_152", FloatFormat(4, 3, saturate=True), mul_rounding="up",
                                     acc_rounding="down"),
    "e5m2_down-e4m3fn_up_lanes2": MADUnit("fp8_152", "e4m3fn", mul_rounding="down", acc_rounding="up", lanes=2),
    "e4m3_odd-fp16_odd": MADUnit("fp8_143", "fp16", mul_rounding="odd", acc_rounding="odd", chunk=3),
    "bf16_away-e5m2_away": MADUnit("bf16", "fp8_152", mul_rounding="nearest_away", acc_rounding="nearest_away"),
    # the toward-zero pair's variant (same modes and plan), on an accumulator without subnormals
    "e5m2_tz-fp16_nosub_tz": MADUnit("fp8_152", FloatFormat(5, 10, subnormals=False), mul_rounding="toward_zero",
                                     acc_rounding="toward_zero", lanes=2),
    "e5m2_nosub_up-fp32_down": MADUnit(FloatFormat(5, 2, subnormals=False), "fp32", mul_rounding="up",
                                       acc_rounding="down"),
    "fp16_near-e5m2_near_wider_product": MADUnit("fp16", "fp8_152", chunk=2),
    "fused_bf16_up_lanes2": MADUnit(None, "bf16", fused=True, acc_rounding="up", lanes=2),
    "fused_e6m9_sr9_chunk3_lanes3": MADUnit(None, "fp16_169", fused=True, acc_rounding="stochastic", sr_bits=9,
                                            chunk=3, lanes=3),
    "e5m2-fixed16_12_sr": MADUnit("fp8_152", "fixed16_12", acc_rounding="stochastic"),
    "e5m2_sr7-fixed12_4_wrap_away": MADUnit("fp8_152", FixedFormat(12, 4, saturate=False), mul_rounding="stochastic",
                                            acc_rounding="nearest_away", sr_bits=7, chunk=4),
    "fused-ufixed10_2_odd_lanes2": MADUnit(None, "ufixed10_2", fused=True, acc_rounding="odd", lanes=2),
    "e4m3-fixed16_8_down": MADUnit("fp8_143", "fixed16_8", acc_rounding="down", chunk=6),
    "e4m3-fixed16_8_up_nearest": MADUnit("fp8_143", FixedFormat(16, 8, saturate=False), acc_rounding="up"),
}


def _adversarial(rng, shape, fmt):
    """Operands whose products and sums hit ties, the accumulator's overflow and subnormal ranges, cancellation."""
    x = _operands(rng, shape, fmt, special=False).astype(np.float64)
    n = x.size
    flat = x.reshape(-1)
    big = rng.random(n) < 0.05
    flat[big] = np.exp2(rng.integers(8, 15, big.sum())) * rng.choice([-1.0, 1.0], big.sum())  # overflow
    tiny = rng.random(n) < 0.05
    flat[tiny] = np.exp2(rng.integers(-16, -9, tiny.sum())) * rng.choice([-1.5, 1.0, -1.25], tiny.sum())  # subnormal
    half = rng.random(n) < 0.1
    flat[half] = rng.choice([0.5, 1.5, -2.5, 3.0, -0.75], half.sum())  # ties on coarse grids
    return emunum.quantize(torch.from_numpy(x), fmt).float().numpy()


def _same_bits(got, want, what):
    """Raw float64 bits, NaNs included (every path returns the one NaN of emunum.mad)."""
    g, w = got.view(np.int64), want.view(np.int64)
    assert np.array_equal(g, w), (what, np.argwhere(g != w)[:5])


# Each combination of modes, accumulator kind, checks and exact sums compiles its own gemm_vec variant (~9 s with an
# empty cache; formats, lanes and chunks are runtime arguments, so units that differ only there share one); make
# test runs a subset that still covers every product and accumulator mode, fused, lanes, chunks, saturation, no
# subnormals and fixed point (saturating and wrapping); the rest run with pytest -m exhaustive.
_VEC_EXHAUSTIVE = {"e4m3-fp16_sr13_chunk5_lanes3", "e5m2_nosub_up-fp32_down", "fp16_near-e5m2_near_wider_product",
                   "fused_bf16_up_lanes2", "e5m2-fixed16_12_sr", "e4m3-fixed16_8_down", "e4m3-fixed16_8_up_nearest"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.exhaustive) if n in _VEC_EXHAUSTIVE else n
                                  for n in VEC_UNITS])
@pytest.mark.parametrize("operands", ["random", "adversarial", "special"])
def test_vec_kernel_equals_general_kernel_bit_for_bit(name, operands):
    """Invariant: gemm_vec gives gemm_general's float64 bit patterns (NaNs included),
    batched, broadcast B, bias, ragged tiles (M=17, N=130 over the 8 x 64 tiles), every mode and datapath."""
    unit = VEC_UNITS[name]
    mulp, accp = unit.kernel_params()
    rng = np.random.default_rng(abs(hash((name, operands))) % 2**32)
    op = "bf16" if unit.mul_fmt is not None and unit.mul_fmt.man > 3 else "fp8_152"
    make = _adversarial if operands == "adversarial" else (lambda r, s, f: _operands(r, s, f, operands == "special"))
    A = make(rng, (2, 17, 70), op)
    B = make(rng, (1, 70, 130), op)
    bias = rng.standard_normal((2, 17, 130)) * 64
    assert gemm_cpu.kernel_choice(A, B, int(unit.fused), mulp, accp) == "vec"  # reached through the dispatcher
    for seed, b in ((0, bias), (5, None)):
        _same_bits(_run(A, B, b, unit, fast=None, seed=seed), _run(A, B, b, unit, fast=False, seed=seed),
                   f"{name} {operands} seed {seed}")


def test_vec_kernel_declines_what_it_cannot_prove():
    """Invariant: units outside ``vec_applies`` (man = 0, fixed-point products) keep the reference kernel."""
    A = np.ones((1, 2, 3), np.float32)
    for unit in [MADUnit(FloatFormat(8, 0), "fp32", acc_rounding="up"), MADUnit("fp8_152", FloatFormat(8, 0)),
                 MADUnit("fixed8_4", "fp32", acc_rounding="stochastic")]:
        mulp, accp = unit.kernel_params()
        assert gemm_cpu.kernel_choice(A, A.transpose(0, 2, 1), int(unit.fused), mulp, accp) == "general"
    nearest = MADUnit("fp8_152", "fp16_169", chunk=64)
    assert gemm_cpu.kernel_choice(A, A.transpose(0, 2, 1), 0, *nearest.kernel_params()) == "fast"


def test_vec_results_do_not_depend_on_thread_count():
    rng = np.random.default_rng(8)
    A, B = _operands(rng, (1, 40, 33), "fp8_152"), _operands(rng, (1, 33, 70), "fp8_152")
    unit = VEC_UNITS["e5m2-e6m9_sr_chunk64"]
    n = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _run(A, B, None, unit, fast="vec", seed=3)
    finally:
        numba.set_num_threads(n)
    np.testing.assert_array_equal(one, _run(A, B, None, unit, fast="vec", seed=3))


@pytest.mark.parametrize("n_threads", [2, 3, 7])
def test_vec_tiles_on_threads_equal_one_thread(n_threads):
    """Invariant: gemm_vec's output tiles shared over threads (kernels/threads.py) give the one-thread bits, with
    more tiles than threads and more threads than some shares hold."""
    rng = np.random.default_rng(9)
    A, B = _operands(rng, (2, 17, 70), "fp8_152"), _operands(rng, (1, 70, 130), "fp8_152")
    unit = VEC_UNITS["e5m2-e6m9_sr_chunk64"]
    mulp, accp = unit.kernel_params()
    outs = []
    for t in (1, n_threads):
        out = np.full((2, 17, 130), np.nan)
        gemm_vec.run(A, B, np.zeros((1, 1, 1)), False, out, 0, mulp, accp, unit.lanes, unit.chunk or 0,
                     stream_keys(5), unit.sr_bits, n_threads=t)
        outs.append(out)
    _same_bits(outs[1], outs[0], f"{n_threads} threads")
    _same_bits(outs[0], _run(A, B, None, unit, fast=False, seed=5), "general")


def _vec_operands(name, operands):
    """The grid's operands for one unit (test_vec_kernel_equals_general_kernel_bit_for_bit)."""
    unit = VEC_UNITS[name]
    rng = np.random.default_rng(abs(hash((name, operands))) % 2**32)
    op = "bf16" if unit.mul_fmt is not None and unit.mul_fmt.man > 3 else "fp8_152"
    make = _adversarial if operands == "adversarial" else (lambda r, s, f: _operands(r, s, f, operands == "special"))
    return make(rng, (2, 17, 70), op), make(rng, (1, 70, 130), op)


def test_exact_sums_plan():
    """Invariant: gemm_vec drops TwoSum (EXACT) only where every sum is a multiple of 2**g below 2**(g + 53):
    by the formats (e5m2 products, grid 2**-16, into fp16 / e6m9 / fixed24_8: any operands, any K), or by the
    operands' bound (bf16 accumulator: small K and magnitudes), never for fused products or bf16 products."""
    small = np.full((1, 4, 70), 3.0, np.float32)
    huge = np.full((1, 4, 4096), 57344.0, np.float32)
    special = small.copy()
    special[0, 0, :3] = [np.inf, -np.inf, np.nan]
    for acc in ("fp16", "fp16_169", "fixed24_8"):
        mulp, accp = MADUnit("fp8_152", acc, acc_rounding="up").kernel_params()
        for A in (small, huge, special):
            assert gemm_vec.exact_sums(A, A.transpose(0, 2, 1), 0, mulp, accp), acc
    mulp, accp = MADUnit("fp8_152", "bf16", acc_rounding="up").kernel_params()
    assert gemm_vec.exact_sums(small, small.transpose(0, 2, 1), 0, mulp, accp)
    assert gemm_vec.exact_sums(special, special.transpose(0, 2, 1), 0, mulp, accp)  # only finite values count
    assert not gemm_vec.exact_sums(huge, huge.transpose(0, 2, 1), 0, mulp, accp)
    fused = MADUnit(None, "fp16", fused=True).kernel_params()
    assert not gemm_vec.exact_sums(small, small.transpose(0, 2, 1), 1, *fused)
    assert not gemm_vec.exact_sums(small, small.transpose(0, 2, 1), 0, *MADUnit("bf16", "fp8_152").kernel_params())


def test_vec_grid_takes_both_sum_paths():
    """The bit-for-bit grid reaches gemm_vec with exact sums (no TwoSum) and with TwoSum + round-to-odd, the
    latter with overflow checks on and off, in the default run (so a wrong plan or a wrong path would fail it;
    exact sums without checks: test_vec_kernel_without_checks_equals_general_kernel)."""
    seen = set()
    for name in VEC_UNITS:
        if name in _VEC_EXHAUSTIVE:
            continue
        unit = VEC_UNITS[name]
        mulp, accp = unit.kernel_params()
        for operands in ("random", "adversarial", "special"):
            A, B = _vec_operands(name, operands)
            seen.add((gemm_vec.exact_sums(A, B, int(unit.fused), mulp, accp), unit.fused,
                      gemm_vec.needs_checks(A, B, int(unit.fused), mulp, accp)))
    assert {(True, False, True), (False, False, True), (False, True, True), (False, True, False)} <= seen, seen


def test_vec_declines_fixed_point_spans_that_are_not_powers_of_two():
    """Invariant: gemm_vec's fixed-point rounding multiplies by 1/span and 1/period, exact only for powers of
    two (every FixedFormat's span is 2**bits); a parameter vector with another span keeps gemm_general."""
    unit = MADUnit("fp8_152", "fixed16_8", acc_rounding="stochastic")
    mulp, accp = unit.kernel_params()
    assert gemm_vec.vec_applies(0, mulp, accp)
    odd_span = np.array(accp).copy()
    odd_span[P_CMIN] += 1  # span 2**16 - 1
    assert not gemm_vec.vec_applies(0, mulp, odd_span)


# Operands whose products and sums provably stay finite and in range (needs_checks is False): the variants without
# overflow checks, on the benchmark's kind of data. The grid's operands overflow every non-fused unit.
VEC_TAME_UNITS = {
    "e5m2_up-bf16_down": MADUnit("fp8_152", "bf16", mul_rounding="up", acc_rounding="down"),
    "e5m2_odd-e6m9_away_chunk5": MADUnit("fp8_152", "fp16_169", mul_rounding="odd", acc_rounding="nearest_away",
                                         chunk=5),
    "e5m2_tz-fixed16_8_sr9_lanes2": MADUnit("fp8_152", "fixed16_8", mul_rounding="toward_zero",
                                            acc_rounding="stochastic", sr_bits=9, lanes=2),
    "e5m2_sr16-bf16_sr16_lanes4": MADUnit("fp8_152", "bf16", mul_rounding="stochastic", acc_rounding="stochastic",
                                          lanes=4, sr_bits=16),
    "e5m2_near-fixed12_4_wrap_up": MADUnit("fp8_152", FixedFormat(12, 4, saturate=False), acc_rounding="up"),
    "bf16_tz-bf16_up_twosum": MADUnit("bf16", "bf16", mul_rounding="toward_zero", acc_rounding="up"),
}
_VEC_TAME_EXHAUSTIVE = {"e5m2_sr16-bf16_sr16_lanes4", "e5m2_near-fixed12_4_wrap_up", "bf16_tz-bf16_up_twosum"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.exhaustive) if n in _VEC_TAME_EXHAUSTIVE else n
                                  for n in VEC_TAME_UNITS])
def test_vec_kernel_without_checks_equals_general_kernel(name):
    """Invariant: gemm_vec's variants without overflow checks (and, but for bf16 products, without TwoSum) give
    gemm_general's bits: batched, bias, ragged tiles, sums with cancellation and zeros, K = 300."""
    unit = VEC_TAME_UNITS[name]
    mulp, accp = unit.kernel_params()
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    op = "bf16" if unit.mul_fmt.man > 3 else "fp8_152"
    A = emunum.quantize(torch.from_numpy(rng.standard_normal((2, 17, 300)) * 2), op).float().numpy()
    B = emunum.quantize(torch.from_numpy(rng.standard_normal((1, 300, 130))), op).float().numpy()
    A[0, :, :40] = 0.0
    B[0, 100:110] = -B[0, 90:100]
    assert gemm_cpu.kernel_choice(A, B, 0, mulp, accp) == "vec"
    assert not gemm_vec.needs_checks(A, B, 0, mulp, accp)
    assert gemm_vec.exact_sums(A, B, 0, mulp, accp) == (unit.mul_fmt.man <= 3)
    bias = rng.standard_normal((2, 17, 130))
    for seed, b in ((0, bias), (7, None)):
        _same_bits(_run(A, B, b, unit, fast=None, seed=seed), _run(A, B, b, unit, fast=False, seed=seed),
                   f"{name} seed {seed}")


def test_wherever_the_depth_bound_drops_the_checks_small_accumulators_give_the_general_kernels_bits():
    """Random positive sums near the range of small accumulators (e5m2, e5m3, e4m3fn: 1.25-1.125 growth per
    rounding in the bound), lanes 1-3, chunks none-3, K < 40: in every case where the unit's depth bound drops
    the overflow checks that the datapath-blind bound kept, gemm_fast gives gemm_general's (finite) bits."""
    units = ([MADUnit("fp8_152", "fp8_152", chunk=c, lanes=w) for c in (None, 1, 3) for w in (1, 3)]
             + [MADUnit("fp8_152", FloatFormat(5, 3), chunk=2, lanes=2), MADUnit("e4m3fn", "e4m3fn", chunk=2)])
    rng = np.random.default_rng(1)
    dropped = 0
    for _ in range(400):
        unit = units[rng.integers(len(units))]
        mulp, accp = unit.kernel_params()
        K, M, N = int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 6))
        scale = 2.0 ** rng.uniform(-2, 9)
        A, B = (emunum.quantize(torch.from_numpy(rng.uniform(0.5, 1, s) * scale), unit.mul_fmt).float().numpy()
                for s in ((1, M, K), (1, K, N)))
        plan = gemm_cpu.fast_plan(A, B, 0, mulp, accp, lanes=unit.lanes, chunk=unit.chunk or 0)
        if plan is None or plan[3] or not gemm_cpu.fast_plan(A, B, 0, mulp, accp)[3]:
            continue
        dropped += 1
        want = _run(A, B, None, unit, fast=False)
        assert np.isfinite(want).all()
        _same_bits(_run(A, B, None, unit, fast=None), want, (unit, K, scale))
    assert dropped >= 60


def test_vec_kernel_drops_checks_on_long_chunked_sums_by_the_units_datapath():
    """gemm_vec's overflow bound counts the unit's roundings on a path (``accumulator_depth``): a chunked unit's
    K = 4096 sums of products up to ~2**15.6 run without overflow checks, which the datapath-blind bound (2K + 8
    roundings on a path) kept, and give gemm_general's bits."""
    unit = VEC_TAME_UNITS["e5m2_odd-e6m9_away_chunk5"]  # directed product rounding: gemm_vec, not gemm_fast
    mulp, accp = unit.kernel_params()
    rng = np.random.default_rng(5)
    K = 4096
    A = emunum.quantize(torch.from_numpy(rng.uniform(128, 192, (1, 3, K))), "fp8_152").float().numpy()
    B = emunum.quantize(torch.from_numpy(rng.uniform(128, 192, (1, K, 70))), "fp8_152").float().numpy()
    A[:, 1:, :] *= np.where(rng.random((1, 2, K)) < 0.3, -1, 1).astype(np.float32)
    assert gemm_cpu.kernel_choice(A, B, 0, mulp, accp, lanes=unit.lanes, chunk=unit.chunk) == "vec"
    assert not gemm_vec.needs_checks(A, B, 0, mulp, accp, unit.lanes, unit.chunk)
    assert gemm_vec.needs_checks(A, B, 0, mulp, accp)
    want = _run(A, B, None, unit, fast=False)
    assert np.abs(want).max() > 2.0**26
    _same_bits(_run(A, B, None, unit, fast=None), want, "vec, unchecked")


@pytest.mark.exhaustive
def test_vec_two_sum_matters_where_exact_sums_declines():
    """The TwoSum path is not vacuous: where ``exact_sums`` declines (bf16 products, magnitudes 2**-60..2**60,
    rounding up), forcing exact sums changes bits, so the comparisons with gemm_general would catch an
    ``exact_sums`` that says yes too often."""
    unit = VEC_TAME_UNITS["bf16_tz-bf16_up_twosum"]
    mulp, accp = unit.kernel_params()
    rng = np.random.default_rng(3)
    def wide(shape):
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))
        return emunum.quantize(torch.from_numpy(x), "bf16").float().numpy()

    A, B = wide((1, 16, 64)), wide((1, 64, 64))
    assert not gemm_vec.exact_sums(A, B, 0, mulp, accp) and not gemm_vec.needs_checks(A, B, 0, mulp, accp)
    want = _run(A, B, None, unit, fast=False)
    _same_bits(_run(A, B, None, unit, fast="vec"), want, "planned")
    forced = np.empty_like(want)
    gemm_vec.run(A, B, np.zeros((1, 1, 1)), False, forced, 0, mulp, accp, unit.lanes, unit.chunk or 0, stream_keys(0),
                 unit.sr_bits, exact=True)
    assert not np.array_equal(forced, want)


@pytest.mark.parametrize("fast", [None, False], ids=["gemm_fast", "gemm_general"])
def test_a_read_only_bias_runs_the_kernel_compiled_for_a_writable_one(fast):
    """A read-only bias (np.broadcast_to's view of a full-shape bias), a writable one and none run one compiled
    kernel, with the same bits for the two biases: numba types read-only arrays apart (a compile of seconds)."""
    from kernel_signatures import needless_variants

    unit = FAST_UNITS["e5m2-e6m9_chunk8"]
    rng = np.random.default_rng(3)
    A, B = _operands(rng, (1, 8, 16), "fp8_152"), _operands(rng, (1, 16, 40), "fp8_152")
    bias = rng.standard_normal((1, 8, 40))
    mulp, accp = unit.kernel_params()
    assert gemm_cpu.fast_plan(A, B, 0, mulp, accp) is not None
    frozen = np.broadcast_to(bias, bias.shape)
    assert not frozen.flags.writeable
    got = [_run(A, B, b, unit, fast=fast) for b in (bias, frozen, None)]
    np.testing.assert_array_equal(got[0].view(np.uint64), got[1].view(np.uint64))
    assert needless_variants(gemm_cpu.gemm_fast if fast is None else gemm_cpu.gemm_general) == []


def test_exact_product_rows_fuse_each_product_into_its_sum_where_the_cpu_has_fma():
    """``_add_rows_2x4`` (the fp8 recipe's GEMM rows) takes a * b + acc as one fused multiply-add where numba
    compiles for a CPU with FMA instructions, and as a multiply and an add elsewhere (same values: exact
    products); the flag is read from the target numba compiles for."""
    from numba import types

    from emunum.kernels import fma, gemm_fast

    f32 = types.Array(types.float32, 1, "C")
    sig = (f32,) * 6 + (types.float32,) * 8 + (f32,)
    gemm_fast._add_rows_2x4.compile(sig)
    asm = gemm_fast._add_rows_2x4.inspect_asm(sig)
    assert ("vfmadd" in asm) == fma.compiles_with_fma()
