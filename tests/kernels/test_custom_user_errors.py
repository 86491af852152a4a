"""User code that lies or raises inside the CustomFormat kernels: every code that ``to_code`` (and ``mul``/``add``
in ``custom_matmul``) returns is checked before ``from_code`` sees it, and an exception raised by any user
function reaches the caller, on the serial and the parallel CPU loop, at any size, layout and thread count, and
in the CUDA simulator. A from_code that indexes a table with the code could crash the process: those cases run
in a subprocess with a timeout."""
import re
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
import torch
from numba import njit

import emunum
from emunum.formats import CustomFormat
from emunum.kernels import custom_cpu

LIMIT = 3.875  # the largest value of the types below: codes 0..31 are the values c / 8


@njit
def lying_to_code(x):
    """Codes c = round(8x) with no clamp: 5.0 -> 40, outside 0..31; negative x -> a negative code."""
    return np.int64(round(x * 8.0))


@njit
def eighths(c):
    return c / 8.0


@njit
def raising_to_code(x):
    if x > 100.0:
        raise ValueError("value too large for this type")
    return np.int64(min(max(round(x * 8.0), 0), 31))


@njit
def raising_from_code(c):
    if c == 31:
        raise ZeroDivisionError("code 31 has no value")
    return c / 8.0


@njit
def clamped_to_code(x):
    return np.int64(min(max(round(x * 8.0), 0), 31))


LYING = CustomFormat(lying_to_code, eighths, 5, name="lying5")
RAISE_TO = CustomFormat(raising_to_code, eighths, 5, name="raise_to5")
RAISE_FROM = CustomFormat(clamped_to_code, raising_from_code, 5, name="raise_from5")


def _run(fmt, x, parallel):
    flat = x.reshape(-1)
    dst = np.empty_like(flat)
    custom_cpu.custom_runner(flat.dtype, fmt.to_kernel_args())(flat.ctypes.data, dst.ctypes.data, flat.size, 0, 0, 32, parallel)
    return dst


SIZES = [1, 1000, 1 << 18, (1 << 18) + 7]


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bad", [5.0, -1.0, 1e30])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_out_of_range_code_raises_naming_format_value_and_code(parallel, size, bad, dtype):
    x = np.full(size, 0.5, dtype)
    x[size * 2 // 3] = bad
    code = int(lying_to_code(float(dtype(bad))))
    want = f"lying5: to_code({float(dtype(bad))!r}) returned code {code}, outside the codes 0..31"
    with pytest.raises(ValueError, match=re.escape(want)):
        _run(LYING, x, parallel)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("size", SIZES)
def test_the_first_failing_element_is_named_whatever_the_loop(parallel, size):
    x = np.zeros(size, np.float32)
    x[-1] = 9.0
    x[size // 2] = 6.0  # the earlier one is reported
    with pytest.raises(ValueError, match=r"to_code\(6\.0\) returned code 48"):
        _run(LYING, x, parallel)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", [3, 1 << 18, 1 << 20])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("fmt,bad,exc,words", [
    (RAISE_TO, 1e6, ValueError, "value too large"),
    (RAISE_FROM, 3.875, ZeroDivisionError, "code 31 has no value"),
    (LYING, 5.0, ValueError, r"returned code 40, outside"),
])
def test_quantize_reaches_the_caller_with_the_users_error(threads, size, layout, fmt, bad, exc, words):
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        base = torch.zeros(size * 2)
        x = {"contiguous": base[:size], "strided": base[::2],
             "transposed": base[:size].reshape(1, size).t()}[layout]
        x.view(-1)[size - 1] = bad if layout != "strided" else 0.0
        if layout == "strided":
            base[2 * (size - 1)] = bad
        with pytest.raises(exc, match=words):
            emunum.quantize(x, fmt)
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_users_exception_carries_a_note_naming_the_format(parallel):
    with pytest.raises(ValueError, match="value too large") as info:
        _run(RAISE_TO, np.array([0.0] * 1000 + [1e6]), parallel)
    assert "raise_to5" in "".join(info.value.__notes__)


def test_valid_codes_still_give_the_values_of_the_type():
    x = np.linspace(0.0, LIMIT, 1 << 18).astype(np.float32)
    want = np.round(x.astype(np.float64) * 8.0) / 8.0
    for par in (False, True):
        assert np.array_equal(_run(LYING, x, par), want.astype(np.float32))


