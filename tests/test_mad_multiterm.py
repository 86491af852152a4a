"""Multi-term MAD units and exact accumulation (emunum.mad): kernels against the exact reference.

Oracle: ``emunum.mad.reference_multiterm`` (Python fractions and integers; its own exponent extraction,
alignment and rounding; no code shared with the kernels), itself checked against measured GPU outputs in
tests/test_tensor_cores.py. Zero tolerance: equal values and equal sign bits.
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum import FloatFormat, MADUnit, RoundMode
from emunum.mad import reference_multiterm as ref
from emunum.mad.presets import PRESETS, TABLE

FP32 = FloatFormat(8, 23)


def ref_element(unit: MADUnit, a, b, c, dtype=torch.float32):
    """The reference's d for one dot product on ``unit``."""
    if unit.is_exact:
        out = unit.exact_out_format(dtype)
        if not unit.fused:  # products rounded to mul_fmt first: feed them as p_k * 1
            a = [ref.round_fraction(Fraction(x) * Fraction(y), unit.mul_fmt, unit.mul_rounding) for x, y in zip(a, b)]
            b = [1] * len(a)
        return ref.dot_exact(a, b, c, out, unit.acc_rounding)
    return ref.dot_multiterm(
        a, b, c, terms=unit.terms, in_emin=(unit.in_fmt or FP32).emin, align_bits=unit.align_bits,
        align_rounding=unit.align_rounding, align_floor=unit.align_floor, carry_bits=unit.carry_bits,
        acc_fmt=unit.acc_fmt, acc_rounding=unit.acc_rounding, promote_every=unit.promote_every,
        outer_fmt=unit.outer_fmt, outer_rounding=unit.outer_rounding,
        mul_fmt=None if unit.fused else unit.mul_fmt, mul_rounding=unit.mul_rounding)


def ref_gemm(unit, A, B, C):
    """float64 numpy (nb, M, N) of the reference, A (nb, M, K), B (nb, K, N), C (nb, M, N)."""
    nb, M, K = A.shape
    N = B.shape[2]
    out = np.empty((nb, M, N))
    for b_, i, j in itertools.product(range(nb), range(M), range(N)):
        r = ref_element(unit, [float(x) for x in A[b_, i]], [float(x) for x in B[b_, :, j]], float(C[b_, i, j]))
        out[b_, i, j] = float(r)
    return out


def same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    both_nan = np.isnan(x) & np.isnan(y)
    return bool(np.all(both_nan | ((x == y) & (np.signbit(x) == np.signbit(y)))))


def operands(rng, shape, fmt="bf16", spread=12, subnormal_share=0.1, zero_share=0.1):
    """Values of ``fmt`` with wide exponent spread, exact cancellations, zeros and subnormals."""
    f = emunum.get_format(fmt)
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * np.exp2(rng.integers(-spread, spread + 1, n))
    sub = rng.random(n) < subnormal_share
    x[sub] = rng.integers(-2**f.man + 1, 2**f.man, sub.sum()) * f.min_subnormal
    x[rng.random(n) < zero_share] = 0.0
    t = emunum.quantize(torch.from_numpy(x), fmt)
    return t.reshape(shape).to(torch.float32)


def adversarial_batch(rng, K, fmt):
    """A (2, 3, K), B (2, K, 4) with cancellation (a_k b_k = -a_{k+1} b_{k+1}), a huge term beside tiny ones,
    shifts beyond the alignment width and subnormals."""
    A = operands(rng, (2, 3, K), fmt)
    B = operands(rng, (2, K, 4), fmt)
    if K >= 2:
        A[0, 0, 1] = -A[0, 0, 0]
        B[0, 1, :] = B[0, 0, :]                       # exact cancellation in row 0
        A[1, 1, 0] = 2.0**10
        A[1, 1, 1:] = 2.0**-14                         # huge beside tiny
    f = emunum.get_format(fmt)
    A[1, 2, :] = f.min_subnormal * 3                   # products of subnormals
    B[1, :, 3] = f.min_subnormal
    return A, B


def run_unit(unit, A, B, C):
    return emunum.baddbmm(C, A, B, unit).to(torch.float64).numpy()


# ---- every option combination against the reference --------------------------------------------------

_ACCS = [("fp32", "toward_zero"), ("bf16", "nearest"), ("fp16", "up"), ("e8m13", "toward_zero"), ("fp32", "down")]
_COMBOS = []
for terms, align_bits, arnd, (acc, accr), floor, carry, promote, mul in itertools.product(
        (1, 2, 5, 16), (None, 0, 4, 13, 25), ("toward_zero", "nearest", "up", "odd"), _ACCS, (None, -12),
        (None, 1), (None, 2), (None, "bf16")):
    if carry is not None and align_bits is None:
        continue
    _COMBOS.append((terms, align_bits, arnd, acc, accr, floor, carry, promote, mul))
_RNG_SEL = np.random.default_rng(0)
_COMBOS = [_COMBOS[i] for i in sorted(_RNG_SEL.choice(len(_COMBOS), 60, replace=False))]


@pytest.mark.parametrize("terms,align_bits,arnd,acc,accr,floor,carry,promote,mul", _COMBOS)
def test_multiterm_gemm_matches_exact_reference_for_option_combinations(terms, align_bits, arnd, acc, accr, floor,
                                                                        carry, promote, mul):
    unit = MADUnit(mul, acc, fused=mul is None, acc_rounding=accr, terms=terms, align_bits=align_bits,
                   align_rounding=arnd, align_floor=floor, carry_bits=carry,
                   promote_every=None if promote is None else promote * terms, in_fmt="fp16")
    rng = np.random.default_rng(terms * 1000 + (align_bits or 99))
    K = 2 * terms + 3
    A, B = adversarial_batch(rng, K, "fp16")
    C = operands(rng, (2, 3, 4), "fp16", spread=4)
    C[0, 0, 0] = 2.0**12                                 # c dominates the first step
    got = run_unit(unit, A, B, C)
    want = ref_gemm(unit, A.numpy(), B.numpy(), C.numpy())
    assert same_bits(got, want), (unit, got, want)


