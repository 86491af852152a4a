"""Low-precision optimisation: ``OptimLP`` and ``LossScaler``.

``OptimLP`` wraps any ``torch.optim.Optimizer`` (as QPyTorch's OptimLP does). Each ``step()``:
1. rounds every gradient to the ``grad`` format, in place;
2. runs the wrapped optimizer's step in the parameters' own dtype;
3. rounds the parameters to the ``weight`` format (the update is thereby rounded: with
   ``weight_rounding="stochastic"`` this is the stochastic-rounded weight update of Wang et al. 2018),
   and the optimizer state to the ``momentum`` format (SGD ``momentum_buffer``, Adam ``exp_avg``) and the
   ``second_moment`` format (Adam ``exp_avg_sq``, ``max_exp_avg_sq``). Other state entries are left alone.
   The wrapped step thus updates the weights with the freshly computed state; the rounded state is what
   the next step starts from (as stored state would be in hardware).
A role whose format is None is not rounded. Each role's tensors are rounded as one flat concatenation, in
``param_groups`` order (gradients: the parameters that have one; state: per parameter, in the key order
above), one concatenation per (device, dtype) group: a stochastic rounding's counter is the element's index
in that concatenation, and its seed is ``derive_seed(seed, step number, role id, group index)`` (role ids:
grad 1, weight 2, momentum 3, second_moment 4), so a run restarted from ``state_dict()`` draws the same bits
as one that never stopped.

``LossScaler`` multiplies the loss by ``scale`` before backward and divides the gradients by it before the
step. Static scaling keeps ``scale`` fixed and always steps. Dynamic scaling skips a step whose unscaled
gradients hold an inf or NaN and multiplies ``scale`` by ``backoff_factor``; after ``growth_interval``
consecutive good steps it multiplies ``scale`` by ``growth_factor``. With power-of-two scales and factors
(the defaults) scaling and unscaling are exact unless a gradient leaves the dtype's range.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .formats import FloatFormat, RoundMode, get_format
from .quantize import _KEY0, _NUMPY_DTYPES, _cpu, _cpu_runner, quantize
from .rng import mix64_int, seed_key

__all__ = ["OptimLP", "LossScaler", "derive_seed"]

_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1

# optimizer-state keys rounded by each role
MOMENTUM_KEYS = ("momentum_buffer", "exp_avg")
SECOND_MOMENT_KEYS = ("exp_avg_sq", "max_exp_avg_sq")
_ROLE_IDS = {"grad": 1, "weight": 2, "momentum": 3, "second_moment": 4}


def derive_seed(seed: int, *counters: int) -> int:
    """A seed in [0, 2**62) that depends only on ``seed`` and the integer ``counters`` (splitmix64 chain).

    Used for every stochastic-rounding seed that must be reproducible from (run seed, iteration, ...).
    """
    for name, v in (("seed", seed), *((f"counters[{i}]", c) for i, c in enumerate(counters))):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"derive_seed: {name} must be an int, got {v!r}")
    h = mix64_int(seed)
    for c in counters:
        h = mix64_int((h + (c + 1) * _GOLDEN) & _M64)
    return h >> 2


def _role(name: str, fmt, rounding):
    if fmt is None:
        return None
    try:
        spec = get_format(fmt)
    except (TypeError, ValueError) as e:
        raise type(e)(f"OptimLP {name}: {e}") from None
    return spec, RoundMode.parse(rounding, field=f"{name}_rounding")


class OptimLP(torch.optim.Optimizer):
    """Wrap ``optimizer`` so that gradients, weights and optimizer state live in reduced formats.

    Formats are FloatFormat/FixedFormat specs or preset names (``get_format``); None leaves a role in the
    parameters' dtype. Roundings are ``RoundMode`` names. ``param_groups`` and ``state`` are the wrapped
    optimizer's own objects, so learning-rate changes and schedulers act on both. ``step()`` rounds
    ``p.grad`` in place (see the module doc for the order). ``quantize_parameters_()`` rounds the current
    parameters to the weight format (nearest), e.g. once after initialisation.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, weight=None, weight_rounding="nearest",
                 grad=None, grad_rounding="nearest", momentum=None, momentum_rounding="nearest",
                 second_moment=None, second_moment_rounding="nearest", seed: int = 0):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"OptimLP seed must be an int, got {seed!r}")
        self.optimizer = optimizer
        self.roles = {
            "grad": _role("grad", grad, grad_rounding),
            "weight": _role("weight", weight, weight_rounding),
            "momentum": _role("momentum", momentum, momentum_rounding),
            "second_moment": _role("second_moment", second_moment, second_moment_rounding),
        }
        self.seed = seed
        self.steps = 0  # completed steps; part of the SR seed
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self._link()

    def _link(self):
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state

    def __repr__(self) -> str:
        roles = ", ".join(f"{k}={v[0].name}/{v[1].name.lower()}" for k, v in self.roles.items() if v)
        return f"OptimLP({type(self.optimizer).__name__}, {roles or 'no rounding'})"

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def _round(self, tensors: list, role: str) -> None:
        """Round ``tensors`` in place, as one concatenation per (device, dtype) group (see the module doc)."""
        spec, mode = self.roles[role]
        groups: dict = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
        for g, ts in enumerate(groups.values()):
            seed = derive_seed(self.seed, self.steps, _ROLE_IDS[role], g) if mode == RoundMode.STOCHASTIC else None
            if _round_in_place(ts, spec, mode, seed):
                continue
            flat = torch.cat([t.reshape(-1) for t in ts])
            quantize(flat, spec, mode, seed=seed, out=flat)
            torch._foreach_copy_(ts, [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in ts]), ts)])

    @torch.no_grad()
    def quantize_parameters_(self) -> None:
        """Round every parameter to the weight format (nearest even), in place."""
        if self.roles["weight"] is None:
            return
        spec = self.roles["weight"][0]
        for p in self._params():
            p.copy_(quantize(p, spec, RoundMode.NEAREST))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        if self.roles["grad"] is not None:
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                self._round(grads, "grad")
        self.optimizer.step()
        if self.roles["weight"] is not None and params:
            self._round([p.data for p in params], "weight")
        for role, keys in (("momentum", MOMENTUM_KEYS), ("second_moment", SECOND_MOMENT_KEYS)):
            if self.roles[role] is None:
                continue
            bufs = []
            for p in params:
                state = self.state.get(p, {})
                bufs += [state[k] for k in keys if isinstance(state.get(k), torch.Tensor) and state[k].shape == p.shape]
            if bufs:
                self._round(bufs, role)
        self.steps += 1
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps, "seed": self.seed}

    def load_state_dict(self, state_dict: dict) -> None:
        for k in ("optimizer", "steps", "seed"):
            if k not in state_dict:
                raise ValueError(f"OptimLP.load_state_dict: missing key {k!r}; got {sorted(state_dict)}")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.steps = int(state_dict["steps"])
        self.seed = int(state_dict["seed"])
        self._link()


