"""The numba-cuda MX+ kernel (kernels/mxplus_cuda.py) gives the CPU kernel's bits and scales, for 1-D blocks and
2-D tiles, partial edge blocks, NaN, zero and infinite blocks, equal maxima, in every rounding mode (stochastic:
same seed, same bits). Runs under numba's CUDA simulator without a GPU (tests/kernels/conftest.py sets
NUMBA_ENABLE_CUDASIM)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from emunum.formats import MXPLUS_PRESETS, MXPlusFormat, RoundMode
from emunum.mxplus_quantize import mxplus_args
from emunum.rng import seed_key

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None, reason="needs numba-cuda")

FORMATS = [MXPLUS_PRESETS["mxfp4_e2m1_plus"].with_block_size(8), MXPLUS_PRESETS["mxfp8_e4m3_plus"],
           MXPlusFormat("fp6_e3m2", (4, 8)), MXPLUS_PRESETS["mxfp8_e5m2_plus"].with_block_size(16)]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # block max * 2**127 is inf in float32
@pytest.mark.parametrize("mode", [RoundMode.NEAREST, RoundMode.STOCHASTIC, RoundMode.TOWARD_ZERO, RoundMode.ODD])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_cuda_mxplus_kernel_matches_cpu_bits(fmt, mode):
    from numba import cuda

    from emunum.kernels import mxplus_cpu, mxplus_cuda

    rng = np.random.default_rng(4)
    shape = (2, 10, 40)  # partial blocks along both axes
    src = (rng.standard_normal(shape) * 2.0 ** rng.integers(-130, 100, shape[:2] + (1,))).astype(np.float32)
    src[1, 3, 5] = np.nan
    src[0, 2, :] = 0.0
    src[0, 2, 1] = -0.0
    src[0, 5, 3] = np.inf
    src[1, 6, :8] = np.float32(5.5) * np.sign(rng.standard_normal(8))  # equal maxima
    tile = fmt.tile if fmt.tile[0] else (1, fmt.tile[1])
    nb = (shape[0], -(-shape[1] // tile[0]), -(-shape[2] // tile[1]))
    args = mxplus_args(fmt)
    key = int(seed_key(5))
    d_cpu, s_cpu = np.empty_like(src), np.empty(nb)
    mxplus_cpu.quantize_mxplus(src, d_cpu, s_cpu, tile, args, int(mode), key, 8)
    d_gpu, s_gpu = cuda.device_array(shape, np.float32), cuda.device_array(nb, np.float64)
    mxplus_cuda.quantize_mxplus(cuda.to_device(src), d_gpu, s_gpu, tile, args, int(mode), key, 8)
    assert np.array_equal(d_cpu.view(np.uint32), d_gpu.copy_to_host().view(np.uint32))
    assert np.array_equal(s_cpu, s_gpu.copy_to_host(), equal_nan=True)
    assert np.isnan(d_cpu[1, 3]).any() and np.signbit(d_cpu[0, 2, 1])
