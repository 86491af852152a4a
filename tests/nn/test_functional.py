"""Functional GEMMs inside a patched model: each op gives the bits of its reference composition of roundings
(``Q_out(op(Q_a(a), Q_b(b)))``, forward and backward), for element formats, block formats and MAD units."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emunum
from emunum.autograd import Quantizer

ELEMENT = ["e4m3fn", "e5m2"]


def tame(*shape, seed=0):
    """Values in +-[0.5, 8): their e4m3/e5m2 roundings have products whose fp32 sums are exact in any order."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.rand(*shape, generator=g) * 7.5 + 0.5
    sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
    return mag * sign


class Fn(nn.Module):
    """A module (not swappable) that runs ``fn(self, *inputs)`` in its forward; ``w`` is a Parameter."""

    def __init__(self, fn, w=None, b=None):
        super().__init__()
        self.fn = fn
        self.w = None if w is None else nn.Parameter(w.clone())
        self.b = None if b is None else nn.Parameter(b.clone())

    def forward(self, *xs):
        return self.fn(self, *xs)


def nearest_policy(fmt):
    return emunum.Policy.make(fmt, grad_rounding="nearest")


def refq(fmt):
    """The reference rounding of one role: fmt forward, fmt backward, both to nearest."""
    return Quantizer(forward=fmt, backward=fmt, forward_rounding="nearest", backward_rounding="nearest")


def run(module, xs, policy):
    """(output, input grads, parameter grads) of the patched module for a fixed output gradient."""
    m = emunum.patch(copy.deepcopy(module), policy)
    xs = [x.clone().requires_grad_(True) for x in xs]
    y = m(*xs)
    y.backward(tame(*y.shape, seed=9))
    return y, [x.grad for x in xs], [p.grad for p in m.parameters()]


def ref_grads(fn, xs, params):
    xs = [x.clone().requires_grad_(True) for x in xs]
    ps = [p.clone().requires_grad_(True) for p in params]
    y = fn(xs, ps)
    y.backward(tame(*y.shape, seed=9))
    return y, [x.grad for x in xs], [p.grad for p in ps]


def equal(a, b) -> None:
    """Bit for bit, NaN where NaN (zero tolerance)."""
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def assert_same(got, want):
    (y, gx, gp), (ry, rgx, rgp) = got, want
    equal(y, ry)
    assert len(gx + gp) == len(rgx + rgp)
    for a, b in zip(gx + gp, rgx + rgp):
        equal(a, b)