def _round_in_place(ts: list, spec, mode: RoundMode, seed) -> bool:
    """Round the tensors ``ts`` in place as one concatenation, without building it (``cpu.f32_many_at``: the
    same bits, stochastic ones included, as rounding ``torch.cat(ts)``), where that applies: CPU float32/float64
    contiguous tensors, a FloatFormat, and a concatenation that the serial loop would round (fewer elements than
    the parallel kernels' threshold, or one numba thread). False otherwise."""
    t0 = ts[0]
    if not (t0.is_cpu and t0.dtype in _NUMPY_DTYPES and isinstance(spec, FloatFormat)):
        return False
    sizes = [t.numel() for t in ts]
    if _cpu().use_parallel(sum(sizes)) or not all(t.is_contiguous() and not t.is_neg() for t in ts):
        return False
    key = seed_key(seed) if mode == RoundMode.STOCHASTIC else _KEY0
    addrs = np.array([t.data_ptr() for t in ts], dtype=np.int64)
    _cpu_runner(spec, t0.dtype).many(addrs, np.array(sizes, dtype=np.int64), int(mode), key, 32)
    for t in ts:  # written behind autograd's back, as quantize(out=) does
        torch.autograd.graph.increment_version(t)
    return True


def _positive_float(name: str, value, lo_excl: float = 0.0, hi_excl: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"LossScaler {name} must be a number, got {value!r}")
    v = float(value)
    if not (lo_excl < v < hi_excl):
        raise ValueError(f"LossScaler {name}={value!r} is out of range; allowed: ({lo_excl}, {hi_excl})")
    return v


