"""emunum.reference: the numpy reference and its torch twin (the fallback for devices without a kernel and
the path of tiny CUDA tensors) against the same independent oracles as the kernels, and the counter-based
random bits against the splitmix64 definition and the kernels' scalar core."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum import FixedFormat, FloatFormat, RoundMode
from emunum.rng import mix64_int, random_bits_reference, random_bits_torch, seed_key
from emunum.reference import quantize_reference, quantize_torch

IMPLS = {
    "numpy": lambda x, fmt, rnd, seed: quantize_reference(x, fmt, rnd.mode, seed, rnd.sr_bits),
    "torch": lambda x, fmt, rnd, seed: quantize_torch(x, fmt, rnd.mode, seed, rnd.sr_bits),
}

def _subsample(v: np.ndarray, n: int = 16000) -> np.ndarray:
    """A fixed random subset of the wide formats' probes (their codes are random samples already)."""
    return v if v.size <= n else v[np.random.default_rng(0).choice(v.size, n, replace=False)]


@pytest.mark.parametrize("impl", list(IMPLS))
def test_float_reference_matches_oracle(value_set_float_case, rounding, impl, oracles):
    """float64 inputs (the reference computes in float64; float32 inputs are a subset)."""
    fmt = value_set_float_case
    v = _subsample(oracles.float_probes(fmt, np.float64))
    got = IMPLS[impl](torch.from_numpy(v.copy()), fmt, rounding, oracles.SEED).numpy()
    oracles.assert_same_values(got, oracles.value_set_round(fmt, v, rounding), v, f"{impl} {fmt.name}")


@pytest.mark.parametrize("impl", list(IMPLS))
def test_float_reference_tiny_inputs_with_huge_quantum(impl, oracles):
    """|x| / quantum underflows float64 for tiny x when min_subnormal > 1; the remainder is still nonzero."""
    x = torch.tensor([5e-324, -5e-324], dtype=torch.float64)
    fmt = FloatFormat(6, 2, bias=-40)
    assert torch.equal(IMPLS[impl](x, fmt, oracles.Rounding(RoundMode.UP), 0),
                       torch.tensor([2.0**39, -0.0], dtype=torch.float64))
    assert torch.equal(IMPLS[impl](x, fmt, oracles.Rounding(RoundMode.ODD), 0),
                       torch.tensor([2.0**39, -(2.0**39)], dtype=torch.float64))


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("name", ["tf32", "fp32"])
def test_wide_float_reference_matches_gfloat(name, rounding, impl, oracles):
    fmt = emunum.get_format(name)
    v = _subsample(oracles.float_probes(fmt, np.float64))
    got = IMPLS[impl](torch.from_numpy(v.copy()), fmt, rounding, oracles.SEED).numpy()
    oracles.assert_same_values(got, oracles.gfloat_round(fmt, v, rounding), v, f"{impl} {name}")


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_fixed_reference_matches_integer_arithmetic(fixed_case, rounding, dtype, impl, oracles):
    fmt = fixed_case
    v = oracles.fixed_probes(fmt, dtype)
    got = IMPLS[impl](torch.from_numpy(v.copy()), fmt, rounding, oracles.SEED).numpy()
    oracles.assert_same_values(got, oracles.fixed_expected(fmt, dtype, rounding), v, f"{impl} {fmt.name}")


@pytest.mark.parametrize("impl", list(IMPLS))
def test_fixed_reference_wraps_huge_values(impl, oracles):
    """Codes wrap modulo 2**bits however large, also where x * 2**frac_bits would overflow float64."""
    fmt, rnd = FixedFormat(8, 3, saturate=False), oracles.Rounding(RoundMode.NEAREST)
    x32 = torch.tensor([3.4028234663852886e38, -3.4028234663852886e38])
    assert torch.equal(IMPLS[impl](x32, fmt, rnd, 0), torch.zeros(2))
    x64 = torch.tensor([1.7976931348623157e308, 2.0**50 + 768 + 1.5], dtype=torch.float64)
    assert torch.equal(IMPLS[impl](x64, fmt, rnd, 0), torch.tensor([0.0, 1.5], dtype=torch.float64))


@pytest.mark.parametrize("impl", list(IMPLS))
def test_fixed_reference_negative_frac_bits_tiny_inputs(impl, oracles):
    """x * 2**frac_bits underflows for tiny x when frac_bits < 0; the remainder is still nonzero."""
    x = torch.tensor([5e-324, -5e-324], dtype=torch.float64)
    assert torch.equal(IMPLS[impl](x, FixedFormat(5, -2), oracles.Rounding(RoundMode.UP), 0),
                       torch.tensor([4.0, 0.0], dtype=torch.float64))
    assert torch.equal(IMPLS[impl](x, FixedFormat(5, -2), oracles.Rounding(RoundMode.ODD), 0),
                       torch.tensor([4.0, -4.0], dtype=torch.float64))


