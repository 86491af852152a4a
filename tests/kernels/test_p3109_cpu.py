"""The unsigned P3109 CPU kernels (kernels/p3109_cpu.py): the fused float32 nearest loop and the two-pass path
give the exact torch reference's bits (``formats.p3109.round_p3109_torch``, itself tested against gfloat), in
place and out of place, on the serial and the parallel loops."""
import numpy as np
import pytest
import torch

import emunum
from emunum import backends
from emunum.formats import RoundMode
from emunum.formats.p3109 import round_p3109_torch
from emunum.kernels import p3109_cpu
from emunum.rng import seed_key

FORMATS = ["p3109_k8p4uf", "p3109_k8p3u", "p3109_k6p1u", "p3109_k7p7uf"]


def data(dtype, n=5000):
    rng = np.random.default_rng(8)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    x[:6] = [0.0, -0.0, np.nan, np.inf, -np.inf, -1e-30]
    return torch.from_numpy(x).to(dtype)


def bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", FORMATS)
def test_unsigned_runner_gives_the_references_bits_in_and_out_of_place(name, dtype, mode, parallel):
    fmt, m = emunum.get_format(name), RoundMode.parse(mode)
    x = data(dtype)
    want = round_p3109_torch(x, fmt, m, seed=3).to(dtype)
    want = torch.where(torch.isnan(x), x, want)  # an input NaN comes back itself (quietened: no payload here)
    run = backends.runner(fmt, "cpu", dtype)
    out = torch.empty_like(x)
    run(x.data_ptr(), out.data_ptr(), x.numel(), int(m), seed_key(3), 32, parallel)
    assert torch.equal(bits(out), bits(want))
    y = x.clone()
    run(y.data_ptr(), y.data_ptr(), y.numel(), int(m), seed_key(3), 32, parallel)
    assert torch.equal(bits(y), bits(want))


def test_the_fused_loop_is_taken_for_float32_nearest():
    fmt = emunum.get_format("p3109_k8p4uf")
    a = fmt.to_kernel_args()
    assert p3109_cpu._ew.nearest_ok(a.man, a.emin, 1, a.max)
