"""Approximate multipliers in MAD units (``emunum.mad.Multiplier``).

Oracles, written here in plain Python integers and ``fractions`` from the papers, independent of the kernels:
- Mitchell 1962: N = 2**k (1 + x); product 2**(k1+k2) (1 + x1 + x2), or 2**(k1+k2+1) (x1 + x2) if x1 + x2 >= 1;
- truncated: keep the leading one and t bits after it, multiply exactly;
- DRUM (Hashemi, Bahar, Reda, ICCAD 2015; scale-lab/DRUM Verilog): an integer of more than k bits keeps its
  k bits from the leading one with the last set to 1.
Operands: every pair of e4m3fn codes (decoded here from the OCP bit layout) or int8 codes.
CPU == CUDA runs in numba's simulator (NUMBA_ENABLE_CUDASIM=1, set here when no GPU and numba.cuda is not
imported yet).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

if (importlib.util.find_spec("numba_cuda") is not None and not torch.cuda.is_available()
        and "numba.cuda" not in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "") in ("", "0")):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import emunum  # noqa: E402
from emunum.mad import MADUnit, Multiplier  # noqa: E402
from emunum.mad.unit import stream_keys  # noqa: E402

# ---- operands: (sign, N, q) with value (-1)**sign * N * 2**q -----------------------------------------------


def e4m3fn_operand(code: int):
    """OCP e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN (None); no inf."""
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return None
    return (s, m, -9) if e == 0 else (s, 8 + m, e - 10)


def int8_operand(code: int):
    v = code - 256 if code >= 128 else code
    return (int(v < 0), abs(v), 0)


OPERANDS = {"e4m3fn": e4m3fn_operand, "int8": int8_operand}


def value(op) -> Fraction:
    s, n, q = op
    return (-1) ** s * Fraction(n) * Fraction(2) ** q


def as_float(op) -> float:
    s, n, q = op
    x = float(Fraction(n) * Fraction(2) ** q)
    return -x if s else x


# ---- the published definitions ------------------------------------------------------------------------------

def mitchell(n1: int, n2: int) -> Fraction:
    k1, k2 = n1.bit_length() - 1, n2.bit_length() - 1
    x1, x2 = Fraction(n1, 2**k1) - 1, Fraction(n2, 2**k2) - 1
    if x1 + x2 < 1:
        return Fraction(2) ** (k1 + k2) * (1 + x1 + x2)
    return Fraction(2) ** (k1 + k2 + 1) * (x1 + x2)


def truncated(t: int):
    def f(n1, n2):
        def tr(n):
            drop = max(n.bit_length() - 1 - t, 0)
            return (n >> drop) << drop
        return Fraction(tr(n1) * tr(n2))
    return f


def drum(k: int):
    def f(n1, n2):
        def dr(n):
            if n.bit_length() <= k:
                return n
            s = n.bit_length() - k
            return ((n >> s) | 1) << s
        return Fraction(dr(n1) * dr(n2))
    return f


def oracle_product(op1, op2, integer_product) -> float:
    """sign xor, zero stays a signed zero; else integer_product(N1, N2) * 2**(q1 + q2)."""
    (s1, n1, q1), (s2, n2, q2) = op1, op2
    neg = bool(s1 ^ s2)
    if n1 == 0 or n2 == 0:
        return -0.0 if neg else 0.0
    mag = float(integer_product(n1, n2) * Fraction(2) ** (q1 + q2))
    return -mag if neg else mag


def all_pairs(fmt: str):
    ops = [op for op in (OPERANDS[fmt](c) for c in range(256)) if op is not None]
    a = [p for p in ops for _ in ops]
    b = [p for _ in ops for p in ops]
    return a, b


def products_on_unit(mult: Multiplier, a_ops, b_ops) -> np.ndarray:
    """The unit's product of each pair: a fused fp32 unit with c = -0 returns the product exactly (every
    product here fits fp32) and keeps a zero's sign."""
    unit = MADUnit(None, "fp32", fused=True, multiplier=mult)
    a = torch.tensor([as_float(o) for o in a_ops], dtype=torch.float32)
    b = torch.tensor([as_float(o) for o in b_ops], dtype=torch.float32)
    return emunum.mad.elementwise(a, b, torch.full_like(a, -0.0), unit).numpy()


