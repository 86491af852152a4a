"""One NaN rule on every dtype: a NaN made by the rounding (overflow in an fn/fnuz format) is the
positive quiet NaN; an input NaN keeps its sign and payload, quietened."""
from __future__ import annotations

import pytest
import torch

import emunum

_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@pytest.mark.parametrize("dtype", list(_INT), ids=str)
@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
def test_overflow_nans_are_positive_and_input_nans_keep_their_sign(dtype, fmt):
    x = torch.tensor([1e4, -1e4, 1.0, 1.0], dtype=dtype)
    x[2:] = float("nan")
    x.view(_INT[dtype])[3] |= torch.iinfo(_INT[dtype]).min  # a negative NaN
    q = emunum.quantize(x, fmt)
    assert torch.isnan(q).all()
    assert torch.signbit(q).tolist() == [False, False, False, True]
    assert torch.equal(q.view(_INT[dtype]), emunum.reference.quantize_reference(x, emunum.get_format(fmt)).view(_INT[dtype]))