CASES = {  # name: (fn(module, *xs), input shapes, weight shape or None, reference(q, xs, ps) with q(t) rounding)
    "matmul_acts": (lambda m, a, b: a @ b, [(2, 3, 5, 8), (2, 3, 8, 4)], None,
                    lambda q, xs, ps: q(q(xs[0]) @ q(xs[1]))),
    "matmul_broadcast": (lambda m, a, b: torch.matmul(a, b), [(2, 3, 5, 8), (8, 4)], None,
                         lambda q, xs, ps: q(torch.matmul(q(xs[0]), q(xs[1])))),
    "matmul_vector": (lambda m, a, b: torch.matmul(a, b), [(5, 8), (8,)], None,
                      lambda q, xs, ps: q(torch.matmul(q(xs[0]), q(xs[1])))),
    "x_at_weight": (lambda m, x: x @ m.w, [(4, 6, 8)], (8, 5), lambda q, xs, ps: q(q(xs[0]) @ q(ps[0]))),
    "bmm": (lambda m, a, b: torch.bmm(a, b), [(3, 4, 8), (3, 8, 2)], None,
            lambda q, xs, ps: q(torch.bmm(q(xs[0]), q(xs[1])))),
    "mm_method": (lambda m, a: a.mm(m.w.t()), [(4, 8)], (5, 8), lambda q, xs, ps: q(q(xs[0]).mm(q(ps[0]).t()))),
    "addmm_conv1d_style": (lambda m, x: torch.addmm(m.b, x, m.w), [(6, 8)], (8, 5),
                           lambda q, xs, ps: q(torch.addmm(q(ps[1]), q(xs[0]), q(ps[0])))),
    "addmm_scaled_activation_term": (lambda m, c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
                                     [(4, 3), (4, 8), (8, 3)], None,
                                     lambda q, xs, ps: q(torch.addmm(xs[0], q(xs[1]), q(xs[2]), beta=0.5,
                                                                     alpha=2.0))),
    "baddbmm": (lambda m, c, a, b: torch.baddbmm(c, a, b), [(2, 4, 3), (2, 4, 8), (2, 8, 3)], None,
                lambda q, xs, ps: q(torch.baddbmm(xs[0], q(xs[1]), q(xs[2])))),
    "linear": (lambda m, x: F.linear(x, m.w, m.b), [(2, 4, 8)], (5, 8),
               lambda q, xs, ps: q(F.linear(q(xs[0]), q(ps[0]), q(ps[1])))),
    "conv2d": (lambda m, x: F.conv2d(x, m.w, m.b, padding=1), [(2, 3, 6, 6)], (4, 3, 3, 3),
               lambda q, xs, ps: q(F.conv2d(q(xs[0]), q(ps[0]), q(ps[1]), padding=1))),
    # torch's own keyword names (BLOOM's attention calls torch.baddbmm(input=, batch1=, batch2=, beta=, alpha=))
    "kw_matmul": (lambda m, a, b: torch.matmul(input=a, other=b), [(2, 5, 8), (2, 8, 4)], None,
                  lambda q, xs, ps: q(q(xs[0]) @ q(xs[1]))),
    "kw_mm": (lambda m, a: torch.mm(input=a, mat2=m.w), [(4, 8)], (8, 5), lambda q, xs, ps: q(q(xs[0]) @ q(ps[0]))),
    "kw_bmm_method": (lambda m, a, b: a.bmm(mat2=b), [(3, 4, 8), (3, 8, 2)], None,
                      lambda q, xs, ps: q(torch.bmm(q(xs[0]), q(xs[1])))),
    "kw_mv": (lambda m, a, v: torch.mv(a, vec=v), [(5, 8), (8,)], None,
              lambda q, xs, ps: q(torch.mv(q(xs[0]), q(xs[1])))),
    "kw_addmm": (lambda m, x: torch.addmm(input=m.b, mat1=x, mat2=m.w, beta=1.0, alpha=1.0), [(6, 8)], (8, 5),
                 lambda q, xs, ps: q(torch.addmm(q(ps[1]), q(xs[0]), q(ps[0])))),
    "kw_baddbmm": (lambda m, c, a, b: torch.baddbmm(input=c, batch1=a, batch2=b, beta=0.5, alpha=0.25),
                   [(2, 4, 3), (2, 4, 8), (2, 8, 3)], None,
                   lambda q, xs, ps: q(torch.baddbmm(xs[0], q(xs[1]), q(xs[2]), beta=0.5, alpha=0.25))),
    "kw_baddbmm_method": (lambda m, c, a, b: c.baddbmm(batch1=a, batch2=b), [(2, 4, 3), (2, 4, 8), (2, 8, 3)], None,
                          lambda q, xs, ps: q(torch.baddbmm(xs[0], q(xs[1]), q(xs[2])))),
    "kw_linear": (lambda m, x: F.linear(input=x, weight=m.w, bias=m.b), [(2, 4, 8)], (5, 8),
                  lambda q, xs, ps: q(F.linear(q(xs[0]), q(ps[0]), q(ps[1])))),
    "kw_conv2d": (lambda m, x: F.conv2d(input=x, weight=m.w, bias=m.b, padding=1), [(2, 3, 6, 6)], (4, 3, 3, 3),
                  lambda q, xs, ps: q(F.conv2d(q(xs[0]), q(ps[0]), q(ps[1]), padding=1))),
    "bilinear": (lambda m, a, b: F.bilinear(a, b, m.w, m.b), [(2, 3, 8), (2, 3, 6)], (4, 8, 6),
                 lambda q, xs, ps: q(q(torch.einsum("boj,bj->bo", q(q(torch.einsum(
                     "bi,oij->boj", q(xs[0].reshape(6, 8)), q(ps[0])))), q(xs[1].reshape(6, 6)))) + q(ps[1])).reshape(
                     2, 3, 4)),
    "conv_transpose2d": (lambda m, x: F.conv_transpose2d(x, m.w, m.b, stride=2, padding=1, output_padding=1),
                         [(2, 3, 4, 4)], (3, 4, 3, 3), lambda q, xs, ps: q(F.conv_transpose2d(
                             q(xs[0]), q(ps[0]), q(ps[1]), stride=2, padding=1, output_padding=1))),
    "dot": (lambda m, a, b: torch.dot(a, b).reshape(1), [(8,), (8,)], None,  # (1,): the harness's gradient
            lambda q, xs, ps: q(q(xs[0]) @ q(xs[1])).reshape(1)),
    "vdot_method": (lambda m, a: a.vdot(m.w).reshape(1), [(8,)], (8,),
                    lambda q, xs, ps: q(q(xs[0]) @ q(ps[0])).reshape(1)),
    "inner": (lambda m, a, b: torch.inner(a, b), [(2, 3, 8), (5, 8)], None,
              lambda q, xs, ps: q(q(xs[0]) @ q(xs[1]).t())),
    "tensordot": (lambda m, a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])), [(3, 4, 2), (4, 2, 5)], None,
                  lambda q, xs, ps: q(q(xs[0]).reshape(3, 8) @ q(xs[1]).reshape(8, 5))),
    "tensordot_int": (lambda m, a: torch.tensordot(a, m.w, dims=1), [(3, 8)], (8, 5),
                      lambda q, xs, ps: q(q(xs[0]) @ q(ps[0]))),
    "tensordot_tensor_dims": (lambda m, a, b: torch.tensordot(a, b, dims=torch.tensor([[-1], [1]])),
                              [(3, 4, 2), (4, 2, 5)], None,
                              lambda q, xs, ps: q(q(xs[0]).reshape(12, 2) @ q(xs[1]).transpose(0, 1).reshape(
                                  2, 20)).reshape(3, 4, 4, 5)),
    "addmv": (lambda m, v: torch.addmv(m.b, m.w, v, beta=0.5), [(8,)], (5, 8),
              lambda q, xs, ps: q(torch.addmv(q(ps[1]), q(ps[0]), q(xs[0]), beta=0.5))),
    "addbmm": (lambda m, c, a, b: torch.addbmm(c, a, b), [(4, 3), (2, 4, 8), (2, 8, 3)], None,
               lambda q, xs, ps: q(torch.addmm(xs[0], q(xs[1]).permute(1, 0, 2).reshape(4, 16),
                                               q(xs[2]).reshape(16, 3)))),
    "multi_dot": (lambda m, a, b, c: torch.linalg.multi_dot([a, b, c]), [(3, 8), (8, 4), (4, 5)], None,
                  lambda q, xs, ps: q(q(q(q(xs[0]) @ q(xs[1]))) @ q(xs[2]))),
    "chain_matmul": (lambda m, a, b: torch.chain_matmul(a, b), [(3, 8), (8, 4)], None,
                     lambda q, xs, ps: q(q(xs[0]) @ q(xs[1]))),
}
BIASED = {"addmm_conv1d_style": 1, "kw_addmm": 1, "linear": 0, "kw_linear": 0, "conv2d": 0, "kw_conv2d": 0,
          "bilinear": 0, "conv_transpose2d": 1, "addmv": 0}


