"""The work of one training iteration of a run's model, counted when the run starts and written into
results.json (``iteration_cost``), so that ``emunum tta --hardware`` reads it as data instead of rebuilding the
model from a result folder's config."""
from __future__ import annotations

import torch

from emunum.analysis.flops import count_iteration

from . import tasks


def measure(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: str) -> dict:
    """``IterationCost`` fields (flops, param_elements, activation_elements, input_elements) of one fp32
    iteration (forward, the task's loss, backward) of ``model`` (unpatched) on the batch (x, y). The model
    and the global random streams are left as they were."""
    with torch.random.fork_rng(devices=[x.device.index or 0] if x.is_cuda else []):
        cost = count_iteration(model, x, y, tasks.loss_fn(task))
    return {"flops": cost.flops, "param_elements": cost.param_elements,
            "activation_elements": cost.activation_elements, "input_elements": cost.input_elements}
