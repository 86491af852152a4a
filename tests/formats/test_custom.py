"""CustomFormat (user-defined types from two njit functions). Oracles: the built-in e5m2 ("fp8_152") and
ml_dtypes' float8_e5m2 for a user type that reimplements e5m2 from its definition; the built-in
FixedFormat(24, 8) for a 24-bit user type; a pure-Python loop and the built-in e5m2 rounding of every step
for ``custom_matmul``."""
import copy
import functools
import math

import numpy as np
import pytest
import torch
from numba import njit

import emunum
from emunum import backends
from emunum.formats import CustomFormat, FixedFormat, RoundMode
from emunum.rng import seed_key

E5M2 = emunum.get_format("fp8_152")


# ---- a user's e5m2, written from the IEEE definition (1 sign, 5 exponent bits bias 15, 2 mantissa bits) ----
@njit
def e5m2_to_code(x):
    """Nearest, ties to even; overflow to inf; NaN -> 0x7E."""
    if x != x:
        return 0x7E
    s = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a == math.inf:
        return s | 0x7C
    e = math.frexp(a)[1] - 1  # a = 1.f * 2**e
    q = e - 2 if e >= -14 else -16  # the quantum (ulp) at a
    r = a * 2.0 ** -q
    n = math.floor(r)
    f = r - n
    if f > 0.5 or (f == 0.5 and n % 2 == 1):
        n += 1
    v = n * 2.0 ** q
    if v >= 65536.0:
        return s | 0x7C
    if v < 2.0 ** -14:
        return s | int(n)  # subnormal (or zero)
    e = math.frexp(v)[1] - 1
    return s | ((e + 15) << 2) | (int(v * 2.0 ** (2 - e)) - 4)


@njit
def e5m2_from_code(c):
    s = -1.0 if c & 0x80 else 1.0
    ex, mn = (c >> 2) & 0x1F, c & 3
    if ex == 31:
        return s * math.inf if mn == 0 else math.nan
    if ex == 0:
        return s * mn * 2.0 ** -16
    return s * (4 + mn) * 2.0 ** (ex - 17)


@njit
def e5m2_mul(a, b):
    return e5m2_to_code(e5m2_from_code(a) * e5m2_from_code(b))  # the float64 product is exact


@njit
def e5m2_add(a, b):
    return e5m2_to_code(e5m2_from_code(a) + e5m2_from_code(b))  # the float64 sum is exact


@functools.cache
def my() -> CustomFormat:
    """The e5m2 twin of the tests (made at first use: CustomFormat compiles its functions, ~2 CPU-s that every
    pytest-xdist worker paid at collection)."""
    return CustomFormat(e5m2_to_code, e5m2_from_code, 8, name="my_e5m2", add=e5m2_add, mul=e5m2_mul)


CODES = np.arange(256, dtype=np.int64)
DIRECTED = ["toward_zero", "up", "down"]