@pytest.mark.parametrize("fmt", ELEMENT)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_functional_gemm_rounds_its_operands_output_and_gradients_like_a_layer(case, fmt):
    fn, shapes, wshape, ref = CASES[case]
    xs = [tame(*s, seed=i) for i, s in enumerate(shapes)]
    params = []
    if wshape is not None:
        params = [tame(*wshape, seed=7)]
        if case in BIASED:  # the bias has the weight's output dimension
            params.append(tame(wshape[BIASED[case]], seed=8))
    module = Fn(fn, *params)
    got = run(module, xs, nearest_policy(fmt))
    q = refq(fmt)
    want = ref_grads(lambda xs_, ps_: ref(q, xs_, ps_), xs, params)
    assert_same(got, want)
    plain = module(*xs)
    assert not torch.equal(got[0], plain)  # the emulation changed something (the values are off the grid)


EINSUMS = {  # equation: (shapes, reference(q, ts) as rounded two-operand products, left to right)
    "bij,bjk->bik": ([(2, 4, 8), (2, 8, 3)], lambda q, t: q(torch.bmm(q(t[0]), q(t[1])))),
    "bhqd,bhkd->bhqk": ([(2, 2, 5, 8), (2, 2, 6, 8)], lambda q, t: q(q(t[0]) @ q(t[1]).transpose(-1, -2))),
    "ij,jk": ([(4, 8), (8, 3)], lambda q, t: q(q(t[0]) @ q(t[1]))),
    "...ij,jk->...ik": ([(2, 3, 4, 8), (8, 5)], lambda q, t: q(q(t[0]) @ q(t[1]))),
    "bi,ij,jk->bk": ([(3, 8), (8, 4), (4, 5)], lambda q, t: q(q(q(q(t[0]) @ q(t[1]))) @ q(t[2]))),
    "ijk,kj->i": ([(3, 4, 8), (8, 4)], lambda q, t: q(q(t[0]).reshape(3, 32) @ q(t[1]).t().reshape(32, 1))[:, 0]),
}


@pytest.mark.parametrize("fmt", ELEMENT)
@pytest.mark.parametrize("eq", sorted(EINSUMS))
def test_einsum_is_a_chain_of_rounded_products(eq, fmt):
    shapes, ref = EINSUMS[eq]
    xs = [tame(*s, seed=i) for i, s in enumerate(shapes)]
    got = run(Fn(lambda m, *ts: torch.einsum(eq, *ts)), xs, nearest_policy(fmt))
    q = refq(fmt)
    assert_same(got, ref_grads(lambda ts, ps: ref(q, ts), xs, []))


UNIT_EINSUMS = {  # torch.einsum runs these as an element-wise product, no GEMM: (equation, shapes)
    "longformer_mask": ("bcxd,bcyd->bcxy", [(2, 3, 4, 1), (2, 3, 5, 1)]),  # its sliding-window mask
    "size_1_in_both": ("ij,jk->ik", [(3, 1), (1, 4)]),
    "size_1_in_second": ("ij,jk->ik", [(3, 5), (1, 4)]),  # j summed out of the first operand first
    "size_1_in_first": ("ij,jk->ik", [(3, 1), (5, 4)]),
    "outer": ("ij,k->ijk", [(3, 5), (4,)]),
}


