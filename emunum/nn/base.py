"""``EmuLayer``, the mixin of every emulated layer: the rounding plan built by ``from_float``, the rounding
of one role per call (``_emu_round``), and the GEMM helpers (torch's, or an emulated MAD unit's)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import grid
from ..autograd import Quantizer
from ..elide import can_elide, round_eliding
from ..policy import BLOCK_ROLES, FORWARD_ROLES, Policy, Role, Scaling, make_policy
from ..formats import BlockFormat
from .block_gemm import block_plan, no_block_path
from .gemm_context import UNROUNDED, GemmContext, stack as ctx_stack
from .gemm_suspend import suspended_modes
from .scaling import ScaledGradQuantizer, ScaledQuantizer

STATE_PREFIX = "_emunum_"  # every attribute an emulated layer adds to the original's state starts with it


_NO_MERGED: dict = {}


def _elidable(d: dict, role: Role):
    """The plan of ``role`` that ``round_eliding`` takes, from a layer's ``__dict__`` d: its merged quantiser's, or
    its one plain ``Quantizer``'s (the other direction unrounded), where elision is on (process and layer) and the
    plan allows it; else None."""
    if not (grid._enabled[0] and d.get("_emunum_elide", True)):
        return None
    merged = d.get("_emunum_q1", _NO_MERGED).get(role)
    if merged is not None:
        plan = merged._plan
    else:
        fq, bq = d["_emunum_q"][role]
        q = fq if bq is None else (bq if fq is None else None)
        if type(q) is not Quantizer:
            return None
        plan = q._plan
    return plan if can_elide(plan) else None


def _unblocked(spec):
    """None for a block-format role: those apply to GEMM operands only (``block_gemm``), not role by role."""
    return None if spec is not None and isinstance(spec.fmt, BlockFormat) else spec


def _role_specs(policy: Policy, role: Role, block: bool):
    """(forward spec, gradient spec) rounded role by role. In a block-GEMM layer (``block``) the GEMM operands
    (input, weight, grad_output) are rounded inside each GEMM by the ``BlockPlan`` instead."""
    spec, gspec = _unblocked(policy.spec(role)), _unblocked(policy.spec(role.gradient))
    if block:
        spec = None if role in BLOCK_ROLES else spec
        gspec = None if role.gradient in BLOCK_ROLES else gspec
    return spec, gspec


def _make_quantizers(policy: Policy, role: Role, block: bool = False):
    """(forward-value quantiser or None, gradient quantiser or None) for a forward role."""
    spec, gspec = _role_specs(policy, role, block)
    fq = bq = None
    if spec is not None:
        fq = Quantizer(forward=spec.fmt, backward=None, forward_rounding=spec.rounding, ste=policy.ste.value,
                       sr_bits=policy.sr_bits)
        if spec.scaling == Scaling.PER_TENSOR:
            fq = ScaledQuantizer(fq, spec.fmt)
    if gspec is not None:
        if gspec.scaling == Scaling.PER_TENSOR:
            bq = ScaledGradQuantizer(gspec.fmt, gspec.rounding, policy.sr_bits)
        else:
            bq = Quantizer(forward=None, backward=gspec.fmt, backward_rounding=gspec.rounding,
                           sr_bits=policy.sr_bits)
    return fq, bq


def _merged_quantizer(policy: Policy, role: Role, block: bool = False):
    """One straight-through node rounding values forward and gradients backward, where that is the same as
    the pair from ``_make_quantizers`` (both roles present and unscaled): half the autograd nodes per role."""
    spec, gspec = _role_specs(policy, role, block)
    if spec is None or gspec is None or Scaling.PER_TENSOR in (spec.scaling, gspec.scaling):
        return None
    return Quantizer(forward=spec.fmt, backward=gspec.fmt, forward_rounding=spec.rounding,
                     backward_rounding=gspec.rounding, ste=policy.ste.value, sr_bits=policy.sr_bits)


def rounding_state(policy: Policy, roles: tuple, block_gemm: bool) -> dict:
    """The attributes an emulated layer (or ``GemmEmulator``) adds: policy, quantisers per role, block plan."""
    plan = block_plan(policy) if block_gemm else None
    return {"_emunum_policy": policy, "_emunum_trace": None, "_emunum_elide": True,
            "_emunum_q": {role: _make_quantizers(policy, role, plan is not None) for role in roles},
            "_emunum_q1": {role: _merged_quantizer(policy, role, plan is not None) for role in roles},
            "_emunum_block": plan}


class EmuLayer:
    """Mixin of every emulated layer. ``ROLES``: the forward roles the layer rounds (gradients follow)."""

    ROLES: tuple = FORWARD_ROLES
    HAS_WEIGHT: bool = True  # a GEMM/lookup layer (counts for Policy.keep_first_last)
    BLOCK_GEMM: bool = False  # its GEMMs take block-format operands (``block_gemm``): Linear, Conv*d, MHA
    LOOKUP: bool = False  # a weight layer without a GEMM (Embedding): block formats leave it unrounded
    _emunum_base: type = nn.Module  # the torch class this emulated class derives from

    @classmethod
    def from_float(cls, module: nn.Module, fmt=None, **policy) -> "EmuLayer":
        """An emulated twin of ``module`` sharing its parameters, buffers, submodules and hooks.

        ``fmt``/``policy``: an ``emunum.Policy`` or its keyword form (``Policy.make``)."""
        pol = make_policy(fmt, **policy)
        if not issubclass(cls, nn.Module):
            raise TypeError(f"{cls.__name__} is a mixin; call Emu<Type>.from_float or emunum.nn.from_float")
        if not isinstance(module, cls._emunum_base):
            raise TypeError(f"{cls.__name__}.from_float needs a {cls._emunum_base.__name__}, "
                            f"got {type(module).__name__}")
        if isinstance(module, EmuLayer):
            raise ValueError(f"module is already emulated ({type(module).__name__}); "
                             "call emunum.unpatch first")
        if pol.uses_block and cls.HAS_WEIGHT and not (cls.BLOCK_GEMM or cls.LOOKUP):
            raise no_block_path(module, pol)
        cls._emunum_check(module, pol)
        emu = cls.__new__(cls)
        emu.__dict__.update(module.__dict__)
        emu.__dict__.update(rounding_state(pol, cls.ROLES, cls.BLOCK_GEMM))
        return emu

    def __call__(self, *args, **kwargs):
        # The layer's GEMMs are its own: a functional-GEMM mode (``gemm_mode``) must not round them again, and
        # leaving it lets the roundings take the eager fast path (``ops.eager_ok``).
        ctx = self.__dict__.get("_emunum_ctx")
        if ctx is None:
            ctx = self.__dict__["_emunum_ctx"] = GemmContext(self._emunum_operands_rounded(), type(self).__name__,
                                                             None if self._emunum_operands_rounded() else
                                                             UNROUNDED)
        stack = ctx_stack()
        stack.append(ctx)
        try:
            with suspended_modes():
                return super().__call__(*args, **kwargs)
        finally:
            stack.pop()

    def _emunum_operands_rounded(self) -> bool:
        pol = self._emunum_policy
        return pol.mad is not None or pol.uses_block or (pol.input is not None and pol.weight is not None)

    @classmethod
    def emunum_applies(cls, policy: Policy) -> bool:
        """Whether the layer has anything to do under ``policy``: False only for a layer without a weight
        (norms, activations) whose roles all hold None or a block format (a GEMM-operand format, which such
        layers do not have); ``emunum.patch`` leaves those layers alone."""
        if cls.HAS_WEIGHT:
            return True
        return any(x is not None for role in cls.ROLES for x in _role_specs(policy, role, False))

    @classmethod
    def _emunum_check(cls, module: nn.Module, policy: Policy) -> None:
        """Raise if the layer cannot be emulated under ``policy`` (overridden where needed)."""

    @property
    def emunum_policy(self) -> Policy:
        return self._emunum_policy

    @property
    def emunum_roles(self) -> tuple:
        """Every role this layer rounds: its forward roles, then their gradients."""
        return tuple(self.ROLES) + tuple(r.gradient for r in self.ROLES)

    def __prepare_scriptable__(self):
        raise TypeError(f"torch.jit.script of an emulated layer ({type(self).__name__}) is not supported: the "
                        "rounding kernels are numba code; use torch.export or torch.compile instead")

    def _emu_begin(self) -> None:
        """Called first in every forward: lets a tracer decide whether to observe this call."""
        if torch.jit.is_tracing():
            raise TypeError(f"torch.jit.trace of an emulated layer ({type(self).__name__}) is not supported: the "
                            "rounding kernels are numba code; use torch.export or torch.compile instead")
        trace = self._emunum_trace
        if trace is not None:
            trace.begin()

    def _eliding_plan(self, role: Role):
        """The plan ``_emu_round`` rounds ``role`` with through ``round_eliding`` now, or None where it takes
        another path (a sampled trace call, elision off, a scaled or clipped role, two quantisers)."""
        trace = self._emunum_trace
        return None if trace is not None and trace.active else _elidable(self.__dict__, role)

    def _emu_round(self, x: Tensor, role: Role) -> Tensor:
        d = self.__dict__  # read once: each attribute of a module subclass costs a lookup through its classes
        trace = d.get("_emunum_trace")
        if trace is not None and trace.active:  # a sampled call; the others take the untraced path below
            fq, bq = d["_emunum_q"][role]
            if isinstance(bq, ScaledGradQuantizer):  # the tracer's gradient rounding is unscaled: not traced
                return bq(trace.round(x, role, fq, None))
            return trace.round(x, role, fq, bq)
        if x.numel() >= grid._min_elements[0]:
            plan = _elidable(d, role)
            if plan is not None:  # keep: a GEMM operand, which only this layer reads
                return round_eliding(plan, x, role is not Role.OUTPUT)
        merged = d.get("_emunum_q1", _NO_MERGED).get(role)
        if merged is not None:  # its plan, called without nn.Module.__call__ (an internal quantiser: no hooks)
            return merged._plan(x)
        fq, bq = d["_emunum_q"][role]
        if fq is not None:
            x = fq(x)
        if bq is not None:
            x = bq(x)
        return x

    def extra_repr(self) -> str:
        base = super().extra_repr()
        pol = self._emunum_policy
        roles = self.emunum_roles if self.BLOCK_GEMM else tuple(
            r for r in self.emunum_roles if _unblocked(pol.spec(r)) is not None or pol.spec(r) is None)
        emu = pol.describe(roles)
        return f"{base}, {emu}" if base else emu


# ---- GEMM helpers (torch's, or an emulated MAD unit's) -------------------------------------------------
def _mad():
    from .. import mad  # noqa: PLC0415  (imported only when a policy names a MAD unit)

    return mad


def _linear(x: Tensor, w: Tensor, b: Optional[Tensor], policy: Policy) -> Tensor:
    if policy.mad is None:
        return F.linear(x, w, b)
    return _mad().linear(x, w, b, unit=policy.mad, backward_units=policy.mad_backward)


def _bmm(a: Tensor, b: Tensor, policy: Policy) -> Tensor:
    if policy.mad is None:
        return torch.bmm(a, b)
    return _mad().matmul(a, b, unit=policy.mad, backward_units=policy.mad_backward)
