"""The numerics of a policy: ``Numerics``, what every tensor role of a layer rounds to, and how."""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .autograd import STE
from .formats import BlockFormat, RoundMode
from .hadamard import check_size
from .quantize import check_sr_bits
from .roles import BLOCK_ROLES, Role, RoleSpec, role_spec

# roles whose tensors take both signs in training: an unsigned format there loses every negative value
SIGNED_ROLES = (Role.WEIGHT, Role.GRAD_WEIGHT, Role.GRAD_INPUT, Role.GRAD_OUTPUT)


def warn_unsigned(specs: dict) -> None:
    """One UserWarning naming the roles of ``SIGNED_ROLES`` in ``specs`` (role -> RoleSpec or None) whose format
    has no negative values (``signed=False``: P3109, fixed point, log), with what a negative value becomes
    (the format's own rounding of -1: NaN in P3109, 0 in fixed point and log)."""
    bad = [(r, s.fmt) for r, s in specs.items() if s is not None and r in SIGNED_ROLES
           and not getattr(s.fmt, "signed", True)]
    if not bad:
        return
    said = "; ".join(f"{r.value}={f.name} (a negative value rounds to {_of_minus_one(f):g})" for r, f in bad)
    warnings.warn(
        f"unsigned format in a role whose tensors take both signs: {said}; give "
        f"{'/'.join(r.value for r, _ in bad)} a signed format (or None: unrounded). Unsigned formats suit tensors "
        "that are never negative, such as a ReLU's output (the input and output roles)", UserWarning,
        stacklevel=_outside_emunum())


def _of_minus_one(fmt) -> float:
    return float(fmt.decode(fmt.encode(np.array([-1.0])))[0])


def _outside_emunum() -> int:
    """The ``stacklevel`` of the first caller outside the emunum package and the dataclass ``__init__``s it
    generated (the user's line)."""
    root = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, f = 1, sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(root)
                             or (f.f_code.co_filename == "<string>" and f.f_code.co_name == "__init__")):
        f, level = f.f_back, level + 1
    return level


@dataclass(frozen=True)
class Numerics:
    """The six roles' ``RoleSpec`` (or None: left in the tensor's own dtype), the straight-through estimator
    of the forward roundings, the random bits per stochastic rounding (None: 32), and the random Hadamard
    transform of block-format weight-gradient GEMMs (``hadamard``: None or its size; ``hadamard_seed``).
    Role values are parsed as ``Policy`` documents: a plain format rounds to nearest in the forward roles,
    stochastically in the gradient roles. A BlockFormat goes to ``BLOCK_ROLES`` only."""

    weight: Optional[RoleSpec] = None
    input: Optional[RoleSpec] = None
    output: Optional[RoleSpec] = None
    grad_weight: Optional[RoleSpec] = None
    grad_input: Optional[RoleSpec] = None
    grad_output: Optional[RoleSpec] = None
    ste: STE = STE.IDENTITY
    sr_bits: Optional[int] = None
    hadamard: Optional[int] = None
    hadamard_seed: int = 0

    def __post_init__(self):
        for role in Role:
            default = RoundMode.STOCHASTIC if role.is_gradient else RoundMode.NEAREST
            spec = role_spec(getattr(self, role.value), role, default)
            if spec is not None and isinstance(spec.fmt, BlockFormat) and role not in BLOCK_ROLES:
                raise ValueError(
                    f"{role.value}={spec.fmt.name}: a block format applies to GEMM operands only; allowed for "
                    f"{role.value}: an element format (FloatFormat/FixedFormat, rounded element-wise) or None; "
                    f"block formats go to {', '.join(r.value for r in BLOCK_ROLES)}")
            object.__setattr__(self, role.value, spec)
        warn_unsigned({r: getattr(self, r.value) for r in Role})
        object.__setattr__(self, "ste", STE.parse(self.ste))
        if self.sr_bits is not None:
            check_sr_bits(self.sr_bits)
        if self.hadamard is not None:
            object.__setattr__(self, "hadamard", check_size(self.hadamard))
            if not self.uses_block:
                raise ValueError(f"hadamard={self.hadamard}: the transform applies to block-format weight-gradient "
                                 "GEMMs, and the policy has no block format; allowed: hadamard=None, or a "
                                 "BlockFormat in input, weight or grad_output")
        if isinstance(self.hadamard_seed, bool) or not isinstance(self.hadamard_seed, int) or self.hadamard_seed < 0:
            raise TypeError(f"hadamard_seed={self.hadamard_seed!r}: allowed: an int >= 0")

    def spec(self, role) -> Optional[RoleSpec]:
        return getattr(self, Role.parse(role).value)

    @property
    def rounds_anything(self) -> bool:
        return any(self.spec(r) is not None for r in Role)

    @property
    def uses_block(self) -> bool:
        """Whether a GEMM-operand role (``BLOCK_ROLES``) holds a BlockFormat."""
        return any(s is not None and isinstance(s.fmt, BlockFormat) for s in map(self.spec, BLOCK_ROLES))