def assert_bits_equal(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    bad = np.flatnonzero(got.view(np.int64) != want.view(np.int64))
    assert bad.size == 0, f"{bad.size} mismatches, first at {bad[0]}: got {got[bad[0]]!r}, want {want[bad[0]]!r}"


BUILTINS = [
    ("mitchell", lambda fmt: Multiplier.mitchell(), lambda: mitchell),
    ("truncated0", lambda fmt: Multiplier.truncated(0), lambda: truncated(0)),
    ("truncated1", lambda fmt: Multiplier.truncated(1), lambda: truncated(1)),
    ("truncated4", lambda fmt: Multiplier.truncated(4), lambda: truncated(4)),
    ("drum2", lambda fmt: Multiplier.drum(2, fmt), lambda: drum(2)),
    ("drum3", lambda fmt: Multiplier.drum(3, fmt), lambda: drum(3)),
    ("drum5", lambda fmt: Multiplier.drum(5, fmt), lambda: drum(5)),
]


@pytest.mark.parametrize("fmt", ["e4m3fn", "int8"])
@pytest.mark.parametrize("name,make,ref", BUILTINS, ids=[b[0] for b in BUILTINS])
def test_builtin_equals_published_definition_on_every_8bit_pair(fmt, name, make, ref):
    a_ops, b_ops = all_pairs(fmt)
    want = [oracle_product(x, y, ref()) for x, y in zip(a_ops, b_ops)]
    assert_bits_equal(products_on_unit(make(fmt), a_ops, b_ops), want)


def exact_lut(fmt: str) -> np.ndarray:
    ops = [OPERANDS[fmt](c) for c in range(256)]
    lut = np.full((256, 256), np.nan)
    for i, x in enumerate(ops):
        for j, y in enumerate(ops):
            if x is not None and y is not None:
                lut[i, j] = float(value(x) * value(y))
    return lut


def mitchell_lut(fmt: str) -> np.ndarray:
    ops = [OPERANDS[fmt](c) for c in range(256)]
    lut = np.full((256, 256), np.nan)
    for i, x in enumerate(ops):
        for j, y in enumerate(ops):
            if x is not None and y is not None:
                lut[i, j] = oracle_product(x, y, mitchell)
    return lut


@pytest.mark.parametrize("fmt", ["e4m3fn", "int8"])
def test_table_returns_its_entry_for_every_code_pair(fmt):
    """A table of Mitchell products, looked up by code (the e4m3fn -0 code included)."""
    a_ops, b_ops = all_pairs(fmt)
    want = [oracle_product(x, y, mitchell) for x, y in zip(a_ops, b_ops)]
    assert_bits_equal(products_on_unit(Multiplier.table(mitchell_lut(fmt), fmt), a_ops, b_ops), want)


def _e4m3(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-4, 5, shape, generator=g).float())
    return emunum.quantize(x, "e4m3fn")


EXACT_UNITS = {
    "e5m10_fp32": dict(mul_fmt="fp16", acc_fmt="fp32"),
    "fused_bf16_lanes2_chunk3": dict(mul_fmt=None, acc_fmt="bf16", fused=True, lanes=2, chunk=3),
    "sr_e5m2_fp16": dict(mul_fmt="e5m2", acc_fmt="fp16", mul_rounding="stochastic", acc_rounding="stochastic"),
}


@pytest.mark.parametrize("name", list(EXACT_UNITS))
def test_table_of_exact_products_gives_the_exact_units_bits(name):
    kw = EXACT_UNITS[name]
    A, B, bias = _e4m3((2, 7, 19), 1), _e4m3((19, 9), 2), torch.randn(9)
    exact = MADUnit(**kw)
    table = MADUnit(**kw, multiplier=Multiplier.table(exact_lut("e4m3fn"), "e4m3fn"))
    assert_bits_equal(emunum.mad.matmul(A, B, table, seed=5), emunum.mad.matmul(A, B, exact, seed=5))
    assert_bits_equal(emunum.mad.linear(A, B.t(), bias, table, seed=5), emunum.mad.linear(A, B.t(), bias, exact,
                                                                                          seed=5))


def test_conv2d_with_a_table_of_exact_products_gives_the_exact_units_bits():
    x, w, b = _e4m3((2, 3, 6, 5), 11), _e4m3((4, 3, 3, 3), 12), torch.randn(4)
    exact = MADUnit("fp16", "bf16", chunk=4)
    table = MADUnit("fp16", "bf16", chunk=4, multiplier=Multiplier.table(exact_lut("e4m3fn"), "e4m3fn"))
    assert_bits_equal(emunum.mad.conv2d(x, w, b, padding=1, unit=table), emunum.mad.conv2d(x, w, b, padding=1,
                                                                                             unit=exact))


