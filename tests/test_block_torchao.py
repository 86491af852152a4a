"""Second oracle: torchao's MX reference (``to_mx`` / ``to_dtype``, FLOOR scale mode = OCP's rule), where torchao
is importable. It is not a dependency: torchao 0.18.0 installs beside torch 2.13 with ``--no-deps`` (no CUDA
pulled; its CUDA extensions fail to load, harmlessly), so this module skips unless it was installed by hand."""
from __future__ import annotations

import pytest
import torch

import emunum

mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")


@pytest.mark.parametrize("name,dtype", [("mxfp8_e4m3", torch.float8_e4m3fn), ("mxfp8_e5m2", torch.float8_e5m2),
                                        ("mxfp6_e3m2", "fp6_e3m2"), ("mxfp6_e2m3", "fp6_e2m3")])
def test_mx_matches_torchao_to_mx(name, dtype):
    torch.manual_seed(0)
    x = torch.randn(64, 256) * torch.logspace(-6, 6, 64)[:, None]
    x[4, :32] = 0.0
    scale, data = mx.to_mx(x, dtype, 32)
    assert torch.equal(emunum.quantize(x, name), mx.to_dtype(data, scale, dtype, 32, torch.float32))