# ---- from_code indexing a table with the unchecked code: a crash before the check -----------------------------
# one child process runs every case (a crash ends it with a nonzero status), compiling the user's functions once
SIZES, SCALES = (10, 1 << 18), (1 << 40, -(1 << 40))
CRASH = textwrap.dedent("""
    import numpy as np, torch, numba, emunum
    TABLE = np.arange(32, dtype=np.float64) / 8.0
    @numba.njit
    def from_code(c):
        return TABLE[c]
    def to_code_times(scale):
        @numba.njit
        def to_code(x):
            c = np.int64(round(x * 8.0))
            return c * scale if x > 2.0 else c
        return to_code
    for scale in {scales}:
        f = emunum.CustomFormat(to_code_times(scale), from_code, 5, name="tabled5")
        for size in {sizes}:
            x = torch.full((size,), 0.25)
            x[size // 2] = 3.0
            try:
                emunum.quantize(x, f)
            except ValueError as e:
                print("RAISED", size, e, flush=True)
""")


def test_from_code_never_sees_an_out_of_range_code():
    p = subprocess.run([sys.executable, "-c", CRASH.format(sizes=SIZES, scales=SCALES)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for scale in SCALES:
        for size in SIZES:
            assert f"RAISED {size} tabled5: to_code(3.0) returned code {24 * scale}" in p.stdout, (
                p.stdout + p.stderr[-2000:])


# ---- custom_matmul: to_code, mul, add, from_code ---------------------------------------------------------------
@njit
def add_ok(a, b):
    return min(a + b, 31)


@njit
def mul_ok(a, b):
    return min(a * b // 8, 31)


@njit
def add_lies(a, b):
    return a + b  # no clamp: 40 and more


@njit
def mul_raises(a, b):
    if a * b > 200:
        raise OverflowError("product out of range")
    return a * b // 8


@pytest.mark.parametrize("m", [1, 64])
@pytest.mark.parametrize("to_code,add,mul,from_code,exc,words", [
    (lying_to_code, add_ok, mul_ok, eighths, ValueError, r"to_code\(5\.0\) returned code 40"),
    (clamped_to_code, add_lies, mul_ok, eighths, ValueError, r"add\(\d+, \d+\) returned code \d+, outside"),
    (clamped_to_code, add_ok, mul_raises, eighths, OverflowError, "product out of range"),
    (clamped_to_code, add_ok, mul_ok, raising_from_code, ZeroDivisionError, "code 31 has no value"),
])
def test_custom_matmul_checks_every_code_and_passes_on_every_exception(m, to_code, add, mul, from_code, exc, words):
    fmt = CustomFormat(to_code, from_code, 5, name="gemm5", add=add, mul=mul)
    a = torch.full((m, 8), 3.0)
    a[-1, -1] = 5.0 if to_code is lying_to_code else 3.875
    b = torch.full((8, 3), 3.875)
    with pytest.raises(exc, match=words):
        emunum.mad.custom_matmul(a, b, fmt)


# ---- the CUDA simulator --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,bad,exc,words", [
    (LYING, 5.0, ValueError, r"lying5: to_code\(5\.0\) returned code 40"),
    (LYING, -2.0, ValueError, r"lying5: to_code\(-2\.0\) returned code -16"),
    (RAISE_TO, 1e6, ValueError, "value too large"),
    (RAISE_FROM, 3.875, ZeroDivisionError, "code 31 has no value"),
])
def test_cuda_kernel_checks_codes_and_passes_on_exceptions(fmt, bad, exc, words):
    pytest.importorskip("numba_cuda")
    from emunum.kernels import custom_cuda
    x = np.full(70, 0.5, np.float32)
    x[41] = bad
    with pytest.raises(exc, match=words):
        custom_cuda.quantize_custom(x, x.copy(), fmt.to_kernel_args(), 0, 0, 32)


# ---- Multiplier.function: a user product inside the parallel GEMM and MAD kernels ------------------------------
@njit
def product_raises(a, b):
    if a > 1000.0:
        raise ArithmeticError("operand outside this multiplier's range")
    return a * b


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M", [1, 40, 300])
def test_a_multiplier_functions_exception_reaches_the_caller_from_the_gemm(threads, M):
    from emunum.mad import MADUnit, Multiplier
    unit = MADUnit(None, "fp32", fused=True, multiplier=Multiplier.function(product_raises))
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        A, B = torch.ones(M, 16), torch.ones(16, 24)
        assert torch.equal(emunum.mad.matmul(A, B, unit), A @ B)  # the function works where it does not raise
        A[M - 1, 3] = 2048.0
        with pytest.raises(ArithmeticError, match="outside this multiplier's range"):
            emunum.mad.matmul(A, B, unit)
        a = torch.ones(M * 1000)
        a[-1] = 4096.0
        with pytest.raises(ArithmeticError, match="outside this multiplier's range"):
            emunum.mad.mad(a, torch.ones_like(a), torch.zeros_like(a), unit)
    finally:
        numba.set_num_threads(old)
