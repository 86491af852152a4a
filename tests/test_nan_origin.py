"""emunum.nan_origin: the first non-finite event of a replayed step, in execution order."""
import math

import pytest
import torch
from torch import nn

import emunum
from emunum.nan_origin import find_nan_origin


class _Scale(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


def _model(k):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), _Scale(k), nn.Linear(8, 4))
    return emunum.patch(m, "e4m3fn", grad_rounding="nearest")


def test_a_non_finite_parameter_is_reported_before_any_replay():
    m = _model(1.0)
    with torch.no_grad():
        m[2].weight[1, 3] = math.nan
    got = find_nan_origin(m, lambda: pytest.fail("the step must not run"))
    assert (got.kind, got.name, got.values, got.total) == ("parameter", "2.weight", 1, 32)


@pytest.mark.parametrize("k, kind, name, role", [(1e3, "rounding", "2", "input"),  # e4m3fn: NaN beyond 448
                                                 (1e39, "module", "1", None)])  # fp32 overflow: inf
def test_the_first_event_names_the_rounding_or_the_module(k, kind, name, role):
    m = _model(k)
    x = torch.randn(16, 8)
    got = find_nan_origin(m, lambda: m(x).square().sum())
    assert (got.kind, got.name, got.role, got.phase) == (kind, name, role, "forward")
    h = m[0](x) * k  # the tensor entering layer 2: the values that overflowed are those beyond 448 (or inf)
    want = int((h.abs() > 448).sum()) if kind == "rounding" else int((~torch.isfinite(h)).sum())
    assert got.values == want > 0


def test_a_backward_overflow_is_found_in_the_backward_phase_and_tracers_are_restored():
    m = _model(1.0)
    t = emunum.trace.enable(m, every=1)
    x = torch.randn(16, 8)
    got = find_nan_origin(m, lambda: m(x).sum() * 1e4, backward=True)  # gradients beyond 448
    assert (got.kind, got.role, got.phase) == ("rounding", "grad_output", "backward")
    assert got.name == "2"  # the last layer's incoming gradient rounds first
    assert all(layer._emunum_trace is t.layers[n] for n, layer in (("0", m[0]), ("2", m[2])))
    assert find_nan_origin(m, lambda: m(x).sum()) is None
