"""4/6 block-scale selection (``BlockFormat(four_over_six=...)``) equals, bit for bit, TransformerEngine's
pure-PyTorch reference and (where the two references agree) mit-han-lab/fouroversix's. Neither installs on this
CPU machine (TransformerEngine needs CUDA to build; fouroversix imports its CUDA/Triton kernels), so each
reference's definition is written below from its source, as torch float32 code:

- TE: https://github.com/NVIDIA/TransformerEngine/blob/d0067d0da6cb01811b8072a7d304f0e00344ce2b/transformer_engine/pytorch/custom_recipes/reference_nvfp4.py
  (``_quantize_blockwise_reference`` and ``_quantize_blockwise_4over6_reference``, error not in fast math)
- fouroversix: https://github.com/mit-han-lab/fouroversix/blob/dadfad6901d473a734fe71e0b082e70ee993e23a/src/fouroversix/quantize/pytorch/reference.py
  (``compute_nv_scale_factors``, ``select_fouroversix``, ``fake_quantize_to_e2m1``)

Where they differ, emunum follows TE (docs/nvfp4.md): errors are summed in element order (fouroversix sums with
torch.sum, whose order is torch's), and a scaled element above 6 saturates (fouroversix's e2m1 rounding leaves
|x| >= 7 at 8, possible when the e4m3 scale is subnormal and rounds down).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum.block_quantize import quantize_block_checked
from emunum.formats import BlockFormat, FourOverSix, RoundMode
from emunum.rng import seed_key

F32MAX = torch.finfo(torch.float32).max
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def fmt_of(metric, bound, tile=16, outer="tensor"):
    return BlockFormat("fp4_e2m1", tile, "e4m3fn", scale_rule="amax", outer_scale=outer,
                       four_over_six=FourOverSix(metric, bound))


def te_e2m1(v):
    """TE's cast_to_fp4x2 then cast_from_fp4x2 as values: v in [-6, 6] to nearest, ties to the even code."""
    a = v.abs()
    q = torch.where(a <= 0.25, 0.0, torch.where(a < 0.75, 0.5, torch.where(a <= 1.25, 1.0, torch.where(
        a < 1.75, 1.5, torch.where(a <= 2.5, 2.0, torch.where(a < 3.5, 3.0, torch.where(a <= 5.0, 4.0, 6.0)))))))
    return torch.where(v < 0, -q, q)


def te_tree(err):
    """TE's _sum_4over6_2d_error: 16 row errors (dim 0) added pairwise at distances 8, 4, 2, 1."""
    r = err
    for h in (8, 4, 2, 1):
        r = r[:h] + r[h:2 * h]
    return r[0]


