"""What ``emunum.patch`` emulates: a frozen ``Policy`` holding a format and rounding per tensor ``Role``.

A layer computes ``output = op(input, weight)``. Its six roles are the three forward tensors (``weight``,
``input``, ``output``) and, in the backward pass, the gradients with respect to each of them
(``grad_weight``, ``grad_input``, ``grad_output``; ``grad_output`` is the error arriving from above).
Each role holds a ``RoleSpec`` (format + rounding) or None (left in the tensor's own dtype).

The keyword form ``Policy.make(fmt="e5m2")`` (what ``emunum.patch(model, fmt=..., ...)`` calls) sets every
role to ``fmt``, rounding to nearest (ties to even) in the forward pass and stochastically in the backward
pass; ``grad=`` gives the three gradient roles another format, and a role's own keyword
(``weight="int8"``, ``grad_input=None``, ``output=("e4m3fn", "toward_zero")``) overrides both.
``scaling="per_tensor"`` (``grad_scaling=`` for the gradient roles, default: the same) rounds each tensor
with per-tensor power-of-two scaling (``Scaling``).
Block formats (``BlockFormat``: MX, NVFP4) are formats of GEMM operands only: the roles ``input``, ``weight``
and ``grad_output`` (``BLOCK_ROLES``; see ``emunum.nn.block_gemm``). A block format given to ``output``,
``grad_input`` or ``grad_weight`` raises ValueError; the keyword form's ``fmt=``/``grad=`` give a block
format to the operand roles only and leave those three roles unrounded (None).
Strings (formats, roundings, scalings, roles, straight-through estimators) are parsed here, once.

A ``Policy`` is the user's one flat form of four separate concerns, each its own frozen type that validates
its own fields: ``policy.numerics`` (``emunum.numerics.Numerics``: roles, ste, sr_bits, hadamard),
``policy.units`` (``emunum.datapath.Units``: mad, mad_backward), ``policy.factories``
(``emunum.factories.Factories``: approx) and ``policy.selection`` (``emunum.selection.Selection``: filter,
keep_first_last). Each consumer reads the part it needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

from torch import nn

from .autograd import STE
from .datapath import Units
from .factories import ActivationFactory, ApproxSpec, Factories  # noqa: F401  (re-exported)
from .formats import BlockFormat, RoundMode, format_or_none  # noqa: F401
from .numerics import Numerics
from .roles import (BLOCK_ROLES, FORWARD_ROLES, GRADIENT_ROLES, Role, RoleSpec, Scaling,  # noqa: F401
                    role_spec)
from .selection import Selection


@dataclass(frozen=True)
class Policy:
    """How ``emunum.patch`` emulates each layer. Frozen and compared by value (``filter``/factories by identity).

    Role fields (``weight`` ... ``grad_output``) accept a ``RoleSpec``, a format or name (rounded to nearest
    in the forward roles, stochastically in the gradient roles, unscaled), a ``(format, rounding)`` pair, a
    ``(format, rounding, scaling)`` triple, or None. An unsigned format (``signed=False``) in ``weight`` or a
    gradient role warns (UserWarning): negative values there become NaN (P3109) or 0 (fixed point, log).
    ste: the straight-through estimator of the forward roundings ("identity" or "clipped", see
    ``emunum.quantize_ste``). sr_bits: random bits per stochastic rounding (None: 32).
    mad / mad_backward: an ``emunum.mad.MADUnit`` (``mad`` also a preset name, e.g. "h100_fp8_e4m3") for the GEMMs of Linear, Conv1d/2d and attention layers,
    and the units of their backward GEMMs (passed to ``emunum.mad`` as ``backward_units``); None: torch's.
    approx: ``{activation: spec}`` replaces activations by approximate operators instead of rounding their
    output. activation: nn.Tanh / nn.Sigmoid / nn.Softmax or "tanh" / "sigmoid" / "softmax" (for a method
    name or options), or any nn.Module subclass (for a factory). spec: an ``emunum.approx`` method name
    (``{"tanh": "pwl"}``; for softmax the exp2 method), a dict of that module's options
    (``{"tanh": {"method": "lut", "grad": "exact"}}``), or ``factory(module, policy) -> nn.Module``. By
    default the operator computes in the output role's format and rounding (see ``ApproxSpec``).
    hadamard: None, or the size n (4, 16, 64 or 256) of a random Hadamard transform applied to both operands
    of every block-format weight-gradient GEMM along its reduction dimension, before they are quantised
    (NVFP4 recipe: 16; ``emunum.hadamard``); needs a block format in input/weight/grad_output.
    hadamard_seed: the seed of its sign vector (one vector per run, shared by every layer and step).
    filter: ``filter(module, qualified_name) -> bool``; only layers it accepts are emulated.
    keep_first_last: leave the model's first and last weight layers (Linear, Conv*, Embedding, attention, in
    ``named_modules`` order) in full precision, as Wang et al. (2018) did.
    """

    weight: Optional[RoleSpec] = None
    input: Optional[RoleSpec] = None
    output: Optional[RoleSpec] = None
    grad_weight: Optional[RoleSpec] = None
    grad_input: Optional[RoleSpec] = None
    grad_output: Optional[RoleSpec] = None
    ste: STE = STE.IDENTITY
    sr_bits: Optional[int] = None
    mad: Any = None
    mad_backward: Any = None
    approx: tuple = ()
    hadamard: Optional[int] = None
    hadamard_seed: int = 0
    filter: Optional[Callable[[nn.Module, str], bool]] = field(default=None)
    keep_first_last: bool = False

    numerics: Numerics = field(init=False, repr=False, compare=False)
    units: Units = field(init=False, repr=False, compare=False)
    factories: Factories = field(init=False, repr=False, compare=False)
    selection: Selection = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        numerics = Numerics(*(getattr(self, r.value) for r in Role), ste=self.ste, sr_bits=self.sr_bits,
                            hadamard=self.hadamard, hadamard_seed=self.hadamard_seed)
        parts = {"numerics": numerics, "units": Units(self.mad, self.mad_backward),
                 "factories": Factories(self.approx), "selection": Selection(self.filter, self.keep_first_last)}
        for name, part in parts.items():  # each part's normalised values are the flat fields' values
            object.__setattr__(self, name, part)
            for f in fields(part):
                object.__setattr__(self, f.name, getattr(part, f.name))
        if not numerics.uses_block:
            self.units.check_element_gemms()

    # ---- keyword form ---------------------------------------------------------------------------------
    @classmethod
    def make(cls, fmt=None, *, grad=..., rounding="nearest", grad_rounding="stochastic", scaling="none",
             grad_scaling=..., **kwargs) -> "Policy":
        """The keyword form: ``fmt`` for every role, ``grad`` (default: ``fmt``) for the gradient roles,
        forward roles rounded with ``rounding`` after ``scaling`` ("none" or "per_tensor", see ``Scaling``),
        gradient roles with ``grad_rounding`` after ``grad_scaling`` (default: ``scaling``); a role's own
        keyword overrides (a plain format there takes its direction's rounding and scaling). A block format
        as ``fmt``/``grad`` goes to the GEMM-operand roles only (``BLOCK_ROLES``); output, grad_input and
        grad_weight then stay None unless given. Other keywords are ``Policy`` fields. Unknown keywords raise
        TypeError."""
        names = [f.name for f in fields(cls) if f.init]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise TypeError(
                f"unknown policy option(s) {', '.join(map(repr, unknown))}; allowed: fmt, grad, rounding, "
                f"grad_rounding, scaling, grad_scaling, {', '.join(names)}"
            )
        fwd_mode = RoundMode.parse(rounding, "rounding")
        bwd_mode = RoundMode.parse(grad_rounding, "grad_rounding")
        fwd_scaling = Scaling.parse(scaling, "scaling")
        bwd_scaling = fwd_scaling if grad_scaling is ... else Scaling.parse(grad_scaling, "grad_scaling")
        base = format_or_none(fmt, "fmt")
        gbase = base if grad is ... else format_or_none(grad, "grad")
        for role in Role:
            mode = bwd_mode if role.is_gradient else fwd_mode
            sc = bwd_scaling if role.is_gradient else fwd_scaling
            if role.value in kwargs:
                kwargs[role.value] = role_spec(kwargs[role.value], role, mode, sc)
                continue
            f = gbase if role.is_gradient else base
            if isinstance(f, BlockFormat) and role not in BLOCK_ROLES:
                f = None  # a block format is a GEMM-operand format (see the module docstring)
            kwargs[role.value] = None if f is None else RoleSpec(f, mode, sc)
        return cls(**kwargs)

    # ---- queries --------------------------------------------------------------------------------------
    def spec(self, role) -> Optional[RoleSpec]:
        return self.numerics.spec(role)

    @property
    def rounds_anything(self) -> bool:
        return self.numerics.rounds_anything

    @property
    def uses_block(self) -> bool:
        """Whether a GEMM-operand role (``BLOCK_ROLES``) holds a BlockFormat."""
        return self.numerics.uses_block

    def describe(self, roles=tuple(Role)) -> str:
        """``weight|input|output=e5m2/nearest, grad_weight|...=e5m2/stochastic``: roles grouped by spec
        (``-``: not rounded; a ``/per_tensor`` suffix: scaled), then any non-default ste, sr_bits and MAD unit."""
        groups: dict = {}  # spec -> role names, in first-seen order; roles with one spec share an entry
        for r in roles:
            groups.setdefault(self.spec(r), []).append(r.value)
        parts = [f"{'|'.join(names)}={spec if spec is not None else '-'}" for spec, names in groups.items()]
        if self.ste != STE.IDENTITY:
            parts.append(f"ste={self.ste.value}")
        if self.sr_bits is not None:
            parts.append(f"sr_bits={self.sr_bits}")
        if self.mad is not None:
            parts.append(f"mad={self.mad}")
        if self.hadamard is not None:
            parts.append(f"hadamard={self.hadamard}/seed={self.hadamard_seed}")
        return ", ".join(parts)


def make_policy(fmt=None, policy: Optional[Policy] = None, **kwargs) -> Policy:
    """The API edge of ``patch``: a Policy passed as ``fmt`` or ``policy=``, or the keyword form."""
    if isinstance(fmt, Policy):
        if policy is not None:
            raise TypeError("give the Policy once: as fmt or as policy=, not both")
        fmt, policy = None, fmt
    if policy is not None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be an emunum.Policy, got {type(policy).__name__}")
        if fmt is not None or kwargs:
            extra = (["fmt"] if fmt is not None else []) + sorted(kwargs)
            raise TypeError(f"a Policy was given; also passing {', '.join(extra)} is ambiguous: "
                            "use dataclasses.replace(policy, ...) instead")
        return policy
    return Policy.make(fmt, **kwargs)
