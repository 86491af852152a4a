"""``emunum.coverage`` on real third-party models, cross-checked by an independent counter that looks only at the
operands of every GEMM torch executes (on the format's grid or not)."""
import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import emunum
from emunum.nn.gemm_context import CHOSEN

from third_party_models import MODELS, loss_of

pytest.importorskip("transformers")

A = torch.ops.aten
OPERANDS = {A.mm.default: (0, 1), A.bmm.default: (0, 1), A.addmm.default: (1, 2), A.baddbmm.default: (1, 2),
            A.convolution.default: (0, 1), A.convolution_backward.default: (0, 1, 2)}
FUSED = {A._scaled_dot_product_flash_attention_for_cpu.default,
         A._scaled_dot_product_flash_attention_for_cpu_backward.default}


class GridCounter(TorchDispatchMode):
    """Counts GEMM outputs (elements) whose operands all lie on ``fmt``'s grid (``quantize(t) == t``) and those
    whose operands do not; a fused attention kernel counts as off the grid. Knows nothing of emunum's internals."""

    def __init__(self, fmt):
        super().__init__()
        self.fmt, self.on, self.off = fmt, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in OPERANDS:
            first = out[0] if isinstance(out, tuple) else out
            n = max(1, first.numel() if first is not None else 1)
            on = all(torch.equal(emunum.quantize(args[i], self.fmt), args[i]) for i in OPERANDS[func])
            self.on, self.off = (self.on + n, self.off) if on else (self.on, self.off + n)
        elif func in FUSED:
            self.off += 1
        return out

    @property
    def fraction(self):
        return self.on / max(1, self.on + self.off)


def grid_fraction(model, args, kwargs, fmt):
    counter = GridCounter(fmt)
    with counter:
        loss_of(model(*args, **kwargs)).backward()
    return counter.fraction


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), (torch.randn(8, 16),), {}


