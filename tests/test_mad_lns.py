"""``emunum.mad.lns_matmul`` (LNS MAD unit) against pure-Python references of the stated datapath:
- add="exact": the accumulator sum is an exact ``Fraction`` of the two addends' values, rounded to the LNS
  grid by exact log-domain comparisons (x lies above the midpoint of k and k+1 exactly when x**(2F) >
  2**(2k+1), integer powers);
- add="mitchell": integer exponents, the Mitchell term round(F * 2**(-d/F)) found by exact integer
  comparisons ((2n+1)**F * 2**d against (2F)**F), ties to the even exponent.
Operand codes come from ``emunum.quantize`` (tested against exact rounding in tests/formats/test_log.py)."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum.formats import FloatFormat, LogFormat
from emunum.mad import lns_matmul
from emunum.mad.lns import mitchell_table

FORMATS = [LogFormat(4, 3), LogFormat(5, 5), LogFormat(3, 2, signed=False), LogFormat(2, 0)]
ADDS = ["exact", "mitchell"]


def ref_operand(t: torch.Tensor, fmt: LogFormat):
    """Rows of (None: zero | 'nan' | (negative, k)) for t rounded to fmt: k the code with value_of(k) == |v|."""
    q = emunum.quantize(t.to(torch.float64), fmt, "nearest").tolist()
    F = 1 << fmt.frac_bits

    def code(v):
        k0 = round(F * math.log2(abs(v)))
        (k,) = [k for k in (k0 - 1, k0, k0 + 1) if fmt.kmin <= k <= fmt.kmax and fmt.value_of(k) == abs(v)]
        return v < 0, k

    return [[None if v == 0 else "nan" if math.isnan(v) else code(v) for v in row] for row in q]


def ref_product(a, b, fmt):
    if a == "nan" or b == "nan":
        return "nan"
    if a is None or b is None:
        return None
    k = min(a[1] + b[1], fmt.kmax)
    return None if k < fmt.kmin else (a[0] != b[0], k)


def round_exact(s: Fraction, fmt: LogFormat):
    """The exact sum s rounded to the LNS grid: k = round(F*log2|s|) (no ties: midpoints are irrational)."""
    if s == 0:
        return None
    F, x = 1 << fmt.frac_bits, abs(s)
    H = math.floor(2 * F * math.log2(x))  # then made exact: 2**H <= x**(2F) < 2**(H+1)
    while x ** (2 * F) < Fraction(2) ** H:
        H -= 1
    while x ** (2 * F) >= Fraction(2) ** (H + 1):
        H += 1
    k = min((H + 1) // 2, fmt.kmax)
    return None if k < fmt.kmin else (s < 0, k)


def mitchell_n(d: int, F: int):
    """(n, tie) for F*t, t = 2**(-d/F): n = #{j >= 0 : j + 1/2 < F*t} (a float guess, made exact by integer
    comparisons of (2j+1)**F * 2**d with (2F)**F); tie: F*t = n + 1/2 exactly (else n = round(F*t))."""
    def below(j):  # j + 1/2 < F*t
        return (2 * j + 1) ** F * 2**d < (2 * F) ** F

    n = max(0, math.floor(F * 2.0 ** (-d / F) + 0.5))
    while n > 0 and not below(n - 1):
        n -= 1
    while below(n):
        n += 1
    return n, (2 * n + 1) ** F * 2**d == (2 * F) ** F


def round_even(num2: int):
    """The integer nearest num2/2 (num2 odd: a tie, to the even one)."""
    lo = num2 // 2
    return lo if num2 % 2 == 0 or lo % 2 == 0 else lo + 1


def add_mitchell(acc, p, fmt):
    F = 1 << fmt.frac_bits
    (na, ka), (np_, kp) = acc, p
    hi, d = max(ka, kp), abs(ka - kp)
    same = na == np_
    if not same and d == 0:
        return None
    neg = na if ka >= kp else np_
    n, tie = mitchell_n(d, F)
    # exponent hi +- (n + 1/2) on a tie, else hi +- n; twice it, rounded half to even
    twice = 2 * hi + (2 * n + 1 if tie else 2 * n) * (1 if same else -1)
    k = min(round_even(twice), fmt.kmax)
    return None if k < fmt.kmin else (neg, k)


def value(c, fmt):
    if c is None:
        return 0.0
    if c == "nan":
        return math.nan
    return -fmt.value_of(c[1]) if c[0] else fmt.value_of(c[1])


def reference(A, B, fmt, add):
    a, b = ref_operand(A, fmt), ref_operand(B, fmt)
    M, K, N = len(a), len(b), len(b[0]) if b else 0
    out = np.zeros((M, N))
    for i in range(M):
        for j in range(N):
            acc = None
            for k in range(K):
                p = ref_product(a[i][k], b[k][j], fmt)
                if p == "nan" or acc == "nan":
                    acc = "nan"
                elif p is None:
                    pass
                elif acc is None:
                    acc = p
                elif add == "exact":
                    acc = round_exact(Fraction(value(acc, fmt)) + Fraction(value(p, fmt)), fmt)
                else:
                    acc = add_mitchell(acc, p, fmt)
            out[i, j] = value(acc, fmt)
    return torch.from_numpy(out)


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


def random_operands(seed, M, K, N, dtype=torch.float64, spread=6, zeros=0.2):
    g = torch.Generator().manual_seed(seed)

    def scale(shape):
        return 2.0 ** torch.randint(-spread, spread + 1, shape, generator=g)

    A = torch.randn(M, K, generator=g, dtype=torch.float64) * scale((M, K))
    B = torch.randn(K, N, generator=g, dtype=torch.float64) * scale((K, N))
    A[torch.rand(M, K, generator=g) < zeros] = 0.0
    B[torch.rand(K, N, generator=g) < zeros] = 0.0
    return A.to(dtype), B.to(dtype)


@pytest.mark.parametrize("add", ADDS)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lns_matmul_equals_reference_bit_for_bit(fmt, add, seed):
    A, B = random_operands(seed, 5, 9, 4, spread=4 if fmt.int_bits < 4 else 6)
    got = lns_matmul(A, B, fmt, add)
    assert got.dtype == torch.float64 and got.shape == (5, 4)
    assert same_bits(got, reference(A, B, fmt, add))


@pytest.mark.parametrize("add", ADDS)
def test_float32_inputs_give_the_float64_results_cast(add):
    fmt = LogFormat(4, 3)
    A, B = random_operands(7, 4, 6, 3)
    got = lns_matmul(A.float(), B.float(), fmt, add)
    assert got.dtype == torch.float32
    assert same_bits(got, reference(A.float(), B.float(), fmt, add).float())


@pytest.mark.parametrize("add", ADDS)
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=str)
def test_long_sums_match_reference_including_cancellation(fmt, add):
    """K = 40 with terms of one magnitude and mixed signs: many cancellations and near-cancellations."""
    g = torch.Generator().manual_seed(3)
    A = torch.randint(-2, 3, (3, 40), generator=g).double() * 0.75
    B = torch.randint(-2, 3, (40, 2), generator=g).double()
    assert same_bits(lns_matmul(A, B, fmt, add), reference(A, B, fmt, add))


@pytest.mark.parametrize("add", ADDS)
def test_exact_cancellation_and_zero_operands_give_zero(add):
    fmt = LogFormat(4, 3)
    A = torch.tensor([[1.5, -1.5], [0.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    B = torch.tensor([[2.0], [2.0]], dtype=torch.float64)
    got = lns_matmul(A, B, fmt, add)
    want3 = 2.0 * emunum.quantize(torch.tensor(3.0, dtype=torch.float64), fmt).item()  # k + F: twice the value
    assert got[0, 0].item() == 0.0 and got[1, 0].item() == 0.0
    assert got[2, 0].item() == want3


@pytest.mark.parametrize("add", ADDS)
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=str)
def test_products_and_sums_saturate_at_max(fmt, add):
    A = torch.full((1, 3), fmt.max, dtype=torch.float64)
    B = torch.full((3, 1), fmt.max, dtype=torch.float64)
    assert lns_matmul(A, B, fmt, add).item() == fmt.max
    assert lns_matmul(A, -B, fmt, add).item() == -fmt.max


@pytest.mark.parametrize("add", ADDS)
def test_product_below_min_is_zero_and_skipped(add):
    fmt = LogFormat(4, 3)
    A = torch.tensor([[fmt.min_positive, 1.0]], dtype=torch.float64)
    B = torch.tensor([[fmt.min_positive], [0.5]], dtype=torch.float64)
    assert lns_matmul(A, B, fmt, add).item() == 0.5


@pytest.mark.parametrize("add", ADDS)
def test_nan_operand_gives_nan_output(add):
    fmt = LogFormat(4, 3)
    A = torch.tensor([[1.0, math.nan], [1.0, 2.0]], dtype=torch.float64)
    B = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    got = lns_matmul(A, B, fmt, add)
    assert math.isnan(got[0, 0].item()) and not math.isnan(got[1, 0].item())
    assert same_bits(got, reference(A, B, fmt, add))


def test_mitchell_tie_goes_to_even_exponent():
    """LogFormat(4, 1), F = 2: 2**(1/2) + 2**(-3/2): d = 4, F*t = 2*2**-2 = 1/2, exponent 1 + 1/2 -> 2 (even):
    the result is 2.0; 2**(1/2) - 2**(-3/2): exponent 1 - 1/2 -> 0 (even): 1.0."""
    fmt = LogFormat(4, 1)
    A = torch.tensor([[2**0.5, 2**-1.5]], dtype=torch.float64)
    assert lns_matmul(A, torch.tensor([[1.0], [1.0]], dtype=torch.float64), fmt, "mitchell").item() == 2.0
    assert lns_matmul(A, torch.tensor([[1.0], [-1.0]], dtype=torch.float64), fmt, "mitchell").item() == 1.0


@pytest.mark.parametrize("add", ADDS)
@pytest.mark.parametrize("fmt", [LogFormat(10, 10), LogFormat(6, 8, signed=False)], ids=str)
def test_wide_formats_equal_reference_bit_for_bit(fmt, add):
    """Exponent fields beyond 16 bits (LogFormat.encode's table limit)."""
    A, B = random_operands(11, 3, 6, 2, spread=8)
    assert same_bits(lns_matmul(A, B, fmt, add), reference(A, B, fmt, add))


@pytest.mark.parametrize("frac_bits", [0, 1, 3, 5, 8])
def test_mitchell_table_is_exact_rounding(frac_bits):
    F = 1 << frac_bits
    tab = mitchell_table(frac_bits)
    assert len(tab) == F * (frac_bits + 1)
    for d in range(len(tab)):
        n, tie = mitchell_n(d, F)
        assert not tie and tab[d] == n, d
    assert mitchell_n(len(tab), F) == (0, True)


@pytest.mark.parametrize("add", ADDS)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_single_products_equal_mul_codes(fmt, add):
    """K = 1: each output is one product, which must be ``LogFormat.mul_codes`` of the operands' codes."""
    a = torch.tensor([[0.0], [1.0], [-0.3], [fmt.max], [fmt.min_positive], [2.5]], dtype=torch.float64)
    b = torch.tensor([[0.0, 1.0, -0.3, fmt.max, fmt.min_positive, 2.5, -7.0]], dtype=torch.float64)
    ca = fmt.encode(emunum.quantize(a, fmt).numpy())
    cb = fmt.encode(emunum.quantize(b, fmt).numpy())
    want = torch.from_numpy(fmt.decode(fmt.mul_codes(ca, cb)))
    assert same_bits(lns_matmul(a, b, fmt, add), want)


def test_empty_shapes():
    fmt = LogFormat(4, 3)
    assert lns_matmul(torch.zeros(0, 3), torch.zeros(3, 2), fmt).shape == (0, 2)
    assert torch.equal(lns_matmul(torch.zeros(2, 0), torch.zeros(0, 2), fmt), torch.zeros(2, 2))


def test_inputs_are_not_modified():
    fmt = LogFormat(4, 3)
    A, B = random_operands(5, 3, 4, 2)
    A0, B0 = A.clone(), B.clone()
    lns_matmul(A, B, fmt, "mitchell")
    assert torch.equal(A, A0) and torch.equal(B, B0)


@pytest.mark.parametrize("fmt", [FloatFormat(4, 3), "lns4_3", None], ids=str)
def test_non_log_format_is_a_type_error_naming_fmt(fmt):
    with pytest.raises(TypeError, match="fmt must be a LogFormat"):
        lns_matmul(torch.ones(2, 2), torch.ones(2, 2), fmt)


@pytest.mark.parametrize("add", ["gauss", "", 1, None])
def test_bad_add_is_a_value_error_naming_add_and_choices(add):
    with pytest.raises(ValueError, match=r"add=.*allowed: exact, mitchell"):
        lns_matmul(torch.ones(2, 2), torch.ones(2, 2), LogFormat(4, 3), add)


@pytest.mark.parametrize("A, B, err, match", [
    (torch.ones(2), torch.ones(2, 2), ValueError, "A must be 2-D"),
    (torch.ones(2, 3), torch.ones(2, 2), ValueError, "do not chain"),
    (torch.ones(2, 2, dtype=torch.float16), torch.ones(2, 2), TypeError, "A.dtype=torch.float16"),
    (torch.ones(2, 2), torch.ones(2, 2, dtype=torch.float64), ValueError, "one dtype"),
    (torch.ones(2, 2), [[1.0]], TypeError, "B must be a torch.Tensor"),
    (torch.ones(2, 2, device="meta"), torch.ones(2, 2), ValueError, "CPU only"),
])
def test_bad_operands_are_named(A, B, err, match):
    with pytest.raises(err, match=match):
        lns_matmul(A, B, LogFormat(4, 3))


@pytest.mark.parametrize("add", ADDS)
@pytest.mark.parametrize("hi, mitchell_k", [(9, 2), (7, 0), (6, None)])
def test_near_cancellation_below_min_matches_reference(add, hi, mitchell_k):
    """V(kmin+hi) - V(kmin+hi-1) in LogFormat(4, 3) is below the zero/min midpoint (< 0.2 * min): the
    exact-rounded sum is zero. Mitchell gives kmin + hi - round(8 * 2**(-1/8)) = kmin + hi - 7: kmin + 2,
    kmin, and kmin - 1 (below kmin: zero)."""
    fmt = LogFormat(4, 3)
    A = torch.tensor([[fmt.value_of(fmt.kmin + hi), -fmt.value_of(fmt.kmin + hi - 1)]], dtype=torch.float64)
    B = torch.ones(2, 1, dtype=torch.float64)
    got = lns_matmul(A, B, fmt, add)
    assert same_bits(got, reference(A, B, fmt, add))
    if add == "exact" or mitchell_k is None:
        assert got.item() == 0.0
    else:
        assert got.item() == fmt.value_of(fmt.kmin + mitchell_k)


def test_both_additions_share_one_compiled_kernel():
    """The Mitchell addition's read-only table and the exact addition's placeholder reach ``lns_gemm`` alike
    (numba types read-only arrays apart: one compile too many)."""
    from kernel_signatures import needless_variants

    from emunum.kernels import lns_gemm_cpu

    A, B = random_operands(3, 4, 6, 5)
    for add in ADDS:
        lns_matmul(A, B, FORMATS[0], add)
    assert needless_variants(lns_gemm_cpu.lns_gemm) == []
