"""The tensor roles of a layer and what one role rounds to: ``Role``, ``Scaling`` and ``RoleSpec``.

A layer computes ``output = op(input, weight)``. Its six roles are the three forward tensors (``weight``,
``input``, ``output``) and, in the backward pass, the gradients with respect to each of them
(``grad_weight``, ``grad_input``, ``grad_output``; ``grad_output`` is the error arriving from above).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

from .formats import BlockFormat, Format, FormatSpec, RoundMode, get_format, parse_enum


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


def role_spec(value, role: Role, default_rounding, default_scaling=Scaling.NONE) -> Optional[RoleSpec]:
    """None | RoleSpec | format | name | (format, rounding[, scaling]) -> RoleSpec or None, naming ``role`` on
    errors. A plain format or a pair takes ``default_scaling``."""
    if value is None or isinstance(value, RoleSpec):
        return value
    try:
        if isinstance(value, tuple):
            if len(value) not in (2, 3):
                raise ValueError(f"a (format, rounding[, scaling]) tuple has 2 or 3 items, got {len(value)}")
            return RoleSpec(value[0], value[1], value[2] if len(value) == 3 else default_scaling)
        if isinstance(value, (str, FormatSpec)):  # every number system's spec, element or block
            return RoleSpec(value, default_rounding, default_scaling)
        raise TypeError(
            f"expected a format, a format name, a RoleSpec, a (format, rounding[, scaling]) tuple or None, "
            f"got {type(value).__name__}"
        )
    except (TypeError, ValueError) as e:
        raise type(e)(f"{role.value}={value!r}: {e}") from None