def test_exact_multiplier_is_the_plain_unit():
    assert MADUnit("fp16", "fp32", multiplier=Multiplier.exact()) == MADUnit("fp16", "fp32")
    assert MADUnit("fp16", "fp32", multiplier="mitchell") == MADUnit("fp16", "fp32", multiplier=Multiplier.mitchell())


def test_equal_tables_give_equal_hashable_units():
    lut = exact_lut("int8")
    u1 = MADUnit("fp16", "fp32", multiplier=Multiplier.table(lut, "int8"))
    u2 = MADUnit("fp16", "fp32", multiplier=Multiplier.table(lut.copy(), "int8"))
    lut[3, 4] += 1
    u3 = MADUnit("fp16", "fp32", multiplier=Multiplier.table(lut, "int8"))
    assert u1 == u2 and hash(u1) == hash(u2) and u1 != u3


def test_addmm_starts_from_c_with_a_multiplier():
    """addmm(c, A, B) equals matmul plus c entering the first step: checked against mad() step by step."""
    unit = MADUnit("fp16", "bf16", multiplier=Multiplier.drum(3, "e4m3fn"))
    A, B, C = _e4m3((3, 4), 3), _e4m3((4, 2), 4), torch.randn(3, 2)
    got = emunum.mad.addmm(C, A, B, unit)
    acc = C.clone()
    for k in range(4):
        acc = emunum.mad.elementwise(A[:, k:k + 1], B[k:k + 1, :], acc, unit)
    assert_bits_equal(got, acc)


@pytest.fixture
def numba_fn():
    from numba import njit

    @njit
    def half_sum(a, b):  # an arbitrary "multiplier": (a + b) / 2
        return (a + b) * 0.5
    return half_sum


def test_user_function_products(numba_fn):
    a, b = torch.tensor([1.0, 3.0, -2.0]), torch.tensor([5.0, 0.5, 0.25])
    unit = MADUnit(None, "fp32", fused=True, multiplier=Multiplier.function(numba_fn))
    assert_bits_equal(emunum.mad.elementwise(a, b, torch.zeros(3), unit), [3.0, 1.75, -0.875])


# ---- CPU == CUDA (simulator) --------------------------------------------------------------------------------

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None


def _sim_or_gpu():
    if not HAVE_NUMBA_CUDA:
        return False
    from numba import cuda

    return cuda.to_device.__module__.startswith("numba.cuda.simulator") or torch.cuda.is_available()


@pytest.mark.skipif(not _sim_or_gpu(), reason="needs numba-cuda and a GPU or NUMBA_ENABLE_CUDASIM=1")
@pytest.mark.parametrize("which", ["mitchell", "table", "drum", "function"])
def test_cuda_kernels_equal_cpu_kernels(which, numba_fn):
    from emunum.kernels import gemm_approx, gemm_approx_cuda

    mult = {"mitchell": Multiplier.mitchell(), "drum": Multiplier.drum(3, "e4m3fn"),
            "table": Multiplier.table(mitchell_lut("e4m3fn"), "e4m3fn"),
            "function": Multiplier.function(numba_fn)}[which]
    unit = MADUnit("e5m2", "fp16", acc_rounding="stochastic", lanes=2, chunk=3, multiplier=mult)
    A, B = _e4m3((2, 3, 7), 7), _e4m3((1, 7, 4), 8)
    if which == "table":  # table kernels take codes
        A, B = mult.encode_operands(A), mult.encode_operands(B)
    A, B = A.numpy(), B.numpy()
    bias = np.random.default_rng(0).standard_normal((2, 3, 4))
    mulp, accp = unit.kernel_params()
    keys, margs = stream_keys(9), mult.kernel_args()
    want, got = np.empty((2, 3, 4)), np.zeros((2, 3, 4))
    gemm_approx.gemm(A, B, bias, None, want, 0, mulp, accp, 2, 3, keys, 32, margs, mult.fn)
    gemm_approx_cuda.gemm(A, B, bias, True, np.zeros((1, 1, 1)), False, got, 0, mulp, accp, 2, 3, keys, 32, margs,
                          mult.fn)
    assert_bits_equal(got, want)
    a, b, c = A.reshape(-1)[:20].copy(), B.reshape(-1)[:20].copy(), bias.reshape(-1)[:20].copy()
    want, got = np.empty(20), np.zeros(20)
    gemm_approx.mad(a, b, c, want, 0, mulp, accp, keys, 32, margs, mult.fn)
    gemm_approx_cuda.mad(a, b, c, got, 0, mulp, accp, keys, 32, margs, mult.fn)
    assert_bits_equal(got, want)


