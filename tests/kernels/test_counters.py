"""kernels/counters.py: the fused round-and-count kernels against the rounding kernels and the separate counters.

Zero tolerance: the fused kernels must give the bits of ``emunum.quantize`` (stochastic bits included) and the
counts and sums of the standalone counters, serial or parallel, bit for bit. The sums themselves are checked
against ``math.fsum`` (exact) within the bound the module documents for nonnegative terms in any order.
"""
import math
import warnings

import numpy as np
import pytest
import torch

import emunum
from emunum.formats import FixedFormat, FloatFormat, RoundMode
from emunum.kernels import counters as C
from emunum.rng import seed_key
from emunum.trace import _range, accumulate, round_observed

FORMATS = {
    "e5m2": emunum.get_format("e5m2"),
    "e4m3fn": emunum.get_format("e4m3fn"),
    "e5m2_sat": FloatFormat(5, 2, saturate=True),
    "e3m0": FloatFormat(3, 0),  # no mantissa bit: the bit-level core for nearest too
    "bf16": emunum.get_format("bf16"),
    "e8m5_b140": FloatFormat(8, 5, bias=140),  # emin < -126: the general float loop (float_counted_at)
    "fixed8_3": FixedFormat(8, 3),
    "fixed8_3_wrap": FixedFormat(8, 3, saturate=False),
}
MODES = [RoundMode.NEAREST, RoundMode.STOCHASTIC, RoundMode.TOWARD_ZERO, RoundMode.UP, RoundMode.NEAREST_AWAY]
SIZES = [1, C.CHUNK - 1, C.CHUNK + 1, 3 * C.CHUNK + 5]


def values(n, dtype, fmt, seed):
    """Wide-ranging values with NaN, +-inf, +-0, values beyond the range and values that flush to zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-30, 30, (n,), generator=g)
    specials = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, fmt.max * 3, -fmt.max * 5, fmt.max,
                float(getattr(fmt, "min_subnormal", 2.0**-3)) / 3]
    k = min(n, len(specials))
    x[:k] = torch.tensor(specials[:k], dtype=torch.float64)
    return x.to(dtype)


def fused(x, fmt, mode, seed, sqnr=True, parallel=None):
    lo, hi = _range(fmt)
    q, acc = torch.empty_like(x), torch.zeros(6, dtype=torch.float64)
    dt = np.dtype(np.float32 if x.dtype == torch.float32 else np.float64)
    make = C.float_counted_runner if isinstance(fmt, FloatFormat) else C.fixed_counted_runner
    run = make(dt, *fmt.to_kernel_args())
    run(x.data_ptr(), q.data_ptr(), x.numel(), int(mode), seed_key(seed), 32, lo, hi, sqnr, acc.data_ptr(), parallel)
    return q, acc


def separate(x, q, fmt, sqnr=True):
    lo, hi = C.thresholds(*_range(fmt), x.numpy().dtype)
    a, b = np.zeros(6), np.zeros(6)
    C.counters_serial(x.numpy(), q.numpy(), lo, hi, sqnr, a)
    C.counters_parallel(x.numpy(), q.numpy(), lo, hi, sqnr, b)
    assert a.tolist() == b.tolist()
    return a.tolist()


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("mode", MODES, ids=[m.name.lower() for m in MODES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_kernel_rounds_and_counts_as_the_separate_kernels(fmt, mode, dtype):
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for i, n in enumerate(SIZES):
        x = values(n, dtype, fmt, seed=i)
        want_q = emunum.quantize(x, fmt, mode, seed=1234)
        want = separate(x, want_q, fmt)
        for par in (False, True):
            q, acc = fused(x, fmt, mode, 1234, parallel=par)
            assert torch.equal(q.view(bits), want_q.view(bits)), (n, par)
            assert acc.tolist() == want, (n, par)
        q, acc = fused(x, fmt, mode, 1234, sqnr=False)
        assert acc.tolist() == want[:4] + [0.0, 0.0]


@pytest.mark.parametrize("limit", [57344.0, 1.0 + 2.0**-30, 2.0**200, 3.0e-42, 0.0])
def test_float32_thresholds_compare_as_the_exact_limits_without_a_warning(limit):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(1000, generator=g) * limit, torch.tensor([limit, -limit]).float(),
                   torch.tensor([limit, -limit]).float().nextafter(torch.tensor(float("inf"))),
                   torch.tensor([limit, -limit]).float().nextafter(torch.tensor(float("-inf")))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a limit beyond float32's range is no overflow for the caller to see
        lo32, hi32 = C.thresholds(-limit, limit, np.float32)
    xd = x.double()
    assert torch.equal((x > float(hi32)) | (x < float(lo32)), (xd > limit) | (xd < -limit))


def gamma(m, u):
    return m * u / (1 - m * u)


def sum_bound(dtype, chunks):
    """The module's relative bound on a sum: the chunk loop (float32 lanes or float64), then the float64 total."""
    k = C.CHUNK
    chunk = gamma(k + 2, 2.0**-24) + 2.0**-37 if dtype == torch.float32 else gamma(k + 2, 2.0**-53)
    return (1 + chunk) * (1 + gamma(chunks, 2.0**-53)) - 1


