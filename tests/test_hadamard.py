"""The random Hadamard transform of the NVFP4 recipe: an exactly orthogonal matrix (checked against
scipy.linalg.hadamard), seed-reproducible signs, and its use on both operands of the weight-gradient GEMM."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

import emunum
from emunum import hadamard as had
from emunum.nn import block_gemm as bg

Q = emunum.quantize


@pytest.mark.parametrize("n", had.SIZES)
def test_sylvester_matrix_equals_scipys_hadamard(n):
    assert np.array_equal(had.hadamard_matrix(n), scipy.linalg.hadamard(n))


@pytest.mark.parametrize("n", had.SIZES)
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_rht_matrix_is_exactly_orthogonal_in_float64(n, seed):
    m = had.rht_matrix(n, seed)
    assert np.array_equal(m @ m.T, np.eye(n)) and np.array_equal(m.T @ m, np.eye(n))
    assert set(np.abs(m).ravel()) == {1 / np.sqrt(n)}  # entries +-2**-k: exact
    s = had.sign_vector(n, seed)
    assert np.array_equal(m * np.sqrt(n), s[:, None] * scipy.linalg.hadamard(n))  # diag(s) @ H / sqrt(n)


def test_sign_vector_is_fixed_by_its_seed():
    assert np.array_equal(had.sign_vector(16, 7), had.sign_vector(16, 7))
    assert not np.array_equal(had.sign_vector(16, 7), had.sign_vector(16, 8))
    assert set(had.sign_vector(256, 0)) == {-1, 1}


@pytest.mark.parametrize("seed", [0, 1, 12345])
@pytest.mark.parametrize("n", had.SIZES)
def test_the_traceable_matrix_made_of_python_numbers_is_rht_matrix(n, seed):
    assert np.array_equal(had._matrix(n, seed).numpy(), had.rht_matrix(n, seed))


def _blockdiag_rht(x: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Independent reference: pad the rows to a multiple of n, then multiply by blockdiag(M^T) from the left
    (each run u of n rows becomes (u^T M)^T), in float64."""
    t = x.shape[0]
    tp = -(-t // n) * n
    xp = torch.zeros((tp,) + x.shape[1:], dtype=torch.float64)
    xp[:t] = x.double()
    m = torch.from_numpy(scipy.linalg.hadamard(n) * had.sign_vector(n, seed)[:, None] / np.sqrt(n))
    big = torch.block_diag(*([m.T] * (tp // n)))
    return (big @ xp).to(x.dtype)


@pytest.mark.parametrize("tokens", [32, 20])
def test_wgrad_with_rht_and_no_quantisation_equals_wgrad_without_it_to_fp32_rounding(tokens):
    torch.manual_seed(0)
    x = torch.randn(tokens, 24, requires_grad=True)
    w = torch.randn(8, 24, requires_grad=True)
    gy = torch.randn(tokens, 8)
    plan = bg.BlockPlan(None, None, None, hadamard=16, hadamard_seed=3)
    bg.block_gemm(x, w, plan).backward(gy)
    torch.testing.assert_close(w.grad, gy.t() @ x.detach(), rtol=1e-5, atol=1e-5)
    # the operands were transformed: rht equals the block-diagonal reference (float64 sums of 16 float32 values
    # of similar magnitude are exact, so summation order does not matter) and differs from the padded input
    assert torch.equal(had.rht(gy, 16, 3, 0), _blockdiag_rht(gy, 16, 3))
    assert not torch.equal(had.rht(gy, 16, 3, 0), torch.nn.functional.pad(gy, (0, 0, 0, -tokens % 16)))


def _run(policy, seed_data=1):
    torch.manual_seed(seed_data)
    lin = nn.Linear(32, 16)
    x = torch.randn(40, 32, requires_grad=True)
    gy = torch.randn(40, 16)
    emu = emunum.patch(nn.Sequential(lin), policy=policy)
    y = emu(x)
    y.backward(gy)
    return lin, x, gy, y.detach()


def test_nvfp4_wgrad_quantises_the_transformed_operands_and_is_seed_reproducible():
    base = dict(grad_rounding="nearest")
    pol = emunum.Policy.make("nvfp4", hadamard=16, hadamard_seed=5, **base)
    lin, x, gy, y = _run(pol)
    want = (Q(_blockdiag_rht(gy, 16, 5), "nvfp4", axis=0).t() @ Q(_blockdiag_rht(x.detach(), 16, 5), "nvfp4", axis=0))
    assert torch.equal(lin.weight.grad, want)
    lin0, x0, _, y0 = _run(emunum.Policy.make("nvfp4", **base))
    assert not torch.equal(lin.weight.grad, lin0.weight.grad)  # the transform changes what is quantised
    assert torch.equal(y, y0) and torch.equal(x.grad, x0.grad)  # forward and grad-input GEMMs: untouched
    again, *_ = _run(pol)
    assert torch.equal(again.weight.grad, lin.weight.grad)
    other, *_ = _run(emunum.Policy.make("nvfp4", hadamard=16, hadamard_seed=6, **base))
    assert not torch.equal(other.weight.grad, lin.weight.grad)


class _Conv1D(nn.Module):
    """GPT-2's ``Conv1D``: y = addmm(b, x, W) with W (in, out), a functional GEMM no layer swaps; ``left``: the
    weight as the left operand instead, y = (W x^T)^T."""

    def __init__(self, left: bool):
        super().__init__()
        self.left = left
        self.weight = nn.Parameter(torch.randn(16, 32) if left else torch.randn(32, 16))
        self.bias = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        if self.left:
            return (self.weight @ x.t()).t() + self.bias
        return torch.addmm(self.bias, x, self.weight)


@pytest.mark.parametrize("left", [False, True], ids=["x_at_w", "w_at_xt"])
def test_a_functional_weight_gemm_transforms_its_weight_gradient_operands_as_a_layer_does(left):
    torch.manual_seed(1)
    layer = _Conv1D(left)
    x, gy = torch.randn(40, 32, requires_grad=True), torch.randn(40, 16)
    base = dict(grad_rounding="nearest")  # no layer to swap: the GEMM is functional
    model = emunum.patch(nn.Sequential(layer), policy=emunum.Policy.make("nvfp4", hadamard=16, hadamard_seed=5,
                                                                          **base))
    y = model(x)
    y.backward(gy)
    tx, tg = _blockdiag_rht(x.detach(), 16, 5), _blockdiag_rht(gy, 16, 5)  # along the tokens
    want = Q(tx, "nvfp4", axis=0).t() @ Q(tg, "nvfp4", axis=0)  # (in, out)
    assert torch.equal(layer.weight.grad, want.t() if left else want)
    grads = (x.grad.clone(), layer.weight.grad.clone())
    plain = emunum.patch(nn.Sequential(_Conv1D(left)), policy=emunum.Policy.make("nvfp4", **base))
    plain[0].load_state_dict(layer.state_dict())
    x.grad = None
    yp = plain(x)
    yp.backward(gy)
    assert torch.equal(y, yp) and torch.equal(x.grad, grads[0])  # forward and grad-input GEMMs: untouched
    assert not torch.equal(plain[0].weight.grad, grads[1])  # the transform changes what is quantised
    assert emunum.coverage(model, x).fraction == 1.0


def test_hadamard_policy_errors_name_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"hadamard=8: .* one of 4, 16, 64, 256"):
        emunum.Policy.make("nvfp4", hadamard=8)
    with pytest.raises(ValueError, match=r"hadamard=16: .*no block format; allowed"):
        emunum.Policy.make("e4m3fn", hadamard=16)
    with pytest.raises(TypeError, match=r"hadamard_seed=-1"):
        emunum.Policy.make("nvfp4", hadamard=16, hadamard_seed=-1)
    assert "hadamard=16/seed=0" in emunum.Policy.make("nvfp4", hadamard=16).describe()


# ---- the butterfly kernel (float32 on the CPU) against the float64 matrix product it stands in for --------
def _reference_rht(x, n, seed, dim, monkeypatch):
    """rht by its float64 matrix product (the butterfly switched off)."""
    with monkeypatch.context() as m:
        m.setattr(had, "_butterfly", lambda *a: None)
        return had.rht(x, n, seed, dim)


def _bits_equal(a, b):
    return a.shape == b.shape and a.stride() == b.stride() and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _data(shape, kind, gen):
    sign = torch.randint(0, 2, shape, generator=gen).float() * 2 - 1  # +-[1, 2) * 2**[-10, 10): spread <= 20
    x = sign * (1 + torch.rand(shape, generator=gen)) * torch.exp2(torch.randint(-10, 10, shape, generator=gen).float())
    if kind == "zeros":  # whole runs of +0 and -0 (the sign of a zero sum)
        x = torch.where(torch.rand(shape, generator=gen) < 0.5, torch.zeros(shape), -torch.zeros(shape))
        x[..., :1] = 1.0
    elif kind == "sparse":
        x[torch.rand(shape, generator=gen) < 0.6] = -0.0
    elif kind == "subnormal":
        x = x * 1e-40
    elif kind == "wide":  # 1-3 significant bits over 2**[-20, 9): a spread of 29 binades, sums far below 53 bits
        x = sign * torch.randint(1, 8, shape, generator=gen).float() * torch.exp2(
            torch.randint(-20, 7, shape, generator=gen).float())
    return x


@pytest.mark.parametrize("n", had.SIZES)
# (1097, 100) along 0: several groups of RUNS runs and of COLUMNS columns, each with a partial last one
@pytest.mark.parametrize("shape,dim", [((70, 24), 0), ((33, 5), 0), ((6, 50, 3), 1), ((4, 7, 130), -1), ((300,), 0),
                                       ((1097, 100), 0)])
@pytest.mark.parametrize("kind", ["normal", "zeros", "sparse", "subnormal", "wide"])
def test_butterfly_gives_the_matrix_products_bits_and_strides(n, shape, dim, kind, monkeypatch):
    x = _data(shape, kind, torch.Generator().manual_seed(n + len(shape)))
    d = dim % x.dim()
    fast, _ = had._butterfly(x, n, 7, d, -(-x.shape[d] // n) * n)  # None: TypeError
    assert fast is not None  # every run's float64 sums are exact (spread <= 20 binades, or few bits: "wide")
    assert _bits_equal(fast, _reference_rht(x, n, 7, dim, monkeypatch))
    assert _bits_equal(had.rht(x, n, 7, dim), fast)


@pytest.mark.parametrize("planted", ["inf", "nan"])
def test_butterfly_declines_runs_that_are_not_finite(planted, monkeypatch):
    x = 1 + torch.rand(64, 8, generator=torch.Generator().manual_seed(3))  # [1, 2): one binade
    x[40, 5] = float(planted)
    assert had._butterfly(x, 16, 0, 0, 64) is None
    assert _bits_equal(had.rht(x, 16, 0, 0), _reference_rht(x, 16, 0, 0, monkeypatch))
    x[40, 5] = 1.0
    fast, _ = had._butterfly(x, 16, 0, 0, 64)
    assert _bits_equal(fast, _reference_rht(x, 16, 0, 0, monkeypatch))


def _orders(x: torch.Tensor, n: int, seed: int):
    """Independent oracles for rht(x, n, seed, 0) of a 2-D float32 x, in Python floats (IEEE double): each
    output's sum in index order from +0 (the definition), and in the butterfly's order (pairs, then pairs of
    pairs; the scale last), each rounded once to float32."""
    m = scipy.linalg.hadamard(n) * had.sign_vector(n, seed)[:, None] / np.sqrt(n)
    s, scale = had.sign_vector(n, seed), 1 / np.sqrt(n)
    t = x.shape[0]
    u = np.zeros((-(-t // n) * n, x.shape[1]))
    u[:t] = x.double().numpy()
    index, tree = np.zeros(u.shape, np.float32), np.zeros(u.shape, np.float32)
    for c in range(u.shape[1]):
        for r0 in range(0, u.shape[0], n):
            run = [float(v) for v in u[r0:r0 + n, c]]
            for i in range(n):
                acc = 0.0
                for j in range(n):
                    acc = acc + run[j] * float(m[j, i])
                index[r0 + i, c] = np.float32(acc)
            w = [float(s[j]) * run[j] for j in range(n)]
            h = 1
            while h < n:
                for i0 in range(0, n, 2 * h):
                    for j in range(i0, i0 + h):
                        w[j], w[j + h] = w[j] + w[j + h], w[j] - w[j + h]
                h *= 2
            for i in range(n):
                tree[r0 + i, c] = np.float32((w[i] + 0.0) * scale)
    return torch.from_numpy(index), torch.from_numpy(tree)


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _midpoint_run(seed: int) -> torch.Tensor:
    """A run whose sums are inexact and whose first output differs between the two orders: its signed terms are
    2**29, 32 and fourteen 2**-24. In index order each 2**-24 is a tie below the float64 ulp of 2**29 + 32 and
    is lost (ties to even), leaving (2**29 + 32) / 4, a float32 midpoint, which rounds to even: 2**27; the
    butterfly first adds them in pairs, keeps 7 * 2**-23 and rounds up: 2**27 + 16."""
    v = torch.tensor([2.0 ** 29, 32.0] + [2.0 ** -24] * 14)
    return v * torch.from_numpy(had.sign_vector(16, seed)).float()


@pytest.mark.parametrize("where", ["kernel", "torch_ops", "autograd"])
def test_a_run_whose_sums_are_inexact_is_summed_in_index_order_on_every_path(where, monkeypatch):
    x = 1 + torch.rand(64, 8, generator=torch.Generator().manual_seed(3))  # the other runs: exact sums
    x[16:32, 3] = _midpoint_run(0)
    index, tree = _orders(x, 16, 0)
    assert index[16, 3] == 2.0 ** 27 and tree[16, 3] == 2.0 ** 27 + 16  # the orders differ on that run only
    assert torch.equal(index[:16], tree[:16]) and torch.equal(index[:, :3], tree[:, :3])
    if where == "kernel":
        got, _ = had._butterfly(x, 16, 0, 0, 64)
    elif where == "torch_ops":
        got = _reference_rht(x, 16, 0, 0, monkeypatch)
    else:
        got = had.rht(x.requires_grad_(), 16, 0, 0).detach()
    assert _same_bits(got, index)


@pytest.mark.parametrize("top,low", [
    ((2 - 2.0 ** -23) * 2.0 ** 25, 1.0),  # a spread of 25 = 29 - log2 16, full significands: the spread test
    (2.0 ** 26, 1.0),  # 26 binades, lowest bit 1: the exact test takes it (sums far below 2**53)
    ((2 - 2.0 ** -23) * 2.0 ** 26, 1.0 + 2.0 ** -23),  # 26 binades, lowest bit 2**-23: sums past 2**30
])
def test_butterfly_gives_the_definitions_bits_at_the_limits_of_its_tests(top, low):
    """At the limit of the kernel's cheap exponent-spread test (with the largest sums it allows), one binade
    past it (where the exact test decides) and past both: the definition's bits (index order, which any order
    meets where the sums are exact; a run the tests wrongly admitted would give the butterfly's order, which
    ``test_a_run_whose_sums_are_inexact...`` shows can differ)."""
    x = 1 + torch.rand(64, 8, generator=torch.Generator().manual_seed(5))
    x[16:31, 2] = top
    x[31, 2] = low
    got, _ = had._butterfly(x, 16, 0, 0, 64)
    assert _same_bits(got, _orders(x, 16, 0)[0])


def test_butterfly_leaves_autograd_float64_and_its_input_alone():
    x = torch.randn(32, 4, requires_grad=True)
    assert had._butterfly(x, 16, 0, 0, 32) is None  # differentiable: the matrix product
    assert had._butterfly(x.detach().double(), 16, 0, 0, 32) is None
    y = x.detach().clone()
    had.rht(y, 16, 0, 0)
    assert torch.equal(y, x.detach())


# ---- the butterfly's scan: the block maxima the quantiser's amax pass would find in its result -------------
@pytest.mark.parametrize("shape,dim", [((70, 24), 0), ((6, 50, 3), 1), ((1097, 100), 0)])
@pytest.mark.parametrize("kind", ["normal", "zeros", "sparse", "subnormal", "huge"])
def test_rht_scan_equals_the_amax_pass_of_the_result(shape, dim, kind):
    from emunum.block_quantize import working_layout
    from emunum.kernels import block_cpu

    gen = torch.Generator().manual_seed(len(shape))
    x = _data(shape, kind, gen)
    if kind == "huge":  # a first run of 2**127 s (s the signs): its first output 2**129 overflows to inf
        s = torch.from_numpy(had.sign_vector(16, 7)).float()
        x.narrow(dim, 0, 16).copy_(2.0 ** 127 * s.view([16 if k == dim % x.dim() else 1 for k in range(x.dim())]))
    out, scan = had.rht_scanned(x, 16, 7, dim)
    assert scan is not None and _bits_equal(out, had.rht(x, 16, 7, dim))
    work, _, _ = working_layout(out, emunum.get_format("nvfp4"), dim)
    amaxes = np.empty(work.numel() // 16)
    amax = block_cpu.block_amaxes(work.numpy(), amaxes, 16)
    assert np.array_equal(scan[0].view(np.int64), amaxes.view(np.int64)) and scan[1] == amax
    if kind == "huge":
        assert np.isinf(amaxes).any() and 0 < amax < np.inf


@pytest.mark.parametrize("grad_rounding", ["stochastic", "nearest"])
def test_nvfp4_wgrad_with_the_scan_equals_it_without_and_draws_the_same_seeds(grad_rounding, monkeypatch):
    pol = emunum.Policy.make("nvfp4", hadamard=16, hadamard_seed=5, grad_rounding=grad_rounding)

    def run():
        torch.manual_seed(2)
        lin = nn.Linear(64, 24)
        x = torch.randn(200, 64, requires_grad=True)
        emunum.patch(nn.Sequential(lin), policy=pol)(x).backward(torch.randn(200, 24))
        return lin.weight.grad, torch.randint(0, 2**62, (4,))  # the generator's state after the step

    calls = []
    scanned = bg.rht_scanned
    monkeypatch.setattr(bg, "rht_scanned", lambda *a: calls.append(a[-1]) or scanned(*a))
    fused = run()
    monkeypatch.setattr(bg, "rht_scanned", lambda *a: scanned(*a[:-1], False))
    plain = run()
    assert calls == [True, True]
    assert torch.equal(fused[0].view(torch.int32), plain[0].view(torch.int32)) and torch.equal(fused[1], plain[1])
