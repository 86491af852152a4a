"""A subset of the NIST SP 800-22 rev. 1a statistical tests, run on the bits behind stochastic rounding.

    python benchmarks/rng_battery.py                  # 2**24 bits per stream (default)
    python benchmarks/rng_battery.py --log2-bits 26

Tests (section numbers of SP 800-22; each returns its P-values, a stream passes at P >= 0.01 in NIST's usage):
  2.1 frequency (monobit); 2.2 frequency within a block (M = 128); 2.3 runs; 2.4 longest run of ones in a
  block (M = 8, 128 or 10**4 by the length, as 2.4.2 prescribes; for M = 10**4 the first 750,000 bits);
  2.11 serial (m = 2 and 3: two P-values each); 2.12 approximate entropy (m = 8; the worked example uses 3);
  2.13 cumulative sums (forward and backward).
Left out: the matrix rank, spectral (DFT), template matching, Maurer, linear complexity and random
excursion tests.

Streams (the generator's words are written most significant bit first, 32 bits per element, or its top
``nbits`` bits for the nbits rows): consecutive indices 0, 1, 2, ... under several keys; strided indices
(i * stride) with strides 3, 2**16 and 2**32 + 1 (the last crosses the index's high word every element);
indices from 2**32 - 2**18 on (the low word wraps); one bit (nbits = 1) and 8 bits per element; and the bits
across keys seed_key(0), seed_key(1), ... for a fixed index. The bits come from the kernels' own scalar core
(``kernels.scalar.random_bits``), compiled by numba in a loop.

The functions follow SP 800-22's definitions and are checked against its worked examples in
tests/test_rng.py.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys

import numpy as np
from scipy.special import erfc, gammaincc
from scipy.stats import norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# ---- tests (each takes a 1-D array of 0/1 uint8) -----------------------------------------------------------
def frequency(bits: np.ndarray) -> list[float]:
    n = bits.size
    s = abs(2 * int(bits.sum()) - n) / math.sqrt(n)
    return [float(erfc(s / math.sqrt(2)))]


def block_frequency(bits: np.ndarray, m: int = 128) -> list[float]:
    nb = bits.size // m
    pi = bits[: nb * m].reshape(nb, m).sum(axis=1, dtype=np.int64) / m
    chi2 = 4.0 * m * float(((pi - 0.5) ** 2).sum())
    return [float(gammaincc(nb / 2, chi2 / 2))]


def runs(bits: np.ndarray) -> list[float]:
    n = bits.size
    pi = float(bits.sum()) / n
    if abs(pi - 0.5) >= 2 / math.sqrt(n):  # the frequency prerequisite (2.3.4 step 2)
        return [0.0]
    v = 1 + int(np.count_nonzero(bits[1:] != bits[:-1]))
    x = abs(v - 2 * n * pi * (1 - pi)) / (2 * math.sqrt(2 * n) * pi * (1 - pi))
    return [float(erfc(x))]


# (M, class bounds lo..hi: runs <= lo pool into the first class, >= hi into the last, class probabilities)
_LONGEST = {8: (1, 4, [0.2148, 0.3672, 0.2305, 0.1875]),
            128: (4, 9, [0.1174, 0.2430, 0.2493, 0.1752, 0.1027, 0.1124]),
            10_000: (10, 16, [0.0882, 0.2092, 0.2483, 0.1933, 0.1208, 0.0675, 0.0727])}


def _longest_run_per_row(rows: np.ndarray) -> np.ndarray:
    """Length of the longest run of ones in each row of a 0/1 matrix."""
    best = np.zeros(rows.shape[0], np.int64)
    cur = np.zeros(rows.shape[0], np.int64)
    for j in range(rows.shape[1]):
        cur = (cur + 1) * rows[:, j]
        np.maximum(best, cur, out=best)
    return best


def longest_run(bits: np.ndarray) -> list[float]:
    n = bits.size
    m = 8 if n < 6272 else (128 if n < 750_000 else 10_000)
    lo, hi, pis = _LONGEST[m]
    nb = n // m if m != 10_000 else 75
    longest = _longest_run_per_row(bits[: nb * m].reshape(nb, m).astype(np.int64))
    v = np.bincount(np.clip(longest, lo, hi) - lo, minlength=hi - lo + 1)
    p = np.array(pis)
    chi2 = float(((v - nb * p) ** 2 / (nb * p)).sum())
    return [float(gammaincc((len(pis) - 1) / 2, chi2 / 2))]


def _pattern_counts(bits: np.ndarray, m: int) -> np.ndarray:
    """Counts of the n overlapping m-bit patterns of the sequence extended by its first m-1 bits."""
    if m == 0:
        return np.array([bits.size])
    ext = np.concatenate([bits, bits[: m - 1]]).astype(np.int64)
    code = np.zeros(bits.size, np.int64)
    for j in range(m):
        code = (code << 1) | ext[j: j + bits.size]
    return np.bincount(code, minlength=1 << m)


def _psi2(bits: np.ndarray, m: int) -> float:
    if m <= 0:
        return 0.0
    c = _pattern_counts(bits, m).astype(np.float64)
    return float((1 << m) / bits.size * (c * c).sum() - bits.size)


def serial(bits: np.ndarray, m: int) -> list[float]:
    p0, p1, p2 = _psi2(bits, m), _psi2(bits, m - 1), _psi2(bits, m - 2)
    d1, d2 = p0 - p1, p0 - 2 * p1 + p2
    return [float(gammaincc(2.0 ** (m - 2), d1 / 2)), float(gammaincc(2.0 ** (m - 3), d2 / 2))]


def approximate_entropy(bits: np.ndarray, m: int = 8) -> list[float]:
    n = bits.size

    def phi(k: int) -> float:
        c = _pattern_counts(bits, k).astype(np.float64) / n
        c = c[c > 0]
        return float((c * np.log(c)).sum())

    apen = phi(m) - phi(m + 1)
    chi2 = 2.0 * n * (math.log(2) - apen)
    return [float(gammaincc(2.0 ** (m - 1), chi2 / 2))]


def _cusum_p(n: int, z: int) -> float:
    """2.13.4 step 4; the summation limits truncate toward zero, as NIST's sts code does (its worked example's
    P-value, 0.4116588, needs that; flooring gives 0.4115847)."""
    sq = math.sqrt(n)
    k1 = np.arange(int((-n / z + 1) / 4), int((n / z - 1) / 4) + 1)
    k2 = np.arange(int((-n / z - 3) / 4), int((n / z - 1) / 4) + 1)
    s1 = (norm.cdf((4 * k1 + 1) * z / sq) - norm.cdf((4 * k1 - 1) * z / sq)).sum()
    s2 = (norm.cdf((4 * k2 + 3) * z / sq) - norm.cdf((4 * k2 + 1) * z / sq)).sum()
    return float(1.0 - s1 + s2)


def cumulative_sums(bits: np.ndarray) -> list[float]:
    x = 2 * bits.astype(np.int64) - 1
    fwd = int(np.abs(np.cumsum(x)).max())
    bwd = int(np.abs(np.cumsum(x[::-1])).max())
    return [_cusum_p(bits.size, fwd), _cusum_p(bits.size, bwd)]


TESTS = {
    "frequency": frequency,
    "block_frequency": block_frequency,
    "runs": runs,
    "longest_run": longest_run,
    "serial_m2": lambda b: serial(b, 2),
    "serial_m3": lambda b: serial(b, 3),
    "approx_entropy_m8": approximate_entropy,
    "cumulative_sums": cumulative_sums,
}


def battery(bits: np.ndarray) -> dict[str, list[float]]:
    return {name: fn(bits) for name, fn in TESTS.items()}


# ---- streams of the generator --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _kernel_words():
    from numba import njit

    from emunum.kernels.scalar import random_bits

    @njit
    def words(keys, idx, nbits, out):
        for j in range(out.size):
            out[j] = random_bits(keys[j], idx[j], nbits)

    return words


def generator_bits(keys, idx, nbits: int = 32) -> np.ndarray:
    """The kernel's words for (keys[j], idx[j]), as a 0/1 uint8 stream, most significant of nbits bits first."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    idx = np.ascontiguousarray(idx, dtype=np.uint64)
    out = np.empty(idx.size, np.uint64)
    _kernel_words()(keys, idx, nbits, out)
    shifts = np.arange(nbits - 1, -1, -1, dtype=np.uint64)
    return ((out[:, None] >> shifts[None, :]) & np.uint64(1)).astype(np.uint8).ravel()


