"""Posit kernels (kernels/posit_cpu.py, kernels/posit_cuda.py) through ``emunum.quantize`` and directly: round
to nearest against SoftPosit (every code, midpoints, +-1 ulp of float64 and float32, extremes, random, a dense
float32 sweep for posit16), the directed modes against brute force over ``values()``, stochastic rounding
(unbiased; the bits ``PositFormat.encode`` gives), NaN/NaR bits, 16-bit dtypes, CPU == CUDA (simulator), and
posits in patched models and torch.compile."""
from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

import emunum
from emunum import PositFormat
from emunum.rng import seed_key
from emunum.kernels import posit_cpu
import tiers
from posit_oracle import (SOFTPOSIT_CASES, around, brute_round, midpoints, needs_softposit, positive_codes,
                          sp_codes, sp_values)

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
SIM = False
if HAVE_NUMBA_CUDA:
    from numba import cuda

    SIM = cuda.to_device.__module__.startswith("numba.cuda.simulator")
needs_cuda_kernels = pytest.mark.skipif(
    not HAVE_NUMBA_CUDA or not (SIM or torch.cuda.is_available()),
    reason="needs numba-cuda and either a GPU or NUMBA_ENABLE_CUDASIM=1 set before numba.cuda is imported")

MODES = [m.name.lower() for m in emunum.RoundMode]
DIRECTED = ["toward_zero", "up", "down", "odd"]
ids = [f"posit{n}_{es}" for n, es in SOFTPOSIT_CASES]
BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
        torch.bfloat16: torch.int16}


def q(x, fmt, mode="nearest", dtype=torch.float64, **kw) -> torch.Tensor:
    return emunum.quantize(torch.as_tensor(np.asarray(x), dtype=dtype), fmt, mode, **kw)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]), rtol=0, atol=0)


def oracle(x: np.ndarray, n: int, es: int, dtype) -> torch.Tensor:
    """SoftPosit's posit value of each float64 x, stored in dtype (to nearest even: quantize's contract)."""
    return torch.from_numpy(sp_values(sp_codes(x, n, es), n, es)).to(dtype)


def special_inputs(fmt: PositFormat) -> np.ndarray:
    mx, mn = fmt.max, fmt.min_positive
    xs = np.array([0.0, mx, mx * 1.5, mx * 2**40, 1e308, mn, mn / 2, mn * 0.75, mn / 2**30, 5e-324,
                   np.nextafter(mx, 0), np.nextafter(mn, 0), np.nextafter(mn, 1)])
    return np.concatenate([xs, -xs])


# ---- round to nearest against SoftPosit -------------------------------------------------------------------
@needs_softposit
@pytest.mark.parametrize("n,es", SOFTPOSIT_CASES, ids=ids)
def test_float64_nearest_matches_softposit_at_codes_midpoints_ulps_extremes_and_random(n, es):
    fmt = PositFormat(n, es)
    pts = np.concatenate([sp_values(positive_codes(n), n, es), midpoints(n, es)])
    rng = np.random.default_rng(n + 100 * es)
    rand = rng.standard_normal(3000) * np.exp2(rng.uniform(-1.2, 1.2, 3000) * fmt.max_exp)
    x = np.concatenate([around(np.concatenate([pts, -pts])), special_inputs(fmt), rand])
    same_bits(q(x, fmt), oracle(x, n, es, torch.float64))


@needs_softposit
@pytest.mark.parametrize("n,es", SOFTPOSIT_CASES, ids=ids)
def test_float32_nearest_matches_softposit_at_codes_midpoints_ulps_extremes_and_random(n, es):
    fmt = PositFormat(n, es)
    pts = np.concatenate([sp_values(positive_codes(n), n, es), midpoints(n, es)])
    pts = pts[pts < 3e38]
    rng = np.random.default_rng(n + 100 * es + 1)
    rand = (rng.standard_normal(3000) * np.exp2(rng.uniform(-1, 1, 3000) * min(fmt.max_exp, 126)))
    sp32 = special_inputs(fmt)
    sp32 = sp32[np.abs(sp32) < 3e38]
    x = np.concatenate([around(np.concatenate([pts, -pts]).astype(np.float32), np.float32),
                        sp32.astype(np.float32), rand.astype(np.float32)]).astype(np.float64)
    same_bits(q(x, fmt, dtype=torch.float32), oracle(x, n, es, torch.float32))


