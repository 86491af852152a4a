"""The numba-cuda block kernel (kernels/block_cuda.py) gives the CPU kernel's bits, scales included, in every
mode (stochastic: same seed, same bits), for 1-D blocks and 2-D tiles with partial edges. Runs under numba's
CUDA simulator without a GPU (tests/kernels/conftest.py sets NUMBA_ENABLE_CUDASIM)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from emunum.block_quantize import block_args
from emunum.formats import RoundMode, get_format
from emunum.rng import seed_key

import tiers

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None, reason="needs numba-cuda")

MODES = [m for m in RoundMode]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # max * 2**127 (an inf's block) in float32
# every preset with every tile by default, float32 and float64 in turn; the rest: the exhaustive tier
@pytest.mark.parametrize("name,tile_shape,dtype", tiers.grid(
    [["mxfp8_e4m3", "mxfp6_e2m3", "mxint8", "nvfp4", "mxfp8_e5m2_rceil", "mxint8_even", "mxfp4_e2m1_ceil",
      "mxfp6_e3m2_even", "mxint8_rceil"],
     [((1, 32), (1, 3, 70)), ((1, 16), (1, 2, 40)), ((4, 8), (2, 9, 13))], [np.float32, np.float64]], lead=2,
    ids=[None, lambda ts: "x".join(map(str, ts[0])), lambda d: d.__name__]))
def test_cuda_block_kernel_matches_cpu_bits_in_every_mode(name, tile_shape, dtype):
    tile, shape = tile_shape
    from emunum.kernels import block_cpu, block_cuda

    fmt = get_format(name)
    rng = np.random.default_rng(1)
    src = (rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 12, shape[:2] + (1,))).astype(dtype)
    src[0, 1, 3] = np.nan
    src[-1, 0, -1] = np.inf
    nb = (shape[0], -(-shape[1] // tile[0]), -(-shape[2] // tile[1]))
    args = block_args(fmt, 0.0078125 if fmt.tensor_scale else 1.0)
    for mode in MODES:
        key = int(seed_key(99))
        d_cpu, s_cpu = np.empty_like(src), np.empty(nb)
        d_gpu, s_gpu = np.empty_like(src), np.empty(nb)
        block_cpu.quantize_blocks(src, d_cpu, s_cpu, tile, args, int(mode), key, 8)
        block_cuda.quantize_blocks(src, d_gpu, s_gpu, tile, args, int(mode), key, 8)
        assert np.array_equal(d_cpu.view(np.uint8), d_gpu.view(np.uint8)), mode  # bits, NaNs included
        assert np.array_equal(s_cpu, s_gpu, equal_nan=True), mode
