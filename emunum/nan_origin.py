"""Where a run's NaN came from: ``find_nan_origin(model, forward)`` replays a failing step under a detector.

Cheap by design: nothing is watched while training runs. When a loss (or a gradient) first turns non-finite,
the caller replays that step (the same weights, batch and seeds, so the same roundings) once through
``find_nan_origin``, which reports, in execution order, the first of:

1. ``parameter``: a parameter or buffer of the model that is already non-finite before the step (the weights
   went bad in an earlier update; its name is reported);
2. ``rounding``: the first rounding of an emulated layer (``emunum.trace``'s observed roundings: every role,
   block-format GEMM operands included, forward then backward) that turned finite values into inf or NaN,
   as a format without infinities does on overflow (e4m3fn: NaN beyond 448), naming the layer and role;
3. ``module``: the first module whose forward returned non-finite values from finite inputs, where no
   rounding did (an fp32 overflow outside the emulated roundings).

None when no such event happened in the replay (the non-finite value arose outside every module, e.g. in the
loss function). Per-tensor-scaled gradient roles are not observed (``emunum.trace``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from .gemm_coverage import tensors_in
from .patch import emulation_sites
from .trace import Tracer


@dataclass(frozen=True)
class NanOrigin:
    """The first event that made values non-finite (see the module doc)."""

    kind: str  # "parameter" | "rounding" | "module"
    name: str  # the parameter's, layer's or module's qualified name ("model" for the root)
    role: Optional[str]  # the rounding's role (kind "rounding"), else None
    phase: str  # "before the step" | "forward" | "backward"
    values: int  # how many values turned non-finite there (non-finite values of the parameter)
    total: int  # of how many

    def describe(self) -> str:
        where = f"{self.name} ({self.role})" if self.role else self.name
        what = {"parameter": "holds non-finite values", "rounding": "rounding turned finite values into inf/NaN",
                "module": "returned non-finite values from finite inputs"}[self.kind]
        return f"{where} {what} ({self.values} of {self.total}, {self.phase})"

    def to_json(self) -> dict:
        return asdict(self)


def _nonfinite(t) -> int:
    return int((~torch.isfinite(t)).sum()) if isinstance(t, Tensor) and t.is_floating_point() else 0


def bad_parameter(model: nn.Module) -> Optional[NanOrigin]:
    """The first parameter or buffer (in ``named_parameters``, then ``named_buffers`` order) holding inf/NaN."""
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        n = _nonfinite(t.detach())
        if n:
            return NanOrigin("parameter", name, None, "before the step", n, t.numel())
    return None


def find_nan_origin(model: nn.Module, forward: Callable[[], Tensor], *, backward: bool = False) -> Optional[NanOrigin]:
    """Replay a step under the detector: ``forward()`` runs the step's forward pass and returns its loss (the
    caller reseeds first, so that the roundings are those of the failing step); with ``backward`` the loss's
    backward pass runs too. Returns the first event (module doc) or None. The model's own tracers are set
    aside during the replay and restored after it; its gradients and normalisation statistics change as in
    any step."""
    bad = bad_parameter(model)
    if bad is not None:
        return bad
    found: list = []
    phase = ["forward"]

    def watch(name, role, x, q):
        if found:
            return
        n = int((torch.isfinite(x) & ~torch.isfinite(q)).sum())
        if n:
            found.append(NanOrigin("rounding", name, role.value, phase[0], n, x.numel()))

    def module_hook(mod, args, out):
        if found:
            return
        n = sum(_nonfinite(t) for t in tensors_in(out))
        if n and not any(_nonfinite(t) for t in tensors_in(args)):
            found.append(NanOrigin("module", names[mod], None, "forward", n, sum(t.numel() for t in tensors_in(out))))

    names = {m: (n or "model") for n, m in model.named_modules()}
    emulated = [m for _, m in emulation_sites(model)]
    saved = [(m, m.__dict__.get("_emunum_trace"), m.__dict__.get("_emunum_block")) for m in emulated]
    for m in emulated:  # set the run's own tracer aside (its counts stay as they were)
        m.__dict__["_emunum_trace"] = None
    hooks = [m.register_forward_hook(module_hook) for m in names]
    tracer = Tracer(model, every=1, sqnr=False) if emulated else None
    try:
        if tracer is not None:
            for lt in tracer.layers.values():
                lt.watch = watch
        loss = forward()
        if backward and not found:
            phase[0] = "backward"
            loss.backward()
    finally:
        if tracer is not None:
            tracer.close()
        for h in hooks:
            h.remove()
        for m, t, plan in saved:
            m.__dict__["_emunum_trace"] = t
            if plan is not None:
                m.__dict__["_emunum_block"] = plan
    return found[0] if found else None
