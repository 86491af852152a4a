"""The functional-GEMM mode under activation checkpointing: a block recomputed in backward (transformers' gradient
checkpointing, ``torch.utils.checkpoint`` over a module, a reversible layer's own autograd Function as in
Reformer) runs its functional GEMMs emulated again, so the gradients are the bits of the same model without
checkpointing, and ``coverage`` counts the recomputation as emulated."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import emunum
from third_party_models import MODELS, loss_of

POLICIES = {"e4m3fn nearest": dict(fmt="e4m3fn", grad_rounding="nearest"),
            "e4m3fn/e5m2 stochastic grads": dict(fmt="e4m3fn", grad="e5m2"), "nvfp4": dict(fmt="nvfp4")}


class Block(nn.Module):
    """Self-attention whose products are functional GEMMs of the block itself, then a Linear."""

    def __init__(self, d=16):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        p = torch.softmax(q @ k.transpose(-2, -1) / 4, dim=-1)
        return x + self.out(torch.matmul(p, v))


class Recomputed(torch.autograd.Function):
    """y = block(x), saving nothing: backward runs the block again with grad on and backpropagates through it (the
    way Reformer's reversible layers recompute)."""

    @staticmethod
    def forward(ctx, x, block, *params):
        ctx.block = block
        ctx.save_for_backward(x)
        return block(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        params = list(ctx.block.parameters())
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            y = ctx.block(xd)
            grads = torch.autograd.grad(y, [xd, *params], grad)
        return (grads[0], None, *grads[1:])


class Checkpointed(nn.Module):
    """Two blocks, each run through ``torch.utils.checkpoint`` (reentrant True or False) or ``Recomputed``
    ("function"), or as they are (None)."""

    def __init__(self, reentrant):
        super().__init__()
        self.reentrant, self.head = reentrant, nn.Linear(16, 4)
        self.blocks = nn.ModuleList([nn.Sequential(Block()), nn.Sequential(Block())])  # the GEMMs a level down

    def forward(self, x):
        for b in self.blocks:
            if self.reentrant is None:
                x = b(x)
            elif self.reentrant == "function":
                x = Recomputed.apply(x, b, *b.parameters())
            else:
                x = checkpoint(b, x, use_reentrant=self.reentrant)
        return self.head(F.gelu(x))


def _own(reentrant):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()  # reentrant: needed
    return Checkpointed(reentrant), (x,), {}


def _llama(reentrant):
    torch.manual_seed(0)
    model, args, kw = MODELS["llama"]()
    if reentrant is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers' name for it changes in v6
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model, args, kw


BUILDERS = {"torch.utils.checkpoint over a block": _own, "transformers llama": _llama}


def _grads(build, reentrant, policy):
    model, args, kw = build(reentrant)
    model.train()
    emunum.patch(model, **policy)
    out = []
    for step in range(2):  # the first forward is patch's coverage check; the second runs without it
        model.zero_grad()
        torch.manual_seed(5 + step)  # the same stochastic roundings with and without checkpointing
        loss_of(model(*args, **kw)).backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out, model, args, kw


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("reentrant", [False, True, "function"], ids=["non_reentrant", "reentrant", "function"])
@pytest.mark.parametrize("model", sorted(BUILDERS))
def test_a_checkpointed_block_recomputes_its_functional_gemms_emulated(model, reentrant, policy):
    if reentrant == "function" and model != "torch.utils.checkpoint over a block":
        pytest.skip("an autograd Function of the test's own: its own model only")
    want, *_ = _grads(BUILDERS[model], None, POLICIES[policy])
    got, patched, args, kw = _grads(BUILDERS[model], reentrant, POLICIES[policy])
    for step_got, step_want in zip(got, want):
        assert all(torch.equal(a, b) for a, b in zip(step_got, step_want))
    cov = emunum.coverage(patched, *args, loss_fn=loss_of, **kw)
    assert cov.fraction == 1.0, str(cov)


class BodyCheckpointed(nn.Module):
    """Attention whose products are functional GEMMs in the body of the function that the checkpoint runs (a
    method of the model itself, outside any submodule's call), then a head."""

    def __init__(self, reentrant):
        super().__init__()
        self.reentrant, self.qkv, self.head = reentrant, nn.Linear(16, 48), nn.Linear(16, 4)
        self.mix = nn.Parameter(torch.randn(16, 16) / 4)

    def _attend(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        p = torch.softmax(q @ k.transpose(-2, -1) / 4, dim=-1)
        return x + F.linear(torch.matmul(p, v), self.mix)

    def forward(self, x):
        for _ in range(2):  # the function checkpointed twice, so each recomputation has its own frame
            x = self._attend(x) if self.reentrant is None else checkpoint(self._attend, x,
                                                                          use_reentrant=self.reentrant)
        return self.head(F.gelu(x))


def _body(reentrant):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
    return BodyCheckpointed(reentrant), (x,), {}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_functional_gemms_in_a_checkpointed_functions_own_body_are_recomputed_emulated(reentrant, policy):
    want, *_ = _grads(_body, None, POLICIES[policy])
    got, patched, args, kw = _grads(_body, reentrant, POLICIES[policy])
    for step_got, step_want in zip(got, want):
        assert all(torch.equal(a, b) for a, b in zip(step_got, step_want))
    cov = emunum.coverage(patched, *args, loss_fn=loss_of, **kw)
    assert cov.fraction == 1.0, str(cov)


class HandWritten(torch.autograd.Function):
    """y = (q k^T) v with a backward of its own that computes the gradients with ``torch.matmul`` (the way
    transformers' YOSO attention does): the autograd engine runs it after the model's forward has returned."""

    @staticmethod
    def forward(ctx, q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2))
        ctx.save_for_backward(q, k, v, s)
        return torch.matmul(s, v)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, s = ctx.saved_tensors
        gs = torch.matmul(grad, v.transpose(-1, -2))
        return torch.matmul(gs, k), torch.matmul(gs.transpose(-1, -2), q), torch.matmul(s.transpose(-1, -2), grad)


class HandWrittenAttention(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.qkv, self.head = nn.Linear(d, 3 * d), nn.Linear(d, 4)

    def forward(self, x):
        return self.head(HandWritten.apply(*self.qkv(x).chunk(3, dim=-1)))


def _hand_written():
    torch.manual_seed(0)
    return HandWrittenAttention(), torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_custom_functions_own_backward_runs_its_gemms_emulated(policy):
    model, x = _hand_written()
    emunum.patch(model, **POLICIES[policy])
    cov = emunum.coverage(model, x, loss_fn=loss_of)
    assert cov.fraction == 1.0, str(cov)
    assert cov.total_flops == emunum.coverage(_hand_written()[0], x, loss_fn=loss_of).total_flops


def test_a_custom_functions_own_backward_rounds_its_products_as_outputs():
    model, x = _hand_written()
    emunum.patch(model, fmt="e4m3fn", grad_rounding="nearest")
    grads = []
    model.qkv.register_full_backward_hook(lambda m, gi, go: grads.append(go[0]) and None)
    loss_of(model(x)).backward()
    g = grads[0]  # dq, dk, dv: each the product of the Function's backward, rounded as its output
    assert torch.equal(g, emunum.quantize(g, "e4m3fn")) and g.abs().sum() > 0
