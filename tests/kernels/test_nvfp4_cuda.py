"""The numba-cuda NVFP4-family kernel (kernels/nvfp4_cuda.py) gives the CPU kernel's bits and scales, for 4/6
selection (1-D blocks and 16x16 tiles, tensor and per-row outer scales, every metric) and per-row outer scales,
in round-to-nearest and stochastic rounding (same seed, same bits), partial edge blocks and NaN blocks included.
Runs under numba's CUDA simulator without a GPU (tests/kernels/conftest.py sets NUMBA_ENABLE_CUDASIM)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from emunum.block_quantize import block_args
from emunum.formats import BLOCK_PRESETS, BlockFormat, FourOverSix, RoundMode
from emunum.nvfp4_quantize import line_arrays
from emunum.rng import seed_key

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None, reason="needs numba-cuda")

FORMATS = [
    BLOCK_PRESETS["nvfp4_4over6"],
    BlockFormat("fp4_e2m1", 16, "e4m3fn", scale_rule="amax", outer_scale="row", four_over_six=FourOverSix("mse", 448)),
    BlockFormat("fp4_e2m1", (16, 16), "e4m3fn", scale_rule="amax", tensor_scale=True,
                four_over_six=FourOverSix("absmax", 256)),
    BLOCK_PRESETS["nvfp4_row"],
]


@pytest.mark.parametrize("mode", [RoundMode.NEAREST, RoundMode.STOCHASTIC])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_cuda_nvfp4_kernel_matches_cpu_bits(fmt, mode):
    from numba import cuda

    from emunum.kernels import nvfp4_cpu, nvfp4_cuda

    rng = np.random.default_rng(2)
    shape = (2, 20, 40)  # partial blocks along both axes
    src = (rng.standard_normal(shape) * 2.0 ** rng.integers(-10, 10, shape[:2] + (1,))).astype(np.float32)
    src[1, 3, 5] = np.nan
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    nb = (shape[0], -(-shape[1] // tile[0]), -(-shape[2] // tile[1]))
    lines = tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in line_arrays(torch.from_numpy(src), fmt))
    args = block_args(fmt, 1.0)[:-1]
    key = int(seed_key(5))
    d_cpu, s_cpu = np.empty_like(src), np.empty(nb)
    nvfp4_cpu.quantize_nvfp4(src, d_cpu, s_cpu, tile, lines, args, int(mode), key, 8)
    d_gpu, s_gpu = cuda.device_array(shape, np.float32), cuda.device_array(nb, np.float64)
    dev_lines = tuple(cuda.to_device(v) if isinstance(v, np.ndarray) else v for v in lines)
    nvfp4_cuda.quantize_nvfp4(cuda.to_device(src), d_gpu, s_gpu, tile, dev_lines, args, int(mode), key, 8)
    assert np.array_equal(d_cpu.view(np.uint32), d_gpu.copy_to_host().view(np.uint32))
    assert np.array_equal(s_cpu, s_gpu.copy_to_host(), equal_nan=True)
    assert np.isnan(d_cpu[1, 3]).any()