def te_reference(x, metric, bound, tile_rows=1, row_scaled=False, error_domain="amax"):
    """(values q * S * gds, block scales S) of TE's 4/6 reference for a 2-D float32 x (sizes multiples of 16).
    error_domain "gds" dequantises the candidates with the global decode scale instead of amax / (6 * bound):
    the algebraically equal form that radixark/miles#1261 found to pick differently on near ties."""
    m, n = x.shape
    xb = x.view(m, n // 16, 16)
    if tile_rows == 16:
        amax_t = x.abs().unfold(0, 16, 16).unfold(1, 16, 16).amax(dim=(-1, -2))
        vmax = amax_t.repeat_interleave(16, dim=0).unsqueeze(-1)
    else:
        vmax = xb.abs().amax(dim=-1, keepdim=True)
    gamax = x.abs().amax(dim=1).view(m, 1, 1) if row_scaled else x.abs().max().view(1)
    ges = torch.clamp(torch.tensor(6.0 * bound) / gamax, max=F32MAX)
    ges = torch.where(ges == 0, torch.ones_like(ges), ges)
    gds = torch.tensor(1.0) / ges
    base = (vmax / torch.tensor(6.0)) * ges
    s4 = torch.clamp(base * 1.5, -448, 448).to(torch.float8_e4m3fn).float()
    s6 = torch.clamp(base, -448, 448).to(torch.float8_e4m3fn).float()
    qs, errs = [], []
    for s in (s4, s6):
        enc = torch.clamp(torch.tensor(1.0) / (s * gds), max=F32MAX)
        q = te_e2m1(torch.clamp(xb * enc, -6.0, 6.0))
        err = torch.zeros_like(vmax)
        for i in range(16):
            if error_domain == "amax":
                val = ((q[:, :, i] * s[:, :, 0]) * gamax.view(-1, 1)) / torch.tensor(6.0 * bound)
            else:
                val = (q[:, :, i] * s[:, :, 0]) * gds.view(-1, 1)
            d = val - xb[:, :, i]
            err = err + (d * d if metric == "mse" else d.abs()).unsqueeze(-1)
        qs.append(q)
        errs.append(err)
    if tile_rows == 16:
        e4 = te_tree(errs[0].view(m // 16, 16, n // 16).transpose(0, 1)).repeat_interleave(16, dim=0)
        e6 = te_tree(errs[1].view(m // 16, 16, n // 16).transpose(0, 1)).repeat_interleave(16, dim=0)
        pick4 = (e4 < e6).unsqueeze(-1)
    else:
        pick4 = errs[0] < errs[1]
    q = torch.where(pick4, qs[0], qs[1])
    s = torch.where(pick4, s4, s6)
    values = (q.double() * s.double() * gds.double().view(-1, 1, 1)).float().view(m, n)
    return values, s.view(m, n // 16)


def fos_e2m1(v):
    """fouroversix's fake_quantize_to_e2m1, round to nearest: no clamp to 6."""
    a = v.abs()
    q = torch.where(a < 2, torch.round(2 * a) / 2, torch.where(a < 4, torch.round(a), 2 * torch.round(a / 2)))
    return v.sign() * q


def fos_reference(x, metric):
    """(values, block scales) of fouroversix's reference 4/6 (1-D blocks of 16 of the flattened x, bound 256)."""
    blocks = x.reshape(-1, 16)
    amax = x.abs().max().float()
    enc = torch.tensor(6.0 * 256) / amax
    dec = 1 / (torch.tensor(6.0 * 256) / amax)
    hp6 = blocks.abs().max(dim=-1).values / torch.tensor(6.0) * enc
    cands = []
    for hp in (hp6 * 1.5, hp6):
        s = hp.to(torch.float8_e4m3fn).float()
        xs = torch.where(s.unsqueeze(1) != 0, blocks * (1 / (dec * s.unsqueeze(1))), 0)
        q = fos_e2m1(xs)
        deq = q * s.unsqueeze(1) * amax / torch.tensor(6.0 * 256)
        d = deq - blocks
        err = {"absmax": d.abs().max(dim=-1).values, "mae": d.abs().sum(dim=-1), "mse": (d ** 2).sum(dim=-1)}[metric]
        cands.append((q, s, err))
    (q4, s4, e4), (q6, s6, e6) = cands
    pick4 = e4 < e6
    q = torch.where(pick4.unsqueeze(1), q4, q6)
    s = torch.where(pick4, s4, s6)
    dec_t = (torch.tensor(1.0) / (torch.tensor(6.0 * 256) / amax)).double()
    return (q.double() * s.double().unsqueeze(1) * dec_t).float().reshape(x.shape), s.reshape(x.shape[0], -1)


def emu(x, fmt, mode=RoundMode.NEAREST):
    values, scales = quantize_block_checked(x, fmt, mode, int(seed_key(0)), 32, -1, return_scales=True)
    return values, scales.reshape(scales.shape[1], scales.shape[2]).float()


def bits_equal(a, b):
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def sample(seed, m=64, n=128):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * torch.exp2(torch.randint(-6, 7, (m, 1), generator=g).float())
    x[0, :16] *= 40.0  # one outlier block, so that the tensor amax lies far above most blocks
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("row_scaled", [False, True])
@pytest.mark.parametrize("bound", [256, 448])
@pytest.mark.parametrize("metric", ["mae", "mse"])
def test_1d_blocks_equal_te_reference_bits_values_and_scales(metric, bound, row_scaled, seed):
    x = sample(seed)
    want, want_s = te_reference(x, metric, bound, row_scaled=row_scaled)
    got, got_s = emu(x, fmt_of(metric, bound, outer="row" if row_scaled else "tensor"))
    assert bits_equal(got, want)
    assert torch.equal(got_s, want_s)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("bound", [256, 448])
@pytest.mark.parametrize("metric", ["mae", "mse"])
def test_16x16_tiles_equal_te_reference_with_its_tree_sum_of_row_errors(metric, bound, seed):
    x = sample(seed, 64, 96)
    want, want_s = te_reference(x, metric, bound, tile_rows=16)
    got, got_s = emu(x, fmt_of(metric, bound, tile=(16, 16)))
    assert bits_equal(got, want)
    assert torch.equal(got_s.repeat_interleave(16, dim=0), want_s)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("metric", ["absmax", "mae", "mse"])
def test_equals_fouroversix_reference_on_random_tensors(metric, seed):
    # rows spread over 2**-3..2**3, so that every block scale is an e4m3 normal (where the references agree)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 128, generator=g) * torch.exp2(torch.randint(-3, 4, (64, 1), generator=g).float())
    want, want_s = fos_reference(x, metric)
    got, got_s = emu(x, fmt_of(metric, 256))
    assert bits_equal(got, want)
    assert torch.equal(got_s, want_s)


def near_tie_rows(metric):
    """Blocks of quarter-integers under a tensor amax of 5 (gds = 1 / (1536 / 5) is inexact), many of them exact
    or near ties between the candidates; ``rows``: those where the amax-domain error (TE, fouroversix) and the
    gds-domain error (radixark/miles#1261) choose differently."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-12, 13, (20000, 16), generator=g).float() * 0.25
    x[0, 0] = 5.0
    a, _ = te_reference(x, metric, 256)
    b, _ = te_reference(x, metric, 256, error_domain="gds")
    return x, (a != b).any(dim=1).nonzero().flatten()


@pytest.mark.parametrize("metric", ["mae", "mse"])
def test_near_tie_blocks_follow_the_amax_domain_error_of_te_not_the_decode_scale_form(metric):
    x, rows = near_tie_rows(metric)
    assert rows.numel() >= 5  # the planted set holds blocks where the two forms choose differently
    want, want_s = te_reference(x, metric, 256)
    got, got_s = emu(x, fmt_of(metric, 256))
    assert bits_equal(got[rows], want[rows])
    assert bits_equal(got, want) and torch.equal(got_s, want_s)


def test_exact_tie_keeps_the_map_to_6_candidate():
    # tensor amax 6: ges = 256, S6 = 256, S4 = 384; 6 and 3 land exactly on e2m1 values under both (6, 3 and
    # 4, 2), so both errors are 0: a tie, which keeps S6
    x = torch.zeros(1, 16)
    x[0, :2] = torch.tensor([6.0, 3.0])
    want, want_s = te_reference(x, "mae", 256)
    got, s = emu(x, fmt_of("mae", 256))
    assert float(want_s[0, 0]) == 256.0 and torch.equal(s, want_s)
    assert bits_equal(got, want) and bits_equal(got, x)


def subnormal_scale_rows():
    """Tensor amax 6 (ges = 256) and a block whose map-to-6 scale vmax / 6 * 256 lies in e4m3's subnormals
    (below 1.6 * 2**-9), where it can round down far enough that scaled elements pass 6."""
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(2, 16)
    x[0, 0] = 6.0
    x[1] = torch.rand(16, generator=g) * (1.6 * 2.0 ** -9 * 6 / 256)
    return x


def test_subnormal_scale_block_saturates_as_te_where_fouroversix_rounds_past_six():
    x = subnormal_scale_rows()
    want, _ = te_reference(x, "absmax", 256)
    other, _ = fos_reference(x, "absmax")
    got, _ = emu(x, fmt_of("absmax", 256))
    assert bits_equal(got, want)
    assert not bits_equal(other, want)  # the references differ here; emunum follows TE


@pytest.mark.parametrize("metric", ["mae", "mse", "absmax"])
def test_block_whose_scales_round_to_zero_is_zero_as_in_te(metric):
    # tensor amax 1e4 (ges = 0.1536): a block of ~1e-6 asks for scales ~3e-8, below half of e4m3's smallest
    # 2**-9: both candidates' scales are 0, the block's values 0 (TE: encode scale FLT_MAX, values 6 * 0)
    x = torch.full((2, 16), 1e-6)
    x[1, 1] = -2e-6
    x[0, 0] = 1e4
    want, want_s = te_reference(x, metric if metric != "absmax" else "mae", 256)
    got, got_s = emu(x, fmt_of(metric, 256))
    assert float(want_s[1, 0]) == 0.0 and bits_equal(got, want) and torch.equal(got_s, want_s)
    assert torch.equal(got[1], torch.zeros(16))