def finite_values(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-30, 30, (n,), generator=g)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("finite", [True, False], ids=["finite", "specials"])
def test_counts_are_exact_and_sums_within_the_documented_bound(dtype, finite):
    """Finite chunks take the lane sums of ``_count_finite`` (float32 for float32), the chunks with NaN and inf
    ``_count_masked``'s float64 sums; both within the module's bound of the exact sums (``math.fsum``)."""
    fmt = FORMATS["e5m2_sat" if finite else "e5m2"]
    lo, hi = _range(fmt)
    n = 5 * C.CHUNK + 17
    x = finite_values(n, dtype, seed=9) if finite else values(n, dtype, fmt, seed=9)
    q, acc = fused(x, fmt, RoundMode.STOCHASTIC, 5)
    xd, qd = x.double().numpy(), q.double().numpy()
    fin = np.isfinite(xd) & np.isfinite(qd)
    counts = [xd.size, int(np.sum(np.isfinite(xd) & ((xd > hi) | (xd < lo)))), int(np.sum((qd == 0) & (xd != 0))),
              int(np.sum(np.isnan(qd)))]
    assert acc[:4].tolist() == counts and counts[1] > 0 and counts[2] > 0 and (counts[3] > 0) != finite
    bound = sum_bound(dtype if finite else torch.float64, 6)
    for got, terms in ((acc[4].item(), xd[fin] ** 2), (acc[5].item(), (qd[fin] - xd[fin]) ** 2)):
        exact = math.fsum(terms.tolist())  # float32 inputs: every term is exact in float64
        assert exact > 0 and abs(got - exact) <= bound * exact


def chunk(fn, x, q, fmt, *args):
    lo, hi = C.thresholds(*_range(fmt), x.dtype)
    parts = np.zeros((1, 5))
    if fn is C._count_finite:
        over, under, sig, noise, _, _ = fn(x, q, lo, hi)
        return [over, under, 0.0, float(sig), float(noise)]
    fn(x, q, lo, hi, *args, parts, 0)
    return parts[0].tolist()


def chunk_cases():
    """(name, x, fmt, which loop's result count_chunk must return) for float32 chunks of CHUNK elements."""
    g = np.random.default_rng(4)
    x = (g.standard_normal(C.CHUNK) * 100).astype(np.float32)
    fixed = FORMATS["fixed8_3"]
    on_grid = emunum.quantize(torch.from_numpy(x), fixed).numpy()
    cases = [("finite", x, FORMATS["e5m2"], "finite"),
             ("overflow_saturated", x * np.float32(1e3), FORMATS["e5m2_sat"], "finite"),
             ("zero_noise", on_grid, fixed, "finite"),  # q == x: noise exactly 0, every term zero
             ("zeros", np.zeros_like(x), fixed, "finite"),
             ("tiny_terms_among_large", np.where(np.arange(x.size) % 2 == 0, x, x * np.float32(1e-30)), fixed,
              "finite")]
    for name, v in (("nan", np.float32(np.nan)), ("inf", np.float32(np.inf))):
        y = x.copy()
        y[77] = v
        cases.append((name, y, FORMATS["e5m2"], "masked"))
    cases.append(("q_inf", x * np.float32(1e3), FORMATS["e5m2"], "masked"))  # x finite, q = inf
    cases.append(("square_overflows_float32", x * np.float32(2.0**62), FORMATS["e5m2_sat"], "masked"))
    cases.append(("squares_underflow", x * np.float32(2.0**-80), FORMATS["e5m2"], "masked"))  # sums ~2**-140
    cases.append(("noise_underflows", x * np.float32(2.0**-59), FloatFormat(8, 22), "masked"))  # sig ~2**-92
    return cases


