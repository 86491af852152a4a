"""benchmarks/real_models.py's timed step: every timed step starts from the model's initial state, and a step whose
loss is not finite stops the run (a diverged model's NaN steps are not training steps)."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from benchmark_script import load

real_models = load("real_models")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def test_reset_puts_back_the_parameters_and_buffers_a_step_changed():
    model = _model()
    x = torch.randn(6, 4)
    step = real_models.TrainStep(model, lambda m: m(x).square().mean())
    before = [t.clone() for t in (*model.parameters(), *model.buffers())]
    step()
    after = [t.clone() for t in (*model.parameters(), *model.buffers())]
    assert sum(not torch.equal(a, b) for a, b in zip(before, after)) >= 5  # weights and running statistics
    step.reset()
    assert all(torch.equal(a, b) for a, b in zip(before, (*model.parameters(), *model.buffers())))


def test_every_timed_step_starts_from_the_initial_weights():
    model = _model()
    x = torch.randn(6, 4)
    seen = []

    def loss(m):
        seen.append(m[0].weight.detach().clone())
        return m(x).square().mean()

    real_models.time_steps(real_models.TrainStep(model, loss), 3, time.perf_counter)
    assert len(seen) == 3 and all(torch.equal(seen[0], w) for w in seen)


def test_a_non_finite_loss_stops_the_timing_unless_unchecked():
    model = _model()
    x = torch.randn(6, 4)
    step = real_models.TrainStep(model, lambda m: m(x).sum() * float("nan"))
    with pytest.raises(RuntimeError, match="not a training step"):
        real_models.time_steps(step, 2, time.perf_counter)
    assert real_models.time_steps(step, 2, time.perf_counter, check=False) >= 0.0
