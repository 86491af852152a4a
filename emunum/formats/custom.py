"""User-defined number types: ``CustomFormat(to_code, from_code, nbits, name=None, *, add=None, mul=None)``,
the design paper's Listing 1 (a type given by its convert and as_float functions, plus optional primitive
operations) in Python.

``to_code(x: float64) -> int`` rounds a value to the type (the user's function IS the ``nearest`` mode: its
tie rule, overflow and NaN handling are whatever it does), and ``from_code(code: int64) -> float`` gives a code's
value. Both are numba-``njit`` functions (plain Python functions are wrapped with ``numba.njit``), so that the
CPU kernel runs them compiled, element by element, and CUDA compiles them as device functions where it can.
Codes are unsigned bit patterns ``0 .. 2**nbits - 1``.

Other rounding modes are derived from the value set when ``nbits <= 16`` (``values()``: every code decoded,
sorted, unique, NaNs dropped): x's two neighbours lo <= x <= hi in that set are found by binary search, then
``toward_zero``, ``up``, ``down`` pick one, and ``stochastic`` picks hi with probability (x - lo) / (hi - lo)
(exactly the ``TableFormat`` rules, whose kernels do the search). ±inf take part when some code decodes to
them (``up`` beyond the largest finite value gives +inf, ``down`` below the smallest gives -inf; every other
mode saturates there, as ``TableFormat`` does); a zero result carries x's sign when some code decodes to -0.0
(as IEEE directed rounding does); NaN stays NaN. ``nearest_away`` and ``odd`` depend on the encoding, not the
value set: they raise ValueError, as does any non-nearest mode for ``nbits > 16``.

``add(a, b)`` and ``mul(a, b)``, optional njit functions on codes (int64, int64) -> integer code, are the
type's arithmetic for ``emunum.mad.custom_matmul``.

numba is imported when a CustomFormat is built (never at ``import emunum``); the functions are compiled then,
for the signatures above, and a function numba cannot compile raises TypeError naming it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..kernels.abi import CustomArgs
from .base import NumberFormat, RoundMode, check_int

MAX_NBITS = 32
MAX_TABLE_NBITS = 16  # value sets (values(), derived modes) up to 2**16 codes
DERIVED_MODES = (RoundMode.TOWARD_ZERO, RoundMode.UP, RoundMode.DOWN, RoundMode.STOCHASTIC)


@dataclass(frozen=True, eq=False, repr=False)
class CustomFormat(NumberFormat):
    """A number type given by two numba-njit scalar functions (module docstring): ``to_code`` float64 ->
    integer code (nearest rounding), ``from_code`` int64 code -> float64 value, ``nbits`` 1..32 bits per code.
    Equal (and hashing equal) iff the functions are the same objects and nbits and name are equal."""

    to_code: Callable
    from_code: Callable
    nbits: int
    name_: Optional[str] = None
    add: Optional[Callable] = None
    mul: Optional[Callable] = None
    _memo: dict = field(init=False, repr=False, compare=False)

    def __init__(self, to_code, from_code, nbits: int, name: Optional[str] = None, *, add=None, mul=None):
        nbits = check_int("CustomFormat.nbits", nbits, 1, MAX_NBITS)
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise TypeError(f"CustomFormat.name must be a non-empty str or None, got {name!r}")
        for f, v in (("to_code", to_code), ("from_code", from_code), ("add", add), ("mul", mul)):
            object.__setattr__(self, f, v)
        object.__setattr__(self, "nbits", nbits)
        object.__setattr__(self, "name_", name)
        memo = {"to_code": _compiled("to_code", to_code, 1, "int"),
                "from_code": _compiled("from_code", from_code, 1, "real")}
        for f, v in (("add", add), ("mul", mul)):
            memo[f] = None if v is None else _compiled(f, v, 2, "int")
        object.__setattr__(self, "_memo", memo)

    # identity semantics: the functions are compared by identity (they have no useful equality)
    def _key(self) -> tuple:
        return (id(self.to_code), id(self.from_code), self.nbits, self.name_, id(self.add), id(self.mul))

    def __eq__(self, other) -> bool:
        return isinstance(other, CustomFormat) and all(
            a is b for a, b in zip((self.to_code, self.from_code, self.add, self.mul),
                                   (other.to_code, other.from_code, other.add, other.mul))
        ) and self.nbits == other.nbits and self.name_ == other.name_

    def __hash__(self) -> int:
        return hash(("CustomFormat",) + self._key())

    def __reduce__(self):  # rebuilt (and re-validated) by the constructor in the receiving process
        return (_rebuild, (self.to_code, self.from_code, self.nbits, self.name_, self.add, self.mul))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self  # immutable, and a copy of the functions would be a different type

    @property
    def bits(self) -> int:
        return self.nbits

    @property
    def name(self) -> str:
        return self.name_ if self.name_ is not None else f"custom{self.nbits}[{_fname(self.to_code)}]"

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        extra = "".join(f", {f}={_fname(getattr(self, f))}" for f in ("add", "mul") if getattr(self, f) is not None)
        return (f"CustomFormat({_fname(self.to_code)}, {_fname(self.from_code)}, nbits={self.nbits}, "
                f"name={self.name_!r}{extra})")

    # ---- the compiled functions -----------------------------------------------------------------------
    @property
    def to_code_jit(self):
        """``to_code`` as a numba dispatcher (the user's own, or its ``numba.njit`` wrapper)."""
        return self._memo["to_code"]

    @property
    def from_code_jit(self):
        return self._memo["from_code"]

    @property
    def add_jit(self):
        return self._memo["add"]

    @property
    def mul_jit(self):
        return self._memo["mul"]

    # ---- values and limits ----------------------------------------------------------------------------
    def _decoded(self) -> np.ndarray:
        """from_code of every code 0 .. 2**nbits-1 (float64; nbits <= 16)."""
        got = self._memo.get("decoded")
        if got is None:
            if self.nbits > MAX_TABLE_NBITS:
                raise ValueError(f"{self.name}: the value set is built for nbits <= {MAX_TABLE_NBITS}, "
                                 f"this type has nbits={self.nbits}")
            got = self.decode(np.arange(1 << self.nbits, dtype=np.int64))
            got.setflags(write=False)
            self._memo["decoded"] = got
        return got

    def values(self) -> np.ndarray:
        """Every value (decode of every code), sorted, unique (-0.0 and 0.0 are one value), NaNs dropped;
        ±inf kept when codes decode to them. nbits <= 16 only (ValueError otherwise)."""
        d = self._decoded()
        v = np.unique(d[~np.isnan(d)])
        return np.where(v == 0.0, 0.0, v)

    def _limits(self) -> tuple:
        got = self._memo.get("limits")
        if got is None:
            if self.nbits <= MAX_TABLE_NBITS:
                d = self._decoded()
            else:  # 2**nbits decodes, not kept (seconds for nbits = 32, once per format)
                d = _scan_limits(self.from_code_jit, 1 << self.nbits)
            fin = d[np.isfinite(d)]
            if fin.size == 0:
                raise ValueError(f"{self.name} has no finite value (from_code of every code is inf or NaN)")
            got = self._memo["limits"] = (float(fin.min()), float(fin.max()))
        return got

    @property
    def max(self) -> float:
        """The largest finite value (decodes every code once: for nbits > 16 a compiled scan of 2**nbits)."""
        return self._limits()[1]

    @property
    def min(self) -> float:
        """The smallest finite value (see ``max``)."""
        return self._limits()[0]

    # ---- encode / decode --------------------------------------------------------------------------------
    def decode(self, codes) -> np.ndarray:
        """Codes (integers in 0 .. 2**nbits-1) -> float64 values, by ``from_code``."""
        c = np.asarray(codes)
        if not np.issubdtype(c.dtype, np.integer):
            raise TypeError(f"codes must be integers, got dtype {c.dtype}")
        c = c.astype(np.int64)
        bad = np.flatnonzero((c < 0) | (c >= (1 << self.nbits)))
        if bad.size:
            raise ValueError(f"code {int(c.reshape(-1)[bad[0]])} is out of range for {self.name}; allowed: "
                             f"0..{(1 << self.nbits) - 1}")
        out = np.empty(c.shape, np.float64)
        _map_codes(self.from_code_jit, c.reshape(-1), out.reshape(-1))
        return out

    def encode(self, values, rounding: str = "nearest") -> np.ndarray:
        """Values -> codes (int64). nearest: ``to_code``; the derived modes: ``to_code`` of the derived
        rounding's value (stochastic draws the bits of seed 0). A code outside 0 .. 2**nbits-1 from the user's
        ``to_code`` raises ValueError naming the value."""
        mode = RoundMode.parse(rounding)
        v = np.array(values, dtype=np.float64)
        flat = v.reshape(-1)
        if mode != RoundMode.NEAREST:
            flat = self.round_derived_np(flat, mode)
        out = np.empty(flat.shape, np.int64)
        _map_values(self.to_code_jit, flat, out)
        bad = np.flatnonzero((out < 0) | (out >= (1 << self.nbits)))
        if bad.size:
            i = bad[0]
            raise ValueError(f"{self.name}: to_code({flat[i]!r}) returned {out[i]}, outside the codes "
                             f"0..{(1 << self.nbits) - 1}")
        return out.reshape(v.shape)

    # ---- derived rounding modes ---------------------------------------------------------------------------
    def check_mode(self, mode: RoundMode) -> RoundMode:
        """``mode`` (a RoundMode or its int code) if this type supports it (module docstring), else ValueError
        naming it."""
        mode = RoundMode(int(mode))
        if mode == RoundMode.NEAREST:
            return mode
        allowed = "nearest" + (", " + ", ".join(m.name.lower() for m in DERIVED_MODES)
                               if self.nbits <= MAX_TABLE_NBITS else "")
        if mode not in DERIVED_MODES or self.nbits > MAX_TABLE_NBITS:
            why = (f"nbits={self.nbits} > {MAX_TABLE_NBITS} has no value set to derive it from"
                   if mode in DERIVED_MODES else "it depends on the encoding, not the value set")
            raise ValueError(f"rounding={mode.name.lower()!r} is not available for {self.name} ({why}); "
                             f"allowed: {allowed}")
        return mode

    def derived(self) -> tuple:
        """The kernel arguments of the derived modes: (table, ninf, pinf, negzero), with ``table`` the
        ``TableFormat`` of the finite values, and flags (0/1) for -inf and +inf in the value set and for a
        code decoding to -0.0."""
        got = self._memo.get("derived")
        if got is None:
            from .table import TableFormat
            d = self._decoded()
            v = self.values()
            fin = v[np.isfinite(v)]
            if fin.size < 2:
                raise ValueError(f"{self.name} has {fin.size} finite value(s); derived rounding modes need 2")
            negzero = bool(np.any((d == 0.0) & np.signbit(d)))
            got = (TableFormat(fin, name=f"{self.name}.values"), int(np.isneginf(v).any()),
                   int(np.isposinf(v).any()), int(negzero))
            self._memo["derived"] = got
        return got

    def round_derived_np(self, x: np.ndarray, mode: RoundMode) -> np.ndarray:
        """Flat float64 x rounded in a derived mode (numpy; the kernels' decisions; seed 0 for stochastic)."""
        from .table import round_table_np
        self.check_mode(mode)
        table, ninf, pinf, negzero = self.derived()
        q = round_table_np(table, x, mode)
        with np.errstate(invalid="ignore"):
            if pinf:
                q = np.where((x == np.inf) | ((x > table.max) & (mode == RoundMode.UP)), np.inf, q)
            if ninf:
                q = np.where((x == -np.inf) | ((x < table.min) & (mode == RoundMode.DOWN)), -np.inf, q)
        if negzero:
            q = np.where(q == 0.0, np.copysign(0.0, x), q)
        return q

    def to_kernel_args(self) -> CustomArgs:
        """``kernels.abi.CustomArgs``: the compiled functions themselves (the kernels take them as first-class
        function arguments) and the number of codes."""
        return CustomArgs(to_code=self.to_code_jit, from_code=self.from_code_jit, ncodes=1 << self.nbits,
                          name=self.name, add=self.add_jit if self.add is not None else None,
                          mul=self.mul_jit if self.mul is not None else None, derived=self.derived_args)

    def derived_args(self, mode) -> tuple:
        """``CustomArgs.derived``: (TableArgs, ninf, pinf, negzero) for ``mode`` (``check_mode``, ``derived``)."""
        self.check_mode(mode)
        table, ninf, pinf, negzero = self.derived()
        return table.to_kernel_args(), ninf, pinf, negzero


def _rebuild(to_code, from_code, nbits, name, add, mul) -> CustomFormat:
    return CustomFormat(to_code, from_code, nbits, name, add=add, mul=mul)


# ---- numba helpers (numba imported lazily, at the first CustomFormat) -------------------------------------
_JIT: dict = {}  # id(python function) -> (function, its njit dispatcher)
_HELPERS: dict = {}


def _fname(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _dispatcher(field_name: str, fn):
    from numba.core.dispatcher import Dispatcher
    if isinstance(fn, Dispatcher):
        return fn
    if not callable(fn):
        raise TypeError(f"CustomFormat.{field_name} must be a numba.njit function (or a plain Python function "
                        f"numba can compile), got {fn!r} ({type(fn).__name__})")
    hit = _JIT.get(id(fn))
    if hit is None or hit[0] is not fn:
        import numba
        try:
            hit = _JIT[id(fn)] = (fn, numba.njit(fn))
        except Exception as e:  # e.g. a builtin or a class
            raise TypeError(f"CustomFormat.{field_name}={_fname(fn)} cannot be wrapped by numba.njit: "
                            f"{_first_line(e)}") from None
    return hit[1]


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Failed in ")] or lines or [type(e).__name__]
    return lines[0]


def _compiled(field_name: str, fn, nargs: int, returns: str):
    """fn's dispatcher, compiled for float64 (to_code), int64 (from_code) or (int64, int64) (add, mul), and
    returning an integer (``returns="int"``) or a real number; TypeError naming fn otherwise."""
    from numba import types
    d = _dispatcher(field_name, fn)
    sig = (types.float64,) if field_name == "to_code" else (types.int64,) * nargs
    shown = ", ".join(str(t) for t in sig)
    try:
        d.compile(sig)
        ret = d.overloads[sig].signature.return_type
    except Exception as e:
        raise TypeError(f"CustomFormat.{field_name}={_fname(fn)} does not compile with numba for ({shown}): "
                        f"{_first_line(e)}") from None
    ok = isinstance(ret, types.Integer) if returns == "int" else isinstance(ret, (types.Integer, types.Float))
    if not ok:
        want = "an integer code" if returns == "int" else "a real number (float64)"
        raise TypeError(f"CustomFormat.{field_name}={_fname(fn)} returns {ret} for ({shown}); it must return {want}")
    return d


def _helpers():
    if not _HELPERS:
        from numba import njit

        @njit
        def map_values(fn, x, out):
            for i in range(x.size):
                out[i] = fn(x[i])

        @njit
        def scan_limits(fn, n):
            lo, hi = math.inf, -math.inf
            for c in range(n):
                v = np.float64(fn(np.int64(c)))
                if math.isfinite(v):
                    lo = min(lo, v)
                    hi = max(hi, v)
            return np.array([lo, hi])

        _HELPERS.update(map=map_values, scan=scan_limits)
    return _HELPERS


def _map_values(fn, x: np.ndarray, out: np.ndarray) -> None:
    _helpers()["map"](fn, x, out)


def _map_codes(fn, c: np.ndarray, out: np.ndarray) -> None:
    _helpers()["map"](fn, c, out)


def _scan_limits(fn, n: int) -> np.ndarray:
    got = _helpers()["scan"](fn, n)
    return got if np.isfinite(got).all() else np.array([], np.float64)
