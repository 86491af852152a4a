"""``borrow`` gives a view of the same memory with the same shape and strides: read and written through it, an
array of any layout (contiguous, strided, transposed, reversed) matches numpy's own view element for element."""
import numpy as np
import pytest
from numba import njit

from emunum.kernels.borrow import borrow


@njit
def _through_2d(a, out):
    b = borrow(a)
    for i in range(b.shape[0]):
        for j in range(b.shape[1]):
            out[i, j] = b[i, j]
            b[i, j] = b[i, j] * 3 + 1


@njit
def _through_1d(a, out):
    b = borrow(a)
    for i in range(b.size):
        out[i] = b[i]
        b[i] = b[i] * 3 + 1


BASE = np.arange(7 * 12, dtype=np.float32).reshape(7, 12) - 40
VIEWS = {"contiguous": lambda a: a, "strided": lambda a: a[1::2, ::3], "transposed": lambda a: a.T,
         "row": lambda a: a[3], "reversed": lambda a: a[2, ::-2], "column": lambda a: a[:, 5]}


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_borrowed_view_reads_and_writes_the_same_elements(view):
    a = BASE.copy()
    v = view(a)
    want_read, want_after = v.copy(), v * 3 + 1
    out = np.empty(v.shape, v.dtype)
    (_through_2d if v.ndim == 2 else _through_1d)(v, out)
    assert np.array_equal(out.view(np.uint32), want_read.view(np.uint32))
    assert np.array_equal(v.view(np.uint32), want_after.view(np.uint32))
    untouched = np.ones(a.shape, bool)
    view(untouched)[...] = False
    assert np.array_equal(a[untouched], BASE[untouched])  # nothing outside the view was written