def e5m2_inputs(dtype) -> np.ndarray:
    """Every e5m2 value, every midpoint of neighbours and the dtype's next values around it (±1 ulp), the
    overflow boundary max + ulp/2 (±1 ulp), below half the smallest subnormal, zeros, ±inf, NaN, and random
    finite values over e5m2's range and beyond."""
    v = E5M2.decode(CODES)
    v = np.unique(v[~np.isnan(v)])
    fin = v[np.isfinite(v)]
    mids = np.concatenate([(fin[:-1] + fin[1:]) / 2, [61440.0, -61440.0, 2.0 ** -17, -(2.0 ** -17)]])
    mids = mids.astype(dtype)
    ulp = [np.nextafter(mids, np.array(np.inf, dtype)), np.nextafter(mids, np.array(-np.inf, dtype))]
    rng = np.random.default_rng(5)
    rand = (rng.standard_normal(3000) * 2.0 ** rng.integers(-20, 20, 3000)).astype(dtype)
    return np.concatenate([v.astype(dtype), mids, *ulp, [0.0, -0.0, np.nan, 1e30, -1e30], rand]).astype(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, except that any NaN matches any NaN (a payload is no property of the type)."""
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    ib = torch.int32 if a.dtype == torch.float32 else torch.int64
    return torch.equal(a[~na].view(ib), b[~nb].view(ib))


# ---- the spec ----------------------------------------------------------------------------------------------
def test_decode_and_encode_equal_the_builtin_e5m2_on_every_code():
    want, got = E5M2.decode(CODES), my().decode(CODES)
    assert np.array_equal(np.isnan(want), np.isnan(got))
    ok = ~np.isnan(want)
    assert np.array_equal(want[ok].view(np.int64), got[ok].view(np.int64))
    assert np.array_equal(my().encode(want[ok]), E5M2.encode(want[ok]))


def test_values_are_the_sorted_unique_decoded_codes_without_nan():
    v = E5M2.decode(CODES)
    v = v[~np.isnan(v)]
    want = np.unique(np.where(v == 0, 0.0, v))
    got = my().values()
    assert np.all(np.diff(got) > 0) and not np.isnan(got).any()
    assert np.array_equal(got, want)
    assert my().max == E5M2.max == 57344.0 and my().min == -57344.0 and my().bits == 8


def test_equality_and_hash_follow_the_functions_identity_nbits_and_name():
    same = CustomFormat(e5m2_to_code, e5m2_from_code, 8, name="my_e5m2", add=e5m2_add, mul=e5m2_mul)
    assert same == my() and hash(same) == hash(my())
    assert CustomFormat(e5m2_to_code, e5m2_from_code, 8, name="other", add=e5m2_add, mul=e5m2_mul) != my()
    assert CustomFormat(e5m2_to_code, e5m2_from_code, 9, name="my_e5m2", add=e5m2_add, mul=e5m2_mul) != my()
    assert CustomFormat(e5m2_to_code, e5m2_from_code, 8, name="my_e5m2") != my()
    assert copy.deepcopy(my()) is my()


def test_pickling_rebuilds_a_working_type():
    import pickle
    back = pickle.loads(pickle.dumps(my()))
    assert isinstance(back, CustomFormat) and back.name == my().name and back.add is not None
    x = torch.tensor(e5m2_inputs(np.float64))
    assert same_bits(emunum.quantize(x, back), emunum.quantize(x, "fp8_152"))


def test_custom_op_encoding_interns_the_spec():
    from emunum.ops import format_from_args, format_to_args
    args = format_to_args(my())
    assert args[0] == 3 and format_from_args(args) is my()
    x = torch.tensor(e5m2_inputs(np.float32))
    assert same_bits(torch.ops.emunum.quantize(x, args, 0, None, 32), emunum.quantize(x, "fp8_152"))


def not_compilable(x):
    return np.zeros(x) + "a"


def returns_a_float(x):
    return x * 2.0


@pytest.mark.parametrize("bad, field, words", [
    (not_compilable, "to_code", ["CustomFormat.to_code=not_compilable", "does not compile", "zeros"]),
    (returns_a_float, "to_code", ["CustomFormat.to_code=returns_a_float", "returns float64", "integer code"]),
    (42, "to_code", ["CustomFormat.to_code", "42", "numba.njit"]),
    (not_compilable, "from_code", ["CustomFormat.from_code=not_compilable", "does not compile", "(int64)"]),
])
def test_a_function_numba_cannot_compile_is_named_in_a_type_error(bad, field, words):
    args = {"to_code": e5m2_to_code, "from_code": e5m2_from_code, field: bad}
    with pytest.raises(TypeError) as e:
        CustomFormat(args["to_code"], args["from_code"], 8)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_bad_add_and_nbits_and_name_are_named():
    with pytest.raises(TypeError, match="CustomFormat.add=not_compilable"):
        CustomFormat(e5m2_to_code, e5m2_from_code, 8, add=not_compilable)
    with pytest.raises(ValueError, match="CustomFormat.nbits=33"):
        CustomFormat(e5m2_to_code, e5m2_from_code, 33)
    with pytest.raises(TypeError, match="CustomFormat.nbits"):
        CustomFormat(e5m2_to_code, e5m2_from_code, True)
    with pytest.raises(TypeError, match="CustomFormat.name"):
        CustomFormat(e5m2_to_code, e5m2_from_code, 8, name="")


def test_a_plain_python_function_is_compiled_with_njit():
    fmt = CustomFormat(e5m2_to_code.py_func, e5m2_from_code.py_func, 8)
    x = torch.tensor([0.3, -7.0, 1e6], dtype=torch.float64)
    assert same_bits(emunum.quantize(x, fmt), emunum.quantize(x, "fp8_152"))


# ---- quantize on the CPU ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nearest_gives_the_builtin_e5m2_bits(dtype):
    x = torch.tensor(e5m2_inputs(dtype))
    assert same_bits(emunum.quantize(x, my()), emunum.quantize(x, "fp8_152"))


def test_nearest_gives_ml_dtypes_float8_e5m2_bits():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = e5m2_inputs(np.float32)
    want = torch.tensor(x.astype(ml_dtypes.float8_e5m2).astype(np.float32))
    assert same_bits(emunum.quantize(torch.tensor(x), my()), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nearest_in_16_bit_dtypes_gives_the_builtin_bits(dtype):
    x = torch.tensor(e5m2_inputs(np.float32)).to(dtype)
    got, want = emunum.quantize(x, my()), emunum.quantize(x, "fp8_152")
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(got)
    assert torch.equal(got[ok].view(torch.int16), want[ok].view(torch.int16))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", DIRECTED)
def test_derived_directed_modes_give_the_builtin_e5m2_directed_bits(mode, dtype):
    x = torch.tensor(e5m2_inputs(dtype))
    assert same_bits(emunum.quantize(x, my(), mode), emunum.quantize(x, "fp8_152", mode))


def test_derived_modes_match_the_numpy_encode_path():
    x = e5m2_inputs(np.float64)
    ok = ~np.isnan(x)
    for mode in DIRECTED:
        q = emunum.quantize(torch.tensor(x[ok]), my(), mode).numpy()
        assert np.array_equal(my().encode(x[ok], mode), E5M2.encode(q))


def test_stochastic_picks_a_neighbour_and_is_unbiased_within_5_sigma():
    n = 40000
    for v in (0.3, -5.5, 3e-5):
        x = torch.full((n,), v, dtype=torch.float64)
        lo, hi = emunum.quantize(x[:1], my(), "down").item(), emunum.quantize(x[:1], my(), "up").item()
        q = emunum.quantize(x, my(), "stochastic", seed=11)
        assert bool(((q == lo) | (q == hi)).all())
        p = (v - lo) / (hi - lo)
        mean_p = float((q == hi).double().mean())
        assert abs(mean_p - p) <= 5 * math.sqrt(p * (1 - p) / n)
        assert torch.equal(q, emunum.quantize(x, my(), "stochastic", seed=11))


@njit
def fx6_to_code(x):
    """6-bit two's complement, 3 fraction bits, nearest-even, saturating; no inf, no -0, NaN -> 0."""
    if x != x:
        return 0
    return round(min(max(x * 8.0, -32.0), 31.0)) & 63  # clamp first: round(inf) has no int


@njit
def fx6_from_code(c):
    return (c - 64 if c >= 32 else c) / 8.0


FX6 = CustomFormat(fx6_to_code, fx6_from_code, 6, name="fx6_3")


@pytest.mark.parametrize("mode", ["nearest", *DIRECTED, "stochastic"])
def test_a_type_without_inf_or_negative_zero_rounds_like_fixed_point_and_its_value_table(mode):
    from emunum.formats import TableFormat
    rng = np.random.default_rng(8)
    x = torch.tensor(np.concatenate([rng.uniform(-5, 5, 3000), (np.arange(-70, 70) + 0.5) / 16.0,
                                     [0.0, -0.0, -1e-9, 1e-9, np.inf, -np.inf, 1e9, -1e9]]))
    assert np.array_equal(FX6.values(), np.arange(-32, 32) / 8.0)
    got = emunum.quantize(x, FX6, mode, seed=2)
    assert same_bits(got, emunum.quantize(x, TableFormat(FX6.values()), mode, seed=2))
    if mode != "stochastic":
        assert same_bits(got, emunum.quantize(x, FixedFormat(6, 3), mode))


@pytest.mark.parametrize("mode", ["nearest_away", "odd"])
def test_modes_that_depend_on_the_encoding_raise_naming_the_mode(mode):
    with pytest.raises(ValueError, match=f"rounding='{mode}'.*allowed: nearest, toward_zero, up, down, stochastic"):
        emunum.quantize(torch.ones(3), my(), mode)


# ---- a 24-bit type: no value set, nearest only ---------------------------------------------------------
@njit
def fx24_to_code(x):
    if x != x:
        return 0
    return round(min(max(x * 256.0, -(2.0 ** 23)), 2.0 ** 23 - 1)) & 0xFFFFFF  # round(): ties to even


@njit
def fx24_from_code(c):
    return (c - (1 << 24) if c >= (1 << 23) else c) / 256.0


FX24 = CustomFormat(fx24_to_code, fx24_from_code, 24, name="fx24_8")


def test_a_24_bit_type_rounds_like_the_builtin_fixed_point_and_scans_its_limits():
    ref = FixedFormat(24, 8)
    rng = np.random.default_rng(2)
    x = torch.tensor(np.concatenate([rng.standard_normal(2000) * 2.0 ** rng.integers(-10, 17, 2000),
                                     (np.arange(-600, 600) + 0.5) / 256.0, [1e9, -1e9, 0.0, np.inf, -np.inf]]))
    assert same_bits(emunum.quantize(x, FX24), emunum.quantize(x, ref))
    assert (FX24.max, FX24.min) == (ref.max, ref.min)
    with pytest.raises(ValueError, match="rounding='up'.*nbits=24.*allowed: nearest$"):
        emunum.quantize(x, FX24, "up")
    with pytest.raises(ValueError, match="nbits <= 16"):
        FX24.values()


# ---- CUDA (numba's simulator without a GPU) ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["nearest", *DIRECTED, "stochastic"])
def test_cuda_kernel_gives_the_cpu_kernels_bits(mode, dtype):
    pytest.importorskip("numba_cuda")
    from emunum.kernels import custom_cpu, custom_cuda
    x = e5m2_inputs(dtype)[::5].copy()  # the simulator is slow: a fifth of the inputs
    m, key = int(RoundMode.parse(mode)), seed_key(4)
    want, got = np.empty_like(x), np.empty_like(x)
    custom_cpu.quantize_custom(x, want, my().to_kernel_args(), m, key, 32)
    custom_cuda.quantize_custom(x, got, my().to_kernel_args(), m, key, 32)
    assert same_bits(torch.tensor(got), torch.tensor(want))
    if mode != "stochastic":  # and the built-in e5m2's bits
        assert same_bits(torch.tensor(got), emunum.quantize(torch.tensor(x), "fp8_152", mode))


def test_cuda_records_functions_that_do_not_compile_for_it(monkeypatch):
    pytest.importorskip("numba_cuda")
    from numba.core.errors import TypingError
    from emunum.kernels import custom_cuda
    fmt = CustomFormat(e5m2_to_code, e5m2_from_code, 8, name="no_cuda")

    def fail(*a):
        raise TypingError("Failed in cuda mode pipeline\nUse of unsupported NumPy function 'numpy.zeros'")
    monkeypatch.setattr(custom_cuda, "_build", fail)
    assert not custom_cuda.compiles(fmt.to_kernel_args())
    assert "numpy.zeros" in custom_cuda.failure(fmt.to_kernel_args())
    x = np.ones(4, np.float32)
    with pytest.raises(RuntimeError, match="no_cuda.*do not compile for CUDA"):
        custom_cuda.quantize_custom(x, x.copy(), fmt.to_kernel_args(), 0, 0, 32)


# ---- training and the MAD unit ------------------------------------------------------------------------------
def test_patched_linear_trains_one_step_like_the_builtin_e5m2():
    results = []
    for fmt in (my(), "fp8_152"):
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 4)
        emunum.patch(layer, fmt=fmt, grad_rounding="nearest")
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        loss = torch.nn.functional.mse_loss(layer(x), y)
        loss.backward()
        grads = [p.grad.clone() for p in layer.parameters()]
        opt.step()
        results.append((loss.detach(), grads, [p.detach().clone() for p in layer.parameters()]))
    (l1, g1, p1), (l2, g2, p2) = results
    assert torch.isfinite(l1) and torch.equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2)) and any(bool(g.abs().sum() > 0) for g in g1)
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


