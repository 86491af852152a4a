"""Name parsing: ``get_format("fp8_152")``, ``"e4m3fn"``, ``"fixed16_12"``, ...

Names are case-insensitive. Grammar (besides the presets):
- ``fp<N>_<s><e><m>[fn|fnuz|none]``: digit-packed sign/exponent/mantissa widths; the bit total N decides
  how the digits split (``fp16_1510`` is 1-5-10), and must match.
- ``[fp<N>_]e<E>m<M>[fn|fnuz|none]``: IEEE-style unless a suffix names another special-value policy.
- ``fixed<bits>_<frac>`` / ``ufixed<bits>_<frac>``; ``int<N>`` / ``uint<N>`` (frac 0).
- ``posit<N>_<es>`` (``posit8_0``, ``posit16_1``); ``posit<N>`` has es=2 (the Posit Standard 2022).
- ``lns<int_bits>_<frac_bits>`` / ``ulns<int_bits>_<frac_bits>``: LogFormat (signed / unsigned).
- ``p3109_k<K>p<P>[u][f]``: IEEE P3109 (``P3109Format``), ``u`` unsigned, ``f`` finite; gfloat's spellings
  ``p3109_k<K>p<P>{s|u}{e|f}`` too (``p3109_k8p3se`` is ``p3109_k8p3``).
- ``hifloat8`` / ``hif8``: HiFloat8 (``HiFloat8Format``); ``hifloat8_sat`` saturates instead of inf.
- codebooks (``TABLE_PRESETS``): ``nf4``, ``af4``, ``fp4_bnb``; block-scaled ``nf4_b64`` (a BlockFormat).
- MX+ block formats (``MXPLUS_PRESETS``, formats/mxplus.py): ``mxfp4_e2m1_plus`` (``mxfp4_plus``), ...
- ``<block preset>_<rule>``, rule one of floor, ceil, even, rceil (``ocp`` = floor): the preset with that
  ``scale_rule`` (``mxfp8_e4m3_rceil``, ``mxfp8_rceil``, ``mxfp4_even``; formats/scale_rule.py).
"""
from __future__ import annotations

import re

from .base import FormatSpec, NumberFormat
from .fixed import FixedFormat
from .float import FloatFormat, Special
from .posit import PositFormat
from .block import E8M0, BlockFormat
from .block_presets import BLOCK_ALIASES, BLOCK_PRESETS
from .mxplus import MXPLUS_ALIASES, MXPLUS_PRESETS
from .scale_rule import split_rule_suffix
from .log import LogFormat
from .p3109 import P3109Format
from .hifloat8 import HiFloat8Format
from .table import TABLE_PRESETS
from .presets import ALIASES, POSIT_PRESETS, PRESETS, known_names

_SUFFIX = r"(fn|fnuz|none)?"
_PACKED = re.compile(r"fp(\d+)_1(\d+?)" + _SUFFIX + r"$")
_EM = re.compile(r"(?:fp(\d+)_)?e(\d+)m(\d+)" + _SUFFIX + r"$")
_FIXED = re.compile(r"(u?)fixed(\d+)_(-?\d+)$")
_INT = re.compile(r"(u?)int(\d+)$")
_POSIT = re.compile(r"posit(\d+)(?:_(\d+))?$")
_LNS = re.compile(r"(u?)lns(\d+)_(\d+)$")
_P3109 = re.compile(r"p3109_k(\d+)p(\d+)(s|u)?(e|f)?$")
_HIF8 = re.compile(r"(?:hifloat8|hif8)(_sat)?$")


def _special(suffix: str | None) -> Special:
    return Special.parse(suffix) if suffix else Special.IEEE


def _checked_total(name: str, total: str | None, fmt: FloatFormat) -> FloatFormat:
    if total is not None and int(total) != fmt.bits:
        raise ValueError(f"format name {name!r}: fp{total} does not match 1+{fmt.exp}+{fmt.man}={fmt.bits} bits")
    return fmt