class LossScaler:
    """Static or dynamic loss scaling (see the module doc).

    Use per iteration: ``scaler.scale_loss(loss).backward(); stepped = scaler.step(optimizer); scaler.update()``.
    ``unscale_(optimizer)`` may be called before ``step`` (e.g. to clip gradients); it divides every
    gradient by ``scale`` in place and returns whether any unscaled gradient is inf or NaN.
    """

    def __init__(self, init_scale: float = 2.0**16, *, dynamic: bool = True, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, min_scale: float = 2.0**-24):
        self.scale_value = _positive_float("init_scale", init_scale)
        if not isinstance(dynamic, bool):
            raise TypeError(f"LossScaler dynamic must be a bool, got {dynamic!r}")
        self.dynamic = dynamic
        self.growth_factor = _positive_float("growth_factor", growth_factor, 1.0)
        self.backoff_factor = _positive_float("backoff_factor", backoff_factor, 0.0, 1.0)
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"LossScaler growth_interval={growth_interval!r} must be an int >= 1")
        self.growth_interval = growth_interval
        self.min_scale = _positive_float("min_scale", min_scale)
        self.good_steps = 0  # consecutive steps without inf/NaN since the last change of scale
        self.skipped_steps = 0  # total
        self._found_inf: bool | None = None  # set by unscale_, cleared by update

    @property
    def scale(self) -> float:
        return self.scale_value

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (a new tensor)."""
        return loss * self.scale_value

    @torch.no_grad()
    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        if self._found_inf is not None:
            raise RuntimeError("LossScaler.unscale_ was already called since the last update()")
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        found = False
        by_device: dict = {}
        for g in grads:
            by_device.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), gs in by_device.items():
            flag = torch.zeros(1, device=device)
            inv = torch.full((1,), 1.0 / self.scale_value, device=device)
            # one fused pass: g *= inv, flag = 1 if any g is inf/NaN
            torch._amp_foreach_non_finite_check_and_unscale_(gs, flag, inv)
            found = found or bool(flag.item())
        self._found_inf = found
        return found

    def step(self, optimizer: torch.optim.Optimizer, closure=None) -> bool:
        """Unscale (if not done yet) and step; returns False when a dynamic scaler skipped the step."""
        if self._found_inf is None:
            self.unscale_(optimizer)
        if self.dynamic and self._found_inf:
            return False
        optimizer.step(closure) if closure is not None else optimizer.step()
        return True

    def update(self) -> None:
        """Adjust the scale after a step (dynamic only) and arm the next unscale_."""
        found, self._found_inf = self._found_inf, None
        if found is None:
            raise RuntimeError("LossScaler.update() called without step() or unscale_() first")
        if not self.dynamic:
            return
        if found:
            self.skipped_steps += 1
            self.scale_value = max(self.scale_value * self.backoff_factor, self.min_scale)
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                grown = self.scale_value * self.growth_factor
                if math.isfinite(grown):
                    self.scale_value = grown
                self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale_value, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps,
                "dynamic": self.dynamic, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "min_scale": self.min_scale}

    def load_state_dict(self, state: dict) -> None:
        for k in ("scale", "good_steps", "skipped_steps"):
            if k not in state:
                raise ValueError(f"LossScaler.load_state_dict: missing key {k!r}; got {sorted(state)}")
        self.scale_value = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        for k in ("dynamic", "growth_factor", "backoff_factor", "growth_interval", "min_scale"):
            if k in state:
                setattr(self, k, state[k])
        self._found_inf = None

    def __repr__(self) -> str:
        kind = f"dynamic, growth_interval={self.growth_interval}" if self.dynamic else "static"
        return f"LossScaler(scale={self.scale_value:g}, {kind})"