def python_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The documented datapath, one Python call of the user's functions at a time."""
    to_code, from_code = e5m2_to_code, e5m2_from_code
    out = np.empty((a.shape[0], b.shape[1]))
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            acc = to_code(0.0)
            for k in range(a.shape[1]):
                acc = e5m2_add(acc, e5m2_mul(to_code(float(a[i, k])), to_code(float(b[k, j]))))
            out[i, j] = from_code(acc)
    return out


def builtin_e5m2_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc = e5m2(acc + e5m2(a_ik * b_kj)), k in order, with the built-in rounding (float64: exact steps)."""
    q = lambda t: emunum.quantize(t, "fp8_152")  # noqa: E731
    a, b = q(a.double()), q(b.double())
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for k in range(a.shape[1]):
        acc = q(acc + q(a[:, k:k + 1] * b[k:k + 1, :]))
    return acc


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_custom_matmul_equals_the_python_loop_and_the_builtin_e5m2_steps(dtype):
    torch.manual_seed(1)
    a, b = torch.randn(5, 9, dtype=dtype) * 4, torch.randn(9, 3, dtype=dtype)
    got = emunum.mad.custom_matmul(a, b, my())
    assert got.dtype == dtype and got.shape == (5, 3)
    assert same_bits(got, torch.tensor(python_matmul(a.numpy(), b.numpy()), dtype=dtype))
    assert same_bits(got, builtin_e5m2_matmul(a, b).to(dtype))


def test_custom_matmul_names_what_is_missing():
    plain = CustomFormat(e5m2_to_code, e5m2_from_code, 8)
    with pytest.raises(ValueError, match="has no add and mul"):
        emunum.mad.custom_matmul(torch.ones(2, 2), torch.ones(2, 2), plain)
    with pytest.raises(ValueError, match="do not chain"):
        emunum.mad.custom_matmul(torch.ones(2, 3), torch.ones(2, 2), my())
    with pytest.raises(TypeError, match="CustomFormat"):
        emunum.mad.custom_matmul(torch.ones(2, 2), torch.ones(2, 2), "fp8_152")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_functions_cuda_cannot_compile_round_on_the_host_after_one_warning(monkeypatch, dtype):
    """quantize's CUDA branch for such a format (run here on CPU tensors: the host copy is then a no-op)."""
    pytest.importorskip("numba_cuda")
    import warnings
    from numba.core.errors import TypingError

    from emunum.kernels import custom_cuda

    def fail(*a):
        raise TypingError("Use of unsupported NumPy function 'numpy.zeros'")
    monkeypatch.setattr(custom_cuda, "_build", fail)
    fmt = CustomFormat(e5m2_to_code, e5m2_from_code, 8, name=f"host_only_{dtype}")
    x = torch.tensor(e5m2_inputs(np.float32)).to(dtype)
    want = emunum.quantize(x, "fp8_152")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            y = torch.empty_like(x)
            backends.runner(fmt, "cuda", x.dtype)(x, y, RoundMode.NEAREST, 0, 32)
            assert torch.equal(torch.isnan(y), torch.isnan(want))
            assert torch.equal(y[~torch.isnan(y)], want[~torch.isnan(want)])
    msgs = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "do not compile for CUDA" in msgs[0] and "numpy.zeros" in msgs[0]


