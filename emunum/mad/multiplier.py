"""``Multiplier``: the product step of a MAD unit, exact or approximate (frozen, hashable, validated once).

A unit with ``multiplier=m`` replaces the exact product a*b of its datapath (``emunum.mad.unit``, step
"products") by m(a, b), a binary64 value; everything after it (mul_fmt rounding when not fused, then the
accumulator) is unchanged. Operands are float32-representable values (as for every unit).

Kinds (``MultiplierKind``):
- ``exact``: a*b (``MADUnit`` stores it as ``multiplier=None``).
- ``table``: ``Multiplier.table(lut, operand_fmt)``: lut[i, j] is the product value of the operands whose codes
  in ``operand_fmt`` (a format of k <= 8 bits, codes as ``operand_fmt.encode`` gives them) are i and j; a
  2**k x 2**k table of float64 values, as EvoApproxLib publishes its 8-bit multipliers. Operands are encoded
  once per call (``encode_operands``; O(MK + KN)), and each product is one table read. An operand that is
  not a value of operand_fmt is an error (``ValueError`` before the kernel runs); a NaN operand gives NaN;
  -0 uses its own code where the format has one.
- ``mitchell``: Mitchell's logarithmic multiplier (J. N. Mitchell, "Computer multiplication and division using
  binary logarithms", IRE Trans. Electronic Computers EC-11(4), 1962). Each |operand| = 2**k (1 + x),
  0 <= x < 1 (k from its leading one); log2(1 + x) ~ x, so log2|ab| ~ k1 + k2 + x1 + x2, and the antilog
  takes 2**(k1+k2) (1 + x1 + x2) if x1 + x2 < 1, else 2**(k1+k2+1) (x1 + x2).
- ``truncated``: ``Multiplier.truncated(t)``: each |operand| = 2**k (1 + x) keeps t fraction bits of x
  (truncated toward zero; the leading one and the t bits after it), then the truncated operands are multiplied
  exactly.
- ``drum``: ``Multiplier.drum(k, operand_fmt)``: DRUM (S. Hashemi, R. I. Bahar, S. Reda, "DRUM: A dynamic range
  unbiased multiplier for approximate applications", ICCAD 2015). Each |operand| is the integer N times its
  quantum in ``operand_fmt`` (fixed point: 2**-frac_bits; float: 2**(max(e, emin) - man), so N is the
  significand, hidden bit included, subnormals unnormalised). If N has more than k bits, its k bits from the
  leading one are kept, the last kept bit is set to 1 and the rest dropped; else N is used as is. The two
  operands are then multiplied exactly (the published Verilog, scale-lab/DRUM, does the same on unsigned
  integers; signs are handled apart, as for every built-in).
- ``function``: ``Multiplier.function(fn)``: a numba-njit-compilable fn(a: float64, b: float64) -> float64.
Built-ins: a zero operand gives a zero of sign sign(a) xor sign(b); an inf or NaN operand gives the IEEE a*b;
otherwise sign(a) sign(b) m(|a|, |b|), each value exact in binary64.
"""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..formats import FixedFormat, FloatFormat, NumberFormat, format_or_none, parse_enum
from ..kernels import abi

MAX_TABLE_BITS = 8
MAX_DRUM_BITS = 24
MAX_TRUNCATED_BITS = 23


class MultiplierKind(enum.IntEnum):
    """The multiplier's algorithm; the integer values are the kernel codes (``kernels.multiplier_scalar``)."""

    EXACT = 0
    TABLE = 1
    MITCHELL = 2
    TRUNCATED = 3
    DRUM = 4
    FUNCTION = 5

    @classmethod
    def parse(cls, value) -> "MultiplierKind":
        return parse_enum(cls, value, "Multiplier.kind", "a multiplier kind")


_compiled: dict = {}  # plain Python function -> its numba dispatcher (one per function, so specs compare equal)


def _check_function(fn):
    """fn as a numba dispatcher compiled for (float64, float64), returning a real number."""
    try:
        from numba.core.registry import CPUDispatcher
        from numba import njit, types
    except ImportError as e:  # pragma: no cover - numba is a dependency
        raise ImportError("Multiplier.function needs numba") from e
    if not isinstance(fn, CPUDispatcher):
        if not callable(fn):
            raise TypeError(f"Multiplier.function: fn must be a numba.njit function (float64, float64) -> float64, "
                            f"got {fn!r}")
        fn = _compiled.setdefault(fn, njit(fn))
    name = getattr(fn, "__name__", repr(fn))
    args = (types.float64, types.float64)
    try:
        fn.compile(args)
        ret = fn.overloads[args].signature.return_type
    except Exception as e:  # numba raises many error types; all mean "cannot compile"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"Multiplier.function: numba cannot compile {name}(float64, float64): {first}") from None
    if not isinstance(ret, (types.Float, types.Integer, types.Boolean)):
        raise TypeError(f"Multiplier.function: {name}(float64, float64) returns {ret}; allowed: a real number "
                        "(float64)")
    return fn