def test_the_independent_counter_sees_a_patched_mlp_on_the_grid_and_a_plain_one_off_it():
    model, args, kw = mlp()
    assert grid_fraction(copy.deepcopy(model), args, kw, "e4m3fn") < 0.01
    patched = emunum.patch(copy.deepcopy(model), "e4m3fn")
    assert grid_fraction(patched, args, kw, "e4m3fn") == 1.0
    assert emunum.coverage(patched, *args).fraction == 1.0
    assert emunum.coverage(model, *args).fraction == 0.0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_coverage_agrees_with_the_grid_counter_on_real_models(name):
    model, args, kw = MODELS[name]()
    plain = emunum.coverage(copy.deepcopy(model), *args, loss_fn=loss_of, **kw)
    assert plain.fraction == 0.0 and plain.total_flops > 0
    assert grid_fraction(copy.deepcopy(model), args, kw, "e4m3fn") < 0.01
    patched = emunum.patch(model, "e4m3fn", grad="e4m3fn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing runs off the format: the first forward does not warn
        cov = emunum.coverage(patched, *args, loss_fn=loss_of, **kw)
    assert cov.fraction >= 0.99, str(cov)
    assert cov.total_flops == plain.total_flops  # the same GEMMs, now on the format
    assert grid_fraction(patched, args, kw, "e4m3fn") >= 0.99


@pytest.mark.parametrize("policy", [{"fmt": "e4m3fn", "grad": "e5m2"}, {"fmt": "mxfp8_e4m3"}, {"fmt": "nvfp4"}],
                         ids=["e4m3fn/e5m2", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_models_reach_full_coverage_and_train(name, policy):
    model, args, kw = MODELS[name]()
    emunum.patch(model, **policy)
    cov = emunum.coverage(model, *args, loss_fn=loss_of, **kw)
    assert cov.fraction >= 0.99, str(cov)
    model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    loss = loss_of(model(*args, **kw))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    changed = sum(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert changed > len(before) // 2


def test_coverage_names_module_op_and_reason_for_what_runs_off_the_format():
    model, args, kw = MODELS["bert"]()
    emunum.patch(model, "e4m3fn", filter=lambda m, n: "attention.self" not in n)
    cov = emunum.coverage(model, *args, loss_fn=loss_of, **kw)
    off = cov.unemulated()
    assert 0.0 < cov.fraction < 1.0 and off
    assert all("attention.self" in r.module and "filter" in r.reason for r in off)
    assert {r.phase for r in off} == {"forward", "backward"}
    assert "NOT emulated: excluded by the policy's filter" in str(cov)
    d = cov.to_dict()
    assert d["total_flops"] == cov.total_flops and len(d["records"]) == len(cov.records)


def test_coverage_refuses_bad_arguments():
    model, args, _ = mlp()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        emunum.coverage("model")
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        emunum.coverage(model, *args, loss_fn=3)
    with pytest.raises(ValueError, match="one-element tensor"):
        emunum.coverage(model, *args, loss_fn=lambda y: y)


def test_mad_unit_gemms_run_in_emunums_kernels_and_are_counted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    x = torch.randn(2, 3, 8, 8)
    plain = emunum.coverage(copy.deepcopy(model), x)
    emunum.patch(model, "e4m3fn", mad="h100_fp8_e4m3")
    cov = emunum.coverage(model, x)
    assert cov.fraction == 1.0, str(cov)
    assert cov.total_flops == plain.total_flops


@pytest.mark.parametrize("conv", [lambda: nn.Conv2d(8, 8, 7, padding=3, groups=8),  # ConvNeXt's depthwise conv
                                  lambda: nn.Conv2d(8, 6, 3, stride=2, padding=1),
                                  lambda: nn.Conv2d(8, 4, (3, 2), padding="same", dilation=2, bias=False),
                                  lambda: nn.Conv1d(8, 6, 5, stride=2, padding=2, groups=2)],
                         ids=["depthwise", "strided", "same-dilated", "conv1d"])
def test_a_mad_unit_counts_the_flops_torch_counts_not_its_padding_zeros_or_bias_sums(conv):
    """The unit computes an input gradient over the padding and a stride's inserted zeros, and a bias gradient
    as a GEMM against ones; coverage counts what torch counts for the same ops, so the totals agree."""
    torch.manual_seed(0)
    model = nn.Sequential(conv(), nn.ReLU(), nn.Flatten(1), nn.LazyLinear(3))
    x = torch.randn(2, 8, 6, 6) if isinstance(model[0], nn.Conv2d) else torch.randn(2, 8, 12)
    model(x)  # materialise the lazy layer
    plain = emunum.coverage(copy.deepcopy(model), x.clone().requires_grad_())
    emunum.patch(model, "e4m3fn", mad="h100_fp8_e4m3")
    cov = emunum.coverage(model, x.clone().requires_grad_())
    assert cov.fraction == 1.0, str(cov)
    for phase in ("forward", "backward"):
        flops = lambda c: sum(r.flops for r in c.records if r.phase == phase)  # noqa: E731
        assert flops(cov) == flops(plain) > 0, (phase, str(plain), str(cov))


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_rounds_p_after_its_dropout_so_every_gemm_operand_is_on_the_grid(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, dropout=0.3, batch_first=batch_first)
    x = torch.randn(5, 3, 16)
    patched = emunum.patch(nn.Sequential(mha), "e4m3fn").train()
    counter = GridCounter("e4m3fn")
    with counter:
        patched[0](x, x, x)[0].square().sum().backward()
    assert counter.fraction == 1.0


@pytest.mark.parametrize("fmt,unit", [("nvfp4", "b200_mxf4nvf4_ue4m3"), ("mxfp4_e2m1", "b200_mxf4nvf4_ue8m0"),
                                      ("mxfp8_e4m3", "b200_mxf8f6f4_e4m3")])
def test_matrix_instruction_gemms_are_counted_once_with_the_plain_models_flops(fmt, unit):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
    x = torch.randn(8, 64)
    plain = emunum.coverage(copy.deepcopy(model), x)
    emunum.patch(model, fmt, mad=unit)
    cov = emunum.coverage(model, x)
    assert cov.fraction == 1.0, str(cov)
    fwd = lambda c: sum(r.flops for r in c.records if r.phase == "forward")  # noqa: E731
    assert fwd(plain) > 0 and fwd(cov) == fwd(plain), (str(plain), str(cov))


@pytest.mark.parametrize("fmt,unit", [("nvfp4", "b200_mxf4nvf4_ue4m3"), ("mxfp8_e4m3", "b200_mxf8f6f4_e4m3"),
                                      ("mxfp8_e4m3", "one-product e4m3fn -> fp32"),
                                      ("nvfp4", "one-product e2m1 -> fp32")])
def test_block_mad_gemms_count_k_not_k_padded_to_whole_blocks(fmt, unit):
    """K = 9, 5 and 20 (a depthwise conv's taps, its input gradient over one output channel, a Linear) are not
    multiples of the block: the unit pads them with zeros, and coverage still counts what torch counts."""
    if unit.startswith("one-product"):
        unit = emunum.MADUnit(unit.split()[1], "fp32")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.ReLU(), nn.Flatten(1),
                          nn.Linear(4 * 5 * 5, 20), nn.ReLU(), nn.Linear(20, 3))
    x = torch.randn(2, 4, 5, 5)
    plain = emunum.coverage(copy.deepcopy(model), x.clone().requires_grad_())
    emunum.patch(model, fmt, mad=unit)
    cov = emunum.coverage(model, x.clone().requires_grad_())
    assert cov.fraction == 1.0, str(cov)
    for phase in ("forward", "backward"):
        flops = lambda c: sum(r.flops for r in c.records if r.phase == phase)  # noqa: E731
        assert flops(cov) == flops(plain) > 0, (phase, str(plain), str(cov))


def test_a_bilinear_layer_is_counted_and_emulated():
    """nn.Bilinear's product (aten._trilinear) is a GEMM: coverage counts 2 * rows * O * I * J for it, on the
    format once patched."""
    class Net(nn.Sequential):
        def forward(self, x, y):
            return self[2](self[1](self[0](x, y)))

    torch.manual_seed(0)
    model = Net(nn.Bilinear(8, 6, 4), nn.ReLU(), nn.Linear(4, 2))
    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 6)
    plain = emunum.coverage(copy.deepcopy(model), x, y)
    forward = lambda c: {r.module: r.flops for r in c.records if r.phase == "forward"}  # noqa: E731
    assert forward(plain)["0"] == 2 * 6 * 4 * 8 * 6
    emunum.patch(model, "e4m3fn")
    cov = emunum.coverage(model, x, y)
    assert cov.fraction == 1.0, str(cov)
    assert forward(cov) == forward(plain)


@pytest.mark.parametrize("op,flops", [
    (lambda: torch.zeros(3, 4).addmm_(torch.randn(3, 5), torch.randn(5, 4)), 2 * 3 * 4 * 5),
    (lambda: torch.zeros(2, 3, 4).baddbmm_(torch.randn(2, 3, 5), torch.randn(2, 5, 4)), 2 * 2 * 3 * 4 * 5),
    (lambda: torch.zeros(3, 4).addbmm_(torch.randn(2, 3, 5), torch.randn(2, 5, 4)), 2 * 3 * 4 * 2 * 5),
    (lambda: torch.zeros(3).addmv_(torch.randn(3, 5), torch.randn(5)), 2 * 3 * 5)],
    ids=["addmm_", "baddbmm_", "addbmm_", "addmv_"])
def test_in_place_products_are_counted(op, flops):
    class M(nn.Module):
        def forward(self, x):
            return op() + x

    assert emunum.coverage(M(), torch.zeros(1), backward=False).total_flops == flops


class Solve(nn.Module):
    """A Linear, then a triangular solve against a matrix built from its output: no GEMM forward, but the solve's
    backward runs GEMMs in torch's autograd formula (the gated delta rule of transformers' Qwen3-Next)."""

    def __init__(self, solve):
        super().__init__()
        self.proj, self.solve = nn.Linear(8, 8), solve

    def forward(self, x):
        a = torch.eye(8) + 0.1 * torch.tril(self.proj(x), -1)
        return self.solve(a, x)


SOLVES = {"solve_triangular": lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
          "solve": torch.linalg.solve, "inv": lambda a, b: torch.linalg.inv(a) + b}


@pytest.mark.parametrize("solve", sorted(SOLVES))
def test_the_backward_gemms_of_a_linear_solve_are_named_for_the_solve(solve):
    x = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(0))
    cov = emunum.coverage(emunum.patch(Solve(SOLVES[solve]), fmt="e4m3fn", grad="e5m2"), x, loss_fn=loss_of)
    off = cov.unemulated()
    assert off and all(r.phase == "backward" and "linear solve" in r.reason and r.module == "" for r in off), str(cov)
    assert cov.total_flops == emunum.coverage(Solve(SOLVES[solve]), x, loss_fn=loss_of).total_flops


@pytest.mark.parametrize("channels", [(3, 8), (16, 32)], ids=["weight-gradient-laid-out", "weight-gradient-panels"])
@pytest.mark.parametrize("special", [False, True], ids=["finite", "inf-input"])
def test_the_fp8_recipes_convolution_kernels_count_each_gemm_once(channels, special):
    """On the fp8 recipe's unit the convolution runs on ``kernels/conv_fast.py`` where its plan allows (per-sample
    columns, weight gradients from panels) and falls back to laid-out operands elsewhere (an infinite input keeps
    the planner's checks on; a narrow weight gradient is laid out): either way each GEMM counts once, as torch
    counts the same ops."""
    torch.manual_seed(0)
    c_in, c_out = channels
    model = nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.Flatten(1), nn.Linear(c_out * 256, 3))
    x = torch.randn(2, c_in, 16, 16)
    if special:
        x[0, 0, 3, 3] = float("inf")
    plain = emunum.coverage(copy.deepcopy(model), x.clone().requires_grad_())
    emunum.patch(model, "fp8_152", mad=emunum.MADUnit("fp16_169", "fp16_169", chunk=64))
    cov = emunum.coverage(model, x.clone().requires_grad_())
    assert cov.fraction == 1.0, str(cov)
    for phase in ("forward", "backward"):
        flops = lambda c: sum(r.flops for r in c.records if r.phase == phase)  # noqa: E731
        assert flops(cov) == flops(plain) > 0, (phase, str(plain), str(cov))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_nvfp4_recipes_policy_patches_every_real_model_and_leaves_out_only_what_it_chose(name):
    """experiments/conf/format/nvfp4.yaml's policy: embeddings excluded, first and last weight layers kept. GPT-2's
    layers left after that are all ``Conv1D`` (functional GEMMs), which patch emulates instead of refusing."""
    model, args, kw = MODELS[name]()
    emunum.patch(model, fmt="nvfp4", weight="nvfp4_2d", grad_rounding="stochastic", hadamard=16,
                 keep_first_last=True, filter=lambda m, _: not isinstance(m, nn.Embedding))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cov = emunum.coverage(model, *args, loss_fn=loss_of, **kw)
    assert {r.reason for r in cov.unemulated()} <= CHOSEN, str(cov)
    assert cov.fraction >= 0.75, str(cov)