# ---- bad input -----------------------------------------------------------------------------------------------

def test_table_of_wrong_shape_is_named():
    with pytest.raises(ValueError, match=r"lut has shape \(256, 255\).*256 x 256"):
        Multiplier.table(np.zeros((256, 255)), "int8")


def test_table_of_more_than_8_bits_is_refused():
    with pytest.raises(ValueError, match=r"operand_fmt=\S+ has k=16 bits; allowed: k <= 8"):
        Multiplier.table(np.zeros((4, 4)), "fp16")


def test_function_numba_cannot_compile_is_named():
    def bad(a, b):
        return object() * a * b  # a Python object: numba's nopython mode cannot type it

    with pytest.raises(ValueError, match=r"numba cannot compile bad\(float64, float64\)"):
        Multiplier.function(bad)


def test_function_returning_a_non_number_is_refused():
    from numba import njit

    @njit
    def pair(a, b):
        return (a, b)

    with pytest.raises(TypeError, match=r"pair\(float64, float64\) returns"):
        Multiplier.function(pair)


@pytest.mark.parametrize("call,match", [
    (lambda: Multiplier.drum(1, "int8"), r"drum: k=1 is out of range; allowed: 2..24"),
    (lambda: Multiplier.truncated(24), r"truncated: t=24 is out of range; allowed: 0..23"),
    (lambda: Multiplier.drum(3, "posit8"), r"operand_fmt='posit8'; allowed: a FloatFormat or FixedFormat"),
    (lambda: MADUnit("fp16", "fp32", multiplier="drum"), r"needs parameters; use Multiplier.drum"),
    (lambda: MADUnit("fp16", "fp32", multiplier="booth"), r"MADUnit.multiplier='booth' is not a multiplier name"),
    (lambda: MADUnit(None, "fp32", fused=True, terms=4, multiplier="mitchell"), r"multi-term.*allowed: a one-product"),
])
def test_bad_multiplier_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_table_operand_outside_its_format_is_named():
    unit = MADUnit("fp16", "fp32", multiplier=Multiplier.table(exact_lut("int8"), "int8"))
    with pytest.raises(ValueError, match=r"A holds 0.5, which is not a value of the table multiplier's operand"):
        emunum.mad.matmul(torch.tensor([[0.5, 1.0]]), torch.ones(2, 1), unit)


# ---- training ------------------------------------------------------------------------------------------------

def test_patched_mlp_trains_with_an_8bit_table_multiplier():
    """Forward GEMMs on an e4m3fn Mitchell table (an EvoApproxLib-style 256 x 256 LUT), backward on Mitchell."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    fwd = MADUnit("fp16", "fp32", multiplier=Multiplier.table(mitchell_lut("e4m3fn"), "e4m3fn"))
    bwd = MADUnit("fp16", "fp32", multiplier="mitchell")
    emunum.patch(model, "e4m3fn", mad=fwd, mad_backward=bwd)
    x = torch.randn(64, 8)
    y = (x[:, 0] + x[:, 1] > 0).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses


def test_table_and_builtin_multipliers_share_one_compiled_kernel():
    """A table multiplier's read-only table and the other kinds' placeholder reach the GEMM and MAD kernels alike:
    numba types read-only arrays apart, which compiled each kernel twice."""
    from kernel_signatures import needless_variants

    from emunum.kernels import gemm_approx

    A, B = _e4m3((1, 5, 7), 1), _e4m3((7, 3), 2)
    for mult in (Multiplier.table(exact_lut("e4m3fn"), "e4m3fn"), Multiplier.drum(3, "e4m3fn")):
        unit = MADUnit("fp16", "bf16", multiplier=mult)
        emunum.mad.matmul(A, B, unit, seed=5)
        emunum.mad.elementwise(A.reshape(-1), A.reshape(-1), torch.zeros(35), unit)
    assert [needless_variants(k) for k in (gemm_approx.gemm_builtin, gemm_approx.mad_builtin)] == [[], []]
