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
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, Union

from torch import nn

from .autograd import STE
from .formats import BlockFormat, Format, NumberFormat, RoundMode, format_or_none, get_format, parse_enum
from .hadamard import check_size
from .quantize import check_sr_bits


class Role(enum.Enum):
    """A tensor role in a layer. Values are the ``Policy`` field names."""

    WEIGHT = "weight"
    INPUT = "input"
    OUTPUT = "output"
    GRAD_WEIGHT = "grad_weight"
    GRAD_INPUT = "grad_input"
    GRAD_OUTPUT = "grad_output"

    @classmethod
    def parse(cls, value: Union[str, "Role"], field: str = "role") -> "Role":
        return parse_enum(cls, value, field, "a tensor role")

    @property
    def is_gradient(self) -> bool:
        return self in GRADIENT_ROLES

    @property
    def gradient(self) -> "Role":
        """The gradient role of a forward role (``INPUT.gradient is GRAD_INPUT``)."""
        return _GRADIENT_OF[self]


FORWARD_ROLES = (Role.WEIGHT, Role.INPUT, Role.OUTPUT)
GRADIENT_ROLES = (Role.GRAD_WEIGHT, Role.GRAD_INPUT, Role.GRAD_OUTPUT)
_GRADIENT_OF = dict(zip(FORWARD_ROLES, GRADIENT_ROLES))
# the GEMM-operand roles, the only ones that take a BlockFormat (x, W and the error gy of y = x W^T)
BLOCK_ROLES = (Role.INPUT, Role.WEIGHT, Role.GRAD_OUTPUT)


class Scaling(enum.Enum):
    """How a role's tensors are scaled around their rounding.

    NONE: rounded as they are. PER_TENSOR ("current scaling" of FP8 training recipes): every tensor ``x``
    is rounded as ``quantize(x * s) / s`` with the power of two ``s = 2**floor(log2(fmt.max / amax))``,
    ``amax = max |x|`` over the whole tensor, computed afresh on every call (no history), so that ``amax * s``
    lands in ``(fmt.max / 2, fmt.max]`` and the rounded values use the format's whole range. Because ``s`` is
    a power of two, multiplying and dividing by it only moves the exponent: exact unless ``x * s`` falls
    into x's own dtype's subnormal range (only possible when ``amax > fmt.max``, for elements below
    ``2**-126 / s`` in float32) or ``quantize(x * s) / s`` leaves the dtype's finite range. ``s = 1`` when
    amax is 0 or not finite (x holds an inf or a NaN): the tensor is then rounded unscaled, so inf and NaN
    follow the format's own overflow rules (e.g. NaN in e4m3fn). ``s`` is clamped to the normal powers of
    two of x's dtype (``2**-126 .. 2**127`` for float32/bfloat16, ``2**-14 .. 2**15`` for float16). See
    ``emunum.nn.per_tensor_scale``.
    """

    NONE = "none"
    PER_TENSOR = "per_tensor"

    @classmethod
    def parse(cls, value: Union[str, "Scaling"], field: str = "scaling") -> "Scaling":
        return parse_enum(cls, value, field, "a scaling")


@dataclass(frozen=True)
class RoleSpec:
    """Round a role's tensors to ``fmt`` with ``rounding`` (a name or ``RoundMode``) after ``scaling`` (a
    name or ``Scaling``; see there); names are parsed here."""

    fmt: Format
    rounding: RoundMode = RoundMode.NEAREST
    scaling: Scaling = Scaling.NONE

    def __post_init__(self):
        object.__setattr__(self, "fmt", get_format(self.fmt))
        object.__setattr__(self, "rounding", RoundMode.parse(self.rounding))
        object.__setattr__(self, "scaling", Scaling.parse(self.scaling))
        if isinstance(self.fmt, BlockFormat) and self.scaling != Scaling.NONE:
            raise ValueError(f"scaling={self.scaling.value!r} with the block format {self.fmt.name}: a block format "
                             "carries its own scales; allowed: scaling='none'")

    def __str__(self) -> str:
        s = f"{self.fmt.name}/{self.rounding.name.lower()}"
        return s if self.scaling == Scaling.NONE else f"{s}/{self.scaling.value}"


