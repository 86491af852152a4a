"""``emunum.mad.block_matmul``: block-pair sums exact, scaled exactly, accumulated on the unit, compared with
an exact-fraction reference built from the numpy reference quantiser (``BlockFormat.encode``/``decode``,
itself checked against gfloat) and the multi-term reference's rounding of rationals."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import emunum
from emunum.formats import FloatFormat, get_format
from emunum.mad import MADUnit, block_matmul
from emunum.mad.reference_multiterm import round_fraction

ACC = {"fp32": FloatFormat(8, 23), "bf16": FloatFormat(8, 7)}


def _ref_split(x: torch.Tensor, fmt, axis: int):
    """(element values, block scale per element, tensor scale) from the numpy reference quantiser."""
    codes, scodes, t = fmt.encode(x.double().numpy(), axis=axis)
    one = fmt.element.encode(np.ones(codes.shape))
    return fmt.element.decode(codes), fmt.decode(one, scodes, axis=axis, tensor_scale=1.0), t


def _reference(A, B, fa, fb, acc_fmt, mode, length):
    return _datapath(*_ref_split(A, fa, -1), *_ref_split(B, fb, -2), fa.tensor_scale or fb.tensor_scale, acc_fmt,
                     mode, length)


def _datapath(ea, sa, ta, eb, sb, tb, tensor_scaled, acc_fmt, mode, length):
    """The block datapath on one (M, K) x (K, N) pair of split operands, in fractions."""
    M, K = ea.shape
    N = eb.shape[1]
    out = np.empty((M, N))
    alpha = Fraction(float(np.float32(ta * tb)))
    for m in range(M):
        for n in range(N):
            acc = Fraction(0)
            for j0 in range(0, K, length):
                block = range(j0, min(j0 + length, K))
                p = sum((Fraction(ea[m, k]) * Fraction(eb[k, n]) for k in block), Fraction(0))
                acc = round_fraction(acc + p * Fraction(sa[m, j0]) * Fraction(sb[j0, n]), acc_fmt, mode)
            if tensor_scaled:
                acc = round_fraction(acc * alpha, acc_fmt, mode)
            out[m, n] = float(acc)
    return torch.from_numpy(out)


def _data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    return x * torch.exp2(torch.randint(-8, 8, (shape[0], 1), generator=g).float())  # rows of varied scale


@pytest.mark.parametrize("fa,fb", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp4_e2m1", "mxfp4_e2m1"), ("nvfp4", "nvfp4"),
                                   ("nvfp4", "nvfp4_2d"), ("mxfp8_e4m3", "mxfp4_e2m1"), ("mxfp6_e3m2", "mxint8"),
                                   ("mxfp8_e4m3_rceil", "mxfp8_e4m3_ceil"), ("mxfp4_e2m1_even", "mxint8_rceil")])
@pytest.mark.parametrize("acc", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["nearest", "toward_zero"])
@pytest.mark.parametrize("K", [96, 100])
def test_block_matmul_equals_the_exact_fraction_datapath(fa, fb, acc, mode, K):
    A, B = _data((3, K), K), _data((4, K), K + 1).t().contiguous()
    unit = MADUnit(acc, acc, acc_rounding=mode, mul_rounding=mode)
    got = block_matmul(A, B, fa, fb, unit)
    f_a, f_b = get_format(fa), get_format(fb)
    length = f_a.tile[1]
    want = _reference(A, B, f_a, f_b, ACC[acc], unit.acc_rounding, length)
    assert got.dtype == torch.float32
    assert torch.equal(got.double(), want)


def test_block_sums_are_scaled_and_accumulated_per_block_not_rounded_once():
    A, B = _data((2, 256), 3), _data((3, 256), 4).t().contiguous()
    unit = MADUnit("bf16", "bf16")
    got = block_matmul(A, B, "mxfp8_e4m3", "mxfp8_e4m3", unit).double()
    exact = emunum.quantize(A.double(), "mxfp8_e4m3") @ emunum.quantize(B.double(), "mxfp8_e4m3", axis=0)
    assert not torch.equal(got, emunum.quantize(exact, "bf16"))  # 8 roundings in bf16, not one


def test_stochastic_accumulation_is_seed_reproducible():
    A, B = _data((4, 128), 5), _data((4, 128), 6).t().contiguous()
    unit = MADUnit("bf16", "bf16", acc_rounding="stochastic")
    a = block_matmul(A, B, "nvfp4", "nvfp4", unit, rounding="stochastic", seed=11)
    assert torch.equal(a, block_matmul(A, B, "nvfp4", "nvfp4", unit, rounding="stochastic", seed=11))
    assert not torch.equal(a, block_matmul(A, B, "nvfp4", "nvfp4", unit, rounding="stochastic", seed=12))


def test_block_matmul_errors_name_the_field_value_and_what_is_allowed():
    A, B, u = torch.randn(2, 64), torch.randn(64, 2), MADUnit("fp32", "fp32")
    with pytest.raises(ValueError, match=r"mxfp8_e5m2 x mxfp8_e5m2 blocks of 32 need 68\.\d bits .* allowed"):
        block_matmul(A, B, "mxfp8_e5m2", "mxfp8_e5m2", u)
    with pytest.raises(ValueError, match=r"blocks of 32 along K and fmt_b=nvfp4 of 16; allowed: the same length"):
        block_matmul(A, B, "mxfp8_e4m3", "nvfp4", u)
    with pytest.raises(TypeError, match=r"fmt_b=e4m3fn: allowed: a BlockFormat"):
        block_matmul(A, B, "mxfp8_e4m3", "e4m3fn", u)
    with pytest.raises(ValueError, match=r"allowed: a one-product unit"):
        block_matmul(A, B, "mxfp8_e4m3", "mxfp8_e4m3", MADUnit("fp32", "fp32", lanes=4))
    with pytest.raises(ValueError, match=r"allowed: a one-product unit"):
        block_matmul(A, B, "mxfp8_e4m3", "mxfp8_e4m3", MADUnit.preset("h100_fp8_e4m3"))
    with pytest.raises(ValueError, match=r"A \(\.\.\., M, K\) and B \(\.\.\., K, N\) with the same batch dims"):
        block_matmul(A, B.t(), "mxfp8_e4m3", "mxfp8_e4m3", u)


# ---- patched layers on MAD units with block formats ------------------------------------------------------
def test_patched_linear_runs_its_three_gemms_as_block_matmuls_on_the_units():
    from torch import nn

    torch.manual_seed(7)
    lin = nn.Linear(64, 16)
    units = (MADUnit("bf16", "bf16"), MADUnit("fp16", "fp16"), MADUnit("fp32", "fp32", acc_rounding="toward_zero"))
    pol = emunum.Policy.make("nvfp4", weight="nvfp4_2d", grad_rounding="nearest", mad=units[0],
                             mad_backward=units[1:])
    emu = emunum.patch(nn.Sequential(lin), policy=pol)
    x = torch.randn(48, 64, requires_grad=True)
    y = emu(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    xd, w = x.detach(), lin.weight.detach()
    assert torch.equal(y.detach(), block_matmul(xd, w.t(), "nvfp4", "nvfp4_2d", units[0]) + lin.bias.detach())
    assert torch.equal(x.grad, block_matmul(gy, w, "nvfp4", "nvfp4_2d", units[1]))
    assert torch.equal(lin.weight.grad, block_matmul(gy.t(), xd, "nvfp4", "nvfp4", units[2]))
    # the accumulator matters: bf16 accumulation differs from the fp32 GEMM on the same quantised operands
    assert not torch.equal(y.detach(), emunum.patch(nn.Sequential(nn.Linear(64, 16)), "nvfp4")[0](xd))


def test_patched_block_layers_on_mad_units_check_formats_at_patch_time():
    from torch import nn

    u = MADUnit("fp32", "fp32")
    with pytest.raises(ValueError, match=r"mxfp8_e4m3 x mxfp8_e5m2|mxfp8_e5m2 x mxfp8_e4m3"):
        emunum.patch(nn.Sequential(nn.Linear(4, 4)), "mxfp8_e4m3", grad="mxfp8_e5m2", mad=u)
    with pytest.raises(ValueError, match=r"grad_output=e5m2\): .*allowed: a BlockFormat in each of input, weight"):
        emunum.patch(nn.Sequential(nn.Linear(4, 4)), "mxfp8_e4m3", grad="e5m2", mad=u)
    with pytest.raises(ValueError, match=r"mxfp8_e5m2 x mxfp8_e5m2|blocks of 32 need"):
        emunum.patch(nn.MultiheadAttention(8, 2), "mxfp8_e4m3", weight="mxfp8_e4m3", grad="mxfp8_e5m2", mad=u)


def test_a_nan_block_makes_its_rows_outputs_nan_and_only_those():
    A, B = _data((3, 64), 8), _data((2, 64), 9).t().contiguous()
    A[1, 40] = float("nan")
    got = block_matmul(A, B, "mxfp8_e4m3", "mxfp8_e4m3", MADUnit("fp32", "fp32"))
    assert torch.isnan(got[1]).all() and torch.isfinite(got[[0, 2]]).all()


@pytest.mark.parametrize("fa,fb", [("mxfp8_e4m3", "mxfp8_e4m3"), ("nvfp4", "nvfp4_2d")])
def test_batched_block_matmul_quantises_the_batch_as_one_tensor(fa, fb):
    A = torch.stack([_data((3, 48), 20), _data((3, 48), 21)])
    B = torch.stack([_data((5, 48), 22), _data((5, 48), 23)]).transpose(-1, -2)
    unit = MADUnit("bf16", "bf16")
    got = block_matmul(A, B, fa, fb, unit)
    f_a, f_b = get_format(fa), get_format(fb)
    # the reference quantises each operand as one tensor (one tensor scale), then multiplies batch by batch
    ea, sa, ta = _ref_split(A, f_a, -1)
    eb, sb, tb = _ref_split(B, f_b, -2)
    assert got.shape == (2, 3, 5)
    for i in range(2):
        want = _datapath(ea[i], sa[i], ta, eb[i], sb[i], tb, f_a.tensor_scale or f_b.tensor_scale, ACC["bf16"],
                         unit.acc_rounding, f_a.tile[1])
        assert torch.equal(got[i].double(), want)


def test_patched_attention_runs_its_batched_products_as_block_matmuls_on_the_units():
    from torch import nn

    torch.manual_seed(8)
    E, H, L, N = 32, 2, 16, 2
    mha = nn.MultiheadAttention(E, H)
    unit = MADUnit("bf16", "bf16")
    emu = emunum.patch(mha, "nvfp4", grad_rounding="nearest", mad=unit)
    x = torch.randn(L, N, E, requires_grad=True)
    out, weights = emu(x, x, x)
    W, b = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
    proj = (block_matmul(x.detach().reshape(-1, E), W.t(), "nvfp4", "nvfp4", unit)).reshape(L, N, 3 * E) + b
    q, k, v = (proj[..., i * E:(i + 1) * E].reshape(L, N * H, E // H).transpose(0, 1) for i in range(3))
    scores = block_matmul(q * math.sqrt(1.0 / (E // H)), k.transpose(-2, -1), "nvfp4", "nvfp4", unit)
    probs = torch.softmax(scores, dim=-1)
    ctx = block_matmul(probs, v, "nvfp4", "nvfp4", unit).transpose(0, 1).reshape(L * N, E)
    want = block_matmul(ctx, mha.out_proj.weight.detach().t(), "nvfp4", "nvfp4", unit) + mha.out_proj.bias.detach()
    assert torch.equal(out.detach(), want.view(L, N, E))
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(mha.in_proj_weight.grad).all()


def _mxplus_split(x: torch.Tensor, fmt, axis: int):
    """MX+ operands: values from ``emunum.quantize`` (tests/formats/test_mxplus.py checks them against the
    definition), each block's scale 2**clip(floor(log2 amax) - emax, -127, 127) recomputed here."""
    q = emunum.quantize(x.double(), fmt, axis=axis).numpy()
    w = np.moveaxis(x.double().numpy(), axis, -1)
    L = fmt.block_size
    s = np.empty_like(w)
    for j0 in range(0, w.shape[-1], L):
        amax = np.abs(w[..., j0:j0 + L]).max(axis=-1, keepdims=True)
        e = np.clip(np.frexp(amax)[1] - 1 - fmt.element_emax, -127, 127)
        s[..., j0:j0 + L] = np.ldexp(1.0, e)
    s = np.moveaxis(s, -1, axis)
    return q / s, s, 1.0