def streams(nbits_total: int):
    """(name, bits) for every stream of the module docstring, each nbits_total bits long."""
    from emunum.rng import seed_key

    n32 = nbits_total // 32
    ar = np.arange(n32, dtype=np.uint64)
    for seed in (0, 1, 12345):
        k = seed_key(seed)
        yield f"seed {seed}, indices 0..", generator_bits(np.full(n32, k, np.uint64), ar)
    k = seed_key(7)
    for stride in (3, 1 << 16, (1 << 32) + 1):
        yield f"seed 7, indices i*{stride}", generator_bits(np.full(n32, k, np.uint64), ar * np.uint64(stride))
    yield "seed 7, indices 2**32-2**18..", generator_bits(np.full(n32, k, np.uint64), ar + np.uint64(2**32 - 2**18))
    for nb in (1, 8):
        m = nbits_total // nb
        yield f"seed 7, nbits={nb}, indices 0..", generator_bits(np.full(m, k, np.uint64), np.arange(m, dtype=np.uint64), nb)
    keys = np.array([seed_key(s) for s in range(n32)], dtype=np.uint64)
    for index in (0, 2**32 + 7):
        yield f"keys seed_key(0..), index {index}", generator_bits(keys, np.full(n32, index, np.uint64))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log2-bits", type=int, default=24, help="bits per stream: 2**this (default 24)")
    args = p.parse_args()
    n = 1 << args.log2_bits
    names = list(TESTS)
    print(f"NIST SP 800-22 subset, {n} bits per stream; P-values (serial: two each, cusum: forward, backward)")
    print(f"{'stream':<36} " + " ".join(f"{nm[:14]:>14}" for nm in names))
    worst = 1.0
    for label, bits in streams(n):
        res = battery(bits)
        worst = min(worst, min(min(v) for v in res.values()))
        cells = ["/".join(f"{v:.3f}" for v in res[nm]) for nm in names]
        print(f"{label:<36} " + " ".join(f"{c:>14}" for c in cells), flush=True)
    print(f"smallest P-value: {worst:.4g} (NIST's per-test level: 0.01; with ~{13 * 11} P-values, a few "
          f"below 0.01 are expected by chance)")


if __name__ == "__main__":
    main()