@pytest.mark.parametrize("carry", [0, 1, 2])
def test_carry_bits_wrap_the_aligned_sum_like_the_reference(carry):
    unit = MADUnit(None, "fp32", fused=True, acc_rounding="toward_zero", terms=8, align_bits=6, carry_bits=carry)
    A = torch.full((1, 2, 8), 1.75)
    A[0, 1, ::2] = -1.75
    B = torch.full((1, 8, 3), 1.5)
    C = torch.zeros((1, 2, 3))
    got = run_unit(unit, A, B, C)
    want = ref_gemm(unit, A.numpy(), B.numpy(), C.numpy())
    assert same_bits(got, want)
    wide = run_unit(MADUnit(None, "fp32", fused=True, acc_rounding="toward_zero", terms=8, align_bits=6), A, B, C)
    assert got[0, 0, 0] != wide[0, 0, 0]  # 8 * 2.625 = 21 needs 5 integer bits: narrower adders wrap


@pytest.mark.parametrize("K", [40, 128, 1000])
@pytest.mark.parametrize("name", ["h100_fp8_e4m3", "a100_bf16", "v100_fp16"])
def test_long_gemm_chains_steps_like_the_reference(name, K):
    unit = MADUnit.preset(name)
    fmt = {"h100_fp8_e4m3": "e4m3fn", "a100_bf16": "bf16", "v100_fp16": "fp16"}[name]
    rng = np.random.default_rng(K)
    A = operands(rng, (1, 2, K), fmt, spread=3, subnormal_share=0.02)
    B = operands(rng, (1, K, 2), fmt, spread=3, subnormal_share=0.02)
    C = operands(rng, (1, 2, 2), "fp32", spread=3, subnormal_share=0, zero_share=0)
    got = run_unit(unit, A, B, C)
    assert same_bits(got, ref_gemm(unit, A.numpy(), B.numpy(), C.numpy()))


def test_promotion_every_128_products_recovers_accuracy_lost_by_13_bit_steps():
    base = MADUnit.preset("h100_fp8_e4m3")
    promoted = MADUnit(None, base.acc_fmt, fused=True, acc_rounding=base.acc_rounding, terms=32, align_bits=13,
                       align_floor=base.align_floor, in_fmt=base.in_fmt, promote_every=128)
    K = 1024
    A = torch.ones((1, 1, K))
    B = torch.full((1, K, 1), 2.0**-8)
    B[0, 0, 0] = 448.0
    C = torch.zeros((1, 1, 1))
    exact = 448.0 + (K - 1) * 2.0**-8
    plain, prom = run_unit(base, A, B, C)[0, 0, 0], run_unit(promoted, A, B, C)[0, 0, 0]
    assert same_bits([prom], [float(ref_element(promoted, A[0, 0].tolist(), B[0, :, 0].tolist(), 0.0))])
    assert plain == 448.0 and abs(prom - exact) < 1.0  # 13-bit steps drop every 2**-8; promotion keeps them


# ---- one product per step: today's bits ------------------------------------------------------------------

@pytest.mark.parametrize("unit", [
    MADUnit(None, "fp32", fused=True),
    MADUnit("bf16", "fp16", mul_rounding="toward_zero", acc_rounding="nearest"),
    MADUnit("fp16", "bf16", acc_rounding="up"),
    MADUnit(None, "e4m3fn", fused=True, acc_rounding="odd"),
], ids=str)
def test_terms_1_lossless_steps_give_todays_bits(unit):
    """addmm with c = 0 runs the multi-term kernel with terms=1 and lossless alignment; matmul runs today's
    one-product kernel: the bits agree."""
    rng = np.random.default_rng(3)
    A = operands(rng, (5, 19), "bf16", spread=6)
    B = operands(rng, (19, 7), "bf16", spread=6)
    got = emunum.addmm(torch.zeros(5, 7), A, B, unit)
    want = emunum.matmul(A, B, unit)
    assert same_bits(got.numpy(), want.numpy())


# ---- exact accumulation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_exact_accumulation_rounds_the_exact_sum_once(mode, dtype):
    unit = MADUnit(None, "exact", fused=True, acc_rounding=mode)
    rng = np.random.default_rng(7)
    fmt, spread, big = {torch.float32: ("fp32", 30, 60), torch.float16: ("fp16", 5, 14),
                         torch.bfloat16: ("bf16", 30, 60)}[dtype]
    A = operands(rng, (1, 4, 300), fmt, spread=spread, subnormal_share=0.05).to(dtype)
    B = operands(rng, (1, 300, 3), fmt, spread=spread, subnormal_share=0.05).to(dtype)
    A[0, 0, :2] = torch.tensor([2.0**big, -2.0**big]).to(dtype)
    A[0, 0, 2] = 2.0**-big
    C = torch.zeros((1, 4, 3), dtype=dtype)
    got = emunum.baddbmm(C, A, B, unit)
    assert got.dtype == dtype
    out_fmt = unit.exact_out_format(dtype)
    want = np.array([[[float(ref.dot_exact(A[0, i].double().tolist(), B[0, :, j].double().tolist(), 0.0, out_fmt,
                                             mode)) for j in range(3)] for i in range(4)]])
    assert same_bits(got.double().numpy(), want)


def test_exact_accumulation_is_order_independent_and_exact_on_cancellation():
    unit = MADUnit(None, "exact", fused=True)
    x = torch.tensor([[1e30, 1.0, -1e30, 2.0**-100]])
    y = torch.ones(4, 1)
    assert emunum.matmul(x, y, unit).item() == 1.0
    perm = emunum.matmul(x[:, [3, 2, 1, 0]], y, unit)
    assert perm.item() == 1.0


