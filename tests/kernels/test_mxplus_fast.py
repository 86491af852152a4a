"""The float32 fast path of the MX+ kernel (kernels/mxplus_fast.py) gives the float64 loop's bits and scales
(``mxplus_serial``), serial and parallel, for every MX+ preset's element, blocks that tile the rows or not,
partial blocks, zero/NaN/inf blocks, float32 subnormals, equal maxima, and in place (dst = src)."""
from __future__ import annotations

import numpy as np
import pytest

from emunum.formats import MXPLUS_PRESETS
from emunum.kernels import mxplus_cpu, mxplus_fast
from emunum.mxplus_quantize import mxplus_args


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-150, 128, shape[:-1] + (1,))
    x = x.astype(np.float32).reshape(-1)
    x[5:40] = 0.0
    x[7] = -0.0
    x[50] = np.nan
    x[100] = np.inf
    x[101] = -np.inf
    x[130:140] = np.float32(-3.0)  # equal maxima
    x[200:230] = rng.integers(-4, 5, 30).astype(np.float32) * np.float32(2.0 ** -140)  # subnormal blocks
    return x.reshape(shape)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shape,tc", [((2, 8, 64), 32), ((1, 12, 70), 32), ((3, 5, 48), 16), ((1, 9, 31), 7)])
@pytest.mark.parametrize("name", sorted(MXPLUS_PRESETS))
def test_fast_path_equals_the_float64_loop(name, shape, tc, parallel):
    args = mxplus_args(MXPLUS_PRESETS[name])
    assert mxplus_fast.fast_ok(args)
    src = _data(shape, tc)
    nb = (shape[0], shape[1], -(-shape[2] // tc))
    want, s_want = np.empty_like(src), np.empty(nb)
    mxplus_cpu.mxplus_serial(src, want, s_want, 1, tc, *args, 0, np.uint64(0), 32)
    got, s_got = np.empty_like(src), np.empty(nb)
    mxplus_cpu.quantize_mxplus(src, got, s_got, (1, tc), args, 0, 0, 32, parallel=parallel)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert np.array_equal(s_want, s_got, equal_nan=True)
    inplace, s_in = src.copy(), np.empty(nb)
    mxplus_cpu.quantize_mxplus(inplace, inplace, s_in, (1, tc), args, 0, 0, 32, parallel=parallel)
    assert np.array_equal(want.view(np.uint32), inplace.view(np.uint32))
    slow_inplace = src.copy()  # the float64 loop in place too
    mxplus_cpu.mxplus_serial(slow_inplace, slow_inplace, np.empty(nb), 1, tc, *args, 0, np.uint64(0), 32)
    assert np.array_equal(want.view(np.uint32), slow_inplace.view(np.uint32))
