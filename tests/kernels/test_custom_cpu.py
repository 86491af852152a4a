"""kernels/custom_cpu.py's derived-mode loop (toward_zero, up, down, stochastic) gives the same bits run whole or
in shares on threads (``threads.launch``), in place or not, for float32 and float64."""
import numpy as np
import pytest
from numba import njit

from emunum.formats import CustomFormat, RoundMode
from emunum.kernels import custom_cpu
from emunum.rng import seed_key


@njit
def to_code(x):
    return np.int64(min(max(round(x * 8.0), 0), 31))


@njit
def from_code(c):
    return c / 8.0


EIGHTHS = CustomFormat(to_code, from_code, 5, name="eighths5")  # codes 0..31: the values c / 8


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", [RoundMode.TOWARD_ZERO, RoundMode.UP, RoundMode.DOWN, RoundMode.STOCHASTIC])
def test_derived_modes_give_the_same_bits_in_shares(mode, dtype, launch_shares):
    rng = np.random.default_rng(int(mode))
    x = (rng.standard_normal(3001) * 3).astype(dtype)
    x[:4] = [np.inf, -np.inf, np.nan, -0.0]
    args = EIGHTHS.to_kernel_args()
    whole = np.empty_like(x)
    custom_cpu.quantize_custom(x, whole, args, int(mode), seed_key(7), 16, parallel=False)
    shared = np.empty_like(x)
    custom_cpu.quantize_custom(x, shared, args, int(mode), seed_key(7), 16, parallel=True)
    inplace = x.copy()
    custom_cpu.quantize_custom(inplace, inplace, args, int(mode), seed_key(7), 16, parallel=True)
    u = np.uint32 if dtype == np.float32 else np.uint64
    assert np.array_equal(whole.view(u), shared.view(u)) and np.array_equal(whole.view(u), inplace.view(u))