def _table_codes(fmt: NumberFormat) -> tuple[np.ndarray, np.ndarray, int]:
    """(sorted non-NaN values other than -0, their codes, the code of -0 or -1) of a format of <= 8 bits."""
    codes = np.arange(2**fmt.bits, dtype=np.int64)
    vals = np.asarray(fmt.decode(codes), dtype=np.float64)
    negzero = -1
    keep = ~np.isnan(vals)
    nz = np.flatnonzero((vals == 0) & np.signbit(vals))
    if nz.size:
        negzero = int(nz[0])
        keep[nz] = False
    v, c = vals[keep], codes[keep]
    order = np.argsort(v, kind="stable")
    v, c = v[order], c[order]
    first = np.concatenate(([True], v[1:] != v[:-1]))  # a value with two codes: its first code
    return np.ascontiguousarray(v[first]), np.ascontiguousarray(c[first]), negzero


@dataclass(frozen=True)
class Multiplier:
    """The product step of a MAD unit (module docstring). Build with the class methods; ``Multiplier.parse``
    turns a name ("exact", "mitchell"), a spec or None into one. Equal specs (same kind, parameters, table
    contents and function) compare and hash equal."""

    kind: MultiplierKind = MultiplierKind.EXACT
    bits: int = 0  # truncated: t fraction bits; drum: k bits; table: k code bits
    operand_fmt: Any = None  # table and drum: the operands' format
    fn: Any = None  # function: the numba dispatcher
    lut: Any = field(default=None, compare=False, repr=False)  # table: read-only float64 (2**k, 2**k)
    lut_digest: str = field(default="", repr=False)

    def __post_init__(self):
        object.__setattr__(self, "kind", MultiplierKind.parse(self.kind))

    # ---- constructors ----------------------------------------------------------------------------
    @classmethod
    def exact(cls) -> "Multiplier":
        return cls(MultiplierKind.EXACT)

    @classmethod
    def mitchell(cls) -> "Multiplier":
        """Mitchell's logarithmic multiplier (1962); see the module docstring."""
        return cls(MultiplierKind.MITCHELL)

    @classmethod
    def truncated(cls, t: int) -> "Multiplier":
        """Operands keep t fraction bits after their leading one (0..23), then multiply exactly."""
        return cls(MultiplierKind.TRUNCATED, _int("Multiplier.truncated: t", t, 0, MAX_TRUNCATED_BITS))

    @classmethod
    def drum(cls, k: int, operand_fmt) -> "Multiplier":
        """DRUM with k bits (Hashemi et al., ICCAD 2015; 2..24) on operands of ``operand_fmt`` (a FloatFormat or
        FixedFormat, or its name), whose quantum defines each operand's integer; see the module docstring."""
        k = _int("Multiplier.drum: k", k, 2, MAX_DRUM_BITS)
        fmt = format_or_none(operand_fmt, "Multiplier.drum: operand_fmt")
        if not isinstance(fmt, (FloatFormat, FixedFormat)):
            raise ValueError(f"Multiplier.drum: operand_fmt={operand_fmt!r}; allowed: a FloatFormat or FixedFormat")
        return cls(MultiplierKind.DRUM, k, fmt)

    @classmethod
    def table(cls, lut, operand_fmt) -> "Multiplier":
        """lut[i, j]: the product value (float64) of the operands with codes i and j of ``operand_fmt`` (a
        format of k <= 8 bits, or its name); shape (2**k, 2**k). The table is copied."""
        fmt = format_or_none(operand_fmt, "Multiplier.table: operand_fmt")
        from ..formats import BlockFormat
        if isinstance(fmt, BlockFormat):  # its codes are not values without their block's scale
            raise ValueError(f"Multiplier.table: operand_fmt={fmt.name} is a block format; allowed: an element "
                             f"format of at most {MAX_TABLE_BITS} bits (e.g. its element, {fmt.element.name})")
        if fmt is None or not isinstance(fmt, NumberFormat) or not hasattr(fmt, "bits"):
            raise ValueError(f"Multiplier.table: operand_fmt={operand_fmt!r}; allowed: a number format of at most "
                             f"{MAX_TABLE_BITS} bits")
        k = int(fmt.bits)
        if k > MAX_TABLE_BITS:
            raise ValueError(f"Multiplier.table: operand_fmt={fmt.name} has k={k} bits; allowed: k <= "
                             f"{MAX_TABLE_BITS} (a 2**k x 2**k table)")
        try:
            t = np.array(lut, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise TypeError(f"Multiplier.table: lut must be a 2-D array of numbers, got {type(lut).__name__}: {e}") \
                from None
        if t.shape != (2**k, 2**k):
            raise ValueError(f"Multiplier.table: lut has shape {t.shape}; {fmt.name} has k={k} bits, so the table "
                             f"must be {2**k} x {2**k}")
        t = np.ascontiguousarray(t)
        t.setflags(write=False)
        digest = hashlib.sha256(t.tobytes()).hexdigest()
        return cls(MultiplierKind.TABLE, k, fmt, None, t, digest)

    @classmethod
    def function(cls, fn) -> "Multiplier":
        """A user product fn(a, b) -> float64: a ``numba.njit`` function (a plain Python function is compiled
        with ``njit``); it must compile for (float64, float64). On CUDA it runs as a device function."""
        return cls(MultiplierKind.FUNCTION, 0, None, _check_function(fn))

    @classmethod
    def parse(cls, value, field_name: str = "MADUnit.multiplier") -> "Multiplier | None":
        """None, a Multiplier, or a name ("exact", "mitchell") -> a Multiplier, or None for an exact one."""
        if value is None:
            return None
        if isinstance(value, str):
            kind = parse_enum(MultiplierKind, value, field_name, "a multiplier name")
            if kind not in (MultiplierKind.EXACT, MultiplierKind.MITCHELL):
                raise ValueError(f"{field_name}={value!r} needs parameters; use Multiplier.{kind.name.lower()}(...)")
            value = cls(kind)
        if not isinstance(value, Multiplier):
            raise TypeError(f"{field_name} must be None, an emunum.mad.Multiplier or 'mitchell', got "
                            f"{type(value).__name__}")
        return None if value.kind == MultiplierKind.EXACT else value

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        k = self.kind
        if k == MultiplierKind.TRUNCATED:
            return f"truncated(t={self.bits})"
        if k == MultiplierKind.DRUM:
            return f"drum(k={self.bits}, {self.operand_fmt.name})"
        if k == MultiplierKind.TABLE:
            return f"table({self.operand_fmt.name}, {self.lut_digest[:8]})"
        if k == MultiplierKind.FUNCTION:
            return f"function({getattr(self.fn, '__name__', '?')})"
        return k.name.lower()

    def __str__(self) -> str:
        return self.name

    def kernel_args(self) -> tuple:
        """(prm, lut): prm the int tuple of ``kernels.multiplier_scalar`` (kind, bits, operand kind 0 float /
        1 fixed, man, emin, frac_bits, unused, table width 2**k); lut the flat float64 table (table kind; a
        one-element dummy otherwise). Table kernels take operand codes (``encode_operands``), not values."""
        prm = [0] * abi.NPRM
        prm[abi.M_KIND], prm[abi.M_BITS], prm[abi.M_WIDTH] = int(self.kind), int(self.bits), 1
        lut = np.zeros(1, np.float64)
        fmt = self.operand_fmt
        if self.kind == MultiplierKind.DRUM:
            if isinstance(fmt, FloatFormat):
                prm[abi.M_MAN], prm[abi.M_EMIN] = fmt.man, fmt.emin
            else:
                prm[abi.M_OKIND], prm[abi.M_FRAC] = 1, fmt.frac_bits
        elif self.kind == MultiplierKind.TABLE:
            prm[abi.M_WIDTH] = 2**self.bits
            lut = self.lut.reshape(-1)
        return tuple(prm), lut

    def encode_operands(self, x, name: str = "operand"):
        """Table kind: the float32 tensor of x's codes in ``operand_fmt`` (NaN stays NaN; -0 takes its own code
        where the format has one). ValueError naming ``name`` when a value is not one of the format's."""
        import torch

        vals, codes, negzero = _table_codes(self.operand_fmt)
        with torch.no_grad():
            t = x.detach().to(torch.float64)
            v = torch.from_numpy(vals).to(t.device)
            idx = torch.searchsorted(v, t.contiguous()).clamp_(max=v.numel() - 1)
            ok = (v[idx] == t) | torch.isnan(t)
            if not bool(ok.all()):
                bad = t[~ok].reshape(-1)[0].item()
                raise ValueError(f"{name} holds {bad!r}, which is not a value of the table multiplier's operand "
                                 f"format {self.operand_fmt.name}; quantize the operands to it first "
                                 "(emunum.quantize or emunum.patch)")
            out = torch.from_numpy(codes.astype(np.float32)).to(t.device)[idx]
            if negzero >= 0:
                out = torch.where((t == 0) & torch.signbit(t), torch.tensor(float(negzero), device=t.device), out)
            return torch.where(torch.isnan(t), torch.tensor(float("nan"), device=t.device), out).contiguous()


def _int(field_name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{field_name} must be an int in [{lo}, {hi}], got {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{field_name}={value} is out of range; allowed: {lo}..{hi}")
    return int(value)