def test_exact_linear_adds_bias_inside_the_exact_sum():
    unit = MADUnit(None, "exact", fused=True)
    x = torch.tensor([[2.0**24, 1.0]])
    w = torch.tensor([[1.0, 1.0]])
    b = torch.tensor([1.0])
    assert emunum.linear(x, w, b, unit).item() == 2.0**24 + 2.0  # fp32 would round 2**24 + 1 first


# ---- addmm / baddbmm API ---------------------------------------------------------------------------------

def test_addmm_input_enters_the_first_step_not_the_end():
    """h100_fp8_e4m3: c = 1 and 32 products of 2**-14 in one step: each aligned at quantum 2**-13 -> lost;
    added at the end they would survive as 32 * 2**-14 = 2**-9."""
    unit = MADUnit.preset("h100_fp8_e4m3")
    A = torch.full((1, 32), 2.0**-7)
    B = torch.full((32, 1), 2.0**-7)
    d = emunum.addmm(torch.ones(1, 1), A, B, unit)
    assert d.item() == 1.0
    assert emunum.matmul(A, B, unit).item() + 1.0 == 1.0 + 2.0**-9


def test_addmm_broadcasts_input_and_matches_baddbmm():
    unit = MADUnit.preset("a100_bf16")
    rng = np.random.default_rng(1)
    A, B = operands(rng, (3, 20), "bf16"), operands(rng, (20, 5), "bf16")
    bias = operands(rng, (5,), "fp32", subnormal_share=0)
    d = emunum.addmm(bias, A, B, unit)
    d2 = emunum.baddbmm(bias.expand(1, 3, 5), A[None], B[None], unit)[0]
    assert d.shape == (3, 5) and same_bits(d.numpy(), d2.numpy())


def test_addmm_rejects_scaling_and_bad_shapes_naming_them():
    unit = MADUnit.preset("a100_bf16")
    A, B = torch.ones(2, 3), torch.ones(3, 4)
    with pytest.raises(ValueError, match="beta=0.5"):
        emunum.addmm(torch.zeros(2, 4), A, B, unit, beta=0.5)
    with pytest.raises(ValueError, match="alpha=2"):
        emunum.addmm(torch.zeros(2, 4), A, B, unit, alpha=2)
    with pytest.raises(ValueError, match="does not broadcast"):
        emunum.addmm(torch.zeros(3, 4), A, B, unit)
    with pytest.raises(ValueError, match="lanes=1"):
        emunum.addmm(torch.zeros(2, 4), A, B, MADUnit(None, "fp32", fused=True, lanes=4))


def test_addmm_gradients_are_matmuls_and_grad_input_is_grad():
    unit = MADUnit(None, "exact", fused=True)
    A = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    B = torch.tensor([[0.5, -1.0], [2.0, 0.25]], requires_grad=True)
    C = torch.tensor([1.0, -1.0], requires_grad=True)
    emunum.addmm(C, A, B, unit).sum().backward()
    A2, B2, C2 = (t.detach().clone().requires_grad_() for t in (A, B, C))
    torch.addmm(C2, A2, B2).sum().backward()
    for x, y in ((A, A2), (B, B2), (C, C2)):
        assert torch.equal(x.grad, y.grad)


def test_inputs_are_not_modified():
    unit = MADUnit.preset("h100_fp8_e4m3")
    A, B, C = torch.ones(2, 32), torch.ones(32, 2), torch.ones(2, 2)
    copies = [t.clone() for t in (A, B, C)]
    emunum.addmm(C, A, B, unit)
    assert all(torch.equal(t, c) for t, c in zip((A, B, C), copies))


# ---- unit validation and presets ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(terms=0), ValueError, "terms=0"),
    (dict(terms=2.5), TypeError, "terms"),
    (dict(terms=4, align_bits=41), ValueError, "align_bits=41"),
    (dict(terms=4, carry_bits=2), ValueError, "carry_bits=2"),
    (dict(terms=4, promote_every=6), ValueError, "promote_every=6"),
    (dict(terms=4, lanes=2), ValueError, "lanes=2"),
    (dict(terms=4, chunk=8), ValueError, "chunk=8"),
    (dict(terms=4, align_rounding="stochastic"), ValueError, "align_rounding"),
    (dict(terms=4, acc_rounding="stochastic"), ValueError, "stochastic"),
    (dict(terms=4, in_fmt="int8"), ValueError, "in_fmt"),
])
def test_multiterm_unit_rejects_bad_fields_naming_them(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        MADUnit(None, "fp32", fused=True, **kwargs)


def test_exact_unit_refuses_steps_and_float64_output():
    with pytest.raises(ValueError, match="terms=4"):
        MADUnit(None, "exact", fused=True, terms=4)
    unit = MADUnit(None, "exact", fused=True)
    with pytest.raises(ValueError, match="float64"):
        emunum.matmul(torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64), unit)


def test_presets_resolve_aliases_and_unknown_names_list_the_known():
    assert MADUnit.preset("h200_fp8_e4m3") == MADUnit.preset("h100_fp8_e4m3")
    assert MADUnit.preset("L40S_bf16") == MADUnit.preset("ada_bf16")
    assert MADUnit.preset("a30_tf32") == MADUnit.preset("a2_tf32") == MADUnit.preset("a100_tf32")
    with pytest.raises(ValueError, match="a100_bf16"):
        MADUnit.preset("z900_fp16")
    for gpu in ("ada", "h100", "b200"):
        for f in ("fp16", "bf16", "tf32", "fp8_e4m3", "fp8_e5m2"):
            assert f"{gpu}_{f}" in PRESETS
    assert {"v100_fp16", "a100_fp16", "a100_bf16", "a100_tf32"} <= set(TABLE)