# ---------------------------------------------------------------------------------------------------------
# agreement with the kernels, bit for bit (NaN payloads included), and the wrapper's contract
# ---------------------------------------------------------------------------------------------------------
def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", ["fp8_152", "e4m3fn", "e4m3fnuz", "fp4_e2m1", "int8"])
@pytest.mark.parametrize("mode", ["nearest", "odd", "stochastic"])
def test_torch_twin_gives_the_kernels_bits(dtype, fmt, mode):
    """quantize_torch promises the kernels' bits, NaN included: input NaNs keep their payload (16-bit:
    quietened), overflow NaNs are the positive quiet NaN."""
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(4000, generator=g) * 300).to(dtype)
    nan_bits = {torch.float32: [0x7FC00001, -0x00000001, 0x7F800001],
                torch.float64: [0x7FF8000000000001, -1, 0x7FF0000000000001],
                torch.float16: [0x7E01, -1, 0x7C01], torch.bfloat16: [0x7FC1, -1, 0x7F81]}[dtype]
    ity = _bits(x).dtype
    x[:3] = torch.tensor(nan_bits, dtype=ity).view(dtype)
    x[3:7] = torch.tensor([float("inf"), float("-inf"), 0.0, -0.0], dtype=dtype)
    a = emunum.quantize(x, fmt, mode, seed=5)
    b = quantize_torch(x, emunum.get_format(fmt), RoundMode.parse(mode), seed=5)
    assert b.dtype == dtype
    if dtype == torch.bfloat16:  # torch's CPU float32 -> bfloat16 cast makes every NaN 0xFFFF: see below
        assert torch.equal(a.isnan(), b.isnan())
        a, b = a[~a.isnan()], b[~b.isnan()]
    assert torch.equal(_bits(a), _bits(b))


def test_bfloat16_nan_payload_is_the_same_on_both_paths():
    """CPU bf16/fp16 results go through torch's float32 cast, which loses NaN payloads: quantize restores them."""
    x = torch.tensor([0x7FC1, 0x7F81], dtype=torch.int16).view(torch.bfloat16)
    a = emunum.quantize(x, "fp8_152")
    b = quantize_torch(x, emunum.get_format("fp8_152"), RoundMode.NEAREST)
    assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_quantize_reference_keeps_dtype_shape_and_matches_kernel_values(dtype):
    x = (torch.randn(6, 7, generator=torch.Generator().manual_seed(3)) * 10).to(dtype)
    for fmt in ("fp8_152", "int8"):
        r = quantize_reference(x, emunum.get_format(fmt), "nearest")
        assert r.dtype == dtype and r.shape == x.shape and r.device == x.device
        assert torch.equal(r, emunum.quantize(x, fmt))


def test_reference_does_not_modify_input():
    x = torch.randn(100)
    before = x.clone()
    quantize_reference(x, emunum.get_format("fp8_152"), "stochastic", seed=1)
    quantize_torch(x, emunum.get_format("fp8_152"), "stochastic", seed=1)
    assert torch.equal(x, before)


# ---------------------------------------------------------------------------------------------------------
# random bits
# ---------------------------------------------------------------------------------------------------------
def test_random_bits_are_splitmix64():
    """key 0, counters 1, 2, 3: the first outputs of Vigna's splitmix64 seeded with 0."""
    assert [int(z) for z in random_bits_reference(0, 3, 64)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [int(z) for z in random_bits_reference(0, 3, 32)] == [0xE220A839, 0x6E789E6A, 0x06C45D18]


def test_seed_key_is_mix64_modulo_2_64():
    assert seed_key(0) == 0  # splitmix64's finaliser fixes 0
    assert seed_key(-1) == seed_key(2**64 - 1) == mix64_int(2**64 - 1)
    assert seed_key(2**64 + 5) == seed_key(5)
    assert len({seed_key(s) for s in range(1000)}) == 1000  # a bijection: no collisions
    # the public API takes int64 seeds only (tests/test_quantize_out.py); within that range -1 keys like 2**64-1
    x = torch.linspace(-2, 2, 999)
    assert torch.equal(emunum.quantize(x, "fp8_152", "stochastic", seed=-1),
                       quantize_reference(x, emunum.get_format("fp8_152"), "stochastic", seed=2**64 - 1))


@pytest.mark.parametrize("nbits", [1, 3, 8, 32])
def test_random_bits_match_the_kernels_scalar_core(nbits):
    from emunum.kernels.scalar import random_bits

    for key in (0, seed_key(1), seed_key(2**40 + 3), 2**64 - 1):
        ref = random_bits_reference(key, 300, nbits)
        core = np.array([random_bits(np.uint64(key), np.uint64(i), nbits) for i in range(300)], dtype=np.uint64)
        assert np.array_equal(ref, core)
        tw = random_bits_torch(key, 300, nbits).numpy().astype(np.uint64)
        assert np.array_equal(ref, tw)
        assert ref.max() < 2**nbits


@pytest.mark.parametrize("nbits", [1, 8, 32])
def test_random_bits_are_uniform(nbits):
    """Each of the nbits bits is set half the time within 5 sigma (n = 200000)."""
    n = 200_000
    r = random_bits_reference(seed_key(99), n, nbits)
    for b in range(nbits):
        k = int(((r >> np.uint64(b)) & np.uint64(1)).sum())
        assert abs(k - n / 2) < 5 * np.sqrt(n / 4), (b, k)


@pytest.mark.parametrize("dtype, bits", [(torch.bfloat16, [0x7FC1, 0x7F81, -0x3F]), (torch.float16, [0x7E01, 0x7C81])])
def test_cpu_16bit_nans_come_back_quietened_with_their_payload(dtype, bits):
    x = torch.tensor(bits, dtype=torch.int16).view(dtype)
    quiet = 1 << 6 if dtype == torch.bfloat16 else 1 << 9
    got = emunum.quantize(x, "fp8_152").view(torch.int16)
    assert torch.equal(got, x.view(torch.int16) | quiet)
