"""Codebook and logarithmic-number kernels: CUDA (numba's simulator without a GPU) gives the CPU kernel's
bits in every mode, stochastic included (same seed and flat index), for float32 and float64; the serial and
parallel CPU loops agree; the custom op and torch.compile carry both formats."""
import numpy as np
import pytest
import torch

import emunum
from emunum.formats import LogFormat, RoundMode, TableFormat
from emunum.kernels import log_cpu, table_cpu
from emunum.kernels.abi import TableArgs
from emunum.rng import seed_key

MODES = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd", "stochastic"]
FORMATS = [emunum.get_format("nf4"), TableFormat([-3.0, -0.75, 0.1, 0.2, 5.0, 1e6]), LogFormat(3, 2),
           LogFormat(2, 3, signed=False)]


def inputs(dtype, n=700):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-8, 8, n)
    x[:8] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-30, -1e30, 1.0]
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def cpu_run(fmt, x, mode, key, parallel):
    out = np.empty_like(x)
    args = fmt.to_kernel_args()
    run = table_cpu.quantize_table if isinstance(args, TableArgs) else log_cpu.quantize_log
    run(x, out, *args, mode, key, 32, parallel=parallel)
    return out


def cuda_run(fmt, x, mode, key):
    from emunum.kernels import log_cuda, table_cuda
    out = np.empty_like(x)
    args = fmt.to_kernel_args()
    run = table_cuda.quantize_table if isinstance(args, TableArgs) else log_cuda.quantize_log
    run(x, out, *args, mode, key, 32)
    return out


def bits(a):
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_cuda_kernel_gives_the_cpu_kernels_bits(fmt, mode, dtype):
    pytest.importorskip("numba_cuda")
    x = inputs(dtype, 300)
    m, key = int(RoundMode.parse(mode)), seed_key(17)
    want = cpu_run(fmt, x, m, key, parallel=False)
    assert np.array_equal(bits(cuda_run(fmt, x, m, key)), bits(want))


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_serial_and_parallel_cpu_loops_agree_bit_for_bit(fmt, mode, launch_shares):
    x = inputs(np.float32, 5000)
    m, key = int(RoundMode.parse(mode)), seed_key(4)
    assert np.array_equal(bits(cpu_run(fmt, x, m, key, True)), bits(cpu_run(fmt, x, m, key, False)))


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_quantize_equals_kernel_and_handles_strided_and_out(fmt):
    x = torch.from_numpy(inputs(np.float64, 600)).view(20, 30)
    want = torch.from_numpy(cpu_run(fmt, x.contiguous().numpy().reshape(-1), 0, seed_key(0), False)).view(20, 30)
    assert torch.equal(emunum.quantize(x, fmt).nan_to_num(7.0), want.nan_to_num(7.0))
    t = x.t()
    assert torch.equal(emunum.quantize(t, fmt).nan_to_num(7.0), want.t().nan_to_num(7.0))
    out = torch.empty_like(x)
    before = x.clone()
    emunum.quantize(x, fmt, out=out)
    assert torch.equal(out.nan_to_num(7.0), want.nan_to_num(7.0))
    assert torch.equal(x.nan_to_num(7.0), before.nan_to_num(7.0))  # the input is never modified


@pytest.mark.parametrize("fmt", [FORMATS[0], FORMATS[2]], ids=str)
def test_torch_compile_traces_the_custom_op_with_an_interned_format(fmt):
    x = torch.randn(64, dtype=torch.float32)
    f = torch.compile(lambda t: emunum.quantize(t, fmt) * 2, backend="aot_eager", fullgraph=True)
    assert torch.equal(f(x), emunum.quantize(x, fmt) * 2)