def test_elementwise_mad_refuses_multiterm_units():
    with pytest.raises(ValueError, match="multi-term"):
        emunum.mad.elementwise(torch.ones(2), torch.ones(2), torch.ones(2), MADUnit.preset("a100_bf16"))


def test_units_cli_lists_every_preset_with_its_source(capsys):
    from emunum.cli import main

    assert main(["units"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out
    assert "models/H100TC.m" in out and "h200" in out


@pytest.mark.parametrize("in_fmt", ["fp16", None])
def test_integer_fast_path_and_general_path_agree_with_the_reference(in_fmt):
    """fp32 operands with in_fmt=fp16 fall off the integer grid (general kernel); in_fmt=None stays on it."""
    from emunum.kernels import gemm_multiterm

    unit = MADUnit(None, "fp32", fused=True, acc_rounding="toward_zero", terms=4, align_bits=20, in_fmt=in_fmt)
    rng = np.random.default_rng(11)
    A = operands(rng, (1, 3, 9), "fp32", spread=20, subnormal_share=0.1)
    B = operands(rng, (1, 9, 2), "fp32", spread=20, subnormal_share=0.1)
    A[0, 0, 0] = 2.0**-140
    C = torch.zeros((1, 3, 2))
    prm, mulp, accp, outerp = (tuple(int(v) for v in p) for p in unit.multiterm_params())
    keys = (np.uint64(0),) * 5
    BT = np.ascontiguousarray(B.numpy().transpose(0, 2, 1))
    general, auto = np.empty((1, 3, 2)), np.empty((1, 3, 2))
    gemm_multiterm.gemm(A.numpy(), BT, C.double().numpy(), np.zeros((1, 1, 1)), False, general, prm, mulp, accp,
                        outerp, keys, 32)
    gemm_multiterm.gemm_auto(A.numpy(), BT, C.double().numpy(), np.zeros((1, 1, 1)), False, auto, prm, mulp, accp,
                             outerp, keys, 32)
    want = ref_gemm(unit, A.numpy(), B.numpy(), C.numpy())
    assert same_bits(general, want) and same_bits(auto, want)


def test_patch_accepts_a_preset_name_and_runs_the_layers_on_it():
    from emunum.policy import Policy

    assert Policy.make("e4m3fn", mad="h200_fp8_e4m3").mad == MADUnit.preset("h100_fp8_e4m3")
    torch.manual_seed(0)
    x = emunum.quantize(torch.randn(2, 40), "e4m3fn")
    outs = []
    for mad in ("h100_fp8_e4m3", MADUnit.preset("h100_fp8_e4m3"), MADUnit(None, "fp32", fused=True)):
        torch.manual_seed(1)
        model = emunum.patch(torch.nn.Sequential(torch.nn.Linear(40, 3)), fmt="e4m3fn", output=None, mad=mad)
        y = model(x)
        y.sum().backward()
        assert model[0].weight.grad is not None
        outs.append(y.detach())
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])  # 13-bit steps differ from fp32 accumulation somewhere


@pytest.mark.parametrize("promote", [None, 8])
def test_tiled_integer_kernel_equals_general_kernel_with_bias_and_ragged_tiles(promote):
    from emunum.kernels import gemm_multiterm

    unit = MADUnit(None, "bf16", fused=True, acc_rounding="nearest", terms=4, align_bits=9, carry_bits=2,
                   align_floor=-20, promote_every=promote, in_fmt="bf16")
    rng = np.random.default_rng(21)
    A = operands(rng, (2, 3, 21), "bf16")
    B = operands(rng, (1, 21, 45), "bf16")  # 45 columns: a full and a ragged tile of 32; batch broadcast
    C = operands(rng, (2, 3, 45), "bf16").double().numpy()
    bias = rng.standard_normal((2, 3, 45))
    prm, mulp, accp, outerp = (tuple(int(v) for v in p) for p in unit.multiterm_params())
    keys = (np.uint64(0),) * 5
    BT = np.ascontiguousarray(B.numpy().transpose(0, 2, 1))
    general, auto = np.empty((2, 3, 45)), np.empty((2, 3, 45))
    gemm_multiterm.gemm(A.numpy(), BT, C, bias, True, general, prm, mulp, accp, outerp, keys, 32)
    gemm_multiterm.gemm_auto(A.numpy(), BT, C, bias, True, auto, prm, mulp, accp, outerp, keys, 32)
    assert same_bits(auto, general)
    want = ref_gemm(unit, A.numpy(), np.broadcast_to(B.numpy(), (2, 21, 45)), C)
    if promote is None:  # bias added last with one rounding to acc_fmt
        want = np.array([[[float(ref.round_fraction(Fraction(want[b, i, j]) + Fraction(bias[b, i, j]),
                                                    unit.acc_fmt, "nearest")) for j in range(45)]
                          for i in range(3)] for b in range(2)])
        assert same_bits(general, want)


# ---- fast CPU kernels (gemm_multiterm_f64, gemm_exact_slices) against the general kernel and the reference --
# Invariant: whichever kernel ``gemm_auto`` picks, the bits are ``gemm_multiterm.gemm``'s (the general, per-step
# kernel) and the fractions reference's. Each case asserts which kernel ran, so a case cannot pass by falling
# back silently.