def _parse(name: str) -> NumberFormat | None:
    m = _EM.match(name)
    if m:
        total, e, mm, suffix = m.groups()
        return _checked_total(name, total, FloatFormat(int(e), int(mm), special=_special(suffix)))
    m = _PACKED.match(name)
    if m:
        total, digits, suffix = int(m.group(1)), m.group(2), m.group(3)
        splits = [(int(digits[:i]), int(digits[i:])) for i in range(1, len(digits))
                  if 1 + int(digits[:i]) + int(digits[i:]) == total]
        if len(splits) != 1:
            raise ValueError(
                f"format name {name!r}: the digits 1{digits} split into sign-exponent-mantissa summing to {total} "
                f"in {len(splits)} ways; write e<E>m<M> instead"
            )
        return FloatFormat(*splits[0], special=_special(suffix))
    m = _FIXED.match(name)
    if m:
        return FixedFormat(int(m.group(2)), int(m.group(3)), signed=not m.group(1))
    m = _INT.match(name)
    if m:
        return FixedFormat(int(m.group(2)), 0, signed=not m.group(1))
    m = _POSIT.match(name)
    if m:
        return PositFormat(int(m.group(1)), 2 if m.group(2) is None else int(m.group(2)))
    m = _LNS.match(name)
    if m:
        return LogFormat(int(m.group(2)), int(m.group(3)), signed=not m.group(1))
    m = _P3109.match(name)
    if m:
        return P3109Format(int(m.group(1)), int(m.group(2)), signed=m.group(3) != "u", extended=m.group(4) != "f")
    m = _HIF8.match(name)
    if m:
        return HiFloat8Format(saturate=m.group(1) is not None)
    return None


_PARSED: dict = {}


def _rule_variant(key: str) -> BlockFormat | None:
    """The block preset of ``<preset>_<rule>`` with that scale rule; None if key is no such name."""
    split = split_rule_suffix(key)
    if split is None:
        return None
    base = BLOCK_ALIASES.get(split[0], split[0])
    if base not in BLOCK_PRESETS:
        return None
    return BLOCK_PRESETS[base].with_scale_rule(split[1])


def get_format(name_or_spec) -> FormatSpec:
    """A format spec (any ``FormatSpec``: an element or block format) passes through; a name is looked up or
    parsed (see module doc)."""
    if isinstance(name_or_spec, FormatSpec):
        return name_or_spec
    if not isinstance(name_or_spec, str):
        raise TypeError(
            f"fmt must be a FloatFormat, FixedFormat or a format name, got {type(name_or_spec).__name__}"
        )
    key = name_or_spec.strip().lower()
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    if key in POSIT_PRESETS:
        return POSIT_PRESETS[key]
    if key in TABLE_PRESETS:
        return TABLE_PRESETS[key]
    key = BLOCK_ALIASES.get(key, key)
    if key in BLOCK_PRESETS:
        return BLOCK_PRESETS[key]
    key = MXPLUS_ALIASES.get(key, key)
    if key in MXPLUS_PRESETS:
        return MXPLUS_PRESETS[key]
    if key == "e8m0":
        return E8M0
    fmt = _PARSED.get(key)
    if fmt is None:
        fmt = _rule_variant(key) or _parse(key)
        if fmt is not None and len(_PARSED) < 1024:  # specs are frozen, so one parse serves every later call
            _PARSED[key] = fmt
    if fmt is None:
        raise ValueError(
            f"fmt={name_or_spec!r} is not a known format; presets: {', '.join(known_names())}; block formats: "
            f"{', '.join(sorted(BLOCK_PRESETS) + sorted(BLOCK_ALIASES))}, "
            f"{', '.join(sorted(MXPLUS_PRESETS) + sorted(MXPLUS_ALIASES))} (MX+), e8m0 (a power-of-two one with a "
            "scale rule suffix _floor, _ceil, _even or _rceil: mxfp8_e4m3_rceil); codebooks: "
            f"{', '.join(TABLE_PRESETS)}; or write fp<N>_<s><e><m>, e<E>m<M>[fn|fnuz|none], fixed<bits>_<frac>, "
            "posit<N>_<es>, [u]lns<int_bits>_<frac_bits>, p3109_k<K>p<P>[u][f], hifloat8[_sat] (hif8)"
        )
    return fmt


def format_or_none(value, field: str) -> FormatSpec | None:
    """``get_format(value)``, or None for None; errors name ``field`` and the value."""
    if value is None:
        return None
    try:
        return get_format(value)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{field}={value!r}: {e}") from None
