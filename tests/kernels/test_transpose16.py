"""``transpose16`` writes dst[d + k * stride + r] = src[s + 16 * r + k] & 0x7FFFFFFF for r, k < 16 and nothing
else, in a function with 512-bit vectors (kernels/wide.py) and without, at any offsets and row stride, by either
network (rows of 16, or 8 x 8 sub-tiles) whichever the CPU is."""
import numpy as np
import pytest
from numba import njit

from emunum.kernels.transpose16 import transpose16, transpose16_rows
from emunum.kernels.wide import prefer_wide_vectors


@njit
def _plain(src, s, dst, d, stride):
    transpose16(src, s, dst, d, stride)


@njit
def _wide(src, s, dst, d, stride):
    prefer_wide_vectors()
    transpose16(src, s, dst, d, stride)


def _network(width):
    t = transpose16_rows[width]

    @njit
    def run(src, s, dst, d, stride):
        t(src, s, dst, d, stride)
    return run


_RUNS = {"plain": _plain, "wide": _wide, "rows16": _network(16), "rows8": _network(8)}


@pytest.mark.parametrize("run", list(_RUNS), ids=list(_RUNS))
@pytest.mark.parametrize("s, d, stride", [(0, 0, 16), (7, 3, 64), (33, 100, 17)])
def test_tile_transposed_with_sign_bits_cleared(run, s, d, stride):
    rng = np.random.default_rng(s + d + stride)
    src = rng.integers(0, 1 << 32, s + 256 + 9, dtype=np.uint64).astype(np.uint32)
    dst = rng.integers(0, 1 << 32, d + 15 * stride + 16 + 9, dtype=np.uint64).astype(np.uint32)
    want = dst.copy()
    for r in range(16):
        for k in range(16):
            want[d + k * stride + r] = src[s + 16 * r + k] & 0x7FFFFFFF
    _RUNS[run](src, s, dst, d, stride)
    assert np.array_equal(dst, want)