def kernel_outputs(unit, A, B, C, bias=None, dtype=torch.float32, seed=5):
    """(name of the kernel gemm_auto ran, its output, the general kernel's output, gemm_auto(fast=False)'s).
    A (bA, M, K), B (bB, K, N), C (nb, M, N) numpy float32/float64; bias None or (nb, M, N) float64."""
    from emunum.kernels import gemm_multiterm
    from emunum.mad.unit import stream_keys

    prm, mulp, accp, outerp = (tuple(int(v) for v in p) for p in unit.multiterm_params(dtype))
    keys = tuple(np.uint64(k) for k in stream_keys(seed))
    A = np.ascontiguousarray(A, np.float32)
    BT = np.ascontiguousarray(np.asarray(B, np.float32).transpose(0, 2, 1))
    nb, M, N = C.shape
    C = np.ascontiguousarray(C, np.float64)
    has_bias = bias is not None
    bias = np.ascontiguousarray(bias, np.float64) if has_bias else np.zeros((1, 1, 1))
    outs = [np.empty((nb, M, N)) for _ in range(3)]
    name = gemm_multiterm.gemm_auto(A, BT, C, bias, has_bias, outs[0], prm, mulp, accp, outerp, keys, unit.sr_bits)
    gemm_multiterm.gemm(A, BT, C, bias, has_bias, outs[1], prm, mulp, accp, outerp, keys, unit.sr_bits)
    gemm_multiterm.gemm_auto(A, BT, C, bias, has_bias, outs[2], prm, mulp, accp, outerp, keys, unit.sr_bits,
                             fast=False)
    return name, *outs


def ref_subset(unit, A, B, C, rows, cols, dtype=torch.float32):
    """The reference on out[b, i, j] for b < nb, i in rows, j in cols (B broadcast over the batch)."""
    nb = C.shape[0]
    got = np.empty((nb, len(rows), len(cols)))
    for b_ in range(nb):
        a_, bm = A[b_ % A.shape[0]], B[b_ % B.shape[0]]
        for x, i in enumerate(rows):
            for y, j in enumerate(cols):
                r = ref_element(unit, [float(v) for v in a_[i]], [float(v) for v in bm[:, j]], float(C[b_, i, j]),
                                dtype)
                got[b_, x, y] = float(r)
    return got


_IN = {"fp8_e4m3": "e4m3fn", "fp8_e5m2": "e5m2", "bf16": "bf16", "fp16": "fp16", "tf32": "tf32"}


def _in_fmt(name):
    return next(v for k, v in _IN.items() if k in name)


@pytest.mark.parametrize("name", ["h100_fp8_e4m3", "h100_fp8_e5m2", "a100_bf16", "a100_tf32", "v100_fp16",
                                  "ada_fp8_e4m3", "a100_fp16_out_fp16", "h100_bf16"])
def test_f64_multiterm_kernel_gives_the_general_kernels_bits_on_preset_operands(name):
    """Batched A against a broadcast B, K not a multiple of the terms nor of the K block, N = one full and one
    ragged column tile, C of the accumulator's format, a bias, zero rows and subnormal operands."""
    from emunum.kernels.gemm_pack import TN

    unit = MADUnit.preset(name)
    fmt = _in_fmt(name)
    rng = np.random.default_rng(len(name))
    K, N = 3 * unit.terms + 5 + 64, TN + 6
    A = operands(rng, (2, 5, K), fmt, spread=4, subnormal_share=0.05).numpy()
    B = operands(rng, (1, K, N), fmt, spread=4, subnormal_share=0.05).numpy()
    A[1, 2, :] = 0.0                                    # an all-zero row: c alone
    A[0, 3, : unit.terms] = 0.0                         # a step of zero products
    C = operands(rng, (2, 5, N), "fp16" if "out_fp16" in name else "fp32", spread=3).double().numpy()
    bias = rng.standard_normal((2, 5, N))
    kern, got, general, slow = kernel_outputs(unit, A, B, C, bias)
    assert kern == "multiterm_f64"
    assert same_bits(got, general) and same_bits(got, slow)
    rows, cols = [0, 2, 3], [0, TN - 1, TN, TN + 5]
    want = ref_subset(unit, A, B, C, rows, cols)
    for x, i in enumerate(rows):  # bias last, one rounding to acc_fmt
        for y, j in enumerate(cols):
            for b_ in range(2):
                want[b_, x, y] = float(ref.round_fraction(Fraction(want[b_, x, y]) + Fraction(bias[b_, i, j]),
                                                          unit.acc_fmt, unit.acc_rounding))
    assert same_bits(got[:, rows][:, :, cols], want)


_F64_UNITS = [
    MADUnit.preset("h100_fp8_e4m3"),
    MADUnit(None, "e8m13", fused=True, acc_rounding="toward_zero", terms=32, align_bits=13, align_floor=-133,
            in_fmt="e4m3fn", promote_every=64),
    MADUnit(None, "fp32", fused=True, acc_rounding="toward_zero", terms=4, align_bits=6, carry_bits=1),
    MADUnit(None, "bf16", fused=True, acc_rounding="nearest", terms=5, align_bits=0, carry_bits=0),
    MADUnit(None, "fp16", fused=True, acc_rounding="up", terms=3, align_bits=25, align_floor=-12),  # slow rounding
    MADUnit(None, "fp32", fused=True, acc_rounding="nearest", terms=16, align_bits=40, in_fmt="fp16"),
    MADUnit(None, "bf16", fused=True, acc_rounding="nearest", terms=2, align_bits=4, in_fmt="fp16",
            promote_every=4, outer_fmt="fp16", outer_rounding="toward_zero"),
]


@pytest.mark.parametrize("unit", _F64_UNITS, ids=str)
@pytest.mark.parametrize("K", [1, 7, 70])
def test_f64_multiterm_kernel_matches_reference_on_adversarial_operands(unit, K):
    """Cancellation to an exact zero sum (+0, never -0), a huge term beside tiny ones, shifts beyond p,
    carries and wrap, subnormal products, c dominating, promotion blocks."""
    rng = np.random.default_rng(K + unit.terms)
    A, B = adversarial_batch(rng, K, "fp16")
    A, B = A.numpy(), B.numpy()
    A[0, 2, :] = -A[0, 1, :]
    B[0, :, 2] = B[0, :, 1]                              # products pairwise equal and opposite in one column
    C = operands(rng, (2, 3, 4), "fp16", spread=4).double().numpy()
    C[0, 0, 0] = 2.0**12
    C[1, 0, 1] = -2.0**-20
    kern, got, general, slow = kernel_outputs(unit, A, B, C)
    assert kern == "multiterm_f64"
    assert same_bits(got, general) and same_bits(got, slow)
    assert same_bits(got, ref_gemm(unit, A, B, C))