@pytest.mark.parametrize("fa,fb", [("mxfp4_plus", "mxfp4_plus"), ("mxfp8_e4m3_plus", "mxfp6_e2m3_plus"),
                                   ("mxfp6_e3m2_plus", "mxfp8_plus")])
@pytest.mark.parametrize("acc", ["fp32", "bf16"])
@pytest.mark.parametrize("K", [96, 100])
def test_mx_plus_block_matmul_equals_the_exact_fraction_datapath(fa, fb, acc, K):
    A, B = _data((3, K), K), _data((4, K), K + 1).t().contiguous()
    unit = MADUnit(acc, acc)
    f_a, f_b = get_format(fa), get_format(fb)
    want = _datapath(*_mxplus_split(A, f_a, -1), *_mxplus_split(B, f_b, -2), False, ACC[acc], unit.acc_rounding, 32)
    assert torch.equal(block_matmul(A, B, fa, fb, unit).double(), want)
    assert not torch.equal(want, block_matmul(A, B, fa.replace("_plus", ""), fb.replace("_plus", ""), unit).double())


def test_patched_linear_with_mx_plus_formats_runs_its_gemms_as_block_matmuls():
    from torch import nn

    torch.manual_seed(8)
    lin = nn.Linear(64, 16)
    units = (MADUnit("bf16", "bf16"), MADUnit("fp32", "fp32"), MADUnit("fp16", "fp16"))
    pol = emunum.Policy.make("mxfp4_plus", weight="mxfp8_e4m3_plus", grad_rounding="nearest", mad=units[0],
                             mad_backward=units[1:])
    emu = emunum.patch(nn.Sequential(lin), policy=pol)
    x = torch.randn(48, 64, requires_grad=True)
    y = emu(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    xd, w = x.detach(), lin.weight.detach()
    bias = lin.bias.detach()
    assert torch.equal(y.detach(), block_matmul(xd, w.t(), "mxfp4_plus", "mxfp8_e4m3_plus", units[0]) + bias)
    assert torch.equal(x.grad, block_matmul(gy, w, "mxfp4_plus", "mxfp8_e4m3_plus", units[1]))
    assert torch.equal(lin.weight.grad, block_matmul(gy.t(), xd, "mxfp4_plus", "mxfp4_plus", units[2]))
    assert not torch.equal(y.detach(), block_matmul(xd, w.t(), "mxfp4", "mxfp8_e4m3", units[0]) + bias)