@pytest.mark.parametrize("mode", ["nearest", "up"])
def test_torch_compile_traces_the_custom_op_with_the_interned_type(mode):
    x = torch.tensor(e5m2_inputs(np.float32)[:500])
    fmt = my()
    f = torch.compile(lambda t: emunum.quantize(t, fmt, mode) * 2, backend="aot_eager", fullgraph=True)
    assert same_bits(f(x), emunum.quantize(x, "fp8_152", mode) * 2)


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_serial_and_parallel_cpu_loops_give_the_same_bits(mode):
    from emunum.kernels import custom_cpu
    x = e5m2_inputs(np.float32)
    m, key = int(RoundMode.parse(mode)), seed_key(9)
    a, b = np.empty_like(x), np.empty_like(x)
    custom_cpu.quantize_custom(x, a, my().to_kernel_args(), m, key, 32, parallel=False)
    custom_cpu.quantize_custom(x, b, my().to_kernel_args(), m, key, 32, parallel=True)
    assert same_bits(torch.tensor(a), torch.tensor(b))


# ---- the example type of docs/number_systems.md -----------------------------------------------------------
@njit
def cube5_to_code(x):  # 1 sign bit, 4 bits k: value ±4·(k/15)³ (cubic companding), nearest in the k domain
    if x != x:
        return 0  # this type has no NaN: NaN becomes 0
    k = round(15.0 * (min(abs(x), 4.0) / 4.0) ** (1 / 3))
    return int(k) | (16 if x < 0 and k > 0 else 0)


@njit
def cube5_from_code(c):
    v = 4.0 * ((c & 15) / 15.0) ** 3
    return -v if c & 16 else v


def test_the_documented_example_type_has_its_stated_values_and_trains_with_patch():
    cube5 = CustomFormat(cube5_to_code, cube5_from_code, 5, name="cube5")
    v = cube5.values()  # 31 values (codes 0 and 16 are both zero), symmetric, from 0.0012 (4/15**3) to 4
    assert v.size == 31 and np.array_equal(v, -v[::-1]) and v[-1] == 4.0 and v[16] == cube5_from_code(1)
    assert np.array_equal(v, np.unique([cube5_from_code(c) for c in range(32)]))
    torch.manual_seed(0)
    model = emunum.patch(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)),
                         fmt=cube5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(256, 8)
    y = x[:, :1] - 0.5 * x[:, 1:2]
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.5 * losses[0]