def test_f64_multiterm_kernel_overflowing_steps_take_the_exact_rounding_and_carry_inf():
    """fp16 accumulator (nearest): a step overflows to +-inf (round_value), later steps carry it (round_acc(c))
    and an inf of the other sign from a later step's own overflow never arises (c dominates E)."""
    unit = MADUnit.preset("a100_fp16_out_fp16")
    A = np.full((1, 2, 40), 240.0, np.float32)
    B = np.full((1, 40, 4), 240.0, np.float32)
    B[0, :, 1] = -240.0
    B[0, :, 3] = 2.0**-10
    A[0, 1, 20:] = 0.0
    C = np.zeros((1, 2, 4))
    C[0, 0, 2] = -60000.0
    kern, got, general, slow = kernel_outputs(unit, A, B, C)
    assert kern == "multiterm_f64"
    assert got[0, 0, 0] == np.inf and got[0, 0, 1] == -np.inf and got[0, 1, 0] == np.inf
    assert same_bits(got, general) and same_bits(got, slow)


@pytest.mark.parametrize("case", ["inf_operand", "nan_operand", "huge_c", "tiny_c", "inf_c", "rounded_products",
                                  "nearest_alignment", "lossless", "k0"])
def test_f64_multiterm_kernel_is_skipped_outside_its_proven_range(case):
    """Non-finite operands, C beyond 2**+-1000 or non-finite, rounded products, other alignment modes and
    lossless steps run the integer or general kernel: same bits as the general kernel either way."""
    unit = MADUnit.preset("a100_bf16")
    if case == "rounded_products":
        unit = MADUnit("bf16", "fp32", acc_rounding="toward_zero", terms=8, align_bits=24)
    elif case == "nearest_alignment":
        unit = MADUnit(None, "fp32", fused=True, terms=8, align_bits=24, align_rounding="nearest")
    elif case == "lossless":
        unit = MADUnit(None, "fp32", fused=True, terms=8, align_bits=None)
    rng = np.random.default_rng(1)
    A = operands(rng, (1, 3, 20), "bf16").numpy()
    B = operands(rng, (1, 20, 5), "bf16").numpy()
    C = np.zeros((1, 3, 5))
    if case == "inf_operand":
        A[0, 1, 3] = np.inf
    elif case == "nan_operand":
        B[0, 4, 2] = np.nan
    elif case == "huge_c":
        C[0, 0, 0] = 2.0**1001
    elif case == "tiny_c":
        C[0, 2, 1] = 2.0**-1001
    elif case == "inf_c":
        C[0, 1, 1] = -np.inf
    elif case == "k0":  # no products: one step of c alone, which rounds c to acc_fmt
        A, B = A[:, :, :0], B[:, :0]
        C = rng.standard_normal((1, 3, 5))
    kern, got, general, slow = kernel_outputs(unit, A, B, C)
    assert kern != "multiterm_f64"
    assert same_bits(got, general) and same_bits(got, slow)


@pytest.mark.parametrize("unit", _F64_UNITS, ids=str)
@pytest.mark.parametrize("bA,bB,N", [(1, 2, 1), (1, 2, 9), (2, 1, 3), (2, 2, 16)])
def test_f64_kernel_on_narrow_outputs_runs_transposed_with_the_general_kernels_bits(unit, bA, bB, N):
    """A conv's GEMM on a small feature map (many rows, a few columns): gemm_auto computes out^T = B^T A^T on the
    float64 kernel (fewer padded column slots); every element is the same dot product, c and bias included,
    so the bits are the general kernel's, across both batch broadcasts."""
    rng = np.random.default_rng(N + 10 * bA)
    K, M = 2 * unit.terms + 7, 150
    A = operands(rng, (bA, M, K), "fp16", spread=4, subnormal_share=0.05).numpy()
    B = operands(rng, (bB, K, N), "fp16", spread=4, subnormal_share=0.05).numpy()
    A[0, 3, :] = 0.0
    C = operands(rng, (2, M, N), "fp16", spread=3).double().numpy()
    bias = rng.standard_normal((2, M, N))
    for b in (None, bias):
        kern, got, general, slow = kernel_outputs(unit, A, B, C, b)
        assert kern == "multiterm_f64_transposed"
        assert same_bits(got, general) and same_bits(got, slow)
        if b is None:
            rows = [0, 3, M - 1]
            assert same_bits(got[:, rows], ref_subset(unit, A, B, C, rows, range(N)))


@pytest.mark.parametrize("mode,has_bias,free", [("nearest", True, True), ("stochastic", False, True),
                                                 ("stochastic", True, False)])
def test_transposing_is_refused_when_the_bias_rounding_draws_output_indexed_counters(mode, has_bias, free):
    """MADUnit keeps multi-term units deterministic; should a caller hand the kernels a stochastic bias rounding,
    its counters (the output's flat index) would move under a transpose, so gemm_auto keeps the layout."""
    from emunum.kernels import gemm_multiterm
    from emunum.kernels.gemm_scalar import P_MODE
    from emunum.kernels.scalar import NEAREST, STOCHASTIC

    prm, _, accp, outerp = (np.array(p) for p in MADUnit.preset("h100_fp8_e4m3").multiterm_params(torch.float32))
    accp[P_MODE] = STOCHASTIC if mode == "stochastic" else NEAREST
    assert gemm_multiterm._index_free(prm, accp, outerp, has_bias) == free


