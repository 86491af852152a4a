"""Block-GEMM layers under torch.compile: no graph break (the block rounding is the custom op
``emunum::quantize_block``), and the compiled step's values and gradients are eager's, bit for bit."""
import copy

import pytest
import torch

import emunum

transformers = pytest.importorskip("transformers")


def _tiny_bert():
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100, attn_implementation="eager", hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)  # no dropout: inductor draws its own bits
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(cfg)


def _step(model, ids, labels):
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()  # the compiled model's backward is AOT autograd's compiled graph
    return out.logits.detach()


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4", "mxfp8_e4m3_rceil"])
def test_a_block_format_bert_compiles_fullgraph_with_eagers_bits(fmt):
    base = _tiny_bert()
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, 100, (4, 32), generator=g), torch.randint(0, 2, (4,), generator=g)
    only_linear = lambda m, name: isinstance(m, torch.nn.Linear)  # noqa: E731
    eager = emunum.patch(copy.deepcopy(base), fmt, grad_rounding="nearest", filter=only_linear)
    comp = emunum.patch(copy.deepcopy(base), fmt, grad_rounding="nearest", filter=only_linear)
    torch._dynamo.reset()
    want = _step(eager, ids, labels)
    # fullgraph=True: a graph break raises (torch.compile's contract), so this step traces one graph or fails.
    # aot_eager: the traced graph's fp32 ops are eager's (inductor's fusions may reassociate the unemulated
    # LayerNorm/GELU arithmetic), so every difference would be the block op's
    got = _step(torch.compile(comp, fullgraph=True, backend="aot_eager"), ids, labels)
    assert torch.equal(want, got)
    for (name, a), b in zip(eager.named_parameters(), comp.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8_e4m3", "nvfp4_2d"])
def test_the_block_op_is_quantize_in_its_layout_and_passes_opcheck(name):
    # the layout too: a compiled graph then hands torch's GEMMs eager's operands (a CPU's GEMM kernel may sum
    # in another order for another layout, and did on an AMD host)
    import emunum.block_ops  # noqa: F401  (registers the op)
    from emunum.formats.interned import intern

    fmt = emunum.get_format(name)
    for x in (torch.randn(48, 40), torch.randn(3, 32, 48)):
        for axis in (-1, 0, 1):
            y = torch.ops.emunum.quantize_block(x, intern(fmt), 0, None, 32, axis)
            want = emunum.quantize(x, fmt, axis=axis)
            assert torch.equal(y, want) and y.stride() == want.stride()
            with torch._subclasses.FakeTensorMode() as mode:
                fake = torch.ops.emunum.quantize_block(mode.from_tensor(x), intern(fmt), 0, None, 32, axis)
            assert fake.shape == y.shape and fake.stride() == y.stride()
            torch.library.opcheck(torch.ops.emunum.quantize_block.default, (x, intern(fmt), 0, 7, 32, axis))


class _LinearAndConv1D(torch.nn.Module):
    """A Linear layer (a block GEMM layer) and GPT-2's ``Conv1D`` form, ``addmm(b, x, W)`` (a functional GEMM)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 48)
        self.w, self.b = torch.nn.Parameter(torch.randn(48, 16) / 7), torch.nn.Parameter(torch.zeros(16))

    def forward(self, x):
        return torch.addmm(self.b, torch.relu(self.fc(x)), self.w)


def test_the_nvfp4_recipe_with_its_hadamard_transform_compiles_fullgraph_with_eagers_bits():
    """The transform's kernel is numpy/numba code, which torch.compile cannot trace: while it traces, the
    transform runs as its tensor ops (the same definition, ``emunum.hadamard``), and the compiled step's output
    and gradients (a layer's weight gradient and a functional GEMM's, both transformed) are eager's, which took
    the kernel, bit for bit."""
    torch.manual_seed(0)
    base, x = _LinearAndConv1D(), torch.randn(40, 32)
    policy = dict(fmt="nvfp4", weight="nvfp4_2d", grad_rounding="nearest", hadamard=16)
    eager, comp = emunum.patch(copy.deepcopy(base), **policy), emunum.patch(copy.deepcopy(base), **policy)
    torch._dynamo.reset()
    want = eager(x)
    want.square().sum().backward()
    got = torch.compile(comp, backend="aot_eager", fullgraph=True)(x)
    got.square().sum().backward()
    assert torch.equal(want, got)
    for (pname, a), b in zip(eager.named_parameters(), comp.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), pname