def _role_spec(value, role: Role, default_rounding, default_scaling=Scaling.NONE) -> Optional[RoleSpec]:
    """None | RoleSpec | format | name | (format, rounding[, scaling]) -> RoleSpec or None, naming ``role`` on
    errors. A plain format or a pair takes ``default_scaling``."""
    if value is None or isinstance(value, RoleSpec):
        return value
    try:
        if isinstance(value, tuple):
            if len(value) not in (2, 3):
                raise ValueError(f"a (format, rounding[, scaling]) tuple has 2 or 3 items, got {len(value)}")
            return RoleSpec(value[0], value[1], value[2] if len(value) == 3 else default_scaling)
        if isinstance(value, (str, NumberFormat)):  # every number system's spec
            return RoleSpec(value, default_rounding, default_scaling)
        raise TypeError(
            f"expected a format, a format name, a RoleSpec, a (format, rounding[, scaling]) tuple or None, "
            f"got {type(value).__name__}"
        )
    except (TypeError, ValueError) as e:
        raise type(e)(f"{role.value}={value!r}: {e}") from None




ActivationFactory = Callable[[nn.Module, "Policy"], nn.Module]

_APPROX_TYPES = {"tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "softmax": nn.Softmax}


@dataclass(frozen=True)
class ApproxSpec:
    """A factory of ``emunum.approx`` modules (compared by value): ``kind`` is tanh, sigmoid or softmax;
    ``options`` the module's keyword arguments as sorted (name, value) pairs. The approximation computes in
    ``options['fmt']`` if given, else in the policy's output format (fp32 if none), with the output
    role's rounding unless ``options['rounding']`` says otherwise. The output role's scaling does not apply
    (an approximate operator computes in its format's range)."""

    kind: str
    options: tuple = ()

    def __call__(self, module: nn.Module, policy: "Policy") -> nn.Module:
        from . import approx  # noqa: PLC0415  (approx sits above policy's imports; loaded when used)

        opts = dict(self.options)
        out = policy.output
        opts.setdefault("fmt", out.fmt if out is not None else "fp32")
        if out is not None:
            opts.setdefault("rounding", out.rounding)
        if self.kind == "softmax":
            if module.dim is None:
                raise ValueError("approx softmax: nn.Softmax(dim=None) has no explicit dim; give the model "
                                 "nn.Softmax(dim=...) or exclude it")
            return approx.Softmax(dim=module.dim, **opts)
        return {"tanh": approx.Tanh, "sigmoid": approx.Sigmoid}[self.kind](**opts)

    def validate(self, field: str) -> None:
        """Build the operator once (in its own format, fp32 if none) so that an unknown method or option is
        an error of ``Policy.make``/``patch``, naming ``field``, whether or not the model has such a layer."""
        from . import approx  # noqa: PLC0415

        opts = dict(self.options)
        opts.setdefault("fmt", "fp32")
        try:
            if self.kind == "softmax":
                approx.Softmax(dim=-1, **opts)
            else:
                {"tanh": approx.Tanh, "sigmoid": approx.Sigmoid}[self.kind](**opts)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{field}: {e}") from None


def _approx_entry(key, value):
    """One approx item -> (module type, factory)."""
    if isinstance(key, str):
        k = key.strip().lower()
        if k not in _APPROX_TYPES:
            raise ValueError(f"approx key {key!r} is not a known activation; allowed names: "
                             f"{', '.join(_APPROX_TYPES)}, or an nn.Module subclass")
        key = _APPROX_TYPES[k]
    if not (isinstance(key, type) and issubclass(key, nn.Module)):
        raise TypeError(f"approx key {key!r} must be an activation name or an nn.Module subclass (e.g. nn.Tanh)")
    if isinstance(value, (str, dict)):
        kinds = {t: n for n, t in _APPROX_TYPES.items()}
        if key not in kinds:
            raise ValueError(f"approx[{key.__name__}]={value!r}: a method name or options need an "
                             f"emunum.approx operator, which exists for {', '.join(t.__name__ for t in kinds)}; "
                             "give a factory(module, policy) instead")
        kind = kinds[key]
        if isinstance(value, str):
            value = {"exp2" if kind == "softmax" else "method": value}
        if not all(isinstance(n, str) for n in value):
            raise TypeError(f"approx[{key.__name__}] options must have str keys, got {list(value)!r}")
        spec = ApproxSpec(kind, tuple(sorted(value.items())))
        spec.validate(f"approx[{key.__name__}]={value!r}")
        return key, spec
    if not callable(value):
        raise TypeError(f"approx[{key.__name__}]={value!r} must be a method name, a dict of options, or a "
                        "factory(module, policy) -> nn.Module")
    return key, value


def _approx_table(value) -> tuple:
    """{activation type or name: method name | options dict | factory} -> ((type, factory), ...)."""
    if value is None or value == ():
        return ()
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, tuple) and all(isinstance(i, tuple) and len(i) == 2 for i in value):
        items = list(value)
    else:
        raise TypeError(f"approx must be a dict {{activation: method | options | factory}}, got {value!r}")
    table = dict(_approx_entry(k, v) for k, v in items)
    return tuple(table.items())