@pytest.mark.parametrize("case", chunk_cases(), ids=[c[0] for c in chunk_cases()])
def test_count_chunk_takes_the_float32_lanes_only_where_they_are_within_the_bound(case):
    _, x, fmt, which = case
    q = emunum.quantize(torch.from_numpy(x), fmt).numpy()
    got = chunk(C.count_chunk, x, q, fmt, True)
    fast, masked = chunk(C._count_finite, x, q, fmt), chunk(C._count_masked, x, q, fmt, True)
    assert got == (fast if which == "finite" else masked)
    assert got[:3] == masked[:3]  # the counts are exact either way
    xd, qd = x.astype(np.float64), q.astype(np.float64)
    fin = np.isfinite(xd) & np.isfinite(qd)
    exact = [math.fsum((xd[fin] ** 2).tolist()), math.fsum(((qd[fin] - xd[fin]) ** 2).tolist())]

    def within(sums, dtype):
        return all(abs(s - e) <= sum_bound(dtype, 1) * e for s, e in zip(sums, exact))

    assert within(got[3:], torch.float32 if which == "finite" else torch.float64)
    if which == "masked" and np.isfinite(x).all() and np.isfinite(q).all():
        assert not within(fast[3:], torch.float32)  # the float32 lanes overflowed or lost underflowed terms


@pytest.mark.parametrize("fmt", ["e5m2", "fixed8_3", "posit8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_round_observed_is_quantize_then_accumulate(fmt, dtype):
    fmt = emunum.get_format(fmt) if fmt != "fixed8_3" else FORMATS[fmt]
    lo, hi = _range(fmt)
    x = values(3 * C.CHUNK + 3, torch.float64, FORMATS["e5m2"], seed=3).to(dtype).view(-1, 3)[:, :2]  # strided
    for mode in (RoundMode.NEAREST, RoundMode.STOCHASTIC):
        torch.manual_seed(7)
        want_q = emunum.quantize(x, fmt, mode)  # seed None: one draw from torch's generator
        want = torch.zeros(6, dtype=torch.float64)
        accumulate(want, x, want_q, lo, hi)
        torch.manual_seed(7)
        acc = torch.zeros(6, dtype=torch.float64)
        q = round_observed(x, fmt, mode, None, 32, acc, lo, hi, True)
        assert q.shape == x.shape and q.is_contiguous()
        bits = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16}[dtype]
        assert torch.equal(q.view(-1).view(bits), want_q.reshape(-1).view(bits))
        assert acc.tolist() == want.tolist()


@pytest.mark.parametrize("fmt", ["e5m2", "fixed8_3"])
def test_fused_kernels_compile_the_rounding_loops_once_for_the_serial_parallel_and_plain_calls(fmt):
    """The chunk kernels and rounding loops that the serial and parallel fused kernels and the plain rounding call
    share are compiled for one signature (prange's index and ``.ctypes.data`` are uint64, a 0 a literal). The
    chunk kernels' callers are in their module, so its disk index counts too; the rounding loops' types from a
    compiled caller are seen where this process compiled it (an empty cache, as in CI)."""
    from kernel_signatures import needless_variants

    from emunum.kernels import cpu

    f = FORMATS[fmt]
    x = values(C.CHUNK + 3, torch.float32, f, 1)
    for mode in (RoundMode.NEAREST, RoundMode.STOCHASTIC):
        for parallel in (False, True):
            fused(x, f, mode, 5, parallel=parallel)
        emunum.quantize(x, f, mode.name.lower(), seed=5)
    loops = cpu.f32_range if isinstance(f, FloatFormat) else cpu.fixed_range
    chunks = [C.count_chunk, C._count_masked, C._f32_chunk, C._fixed_chunk]
    assert [needless_variants(k, disk=True) for k in chunks] == [[]] * len(chunks)
    assert [needless_variants(loops(m)) for m in (RoundMode.NEAREST, RoundMode.STOCHASTIC)] == [[], []]
