"""The counter-based random bits of stochastic rounding (emunum/rng.py, kernels/scalar/common.py).

Oracles from outside the project: NIST SP 800-22's worked examples (section 2.x.8) for the statistical
tests of benchmarks/rng_battery.py, and splitmix64 evaluated in numpy's native uint64 arithmetic (wrapping
multiplies) for the generator's definition (tests/reference pins Vigna's published first outputs). Then: the kernel's bits equal the torch and Python
twins and the CUDA kernels' (simulator), and a small deterministic battery (fixed keys) passes at P > 1e-4.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from emunum.rng import random_bits_int, random_bits_torch, seed_key

from benchmark_script import load

battery = load("rng_battery")

KEYS = [0, 1, 2**64 - 1, seed_key(0), seed_key(1), seed_key(2**40 + 3), 0x0123456789ABCDEF]


def _bits(s: str) -> np.ndarray:
    return np.array([int(c) for c in s], np.uint8)


# ---- the battery's tests against SP 800-22's worked examples -------------------------------------------------
LONG_EXAMPLE = ("11001100000101010110110001001100111000000000001001001101010100010001001111010110100000001101011111"
                "001100111001101101100010110010")


@pytest.mark.parametrize("name, fn, eps, expect", [
    ("2.1.8 frequency", battery.frequency, "1011010101", [0.527089]),
    ("2.2.8 block frequency M=3", lambda b: battery.block_frequency(b, 3), "0110011010", [0.801252]),
    ("2.3.8 runs", battery.runs, "1001101011", [0.147232]),
    ("2.4.8 longest run M=8", battery.longest_run, LONG_EXAMPLE, [0.180598]),
    ("2.11.8 serial m=3", lambda b: battery.serial(b, 3), "0011011101", [0.808792, 0.670320]),
    ("2.12.8 approximate entropy m=3", lambda b: battery.approximate_entropy(b, 3), "0100110101", [0.261961]),
    ("2.13.8 cumulative sums forward", lambda b: battery.cumulative_sums(b)[:1], "1011010111", [0.411659]),
])
def test_battery_reproduces_the_nist_worked_examples_to_six_decimals(name, fn, eps, expect):
    assert [round(p, 6) for p in fn(_bits(eps))] == expect, name


# ---- the definition ------------------------------------------------------------------------------------------
def _words_u64(key: int, idx: np.ndarray) -> np.ndarray:
    """splitmix64 (Vigna) at counter idx + 1, in numpy uint64 arithmetic (products wrap modulo 2**64 natively)."""
    z = np.uint64(key) + (idx.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


INDICES = np.array(list(range(300)) + [2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 3, 2**63 - 1, 2**64 - 1], np.uint64)


@pytest.mark.parametrize("nbits", [1, 7, 16, 32])
def test_kernel_core_and_python_twin_equal_splitmix64_in_uint64_arithmetic(nbits):
    from emunum.kernels.scalar import random_bits

    idx = INDICES.astype(np.uint64)
    for key in KEYS:
        want = _words_u64(key, idx) >> np.uint64(64 - nbits)
        core = np.array([random_bits(np.uint64(key), np.uint64(i), nbits) for i in idx], dtype=np.uint64)
        py = np.array([random_bits_int(key, int(i), nbits) for i in idx], dtype=np.uint64)
        assert np.array_equal(core, want), key
        assert np.array_equal(py, want), key


@pytest.mark.parametrize("nbits", [1, 13, 32])
@pytest.mark.parametrize("start, step", [(0, 1), (2**32 - 100, 1), (5, 2**32 + 1), (2**62, 3)])
def test_torch_twin_equals_the_kernel_core_on_any_index_range(nbits, start, step):
    n = 200
    idx = np.array([start + j * step for j in range(n)], dtype=np.uint64)
    for key in KEYS:
        tw = random_bits_torch(key, n, nbits, start=start, step=step).numpy().astype(np.uint64)
        want = _words_u64(key, idx) >> np.uint64(64 - nbits)
        assert np.array_equal(tw, want), key


def test_quantize_draws_the_documented_bits_on_the_cpu_kernel():
    """Stochastic rounding of x = k + u/2**32 (k integer, fixed-point quantum 1) rounds up iff u + bits >= 2**32,
    so the kernels' bits are visible through the public API: checked for every element."""
    import emunum

    n = 4096
    u = torch.arange(n, dtype=torch.int64) * 1048573 % 2**20  # 20-bit fractions: exact in float64
    x = (u.double() / 2**20) + 3.0
    y = emunum.quantize(x, emunum.FixedFormat(16, 0), "stochastic", seed=11)
    bits = random_bits_torch(seed_key(11), n, 32)
    up = (u * 2**12 + bits) >= 2**32
    assert torch.equal(y, 3.0 + up.double())


cuda = None  # numba-cuda, bound by the test below (the simulator swaps the module global a kernel sees)


def _words_kernel(key, idx, out):
    from emunum.kernels.scalar import random_bits

    j = cuda.grid(1)
    if j < out.size:
        out[j] = random_bits(key, idx[j], 32)


def test_cuda_kernel_bits_equal_the_cpu_kernel_bits_in_the_simulator():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 (tests/kernels/test_cuda.py covers the GPU)")
    global cuda
    from emunum.kernels.cuda import cuda  # noqa: F811  numba-cuda, as the kernels import it

    words = cuda.jit(_words_kernel)
    idx = np.array([0, 1, 2, 2**32 - 1, 2**32, 2**40 + 3, 2**64 - 1], dtype=np.uint64)
    for key in (seed_key(3), 2**64 - 1):
        out = np.zeros(idx.size, np.uint64)
        words[1, 32](np.uint64(key), idx, out)
        assert np.array_equal(out, _words_u64(key, idx) >> np.uint64(32))


# ---- a small deterministic battery ---------------------------------------------------------------------------
N_BITS = 1 << 17


def _streams():
    n32 = N_BITS // 32
    ar = np.arange(n32, dtype=np.uint64)
    for seed in (0, 12345):
        k = np.full(n32, seed_key(seed), np.uint64)
        yield f"seed {seed} consecutive", battery.generator_bits(k, ar)
        yield f"seed {seed} stride 2**32+1", battery.generator_bits(k, ar * np.uint64(2**32 + 1))
        yield f"seed {seed} nbits=1", battery.generator_bits(np.full(N_BITS, seed_key(seed), np.uint64),
                                                             np.arange(N_BITS, dtype=np.uint64), 1)
    keys = np.array([seed_key(s) for s in range(n32)], dtype=np.uint64)
    yield "across keys, index 5", battery.generator_bits(keys, np.full(n32, 5, np.uint64))


STREAMS = dict(_streams())


@pytest.mark.parametrize("stream", list(STREAMS))
@pytest.mark.parametrize("test", list(battery.TESTS))
def test_generator_passes_nist_subset_at_p_above_1e_4(stream, test):
    ps = battery.TESTS[test](STREAMS[stream])
    assert min(ps) > 1e-4, (stream, test, ps)


def test_battery_rejects_a_weak_stream():
    """The battery can fail: the low bit of consecutive counters (0101...) and a biased stream are rejected."""
    alternating = (np.arange(N_BITS) & 1).astype(np.uint8)
    assert battery.runs(alternating)[0] < 1e-4
    assert min(battery.serial(alternating, 2)) < 1e-4
    rng = np.random.default_rng(0)
    biased = (rng.random(N_BITS) < 0.51).astype(np.uint8)
    assert battery.frequency(biased)[0] < 1e-4