@dataclass(frozen=True)
class Policy:
    """How ``emunum.patch`` emulates each layer. Frozen and compared by value (``filter``/factories by identity).

    Role fields (``weight`` ... ``grad_output``) accept a ``RoleSpec``, a format or name (rounded to nearest
    in the forward roles, stochastically in the gradient roles, unscaled), a ``(format, rounding)`` pair, a
    ``(format, rounding, scaling)`` triple, or None.
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

    def __post_init__(self):
        for role in Role:
            default = RoundMode.STOCHASTIC if role.is_gradient else RoundMode.NEAREST
            spec = _role_spec(getattr(self, role.value), role, default)
            if spec is not None and isinstance(spec.fmt, BlockFormat) and role not in BLOCK_ROLES:
                raise ValueError(
                    f"{role.value}={spec.fmt.name}: a block format applies to GEMM operands only; allowed for "
                    f"{role.value}: an element format (FloatFormat/FixedFormat, rounded element-wise) or None; "
                    f"block formats go to {', '.join(r.value for r in BLOCK_ROLES)}")
            object.__setattr__(self, role.value, spec)
        object.__setattr__(self, "ste", STE.parse(self.ste))
        if self.sr_bits is not None:
            check_sr_bits(self.sr_bits)
        object.__setattr__(self, "approx", _approx_table(self.approx))
        if self.hadamard is not None:
            object.__setattr__(self, "hadamard", check_size(self.hadamard))
            if not self.uses_block:
                raise ValueError(f"hadamard={self.hadamard}: the transform applies to block-format weight-gradient "
                                 "GEMMs, and the policy has no block format; allowed: hadamard=None, or a "
                                 "BlockFormat in input, weight or grad_output")
        if isinstance(self.hadamard_seed, bool) or not isinstance(self.hadamard_seed, int) or self.hadamard_seed < 0:
            raise TypeError(f"hadamard_seed={self.hadamard_seed!r}: allowed: an int >= 0")
        if self.filter is not None and not callable(self.filter):
            raise TypeError(f"filter must be callable as filter(module, name) -> bool, got {self.filter!r}")
        if not isinstance(self.keep_first_last, bool):
            raise TypeError(f"keep_first_last must be a bool, got {self.keep_first_last!r}")
        if isinstance(self.mad, str):  # a preset name: MADUnit.preset (emunum units) or a matrix instruction
            from .mad import MMA_PRESETS, MADUnit  # noqa: PLC0415

            try:
                unit = MMA_PRESETS.get(self.mad.strip().lower()) or MADUnit.preset(self.mad)
                object.__setattr__(self, "mad", unit)
            except ValueError as e:
                raise ValueError(f"mad={self.mad!r}: {e}; or a matrix instruction: {', '.join(MMA_PRESETS)}") from None
        if self.mad is not None:
            _check_mad(self.mad, "mad")
        if self.mad_backward is not None:
            units = self.mad_backward if isinstance(self.mad_backward, tuple) else (self.mad_backward,)
            for u in units:
                _check_mad(u, "mad_backward")

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
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(
                f"unknown policy option(s) {', '.join(map(repr, unknown))}; allowed: fmt, grad, rounding, "
                f"grad_rounding, scaling, grad_scaling, {', '.join(f.name for f in fields(cls))}"
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
                kwargs[role.value] = _role_spec(kwargs[role.value], role, mode, sc)
                continue
            f = gbase if role.is_gradient else base
            if isinstance(f, BlockFormat) and role not in BLOCK_ROLES:
                f = None  # a block format is a GEMM-operand format (see the module docstring)
            kwargs[role.value] = None if f is None else RoleSpec(f, mode, sc)
        return cls(**kwargs)

    # ---- queries --------------------------------------------------------------------------------------
    def spec(self, role) -> Optional[RoleSpec]:
        return getattr(self, Role.parse(role).value)

    @property
    def rounds_anything(self) -> bool:
        return any(self.spec(r) is not None for r in Role)

    @property
    def uses_block(self) -> bool:
        """Whether a GEMM-operand role (``BLOCK_ROLES``) holds a BlockFormat."""
        return any(s is not None and isinstance(s.fmt, BlockFormat) for s in map(self.spec, BLOCK_ROLES))

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


def _check_mad(unit, field: str) -> None:
    from .mad import MADUnit, MMAUnit  # noqa: PLC0415  (imported only when a policy names a unit)

    if not isinstance(unit, (MADUnit, MMAUnit)):
        raise TypeError(f"{field} must be an emunum.mad.MADUnit or MMAUnit, got {type(unit).__name__}")


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
