"""The kernel ABI: what a number system hands its kernels, as named records, and the codes they share.

This module imports nothing from emunum: the specs (``emunum.formats``) build their record by field name with
``to_kernel_args()``, and the kernels and ``quantize`` read fields by name. A record is a ``NamedTuple``, so
``run(*record)`` passes the fields in their declared order, which is the order of the kernels' parameters.
Each record type carries its number system's ``KIND`` tag, unique across systems; the custom ops'
``format_to_args`` encodes formats with the same tags.
"""
from __future__ import annotations

import enum
from typing import Any, NamedTuple

import numpy as np


class Kind(enum.IntEnum):
    """One tag per number system (the first int of ``ops.format_to_args``)."""

    FLOAT = 0
    FIXED = 1
    POSIT = 2
    INTERNED = 3  # a table, log or custom format, by its interned id (``emunum.formats.interned``)
    TABLE = 4
    LOG = 5
    CUSTOM = 6
    SCALE = 7  # a power-of-two block scale (E8M0)
    HIF8 = 8  # HiFloat8 (its MAD parameter vector's P_KIND; P_OVF holds its overflow code)


class Mode(enum.IntEnum):
    """Rounding-mode codes, as the kernels take them (``emunum.RoundMode`` has the same values)."""

    NEAREST = 0  # ties to even
    NEAREST_AWAY = 1
    TOWARD_ZERO = 2
    UP = 3
    DOWN = 4
    ODD = 5
    STOCHASTIC = 6


class Overflow(enum.IntEnum):
    """What a float kernel returns beyond the largest finite value (``FloatFormat.overflow``)."""

    INF = 0
    NAN = 1
    SATURATE = 2


class FloatArgs(NamedTuple):
    """Sign/exponent/mantissa floats: ``man`` fraction bits, smallest normal exponent ``emin``, largest finite
    value ``max``, subnormals on or off, the overflow code and whether -0 exists."""

    man: int
    emin: int
    subnormals: int
    max: float
    overflow: int
    negzero: int
    KIND = Kind.FLOAT


class FixedArgs(NamedTuple):
    """Fixed point: value = code * 2**-frac, codes in [code_min, code_max], saturating or wrapping."""

    frac: int
    code_min: int
    code_max: int
    saturate: int
    KIND = Kind.FIXED


class PositArgs(NamedTuple):
    nbits: int
    es: int
    KIND = Kind.POSIT


class TableArgs(NamedTuple):
    """A sorted value set of ``n`` values; ``table`` float64 [values, midpoint high parts, low parts]."""

    n: int
    table: Any
    KIND = Kind.TABLE


class LogArgs(NamedTuple):
    """Logarithmic numbers: exponents k/2**frac in [kmin, kmax]; ``table`` the float64 rounding tables."""

    frac: int
    kmin: int
    kmax: int
    signed: int
    table: Any
    KIND = Kind.LOG


class CustomArgs(NamedTuple):
    """A user type: its compiled ``to_code``/``from_code`` functions and its code count ``2**nbits``; its name
    (for messages), its compiled ``add``/``mul`` on codes (None where not given), and ``derived(mode)``, the
    interface the spec fills for the modes derived from its value set: ``(TableArgs, ninf, pinf, negzero)``
    of the finite values and the -inf/+inf/-0 flags, or ValueError naming a mode the type cannot round in."""

    to_code: Any
    from_code: Any
    ncodes: int
    name: str = "custom"
    add: Any = None
    mul: Any = None
    derived: Any = None
    KIND = Kind.CUSTOM


class HiF8Args(NamedTuple):
    """HiFloat8: everything but the overflow code (inf or saturate) is fixed by the format."""

    overflow: int
    KIND = Kind.HIF8


class ScaleArgs(NamedTuple):
    """A power-of-two scale 2**e, e in [emin, emax] (E8M0: -127 .. 127, code 255 NaN)."""

    emin: int
    emax: int
    KIND = Kind.SCALE


# ---- the MAD datapaths' int64 parameter vectors (slots named once, here) -----------------------------------
# one rounding step (``kernels/gemm_scalar.py``; ``emunum.mad.unit.format_params`` fills it)
P_KIND, P_MAN, P_EMIN, P_SUB, P_MAXBITS, P_OVF, P_NEGZERO, P_FRAC, P_CMIN, P_CMAX, P_SAT, P_MODE = range(12)
NPARAM = 12
# a multi-term unit (``kernels/multiterm_scalar.py``; ``MADUnit.multiterm_params`` fills it)
T_KIND, T_TERMS, T_P, T_AMODE, T_FLOOR, T_CARRY, T_PROMOTE, T_FUSED, T_IN_EMIN, T_C_EMIN, T_MUL_EMIN = range(11)
NTPARAM = 11
NO_FLOOR = -100000  # T_FLOOR when the alignment has no floor
# an approximate multiplier (``kernels/multiplier_scalar.py``; ``Multiplier.kernel_args`` fills it)
M_KIND, M_BITS, M_OKIND, M_MAN, M_EMIN, M_FRAC, M_UNUSED, M_WIDTH = range(8)
NPRM = 8
# the widest units the CUDA kernels hold in registers / shared memory (``MADUnit`` refuses wider ones)
MAX_LANES = 64
MAX_TERMS = 256
# a matrix instruction (``kernels/mma_scalar.py``; ``emunum.mad.mma.MMAUnit.params`` fills it)
X_KIND, X_TERMS, X_FRAC, X_OUT_MAN, X_EL_EMIN, X_SC_EMIN, X_BLOCK, X_PAIRS = range(8)
NXPARAM = 8
X_NV_FUSED, X_NV_GROUPS, X_AMD_TWO_STAGE = 0, 1, 2  # X_KIND's values


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of a (no copy) for an input array the kernel does not write (a table, a bias): numba
    types read-only and writable arrays apart, so callers that pass both would compile the kernel twice."""
    v = a.view()
    v.flags.writeable = False
    return v