def _exact_operands(rng, shape, fmt, spread, subnormal_share=0.0):
    return operands(rng, shape, fmt, spread=spread, subnormal_share=subnormal_share).numpy()


@pytest.mark.parametrize("dtype,mode", [(torch.float32, "nearest"), (torch.float32, "toward_zero"),
                                        (torch.float16, "up"), (torch.bfloat16, "odd"),
                                        (torch.float32, "stochastic"), (torch.float16, "stochastic")])
@pytest.mark.parametrize("fmt,spread,sub", [("bf16", 3, 0.0), ("fp16", 6, 0.05), ("fp32", 12, 0.0), ("fp32", 40, 0.0)])
def test_exact_slices_kernel_gives_the_general_kernels_bits(dtype, mode, fmt, spread, sub):
    """Batched A, broadcast B, ragged K and N, C and bias inside the exact sum, stochastic output rounding
    (counter = output index), cancellation of huge products next to tiny ones; 1 to LMAX slices."""
    from emunum.kernels import gemm_exact_slices, gemm_pack

    unit = MADUnit(None, "exact", fused=True, acc_rounding=mode)
    rng = np.random.default_rng(spread)
    TN = gemm_pack.TN
    K, N = 300, TN + 6
    A = _exact_operands(rng, (2, 4, K), fmt, spread, sub)
    B = _exact_operands(rng, (1, K, N), fmt, spread, sub)
    A[0, 0, :] = 0.0
    A[0, 0, :3] = [2.0**15, 2.0**-14, -2.0**15]           # 2**30 + 2**-28 - 2**30: a float64 sum gives 0
    B[0, :3, :] = np.array([2.0**15, 2.0**-14, 2.0**15])[:, None]
    A[1, 3, :] = 0.0
    C = _exact_operands(rng, (2, 4, N), "fp32", spread).astype(np.float64)
    bias = rng.standard_normal((2, 4, N)) * 2.0**-30
    C[0, 0, :], bias[0, 0, :] = 0.0, 0.0
    kern, got, general, slow = kernel_outputs(unit, A, B, C, bias, dtype=dtype)
    assert kern == "exact_slices"
    assert same_bits(got, general) and same_bits(got, slow)
    spans = [gemm_pack.span(np.ascontiguousarray(x)) for x in (A, B.transpose(0, 2, 1))]
    sig = gemm_exact_slices.plan(K, spans[0][1], spans[0][2], spans[1][1], spans[1][2])
    assert sig is not None and len(sig) >= 1  # at least two slices: the extraction is exercised
    if mode != "stochastic":
        out_fmt = unit.exact_out_format(dtype)
        assert np.all(got[0, 0] == float(ref.round_fraction(Fraction(2) ** -28, out_fmt, mode)))
        for b_, i, j in [(0, 0, 0), (0, 0, TN + 5), (1, 2, TN), (1, 3, 5), (0, 1, TN - 1)]:
            s = Fraction(C[b_, i, j]) + Fraction(bias[b_, i, j])
            dot = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(A[b_, i], B[0, :, j]))
            w = ref.round_fraction(s + dot, out_fmt, mode)
            assert same_bits(got[b_, i, j], float(w))


def test_exact_slices_plan_bounds_and_fallbacks():
    """plan: one slice when the products' span fits 53 - log2 K bits, more as the span grows, None beyond LMAX
    (the integer kernel then runs, same bits); non-finite C and bias go through the Kulisch specials."""
    from emunum.kernels import gemm_exact_slices as gs

    assert len(gs.plan(512, 3, -4, 3, -4)) == 0                       # 13 bits: one slice
    assert len(gs.plan(512, 10, -20, 10, -20)) == 1                   # 62 bits: two
    assert gs.plan(512, 127, -149, 127, -149) is None                 # 554 bits: too many
    assert len(gs.plan(1, 0, 0, 0, 0)) == 0 and len(gs.plan(1, 5, 6, 0, 0)) == 0  # all-zero operand
    unit = MADUnit(None, "exact", fused=True)
    rng = np.random.default_rng(4)
    A = rng.integers(-8, 9, (1, 3, 50)).astype(np.float32)   # small integers: one slice, the plain sum
    B = rng.integers(-8, 9, (1, 50, 4)).astype(np.float32)
    kern, got, general, _ = kernel_outputs(unit, A, B, np.full((1, 3, 4), 0.5))
    assert kern == "exact_slices" and same_bits(got, general) and same_bits(got, (A @ B + 0.5))
    A = _exact_operands(rng, (1, 3, 50), "fp32", 60)
    B = _exact_operands(rng, (1, 50, 4), "fp32", 60)
    A[0, 0, 0], B[0, 0, 0] = 2.0**120, 2.0**120
    A[0, 1, 0], B[0, 1, 1] = 2.0**-140, 2.0**-140
    C = np.zeros((1, 3, 4))
    kern, got, general, _ = kernel_outputs(unit, A, B, C)
    assert kern == "int" and same_bits(got, general)
    A = _exact_operands(rng, (1, 3, 50), "bf16", 3)
    B = _exact_operands(rng, (1, 50, 4), "bf16", 3)
    C[0, 0, 0], C[0, 1, 1], C[0, 2, 2] = np.inf, np.nan, -np.inf
    bias = np.zeros((1, 3, 4))
    bias[0, 0, 0] = -np.inf
    kern, got, general, _ = kernel_outputs(unit, A, B, C, bias)
    assert kern == "exact_slices" and same_bits(got, general) and np.isnan(got[0, 0, 0])
    A[0, 0, 0] = np.inf
    kern, got, general, _ = kernel_outputs(unit, A, B, C)
    assert kern == "general" and same_bits(got, general)
    rounded = MADUnit("bf16", "exact", acc_rounding="nearest")
    kern, got, general, _ = kernel_outputs(rounded, A[:, :, 1:], B[:, 1:], C)
    assert kern != "exact_slices" and same_bits(got, general)


