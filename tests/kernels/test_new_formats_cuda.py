"""The 2026 element formats on CUDA: quantize's CUDA launcher for P3109 and HiFloat8 (``emunum.backends``) gives the
CPU kernel's bits in every mode, stochastic included, for float32 and float64; on numba's simulator, with
the launchers' torch interop swapped for host views (the simulator cannot see torch CUDA tensors). The integer
block presets (mxint4, nvint4): the CUDA block kernel gives the CPU block kernel's bits and scales."""
import contextlib
import importlib.util
import types

import numpy as np
import pytest
import torch

import emunum
from emunum import backends, kernel_backends
from emunum.formats import RoundMode
from emunum.rng import seed_key
import tiers

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None, reason="needs numba-cuda")
MODES = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd", "stochastic"]
FORMATS = ["p3109_k8p3", "p3109_k8p4uf", "p3109_k6p1f", "p3109_k7p7u", "hifloat8", "hifloat8_sat"]


def host_backend():
    from emunum.kernels import cuda as kc

    def as_device_array(t):
        return t.detach().numpy()

    return types.SimpleNamespace(as_device_array=as_device_array, torch_stream=lambda device: None,
                                 device_of=lambda t: contextlib.nullcontext(),
                                 quantize_float=kc.quantize_float, quantize_fixed=kc.quantize_fixed)


def inputs(dtype, n=400):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)
    x[:8] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-30, -1e30, 1.0]
    return torch.from_numpy(x).to(dtype)


def bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


# every format in every mode by default, float32 and float64 in turn; the rest: the exhaustive tier
@pytest.mark.parametrize("name,mode,dtype", tiers.grid([FORMATS, MODES, [torch.float32, torch.float64]], lead=2,
                                                       ids=[None, None, str]))
def test_cuda_launcher_gives_the_cpu_kernels_bits(name, mode, dtype, monkeypatch):
    monkeypatch.setattr(kernel_backends, "cuda_module", host_backend)
    fmt, m, key = emunum.get_format(name), RoundMode.parse(mode), seed_key(9)
    x = inputs(dtype)
    want = emunum.quantize(x, fmt, mode, seed=9)
    for inplace in (False, True):
        src = x.clone()
        dst = src if inplace else torch.empty_like(src)
        backends.runner(fmt, "cuda", dtype)(src, dst, m, key, 32)
        assert torch.equal(bits(dst), bits(want)), inplace


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
@pytest.mark.parametrize("name", ["mxint4", "nvint4"])
def test_cuda_block_kernel_gives_the_cpu_kernels_bits_for_the_integer_block_presets(name, dtype):
    """Blocks along the last axis (a partial last block included), every mode, scales included."""
    from emunum.block_quantize import block_args
    from emunum.kernels import block_cpu, block_cuda

    fmt = emunum.get_format(name)
    rng = np.random.default_rng(2)
    shape, tile = (1, 3, 70), (1, fmt.block_size)
    src = (rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 12, (1, 3, 1))).astype(dtype)
    src[0, 1, 3] = np.nan
    nb = (1, 3, -(-70 // fmt.block_size))
    args = block_args(fmt, 0.0078125 if fmt.tensor_scale else 1.0)
    for mode in RoundMode:
        key = int(seed_key(5))
        d_cpu, s_cpu, d_gpu, s_gpu = np.empty_like(src), np.empty(nb), np.empty_like(src), np.empty(nb)
        block_cpu.quantize_blocks(src, d_cpu, s_cpu, tile, args, int(mode), key, 8)
        block_cuda.quantize_blocks(src, d_gpu, s_gpu, tile, args, int(mode), key, 8)
        assert np.array_equal(d_cpu.view(np.uint8), d_gpu.view(np.uint8)), mode
        assert np.array_equal(s_cpu, s_gpu, equal_nan=True), mode


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_hifloat8_cuda_launcher_rounds_16bit_tensors_as_the_cpu(mode, dtype, monkeypatch):
    monkeypatch.setattr(kernel_backends, "cuda_module", host_backend)
    fmt, m, key = emunum.get_format("hifloat8"), RoundMode.parse(mode), seed_key(4)
    x = inputs(torch.float32).clamp(-60000, 60000).to(dtype)
    want = emunum.quantize(x, fmt, mode, seed=4)
    got = torch.empty_like(x)
    backends.runner(fmt, "cuda", dtype)(x, got, m, key, 32)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