@needs_softposit
@pytest.mark.slow
def test_posit16_of_float32_matches_softposit_over_a_dense_sweep_of_float32_bit_patterns():
    """Every 1031st positive finite float32 (2.1M values, every binade, all low-bit patterns), and negated."""
    bits = np.arange(1, 0x7F800000, 1031, dtype=np.uint32)
    x = bits.view(np.float32)
    got = emunum.quantize(torch.from_numpy(x), "posit16")
    same_bits(got, oracle(x.astype(np.float64), 16, 2, torch.float32))
    same_bits(emunum.quantize(torch.from_numpy(-x), "posit16"), -got)


@needs_softposit
@pytest.mark.parametrize("n,es", [(16, 2), (16, 1), (8, 0), (32, 2)], ids=["posit16_2", "posit16_1", "posit8_0",
                                                                          "posit32_2"])
@pytest.mark.parametrize("grid", [torch.bfloat16, torch.float16])
def test_float32_nearest_matches_softposit_on_every_16_bit_float_value(grid, n, es):
    """Every finite bfloat16 / float16 value (65536 bit patterns each), as a float32 input."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(grid)
    x = x[torch.isfinite(x)].float()
    same_bits(emunum.quantize(x, PositFormat(n, es)), oracle(x.double().numpy(), n, es, torch.float32))


@needs_softposit
@pytest.mark.parametrize("dtype,n,es", [(torch.bfloat16, 8, 2), (torch.float16, 8, 0), (torch.bfloat16, 8, 0)])
def test_16_bit_dtypes_match_softposit_on_every_finite_value(dtype, n, es):
    """posit8 values fit these dtypes exactly: the result is SoftPosit's value."""
    h = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    h = h[torch.isfinite(h)]
    same_bits(emunum.quantize(h, PositFormat(n, es)), oracle(h.double().numpy(), n, es, dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_16_bit_dtypes_round_their_value_then_narrow_to_nearest_even(dtype, mode):
    """posit16 values can be wider than the dtype: the result is the float32 result cast (RNE), as documented."""
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(5000, generator=g) * 2.0 ** torch.randint(-20, 20, (5000,), generator=g)).to(dtype)
    for fmt in (PositFormat(16, 2), PositFormat(12, 5)):
        want = emunum.quantize(h.float(), fmt, mode, seed=5).to(dtype)
        same_bits(emunum.quantize(h, fmt, mode, seed=5), want)


# ---- NaR and special values -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(BITS))
@pytest.mark.parametrize("mode", MODES)
def test_inf_gives_the_positive_quiet_nan_and_a_nan_keeps_its_payload_quietened(dtype, mode):
    x = torch.tensor([math.inf, -math.inf, 0.0, -0.0, 1.0], dtype=dtype)
    nan_payload = {torch.float64: 0x7FF0000000000001 | (1 << 63), torch.float32: 0x7F800001,
                   torch.float16: 0x7C01, torch.bfloat16: 0x7F81}[dtype]
    quiet = {torch.float64: 1 << 51, torch.float32: 1 << 22, torch.float16: 1 << 9, torch.bfloat16: 1 << 6}[dtype]
    pos_nan = {torch.float64: 0x7FF8000000000000, torch.float32: 0x7FC00000, torch.float16: 0x7E00,
               torch.bfloat16: 0x7FC0}[dtype]
    ity = BITS[dtype]
    snan = torch.tensor([nan_payload - (1 << 64) if nan_payload >= 1 << 63 else nan_payload], dtype=torch.int64)
    x = torch.cat([x, snan.to(ity).view(dtype)])
    r = emunum.quantize(x, "posit16", mode, seed=1).view(ity).tolist()
    mask = (1 << (8 * x.element_size())) - 1
    assert [v & mask for v in r[:2]] == [pos_nan, pos_nan]
    assert r[2:4] == [0, 0] and r[4] == torch.tensor([1.0], dtype=dtype).view(ity).item()
    assert r[5] & mask == (nan_payload | quiet) & mask


# ---- directed modes against brute force -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", DIRECTED)
@pytest.mark.parametrize("n,es", [(8, 2), (16, 2), (8, 0), (16, 1), (5, 0), (10, 5)])
def test_directed_modes_give_the_brute_force_neighbour(n, es, mode, dtype):
    fmt = PositFormat(n, es)
    v = fmt.values()
    mids = (v[1:] + v[:-1]) / 2
    rng = np.random.default_rng(n * es + 3)
    rand = rng.uniform(-1, 1, 3000) * np.exp2(rng.uniform(-1.1, 1.1, 3000) * fmt.max_exp)
    x = np.concatenate([around(v), around(mids), special_inputs(fmt), rand])
    if dtype == torch.float32:
        x = x[np.abs(x) < 3e38].astype(np.float32).astype(np.float64)
    want = torch.from_numpy(brute_round(x, v, fmt.encode(v), mode)).to(dtype)
    same_bits(q(x, fmt, mode, dtype=dtype), want)


@pytest.mark.parametrize("n,es", [(16, 2), (8, 0), (32, 2), (32, 5), (3, 1)])
@pytest.mark.parametrize("mode", MODES)
def test_kernel_gives_the_codes_of_the_python_encoder_in_every_mode(n, es, mode):
    """The kernel and PositFormat.encode (Python ints) are separate implementations of one definition;
    stochastic bits come from the same generator (seed, flat index)."""
    fmt = PositFormat(n, es)
    rng = np.random.default_rng(9)
    scale = np.exp2(np.clip(rng.uniform(-1.1, 1.1, 4000) * fmt.max_exp, -1070, 1020))
    x = np.concatenate([rng.standard_normal(4000) * scale, special_inputs(fmt)])
    got = q(x, fmt, mode, seed=11).numpy()
    want = fmt.decode(fmt.encode(x, mode, seed=11))
    np.testing.assert_array_equal(got.view(np.int64), (want + 0.0).view(np.int64))


@pytest.mark.parametrize("n,es", [(8, 2), (16, 1), (32, 2), (12, 5)])
@pytest.mark.parametrize("mode", [m for m in MODES if m != "stochastic"])
def test_rounding_is_monotone_idempotent_and_sign_symmetric(n, es, mode):
    fmt = PositFormat(n, es)
    rng = np.random.default_rng(n + es)
    x = np.sort(np.concatenate([rng.standard_normal(20000) * np.exp2(rng.uniform(-1.2, 1.2, 20000) * fmt.max_exp),
                                special_inputs(fmt)]))
    r = q(x, fmt, mode)
    assert torch.all(r[1:] >= r[:-1])
    same_bits(q(r.numpy(), fmt, mode), r)
    mirror = {"up": "down", "down": "up"}.get(mode, mode)
    same_bits(q(-x, fmt, mirror), -r + 0.0)


# ---- stochastic -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sr_bits", [1, 3, 8, 32])
def test_stochastic_bits_are_the_python_encoders_for_every_sr_bits(sr_bits):
    fmt = PositFormat(8, 1)
    v = fmt.values()
    x = np.repeat((v[1:] + 3 * v[:-1]) / 4, 8)  # a quarter of the way up from each value (exact), 8 draws each
    got = q(x, fmt, "stochastic", seed=99, sr_bits=sr_bits).numpy()
    np.testing.assert_array_equal(got, fmt.decode(fmt.encode(x, "stochastic", seed=99, sr_bits=sr_bits)))
    if sr_bits == 1:  # one bit: a fraction 1/4 rounds to 0 (never away), 3/4 to 1 (always away)
        np.testing.assert_array_equal(got, q(x, fmt, "down").numpy())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,es", [(8, 2), (16, 2), (6, 3)])
def test_stochastic_picks_a_neighbour_and_is_unbiased_within_5_sigma(n, es, dtype):
    fmt = PositFormat(n, es)
    v = fmt.values()
    codes = fmt.encode(v)
    pos = v[v > 0]
    N = 100000
    for x in [pos[len(pos) // 2] * 1.3, pos[-1] * 0.6, pos[-2] * 1.1, pos[0] * 0.37, -pos[len(pos) // 3] * 1.01]:
        x = float(np.float32(x)) if dtype == torch.float32 else x
        lo = brute_round(np.array([x]), v, codes, "down")[0]
        hi = brute_round(np.array([x]), v, codes, "up")[0]
        r = emunum.quantize(torch.full((N,), x, dtype=dtype), fmt, "stochastic", seed=21).double().numpy()
        assert set(np.unique(r)) <= {lo, hi}, (x, lo, hi)
        p = (x - lo) / (hi - lo)
        sigma = (hi - lo) * math.sqrt(p * (1 - p) / N)
        assert abs(r.mean() - x) <= 5 * sigma, (x, r.mean(), sigma)


def test_serial_and_parallel_loops_give_the_same_bits(launch_shares):
    x = np.random.default_rng(0).standard_normal(5000) * 100
    for mode in range(7):
        a, b = np.empty_like(x), np.empty_like(x)
        posit_cpu.quantize_posit(x, a, 16, 2, mode, seed_key(4), 32, parallel=False)
        posit_cpu.quantize_posit(x, b, 16, 2, mode, seed_key(4), 32, parallel=True)
        np.testing.assert_array_equal(a.view(np.int64), b.view(np.int64))
        c = x.copy()  # the address runner, in place
        posit_cpu.posit_runner(x.dtype, 16, 2)(c.ctypes.data, c.ctypes.data, c.size, mode, seed_key(4), 32,
                                                parallel=True)
        np.testing.assert_array_equal(a.view(np.int64), c.view(np.int64))


# ---- CPU == CUDA ------------------------------------------------------------------------------------------
def _cuda_inputs(fmt: PositFormat, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(48, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-30, 30, (48,), generator=g)
    x = torch.cat([x, torch.tensor(special_inputs(fmt)[:8]), torch.tensor([math.inf, -math.inf, math.nan])])
    return x.to(dtype)


@needs_cuda_kernels  # each dtype by default, the posit sizes in turn; the rest: the exhaustive tier
@pytest.mark.parametrize("dtype,n_es", tiers.grid([list(BITS), [(16, 2), (8, 0), (32, 5)]], ids=[str, None]))
def test_cuda_kernel_gives_the_cpu_bits_in_every_mode(dtype, n_es):
    n, es = n_es
    from emunum.kernels import posit_cuda

    fmt = PositFormat(n, es)
    x = _cuda_inputs(fmt, dtype)
    layout = {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(dtype)
    for mode in emunum.RoundMode:
        cpu = emunum.quantize(x, fmt, mode, seed=17)
        src = x.view(torch.int16).numpy().view(np.uint16) if layout else x.numpy()
        dst = np.empty_like(src)
        posit_cuda.quantize_posit(src, dst, n, es, int(mode), seed_key(17), 32, layout=layout)
        got = torch.from_numpy(dst.view(np.int16)).view(dtype) if layout else torch.from_numpy(dst)
        same_bits(got, cpu)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or SIM, reason="needs a CUDA GPU (and no CUDA simulator)")
@pytest.mark.parametrize("dtype", list(BITS))
def test_cuda_tensors_give_the_cpu_bits(dtype):
    fmt = PositFormat(16, 2)
    for numel in (7, 5000):  # posits never take the small-tensor torch path
        x = _cuda_inputs(fmt, dtype).repeat(numel // 59 + 1)[:numel]
        for mode in emunum.RoundMode:
            same_bits(emunum.quantize(x.cuda(), fmt, mode, seed=17).cpu(), emunum.quantize(x, fmt, mode, seed=17))


# ---- through the API --------------------------------------------------------------------------------------
def test_quantize_keeps_shape_dtype_and_input_and_writes_out_and_strided_views():
    x = torch.randn(6, 8, dtype=torch.float64) * 1000
    x0 = x.clone()
    r = emunum.quantize(x.t(), "posit8")
    assert r.shape == (8, 6) and r.dtype == torch.float64
    same_bits(x, x0)
    same_bits(r, emunum.quantize(x.t().contiguous(), "posit8"))
    out = torch.empty(6, 8, dtype=torch.float64)
    assert emunum.quantize(x, "posit8", out=out) is out
    same_bits(out, emunum.quantize(x, PositFormat(8, 2)))


def test_a_patched_linear_trains_one_step_with_posits():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    emunum.patch(model, fmt=PositFormat(16, 2))
    w0 = model[0].weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    out = model(x)
    # the forward's output is a posit16 tensor
    same_bits(out.detach(), emunum.quantize(out.detach(), "posit16"))
    loss = ((out - y) ** 2).mean()
    loss.backward()
    assert torch.isfinite(model[0].weight.grad).all() and model[0].weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(model[0].weight.detach(), w0)


def test_posits_trace_through_torch_compile_as_the_custom_op():
    x = torch.randn(64) * 100
    f = torch.compile(lambda t: emunum.quantize(t, "posit16_1", "toward_zero") * 1.0, fullgraph=True,
                      backend="eager")
    same_bits(f(x), emunum.quantize(x, PositFormat(16, 1), "toward_zero"))


@pytest.mark.parametrize("function", ["tanh", "sigmoid"])
def test_approximate_operators_computed_in_posits_give_posit_values(function):
    x = torch.linspace(-6, 6, 301)
    y = getattr(emunum.approx, function)(x, fmt="posit16", rounding="toward_zero")
    same_bits(y, emunum.quantize(y, "posit16"))
    assert (y - getattr(torch, function)(x)).abs().max() < 0.05