@pytest.mark.parametrize("in_fmt,want", [(None, "int"), ("fp16", "multiterm_f64")])
def test_narrow_outputs_take_the_integer_kernel_unless_operands_are_off_its_grid(in_fmt, want):
    """N < N_F64 columns: the per-element integer kernel where it applies (fp32 operands on fp32's grid), else
    the padded float64 kernel (fp32 operands below fp16's grid), never the general one; the same bits."""
    unit = MADUnit(None, "fp32", fused=True, acc_rounding="toward_zero", terms=4, align_bits=20, in_fmt=in_fmt)
    rng = np.random.default_rng(12)
    A = operands(rng, (1, 6, 13), "fp32", spread=20, subnormal_share=0.1).numpy()
    B = operands(rng, (1, 13, 1), "fp32", spread=20, subnormal_share=0.1).numpy()
    A[0, 0, 0] = 2.0**-140
    C = np.zeros((1, 6, 1))
    kern, got, general, slow = kernel_outputs(unit, A, B, C)
    assert kern == want
    assert same_bits(got, general) and same_bits(got, slow) and same_bits(got, ref_gemm(unit, A, B, C))


@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "up", "stochastic"])
def test_exact_slices_two_term_flush_keeps_the_sticky_bit(mode):
    """1 + 2**-24 + 2**-80 in two slices (c = 0, no bias): the two-term flush's round-to-odd keeps 2**-80, so
    the tie at fp32's 1 + 2**-24 is broken upward, as the Kulisch accumulator does."""
    unit = MADUnit(None, "exact", fused=True, acc_rounding=mode)
    A = np.zeros((1, 2, 6), np.float32)
    A[0, 0, :3] = [1.0, 2.0**-24, 2.0**-80]
    A[0, 1, :3] = [-1.0, 2.0**-24, -2.0**-80]
    B = np.ones((1, 6, 4), np.float32)
    C = np.zeros((1, 2, 4))
    kern, got, general, slow = kernel_outputs(unit, A, B, C)
    assert kern == "exact_slices"
    assert same_bits(got, general) and same_bits(got, slow)
    if mode == "nearest":
        assert np.all(got[0, 0] == 1.0 + 2.0**-23) and np.all(got[0, 1] == -(1.0 - 2.0**-24))


def test_pack_span_and_powers_match_a_python_reading_of_the_operands():
    """gemm_pack.span (msb, lsb, finiteness) and pack_a's 2**max(floor(log2|x|), emin) against math.frexp and
    exact integer arithmetic, on fp32 values with subnormals and zeros."""
    import math

    from emunum.kernels import gemm_pack

    rng = np.random.default_rng(9)
    X = operands(rng, (2, 3, 37), "fp32", spread=60, subnormal_share=0.2).numpy()
    nz = [float(x) for x in X.ravel() if x != 0]
    msb = max(math.frexp(x)[1] - 1 for x in nz)
    lsb = min(Fraction(abs(x)).denominator.bit_length() * -1 + 1 if Fraction(abs(x)).denominator > 1
              else (int(abs(x)) & -int(abs(x))).bit_length() - 1 for x in nz)
    assert gemm_pack.span(X) == (True, msb, lsb)
    ok, hi, _ = gemm_pack.span(np.zeros((1, 2, 3), np.float32))
    assert ok and hi < -1000
    X[1, 2, 5] = np.inf
    assert not gemm_pack.span(X)[0]
    X[1, 2, 5] = 0.0
    _, P = gemm_pack.packed_a(X, -14, True)
    want = [0.0 if x == 0 else 2.0 ** max(math.frexp(float(x))[1] - 1, -14) for x in X.reshape(-1)]
    assert np.array_equal(P.reshape(-1), np.array(want))


@pytest.mark.parametrize("outer", ["fp16", "fp32"])
@pytest.mark.parametrize("signs", [(1, -1), (1, 1), (-1, 1)])
def test_promotion_blocks_that_overflow_follow_ieee_arithmetic(signs, outer):
    """Promotion blocks that overflow to +inf and then -inf give NaN (IEEE +inf + -inf), two of one sign give
    that infinity, in every kernel and in the reference (which used to return the first infinity)."""
    unit = MADUnit(None, "fp16", fused=True, acc_rounding="nearest", terms=2, align_bits=12, in_fmt="fp16",
                   promote_every=4, outer_fmt=outer)
    K = 12
    A = torch.ones(1, 2, K, dtype=torch.float16)
    B = torch.zeros(1, K, 3, dtype=torch.float16)
    B[0, 0:4, 0] = signs[0] * 30000.0     # block 0 of column 0: 4 x 30000 overflows fp16
    B[0, 8:12, 0] = signs[1] * 30000.0    # block 2 of column 0
    B[0, 0:4, 1] = 30000.0                # column 1: one overflowing block, then finite ones
    B[0, 4:8, 1] = -1.0
    B[0, :, 2] = 0.5                      # column 2: finite
    C = torch.zeros(1, 2, 3, dtype=torch.float64)
    got = run_unit(unit, A.float(), B.float(), C)
    want = np.array([[[float(ref_element(unit, A[0, i].float().tolist(), B[0, :, j].float().tolist(), 0.0))
                       for j in range(3)] for i in range(2)]])
    assert same_bits(got, want)
    if outer == "fp16":  # the blocks overflow the outer accumulator too
        expect0 = np.nan if signs[0] != signs[1] else signs[0] * np.inf
        assert same_bits(got[0, :, 0], [expect0, expect0])
    assert same_bits(got[0, :, 1], [np.inf, np.inf])
    assert np.all(np.isfinite(got[0, :, 2]))