@pytest.mark.parametrize("fmt", ELEMENT)
@pytest.mark.parametrize("case", sorted(UNIT_EINSUMS))
def test_an_einsum_that_torch_runs_without_a_gemm_is_torchs_own_product_unrounded(case, fmt):
    eq, shapes = UNIT_EINSUMS[case]
    xs = [tame(*s, seed=i) for i, s in enumerate(shapes)]
    module = Fn(lambda m, *ts: torch.einsum(eq, *ts))
    got = run(module, xs, nearest_policy(fmt))
    assert_same(got, ref_grads(lambda ts, ps: torch.einsum(eq, *ts), xs, []))
    xs = [x.requires_grad_(True) for x in xs]
    plain = emunum.coverage(copy.deepcopy(module), *xs)
    cov = emunum.coverage(emunum.patch(copy.deepcopy(module), fmt), *xs)
    assert plain.total_flops == cov.total_flops == 0


CHAINS = {  # a GEMM beside a summed index of size 1: (equation, shapes, reference(q, ts), forward GEMM FLOPs)
    "size_1_in_first": ("ijl,jlk->ik", [(3, 5, 1), (5, 7, 4)],
                        lambda q, t: q(q(t[0][:, :, 0]) @ q(t[1].sum(1))), 2 * 3 * 5 * 4),
    "element_wise_pair_then_gemm": ("bi,ij,jk->bk", [(3, 1), (1, 4), (4, 5)],
                                    lambda q, t: q(q(t[0] * t[1]) @ q(t[2])), 2 * 3 * 4 * 5),
}


@pytest.mark.parametrize("fmt", ELEMENT)
@pytest.mark.parametrize("case", sorted(CHAINS))
def test_a_summed_index_of_size_1_is_no_gemm_dimension_and_the_gemm_beside_it_is_emulated(case, fmt):
    eq, shapes, ref, flops = CHAINS[case]
    xs = [tame(*s, seed=i) for i, s in enumerate(shapes)]
    module = Fn(lambda m, *ts: torch.einsum(eq, *ts))
    got = run(module, xs, nearest_policy(fmt))
    q = refq(fmt)
    assert_same(got, ref_grads(lambda ts, ps: ref(q, ts), xs, []))
    xs = [x.requires_grad_(True) for x in xs]
    plain = emunum.coverage(copy.deepcopy(module), *xs)
    cov = emunum.coverage(emunum.patch(copy.deepcopy(module), fmt), *xs)
    assert cov.fraction == 1.0 and cov.total_flops == plain.total_flops == 3 * flops  # forward, two backward


@pytest.mark.parametrize("fmt", ELEMENT)
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float", "gqa"])
def test_sdpa_runs_as_its_math_with_both_products_emulated(mask, fmt):
    q_, k_, v_ = tame(2, 4, 5, 8, seed=1), tame(2, 4 if mask != "gqa" else 2, 6, 8, seed=2), \
        tame(2, 4 if mask != "gqa" else 2, 6, 8, seed=3)
    L, S = 5, 6
    bool_mask = torch.rand(L, S, generator=torch.Generator().manual_seed(4)) < 0.7
    bool_mask[:, 0] = True
    kw = {"none": {}, "causal": {"is_causal": True}, "bool": {"attn_mask": bool_mask},
          "float": {"attn_mask": torch.where(bool_mask, 0.0, -1e4)}, "gqa": {"enable_gqa": True}}[mask]
    got = run(Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)), [q_, k_, v_],
              nearest_policy(fmt))
    Q = refq(fmt)

    def ref(ts, ps):
        q, k, v = ts
        if mask == "gqa":
            k, v = k.repeat_interleave(2, -3), v.repeat_interleave(2, -3)
        s = Q(Q(q) @ Q(k).transpose(-2, -1)) * (1 / 8 ** 0.5)
        if mask == "causal":
            s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
        elif mask == "bool":
            s = s.masked_fill(~bool_mask, float("-inf"))
        elif mask == "float":
            s = s + torch.where(bool_mask, 0.0, -1e4)
        return Q(Q(torch.softmax(s, -1)) @ Q(v))

    want = ref_grads(ref, [q_, k_, v_], [])
    assert torch.equal(got[0], want[0])
    for a, b in zip(got[1], want[1]):  # the softmax backward sums in fp32: same ops, same order
        assert torch.equal(a, b)


