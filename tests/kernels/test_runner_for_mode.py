"""``run.for_mode(mode)``, the runners' caller with the mode bound (the eager rounding path's), gives the bits of
``run(..., mode, ...)`` and of the numpy reference, below and above the parallel threshold."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import emunum
from emunum import FloatFormat, RoundMode
from emunum.reference import round_fixed_reference, round_float_reference
from emunum.rng import seed_key

cpu = pytest.importorskip("emunum.kernels.cpu")

SEED = 4242
FORMATS = {"fp8_152": emunum.get_format("fp8_152"), "int8": emunum.get_format("int8")}


def _runner(fmt, dtype):
    if isinstance(fmt, FloatFormat):
        return cpu.float_runner(dtype, *fmt.to_kernel_args())
    return cpu.fixed_runner(dtype, *fmt.to_kernel_args())


def _reference(fmt, src: np.ndarray, mode, sr_bits):
    ref = round_float_reference if isinstance(fmt, FloatFormat) else round_fixed_reference
    return ref(src.astype(np.float64), fmt, mode, seed=SEED, sr_bits=sr_bits)


@pytest.mark.parametrize("n", [17, cpu.PARALLEL_MIN + 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", list(RoundMode), ids=lambda m: m.name.lower())
@pytest.mark.parametrize("name", list(FORMATS))
def test_the_bound_caller_rounds_as_the_runner_with_that_mode(name, mode, dtype, n):
    fmt, sr_bits = FORMATS[name], 13
    rng = np.random.default_rng(7)
    src = torch.from_numpy((rng.standard_normal(n) * 2.0 ** rng.integers(-12, 12, n)).astype(dtype))
    want, got = torch.empty_like(src), torch.empty_like(src)
    run = _runner(fmt, dtype)
    run(src.data_ptr(), want.data_ptr(), n, int(mode), seed_key(SEED), sr_bits)
    call = run.for_mode(int(mode))
    for _ in range(2):  # the first call goes through the dispatcher, later ones through the compiled entry point
        got.fill_(0.0)
        call(src.data_ptr(), got.data_ptr(), n, seed_key(SEED), sr_bits)
        assert torch.equal(got.view(torch.int32 if dtype == np.float32 else torch.int64),
                           want.view(torch.int32 if dtype == np.float32 else torch.int64))
    k = 1000  # the reference on a prefix (element i's random bits do not depend on n)
    assert np.array_equal(got[:k].numpy().astype(np.float64), _reference(fmt, src[:k].numpy(), mode, sr_bits))
