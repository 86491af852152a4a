"""The single-process reference and the per-bucket scale against exact rational arithmetic (Python's
``fractions``), one process, no process group."""
from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from emunum.distributed import pow2_scale, reference_allreduce


@pytest.mark.parametrize("limit", [57344.0, 448.0, 240.0, 6.0, 1.0])
def test_pow2_scale_is_the_largest_power_of_two_keeping_amax_within_the_limit(limit):
    rng = random.Random(0)
    for _ in range(3000):
        amax = rng.uniform(0.5, 1.0) * 2.0 ** rng.randint(-150, 130)
        s = pow2_scale(amax, limit)
        e = round(math.log2(s))
        assert s == 2.0 ** e and -126 <= e <= 127
        if -126 < e < 127:  # not clamped: amax * s in (limit / 2, limit], exactly
            assert Fraction(limit) / 2 < Fraction(amax) * Fraction(s) <= Fraction(limit)
        elif e == 127:
            assert Fraction(amax) * Fraction(s) <= Fraction(limit)


@pytest.mark.parametrize("amax", [0.0, math.inf, math.nan])
def test_pow2_scale_is_one_for_zero_and_non_finite_amax(amax):
    assert pow2_scale(amax, 448.0) == 1.0


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_sum_of_e5m2_values_is_exact_then_rounded_once_to_float32(world):
    """Values already on the e5m2 grid (so the wire rounding keeps them), spanning its whole range: the result
    is float32(exact sum) / W, the exact sum from Fractions. A float32 running sum would not be:
    57344 + 2**-16 is inexact in float32."""
    e5m2 = torch.tensor([57344.0, 2.0**-16, -1.5 * 2.0**-14, 3.0, -0.75, 2.0**-16, 49152.0, -2.0**-15])
    rng = np.random.default_rng(world)
    ranks = [e5m2[torch.from_numpy(rng.permutation(len(e5m2)))] for _ in range(world)]
    got, _ = reference_allreduce(ranks, "e5m2", "nearest")
    exact = [sum(Fraction(float(r[i])) for r in ranks) for i in range(len(e5m2))]
    want = torch.tensor([np.float32(float(x)) for x in exact], dtype=torch.float32) / world  # float(x): exact here
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert float(np.float32(57344.0) + np.float32(2.0**-16)) != 57344.0 + 2.0**-16


def test_the_ring_rounds_every_partial_sum_in_ring_order():
    """Three ranks, one element per chunk, e4m3 nearest: chunk c is Q(Q(q_c + q_{c+1}) + q_{c+2}), checked
    against sums rounded by brute force over the format's values."""
    from emunum import get_format

    vals = np.sort(get_format("fp8_143").values())
    vals = vals[np.isfinite(vals)]

    def q(x: Fraction) -> Fraction:  # nearest, ties to the even code (the lower index among equal candidates)
        i = int(np.argmin([abs(Fraction(float(v)) - x) for v in vals]))
        best = [j for j in range(len(vals)) if abs(Fraction(float(vals[j])) - x) == abs(Fraction(float(vals[i])) - x)]
        if len(best) > 1:  # a tie: the value whose significand is even
            best = [j for j in best if _even(float(vals[j]))]
        return Fraction(float(vals[best[0]]))

    # rank c holds 1 in chunk c, the others 3/64: started at rank c, 1 + 3/64 rounds back to 1 at both hops;
    # started at another rank, 3/64 + 3/64 = 3/32 is kept and 1 + 3/32 rounds to 1.125
    small = 0.046875
    ranks = [torch.tensor([1.0 if i == r else small for i in range(3)]) for r in range(3)]
    got, _ = reference_allreduce(ranks, "fp8_143", "nearest", ring=True)
    assert torch.equal(got, torch.full((3,), 1.0) / 3)
    for c in range(3):
        acc = Fraction(float(ranks[c][c]))
        for j in (1, 2):
            acc = q(acc + Fraction(float(ranks[(c + j) % 3][c])))
        assert float(got[c]) == float(np.float32(float(acc)) / np.float32(3))


def _even(v: float) -> bool:
    """Whether v's e4m3 significand (3 fraction bits) ends in 0."""
    if v == 0:
        return True
    m, e = math.frexp(abs(v))  # v = m * 2**e, m in [0.5, 1)
    e = max(e - 1, -6)  # subnormals share the minimum exponent (ieee e4m3: emin = -6)
    return int(abs(v) / 2.0 ** (e - 3)) % 2 == 0
