"""The public ``emunum.quantize`` inside ``torch.compile(fullgraph=True)`` (no graph break): it goes through the
``emunum::quantize`` custom op while Dynamo traces, and gives eager's bits."""
from __future__ import annotations

import pytest
import torch

import emunum


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_quantize_between_torch_ops_compiles_fullgraph_with_eagers_bits(backend):
    def f(t):
        return emunum.quantize(t * 2 + 1, "fp8_152") - 1

    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    got = torch.compile(f, fullgraph=True, backend=backend)(x)
    assert torch.equal(got.view(torch.int32), f(x).view(torch.int32))


@pytest.mark.parametrize("fmt", ["e4m3fn", "fixed16_12", emunum.FloatFormat(3, 2, special="none")])
def test_out_and_stochastic_with_a_fixed_seed_compile_with_eagers_bits(fmt):
    def g(t, o):
        return emunum.quantize(t, fmt, "stochastic", seed=5, out=o)

    x = torch.randn(513, generator=torch.Generator().manual_seed(1)) * 4
    o_compiled, o_eager = torch.empty(513), torch.empty(513)
    r = torch.compile(g, fullgraph=True, backend="aot_eager")(x, o_compiled)
    g(x, o_eager)
    assert torch.equal(o_compiled.view(torch.int32), o_eager.view(torch.int32))
    assert torch.equal(r, o_compiled)


def test_quantize_compiles_fullgraph_in_a_program_that_imported_only_emunum():
    """``import emunum`` loads the custom ops lazily: the first traced quantize must register them itself."""
    import subprocess
    import sys

    code = ("import torch, emunum\n"
            "f = torch.compile(lambda x: emunum.quantize(x, 'e4m3fn'), fullgraph=True, backend='aot_eager')\n"
            "x = torch.randn(64, generator=torch.Generator().manual_seed(0))\n"
            "print(torch.equal(f(x), emunum.quantize(x, 'e4m3fn')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "True"
