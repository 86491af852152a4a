"""Empty tensors are valid input everywhere (docs/guarantees.md): every block format on a tensor that is
empty along any axis (the block axis included), block_matmul and the MAD GEMMs with M, K or N = 0, and
patched layers on an empty batch (or no input features) return the empty result, or for K = 0 the empty sum,
exactly as torch does in fp32."""
import pytest
import torch
import torch.nn as nn

import emunum
import emunum.mad as mad
from emunum.formats import BLOCK_PRESETS
from emunum.mad import MADUnit
from emunum.mad.block import block_matmul

ONE_D = [n for n, f in BLOCK_PRESETS.items() if not isinstance(f.block_size, tuple)]
TWO_D = [n for n, f in BLOCK_PRESETS.items() if isinstance(f.block_size, tuple)]
SHAPES = [(0,), (5, 0), (0, 5), (0, 0), (2, 0, 3), (0, 3, 4), (3, 4, 0)]


def _axes(shape):
    return sorted({-1, 0, len(shape) - 1} | set(range(len(shape))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ONE_D + TWO_D)
def test_block_formats_return_the_empty_result_on_every_axis(name, shape, dtype):
    if name in TWO_D and len(shape) < 2:
        pytest.skip("2-D tiles need two dimensions (a ValueError, tested elsewhere)")
    for axis in (_axes(shape) if name in ONE_D else [-1]):
        x = torch.empty(shape, dtype=dtype)
        y = emunum.quantize(x, name, axis=axis)
        assert y.shape == x.shape and y.dtype == dtype and y.numel() == 0
        out = torch.empty(shape, dtype=dtype)
        assert emunum.quantize(x, name, axis=axis, out=out) is out


@pytest.mark.parametrize("name", [n for n in ONE_D if not BLOCK_PRESETS[n].nvfp4_path])  # no numpy encode there
def test_block_encode_of_an_empty_tensor_is_empty(name):
    codes, scales, _ = emunum.get_format(name).encode(torch.empty(0, 64))
    assert tuple(codes.shape) == (0, 64) and scales.shape[0] == 0


UNIT = MADUnit("fp32", "fp32")
MKN = [(3, 0, 4), (0, 32, 4), (3, 32, 0), (0, 0, 0), (2, 0, 0), (0, 0, 5)]


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", "mxint8"])
@pytest.mark.parametrize("M,K,N", MKN)
def test_block_matmul_with_a_zero_size_is_torchs_result(fmt, M, K, N):
    A, B = torch.randn(M, K), torch.randn(K, N)
    got = block_matmul(A, B, fmt, fmt, UNIT)
    assert torch.equal(got, A @ B)  # K = 0: the empty sum, zeros; M or N = 0: empty


@pytest.mark.parametrize("unit", [UNIT, MADUnit.preset("h100_fp8_e4m3"), MADUnit("fp8_152", "fp16")],
                         ids=["fp32", "h100_fp8", "e5m2_fp16"])
@pytest.mark.parametrize("M,K,N", MKN)
def test_mad_gemms_with_a_zero_size_are_torchs_result(unit, M, K, N):
    A, B = torch.randn(M, K), torch.randn(K, N)
    C = torch.full((M, N), 2.0)
    assert torch.equal(mad.matmul(A, B, unit).float(), A @ B)
    assert torch.equal(emunum.addmm(C, A, B, unit).float(), C + A @ B)
    assert torch.equal(emunum.baddbmm(C.expand(2, M, N), A.expand(2, M, K), B.expand(2, K, N), unit).float(),
                       (C + A @ B).expand(2, M, N))
    x = torch.randn(M, K, requires_grad=True)
    w = torch.randn(N, K, requires_grad=True)
    b = torch.ones(N, requires_grad=True)
    y = mad.linear(x, w, b, unit)
    y.sum().backward()
    assert torch.equal(y.float(), x @ w.t() + b)
    assert torch.equal(x.grad, torch.ones(M, N) @ w) and torch.equal(w.grad, torch.ones(N, M) @ x)
    assert torch.equal(b.grad, torch.full((N,), float(M)))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4", "mxfp4_e2m1", "fp8_152"])
@pytest.mark.parametrize("shape,in_f", [((0, 8), 8), ((0, 5, 8), 8), ((4, 0, 8), 8), ((3, 0), 0)])
def test_a_patched_linear_on_an_empty_batch_returns_the_empty_result(fmt, shape, in_f):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(in_f, 4))
    m = emunum.patch(nn.Sequential(nn.Linear(in_f, 4)), fmt)
    m.load_state_dict(ref.state_dict())
    x = torch.randn(*shape, requires_grad=True)
    y, want = m(x), ref(x)
    assert y.shape == want.shape and torch.equal(y, want)  # empty, or the bias alone when in_f = 0
    y.sum().backward()
    want.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(m[0].weight.grad, ref[0].weight.grad) and torch.equal(m[0].bias.grad, ref[0].bias.grad)


@pytest.mark.parametrize("fmt", ["posit8", "nf4", "lns4_3", "fp8_152", "fixed8_4"])
@pytest.mark.parametrize("shape", SHAPES)
def test_element_formats_return_the_empty_result(fmt, shape):
    y = emunum.quantize(torch.empty(shape), fmt)
    assert y.shape == torch.Size(shape)


@pytest.mark.parametrize("M,K,N,nb", [(0, 3, 4, 1), (3, 4, 0, 2), (0, 0, 0, 1), (2, 3, 4, 0)])
def test_a_gemm_without_output_elements_returns_the_kernels_empty_result_without_running_it(M, K, N, nb,
                                                                                            monkeypatch):
    """Invariant: mad's CPU GEMM with nb * M * N = 0 returns what the kernel returns (its untouched (nb, M, N)
    float64 output) without calling it, on the one-product and the multi-term datapath."""
    import numpy as np

    from emunum.kernels import gemm_cpu, gemm_multiterm
    from emunum.mad import backend

    unit = MADUnit("fp8_152", "fp16", acc_rounding="toward_zero")
    A, B, bias = torch.randn(1, M, K), torch.randn(1, K, N), torch.randn(N)
    want = np.empty((nb, M, N))
    gemm_cpu.gemm(A.numpy(), B.numpy(), np.zeros((nb, M, N)), want, 0, *unit.kernel_params(), unit.lanes, 0,
                  backend.stream_keys(0), unit.sr_bits, fast=False)

    def never(*args, **kw):
        raise AssertionError("the kernel ran on an empty output")

    monkeypatch.setattr(gemm_cpu, "gemm", never)
    monkeypatch.setattr(gemm_multiterm, "gemm_auto", never)
    for u, c in ((unit, None), (MADUnit.preset("h100_fp8_e4m3"), None), (MADUnit("fp32", "fp32"), torch.ones(M, N))):
        got = backend.gemm(A, B, u, 0, bias=bias, nb=nb, c=c)
        assert got.dtype == torch.float64 and tuple(got.shape) == want.shape == (nb, M, N), u