class _FunctionalMHA(nn.Module):
    """Self-attention through ``F.multi_head_attention_forward`` called directly (as transformers' WavLM does):
    separate q/k/v weights with an additive (batch * heads, L, L) mask and the weights returned (the bmm path),
    or one packed weight without a mask or weights (the SDPA path). ``explicit``: the same function's math path
    for these arguments, written out step by step in handled torch calls (the reference)."""

    def __init__(self, separate: bool, explicit: bool, E=16, H=4):
        super().__init__()
        self.separate, self.explicit, self.E, self.H = separate, explicit, E, H
        g = torch.Generator().manual_seed(3)
        self.w = nn.Parameter(tame(3 * E, E, seed=1) / 16)
        self.b = nn.Parameter(tame(3 * E, seed=2) / 16)
        self.wo, self.bo = nn.Parameter(tame(E, E, seed=4) / 16), nn.Parameter(tame(E, seed=5) / 16)
        self.register_buffer("mask", torch.randn(2 * H, 5, 5, generator=g))

    def forward(self, x):
        x = x.transpose(0, 1)  # (L, batch, E)
        wq, wk, wv = self.w.chunk(3)
        if self.explicit:
            return self._math(x, wq, wk, wv).transpose(0, 1)
        kw = dict(use_separate_proj_weight=True, q_proj_weight=wq, k_proj_weight=wk, v_proj_weight=wv,
                  attn_mask=self.mask, need_weights=True) if self.separate else dict(need_weights=False)
        y, _ = F.multi_head_attention_forward(x, x, x, self.E, self.H, self.w, self.b, None, None, False, 0.0,
                                              self.wo, self.bo, self.training, None, **kw)
        return y.transpose(0, 1)

    def _math(self, x, wq, wk, wv):
        L, B, E, H = x.shape[0], x.shape[1], self.E, self.H
        if self.separate:
            q, k, v = F._in_projection(x, x, x, wq, wk, wv, *self.b.chunk(3))
        else:
            q, k, v = F._in_projection_packed(x, x, x, self.w, self.b)
        q, k, v = (t.view(L, B * H, E // H).transpose(0, 1) for t in (q, k, v))
        if self.separate:
            p = torch.softmax(torch.baddbmm(self.mask, q * math.sqrt(1.0 / float(E // H)), k.transpose(-2, -1)), -1)
            out = torch.bmm(p, v).transpose(0, 1).reshape(L * B, E)
        else:
            q, k, v = (t.reshape(B, H, L, E // H) for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, None, 0.0, False).permute(2, 0, 1, 3).reshape(B * L, E)
        return F.linear(out, self.wo, self.bo).view(L, B, E)


@pytest.mark.parametrize("fmt", ELEMENT)
@pytest.mark.parametrize("separate", [True, False], ids=["separate_bmm", "packed_sdpa"])
def test_a_direct_multi_head_attention_call_runs_its_gemms_emulated_as_its_math(separate, fmt):
    x = tame(2, 5, 16, seed=6)
    got, want = (run(_FunctionalMHA(separate, explicit), [x], nearest_policy(fmt)) for explicit in (False, True))
    for a, b in zip([got[0], *got[1], *got[2]], [want[0], *want[1], *want[2]]):
        assert torch.equal(a, b)
    plain = emunum.coverage(_FunctionalMHA(separate, False), x)
    cov = emunum.coverage(emunum.patch(_FunctionalMHA(separate, False), nearest_policy(fmt)), x)
    assert cov.fraction == 1.0 and cov.total_flops == plain.total_flops > 0, str(cov)


def test_sdpa_gives_zeros_for_a_row_masked_whole_as_torchs_math_path():
    q, k, v = (tame(1, 2, 4, 8, seed=s) for s in (1, 2, 3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    m = emunum.patch(Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), "e5m2")
    y = m(q, k, v)
    assert torch.equal(y[..., 2, :], torch.zeros(1, 2, 8)) and torch.isfinite(y).all()
    ref = torch._safe_softmax(torch.where(mask, 0.0, float("-inf")), -1)  # torch's own rule on the same mask
    assert torch.equal(ref[2], torch.zeros(4))


@pytest.mark.parametrize("rows", ["none_dead", "masked_dead", "nan_beside_-inf", "+inf_beside_-inf", "empty"])
def test_sdpa_finds_the_rows_masked_whole_as_the_full_test_does_with_the_same_values_and_gradients(rows):
    from emunum.nn.functional import _rows_masked_whole_zeroed

    s = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    if rows == "empty":
        s = s[..., :0]
    elif rows != "none_dead":
        s[0, 1, 2] = float("-inf")  # a row masked whole: zeroed
        s[1, 2, 0, :3] = float("-inf")
        if rows != "masked_dead":  # a row of -inf with one other value: not masked whole, stays as softmax gives it
            s[1, 2, 0, 4] = float("nan") if rows == "nan_beside_-inf" else float("inf")
    for grad in (False, True):
        a, b = s.clone().requires_grad_(grad), s.clone().requires_grad_(grad)
        got = _rows_masked_whole_zeroed(torch.softmax(a, -1), a)
        want = torch.softmax(b, -1).masked_fill(torch.isneginf(b).all(-1, keepdim=True), 0.0)
        assert torch.equal(got, want) if rows in ("none_dead", "empty", "masked_dead") else \
            torch.equal(torch.nan_to_num(got, 7.0), torch.nan_to_num(want, 7.0))
        if grad and got.numel():
            w = torch.randn(got.shape, generator=torch.Generator().manual_seed(1))
            torch.nan_to_num(got * w, 0.0).sum().backward()
            torch.nan_to_num(want * w, 0.0).sum().backward()
            assert torch.equal(torch.nan_to_num(a.grad, 7.0), torch.nan_to_num(b.grad, 7.0))


def test_sdpa_dropout_comes_before_the_rounding_of_p():
    q, k, v = (tame(1, 2, 4, 8, seed=s) for s in (1, 2, 3))
    m = emunum.patch(Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)), "e5m2")
    torch.manual_seed(3)
    y = m(q, k, v)
    Q = lambda t: emunum.quantize(t, "e5m2")  # noqa: E731
    torch.manual_seed(3)
    s = Q(Q(q) @ Q(k).transpose(-2, -1)) * (1 / 8 ** 0.5)
    p = F.dropout(torch.softmax(s, -1), 0.5, training=True)
    assert torch.equal(y, Q(Q(p) @ Q(v)))


def exact_block_gemm_data(*shape, seed=0):
    """Magnitudes in [4, 8) and one 10.5, so that NVFP4's tensor scale is 10.5 / 2688 = 2**-8: every quantised
    value (MX or NVFP4) is then a multiple of 2**-5 below 11 with at most 6 significant bits, and the float32
    GEMMs of these tests are exact, whatever order or operand layout the CPU's GEMM kernel takes."""
    t = tame(*shape, seed=seed)
    t = torch.sign(t) * (4 + (t.abs() - 0.5) * (4 / 7.5))
    t.view(-1)[0] = 10.5
    return t


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_block_formats_quantise_each_functional_gemm_along_its_own_k(fmt):
    E = exact_block_gemm_data
    a, b, w = E(2, 3, 5, 32, seed=1), E(2, 3, 32, 4, seed=2), E(32, 6, seed=3)
    # the two products' gradients: one magnitude that both formats hold exactly in every block along any axis
    # (10.5 = 6 * 448 * 2**-8 in NVFP4, 2**3 in MX), so their stochastic rounding draws nothing that matters
    c = 10.5 if fmt == "nvfp4" else 8.0
    g1, g2 = c * torch.sign(tame(2, 3, 5, 4, seed=4)), c * torch.sign(tame(2, 3, 5, 6, seed=5))
    mod = Fn(lambda m, a, b: ((a @ b) * g1).sum() + ((a @ m.w) * g2).sum(), w)
    pm = emunum.patch(copy.deepcopy(mod), fmt)
    a_, b_ = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = pm(a_, b_)
    plan = pm.__dict__["_emunum_gemm"].mode.emu._emunum_block
    R = emunum.Role
    qa, qb, qw = plan.q(a, R.INPUT, -1), plan.q(b, R.INPUT, -2), plan.q(w, R.WEIGHT, 0)
    assert torch.equal(y, ((qa @ qb) * g1).sum() + ((qa.reshape(-1, 32) @ qw).reshape(2, 3, 5, 6) * g2).sum())
    y.backward()
    ga_ab = plan.q(g1, R.GRAD_OUTPUT, -1) @ plan.q(b.transpose(-1, -2), R.INPUT, -2)
    ga_aw = (plan.q(g2.reshape(30, 6), R.GRAD_OUTPUT, -1) @ plan.q(w.t(), R.WEIGHT, -2)).reshape(2, 3, 5, 32)
    assert torch.equal(a_.grad, ga_ab + ga_aw)
    gb = plan.q(a.transpose(-1, -2), R.INPUT, -1) @ plan.q(g1, R.GRAD_OUTPUT, -2)
    assert torch.equal(b_.grad, gb)


def test_mad_units_run_functional_gemms():
    unit = emunum.MADUnit.preset("h100_fp8_e4m3")
    a, b = tame(3, 5, 8, seed=1), tame(3, 8, 4, seed=2)
    m = emunum.patch(Fn(lambda m, a, b: a @ b), "e4m3fn", mad=unit)
    Q = lambda t: emunum.quantize(t, "e4m3fn")  # noqa: E731
    assert torch.equal(m(a, b), Q(emunum.mad.matmul(Q(a), Q(b), unit=unit)))



class _FunctionalConv(nn.Module):
    """conv's forward as F.conv1d/F.conv2d in a module that is not a Conv layer (as Mamba's mixer calls it)."""

    def __init__(self, conv):
        super().__init__()
        self.weight, self.bias, self.fn = conv.weight, conv.bias, (F.conv1d if conv.weight.dim() == 3 else F.conv2d)
        self.kw = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation, groups=conv.groups)

    def forward(self, x):
        return self.fn(x, self.weight, self.bias, **self.kw)


class _ConvNet(nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv, self.head = conv, nn.Linear(1, 1)  # head: a layer, so that patch accepts block formats

    def forward(self, x):
        return torch.tanh(self.conv(x))


@pytest.mark.parametrize("fmt,unit", [("nvfp4", "b200_mxf4nvf4_ue4m3"), ("mxfp8_e4m3", "e4m3fn -> fp32")])
@pytest.mark.parametrize("conv,shape", [(lambda: nn.Conv1d(8, 8, 4, padding=3, groups=8), (2, 8, 12)),
                                        (lambda: nn.Conv2d(6, 4, 3, stride=2, padding=1), (2, 6, 7, 7))],
                         ids=["depthwise1d", "strided2d"])
def test_a_functional_conv_with_block_formats_on_a_mad_unit_gives_the_layers_bits(fmt, unit, conv, shape):
    if "->" in unit:
        unit = emunum.MADUnit(unit.split()[0], unit.split()[-1])
    _assert_layer_and_functional_alike(conv, shape, fmt=fmt, mad=unit)


def _assert_layer_and_functional_alike(conv, shape, **policy):
    """The conv as a layer and as its functional call, each patched with ``policy``: coverage 1 and the same output,
    input gradient and weight gradient (the same stochastic gradient roundings in both)."""
    torch.manual_seed(0)
    c, x = conv(), torch.randn(shape)
    out = []
    for net in (_ConvNet(copy.deepcopy(c)), _ConvNet(_FunctionalConv(copy.deepcopy(c)))):
        emunum.patch(net, **policy)
        xg = x.clone().requires_grad_(True)
        torch.manual_seed(5)
        cov = emunum.coverage(net, xg)
        torch.manual_seed(5)
        y = net(xg)
        y.square().sum().backward()
        out.append((y, xg.grad, net.conv.weight.grad, cov.fraction))
    (y0, gx0, gw0, f0), (y1, gx1, gw1, f1) = out
    assert f0 == f1 == 1.0
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1) and torch.equal(gw0, gw1)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("conv,shape", [(lambda: nn.Conv1d(4, 6, 4, padding="same"), (2, 4, 12)),
                                        (lambda: nn.Conv2d(4, 6, (2, 3), padding="same", dilation=2), (2, 4, 7, 7)),
                                        (lambda: nn.Conv2d(4, 6, 3, padding="valid"), (2, 4, 7, 7))],
                         ids=["same1d_even", "same2d_dilated", "valid2d"])
def test_a_functional_conv_with_string_padding_and_block_formats_gives_the_layers_bits(fmt, conv, shape):
    _assert_layer_and_functional_alike(conv, shape, fmt=fmt, strict=True)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_a_functional_conv_transpose_with_block_formats_gives_the_layers_bits(fmt):
    torch.manual_seed(0)
    c, x = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1), torch.randn(2, 4, 5, 5)
    functional = Fn(lambda m, x: F.conv_transpose2d(x, m.w, m.b, stride=2, padding=1), c.weight.detach(),
                    c.bias.detach())
    out = []
    for net in (_ConvNet(copy.deepcopy(c)), _ConvNet(functional)):
        emunum.patch(net, fmt)
        xg = x.clone().requires_grad_(True)
        torch.manual_seed(5)
        y = net(xg)
        y.square().sum().backward()
        w = net.conv.weight if hasattr(net.conv, "weight") else net.conv.w
        out.append((y, xg.grad, w.grad, emunum.coverage(net, x).fraction))
    (y0, gx0, gw0, f0), (y1, gx1, gw1, f1) = out
    assert f0 == f1 == 1.0
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1) and torch.equal(gw0, gw1)


IN_PLACE = {  # name: (in place, out of place, input shape); x's slices are fresh tensors (x * 1), w a Parameter
    "addmm_": (lambda m, x: (x[:, :4] * 1).addmm_(x, m.w, beta=0.5),
               lambda m, x: torch.addmm(x[:, :4] * 1, x, m.w, beta=0.5), (3, 5)),
    "addmv_": (lambda m, x: (x[:4] * 1).addmv_(m.w.t(), x), lambda m, x: torch.addmv(x[:4] * 1, m.w.t(), x), (5,)),
    "baddbmm_": (lambda m, x: (x[..., :4] * 1).baddbmm_(x, m.w.expand(2, 5, 4)),
                 lambda m, x: torch.baddbmm(x[..., :4] * 1, x, m.w.expand(2, 5, 4)), (2, 3, 5)),
    "addbmm_": (lambda m, x: (x[0, :, :4] * 1).addbmm_(x, m.w.expand(2, 5, 4)),
                lambda m, x: torch.addbmm(x[0, :, :4] * 1, x, m.w.expand(2, 5, 4)), (2, 3, 5)),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_an_in_place_product_gives_the_out_of_place_products_bits(name):
    in_place, out_of_place, shape = IN_PLACE[name]
    x, w = tame(*shape, seed=1), tame(5, 4, seed=2)
    got, want = (run(Fn(f, w), [x], nearest_policy("e5m2")) for f in (in_place, out_of_place))
    assert_same(got, want)
    patched = emunum.patch(Fn(in_place, w), "e5m2")
    assert emunum.coverage(patched, x.clone().requires_grad_(True)).fraction == 1.0

def test_functional_false_leaves_them_alone_and_unpatch_restores_bits():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    mod = Fn(lambda m, a, b: a @ b)
    ref = mod(a, b)
    with pytest.warns(RuntimeWarning, match="has no layer to emulate"):
        off = emunum.patch(copy.deepcopy(mod), "e5m2", functional=False)
    assert torch.equal(off(a, b), ref)
    on = emunum.patch(copy.deepcopy(mod), "e5m2")
    assert not torch.equal(on(a, b), ref)
    back = emunum.unpatch(on)
    assert torch.equal(back(a, b), ref)
    assert not back._forward_hooks and not back._forward_pre_hooks


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        return h @ h.transpose(-1, -2) @ h


def test_the_filter_decides_for_the_module_that_runs_a_functional_gemm():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    x = torch.randn(2, 4, 8)
    emunum.patch(model, "e4m3fn", filter=lambda m, n: not n.startswith("1"))
    cov = emunum.coverage(model, x)
    off = {(r.module, r.reason) for r in cov.unemulated()}
    assert off and all(mod.startswith("1") and "filter" in why for mod, why in off)
    assert {r.module for r in cov.records if r.emulated} >= {"0", "0.proj"}


def test_keep_first_last_leaves_those_layers_functional_gemms_unemulated():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Block(), nn.Linear(8, 3))
    emunum.patch(model, "e4m3fn", keep_first_last=True)
    cov = emunum.coverage(model, torch.randn(8, 8))
    reasons = {r.module: r.reason for r in cov.unemulated()}
    assert reasons == {"0": "keep_first_last", "2": "keep_first_last"}


def _extension_bmm(m, a, b):
    """A C++ extension's GEMM: no torch function call on the way for the mode to see."""
    with torch._C.DisableTorchFunction():
        return torch.bmm(a, b)


class WithExtension(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = Fn(_extension_bmm)
        self.head = nn.Linear(4, 2)

    def forward(self, a, b):
        return self.head(self.ext(a, b))


def test_a_gemm_emunum_cannot_emulate_warns_once_naming_it_or_raises_under_strict():
    a, b = torch.randn(2, 3, 5), torch.randn(2, 5, 4)
    model = emunum.patch(WithExtension(), "e5m2")
    with pytest.warns(RuntimeWarning, match=r"ran off the format.*ext: bmm.*below torch's Python API"):
        model(a, b)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(a, b)  # once only
    strict = emunum.patch(WithExtension(), "e5m2", strict=True)
    with pytest.raises(ValueError, match=r"strict=True.*ran off the format.*ext: bmm"):
        strict(a, b)


def test_strict_raises_for_an_unsupported_op_and_for_a_gemm_no_mechanism_sees():
    m = emunum.patch(Fn(lambda m, a, b: torch.linalg.vecdot(a, b)), "e5m2", strict=True)
    with pytest.raises(ValueError, match="vecdot cannot be emulated: not emulated by emunum"):
        m(torch.randn(3, 5), torch.randn(3, 5))
    hidden = emunum.patch(Fn(_extension_bmm), "e5m2", strict=True)
    with pytest.raises(ValueError, match="ran off the format.*below torch's Python API"):
        hidden(torch.randn(2, 3, 5), torch.randn(2, 5, 4))


def test_strict_and_functional_must_be_bools():
    for kw in ({"strict": "yes"}, {"functional": 1}):
        with pytest.raises(TypeError, match=f"{next(iter(kw))}="):
            emunum.patch(nn.Linear(2, 2), "e5m2", **kw)


def test_compiled_fullgraph_gives_the_eager_bits():
    torch.manual_seed(0)
    mod = Fn(lambda m, x: torch.relu(x @ m.w) @ m.w.t(), torch.randn(8, 8))
    x = torch.randn(4, 8)
    eager = emunum.patch(copy.deepcopy(mod), "e4m3fn")
    compiled = emunum.patch(copy.deepcopy(mod), "e4m3fn")
    y = eager(x)
    yc = torch.compile(compiled, fullgraph=True)(x)
    assert torch.equal(y, yc) and not torch.equal(y, mod(x))


@pytest.mark.parametrize("how", [{"keep_first_last": True}, {"filter": lambda m, n: n != "1"}, {"input": None}],
                         ids=["keep_first_last", "filter", "weight_only"])
def test_what_the_policy_leaves_out_is_reported_by_coverage_not_warned(how):
    import warnings
    torch.manual_seed(0)
    kw = {"fmt": "e5m2", **how} if "input" not in how else {"weight": "e5m2"}
    model = emunum.patch(nn.Sequential(nn.Linear(8, 8), Block(), nn.Linear(8, 3)), strict=True, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(4, 8))
    assert emunum.coverage(model, torch.randn(4, 8)).unemulated()


@pytest.mark.parametrize("fmt", ["e4m3fn", "mxfp8_e4m3"])
def test_a_real_attention_model_compiles_without_graph_breaks_to_the_eager_bits(fmt):
    pytest.importorskip("transformers")
    import warnings

    import torch._dynamo
    from third_party_models import MODELS, loss_of

    model, args, kw = MODELS["llama"]()  # SDPA attention: emulated as its math
    model.eval()
    emunum.patch(model, fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = loss_of(model(*args, **kw))
        torch._dynamo.reset()
        # fullgraph=True: a graph break raises (torch.compile's contract) instead of splitting the graph
        compiled = loss_of(torch.compile(model, backend="aot_eager", fullgraph=True)(*args, **kw))
    assert torch.equal(eager, compiled)
