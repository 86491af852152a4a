"""The grad-weight operand of a 2-D block convolution under the Hadamard transform, made from the image's
distinct runs (emunum/nn/rht_columns.py), is the bits of transforming and quantising the whole im2col matrix,
zero tolerance: the operand itself over geometries and formats, and a layer's every output, gradient and the
seed stream after it with the path on and off (where it declines, the full path runs)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import emunum
from emunum.hadamard import rht_scanned
from emunum.nn import rht_columns
from emunum.nn.block_gemm import block_plan, _I
from emunum.nn.im2col import im2col_rows

RECIPE = dict(weight="nvfp4_2d", grad_rounding="stochastic", hadamard=16)  # experiments/conf/format/nvfp4.yaml
GEOMETRIES = [  # (kernel, stride, padding, dilation, (H, W)); Wo = 32 (a multiple of every block size here)
    ((3, 3), (1, 1), (1, 1), (1, 1), (7, 32)),
    ((3, 3), (1, 2), (1, 1), (1, 1), (5, 63)),
    ((5, 3), (1, 1), (2, 0), (2, 1), (9, 34)),
    ((2, 2), (1, 1), (0, 0), (3, 2), (6, 34)),  # Ho = 3 = dh: every padded row still read
    ((1, 5), (1, 1), (0, 2), (1, 1), (1, 32)),  # a Conv1d's height-1 image
    ((4, 1), (1, 1), (3, 0), (1, 1), (3, 32)),
]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride() and torch.equal(a.view(torch.int32), b.view(torch.int32))


def image(shape, seed: int) -> torch.Tensor:
    """ReLU-like activations: zeros, -0.0 and magnitudes across 2**-12 .. 2**12."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).relu() * 2.0 ** torch.randint(-12, 12, shape[:2] + (1, 1), generator=gen)
    x[0, 0, 0, :3] = -0.0
    return x


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("k,st,p,d,hw", GEOMETRIES)
def test_operand_from_distinct_runs_equals_the_whole_im2col_matrix_transformed(k, st, p, d, hw, fmt):
    plan = block_plan(emunum.Policy.make(fmt, **RECIPE))
    x = image((3, 5, *hw), hash((k, st, p, d)) % 1000)
    ho = (hw[0] + 2 * p[0] - d[0] * (k[0] - 1) - 1) // st[0] + 1
    wo = (hw[1] + 2 * p[1] - d[1] * (k[1] - 1) - 1) // st[1] + 1
    assert rht_columns.applies(plan.input, x, st, wo, plan.hadamard)
    cols, scan = rht_scanned(im2col_rows(x, k, st, p, d), plan.hadamard, plan.hadamard_seed, 0)
    assert scan is not None
    want = plan.q(cols, _I, 0, None, scan)
    got = rht_columns.rht_columns(x, k, st, p, d, ho, wo, plan.hadamard, plan.hadamard_seed,
                                  lambda t, s: plan.q(t, _I, 0, None, s))
    assert got is not None and same_bits(got, want)


def test_declines_where_padded_rows_would_be_read_by_no_output_row():
    plan = block_plan(emunum.Policy.make("nvfp4", **RECIPE))
    x = image((2, 3, 4, 32), 5)  # kernel 2, dilation 3: Ho = 1 < dh, rows 1-2 of the image are read by no tap
    assert rht_columns.rht_columns(x, (2, 1), (1, 1), (0, 0), (3, 1), 1, 32, 16, 0,
                                   lambda t, s: plan.q(t, _I, 0, None, s)) is None


@pytest.mark.parametrize("policy", [
    emunum.Policy.make("nvfp4", **RECIPE, input=emunum.RoleSpec("nvfp4", "stochastic")),  # bits by index
    emunum.Policy.make("nvfp4", **RECIPE, input="nvfp4_row"),  # a row's set of runs differs
    emunum.Policy.make("nvfp4", **RECIPE, input="e4m3"),
])
def test_does_not_apply_to_random_bits_per_row_scales_or_element_formats(policy):
    plan = block_plan(policy)
    assert not rht_columns.applies(plan.input, image((1, 2, 3, 32), 0), (1, 1), 32, 16)


def run(net, x, on: bool, monkeypatch):
    """(y, x.grad, every parameter's grad, one more seed draw) of one step from fixed seeds, and how often the
    path made the operand."""
    made = []
    with monkeypatch.context() as m:
        real = rht_columns.rht_columns

        def path(*a):
            made.append(real(*a) if on else None)
            return made[-1]

        m.setattr(rht_columns, "rht_columns", path)
        torch.manual_seed(3)
        x = x.clone().requires_grad_()
        emu = emunum.patch(nn.Sequential(net), policy=emunum.Policy.make("nvfp4", **RECIPE), functional=False)
        y = emu(x)
        y.backward(torch.randn_like(y) * 1e-3)
        out = [y.detach(), x.grad] + [p.grad for p in net.parameters()] + [torch.randint(0, 2**62, (1,))]
        for p in net.parameters():
            p.grad = None
        return out, sum(r is not None for r in made)


@pytest.mark.parametrize("kind,shape,hit", [
    ("conv2d", (4, 6, 9, 32), 1),
    ("conv1d", (5, 4, 32), 1),
    ("conv2d", (4, 6, 9, 24), 0),  # Wo = 24: runs cross output rows, the full path
    ("conv2d_inf", (4, 6, 9, 32), 0),  # the butterfly declines an infinity: the full path
])
def test_a_layer_keeps_every_bit_and_seed_draw_with_the_path_on(kind, shape, hit, monkeypatch):
    torch.manual_seed(1)
    net = nn.Conv1d(4, 24, 5, padding=2) if kind == "conv1d" else nn.Conv2d(6, 20, 3, padding=1)
    x = image(shape if len(shape) == 4 else shape + (1,), 7)
    x = x if len(shape) == 4 else x[..., 0]
    if kind == "conv2d_inf":
        x[1, 2, 3, 4] = float("inf")
    want, _ = run(net, x, False, monkeypatch)
    got, made = run(net, x, True, monkeypatch)
    assert made == hit
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.view(torch.int32) if g.is_floating_point() else g,
                           w.view(torch.int32) if w.is_floating_point() else w)
