"""The backend registry: quantize reaches every number system's kernel through ``backends.runner``; a new spec
type is one ``register`` call; a subclass takes its nearest registered base's kernel."""
import ctypes

import numpy as np
import pytest
import torch

import emunum
from emunum import backends
from emunum.formats import CustomFormat, FixedFormat, FloatFormat, LogFormat, PositFormat, TableFormat


@pytest.mark.parametrize("fmt_type", [FloatFormat, FixedFormat, PositFormat, TableFormat, LogFormat, CustomFormat])
@pytest.mark.parametrize("device", backends.DEVICES)
def test_every_builtin_number_system_has_a_kernel_on_every_device(fmt_type, device):
    assert fmt_type in backends.registered(device)


class Truncated(FixedFormat):
    """A toy number system: FixedFormat's spec, its own kernel (every value toward zero, whatever the mode)."""


def _truncating_factory(fmt, dtype):
    step = 2.0 ** -fmt.frac_bits
    ctype = ctypes.c_float if dtype == torch.float32 else ctypes.c_double

    def run(src, dst, n, mode, key, nbits):
        a = np.ctypeslib.as_array((ctype * n).from_address(src))
        np.ctypeslib.as_array((ctype * n).from_address(dst))[:] = np.trunc(a / step) * step
    return run


@pytest.fixture
def truncated():
    backends.register(Truncated, "cpu", _truncating_factory)
    yield Truncated(8, 2)
    backends.unregister(Truncated, "cpu")


def test_a_new_number_system_is_one_register_call(truncated):
    x = torch.tensor([0.3, -0.3, 1.9, -1.9])
    assert torch.equal(emunum.quantize(x, truncated), torch.tensor([0.25, -0.25, 1.75, -1.75]))
    assert torch.equal(emunum.quantize(x, FixedFormat(8, 2)), torch.tensor([0.25, -0.25, 2.0, -2.0]))


def test_a_subclass_without_its_own_kernel_takes_its_base_classes():
    x = torch.tensor([0.3, -0.3, 1.9, -1.9])
    assert torch.equal(emunum.quantize(x, Truncated(8, 2)), emunum.quantize(x, FixedFormat(8, 2)))


def test_bad_registrations_and_missing_kernels_are_named():
    with pytest.raises(ValueError, match="device='tpu': allowed: cpu, cuda"):
        backends.register(Truncated, "tpu", _truncating_factory)
    with pytest.raises(TypeError, match="format_type must be a format class"):
        backends.register("Truncated", "cpu", _truncating_factory)
    with pytest.raises(TypeError, match="factory must be callable"):
        backends.register(Truncated, "cpu", 3)
    with pytest.raises(ValueError, match="FloatFormat already has a cpu kernel; pass replace=True"):
        backends.register(FloatFormat, "cpu", _truncating_factory)
    with pytest.raises(ValueError, match="has no 'cpu' kernel of its own"):
        backends.unregister(Truncated, "cpu")

    class Orphan:
        pass

    with pytest.raises(ValueError, match="Orphan has no cpu kernel; registered: FloatFormat"):
        backends.runner(Orphan(), "cpu", torch.float32)
