"""Tensor-core presets: NVIDIA inner-product datapaths as ``MADUnit``s, each bit-exact against measured GPU data.

Source of every parameter: F. A. Khattak and M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores", ACM TACO
(arXiv:2512.07004, 2025), and their models in github.com/north-numerical-computing/MATLAB-tensor-core
(BSD-2-Clause), ``models/<GPU>TC.m`` (``fma`` = terms, ``neab`` = extra alignment bits, ``frmode`` = final
rounding, ``min_exp_limit`` = align_floor) on the generic block-FMA model ``models/tools/Generic_BFMA_TC.m``.
The multi-term behaviour itself (alignment to the largest exponent, truncation of shifted-out bits, one
normalisation and rounding toward zero per step) was first measured by Fasi, Higham, Mikaitis and Pranesh,
"Numerical behavior of NVIDIA tensor cores", PeerJ Comput. Sci. 7:e330 (2021), Sections 4-5.

Mapping to ``MADUnit``: terms = fma; align_bits = 23 + neab (fraction bits kept below the step exponent; the
product exponent is ea + eb with significands in [0, 4)); align_rounding = toward_zero (the models truncate);
acc_fmt = the output format, and for neab < 0 (fp8 on Ada/Hopper) a float with 23 + neab = 13 mantissa bits
and fp32's exponent range (e8m13): the step result keeps 13 fraction bits (the "fp8 accumulates in about 14
bits" effect behind DeepSeek-V3's promotion every 128 products); acc_rounding = frmode (toward_zero for fp32
output, nearest for fp16 output); align_floor = min_exp_limit; in_fmt = the input format (its emin is the
exponent of a subnormal operand). fp16-output variants (``*_out_fp16``) exist where the data set has
``d_*_fp16.txt`` and the preset reproduces it: c is then an fp16 value.

Validation (``tests/mad/test_tensor_cores.py`` on the vendored subset; ``benchmarks/tensor_cores.py`` on all
5,000 vectors per pair): every preset in ``TABLE`` reproduces every measured vector. B200 fp8 (``UNVALIDATED``):
B200TC.m's parameters miss about a third of the vectors; with B200TCRN.m's terms and rounding and a lossless
alignment fitted to the data, E4M3 matches 5,000/5,000 and E5M2 4,999/5,000. Not presets, because no parameter
set we could source or fit reproduces the data: fp16 output of fp8 on H100/H200 and B200 (the H100 model's
neab = -10 leaves 0 fp16 mantissa bits, which the data contradicts). Their mismatch counts are in docs/mad_units.md.
"""
from __future__ import annotations

from dataclasses import dataclass

_IN = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "fp8_e4m3": "e4m3fn", "fp8_e5m2": "e5m2"}
ALIASES = {"a2": "a100", "a30": "a100", "l40s": "ada", "h200": "h100"}


@dataclass(frozen=True)
class Source:
    """Where a preset's parameters come from (model file and the parameters read from it)."""

    model: str
    params: str


def _tc(terms, align_bits, acc, rounding, floor, infmt) -> dict:
    return dict(mul_fmt=None, acc_fmt=acc, fused=True, acc_rounding=rounding, terms=terms, align_bits=align_bits,
                align_rounding="toward_zero", align_floor=floor, in_fmt=_IN[infmt])


_FP32, _E8M13, _FP16 = "fp32", "e8m13", "fp16"


def _table() -> dict[str, tuple]:
    """name -> (terms, align_bits, acc_fmt, acc_rounding, align_floor, input format, Source)."""
    t = {}

    def add(gpu, model, infmt, n, neab, floor, out16_floor=None, fp8=False):
        p = 23 + neab
        acc = _E8M13 if neab < 0 else _FP32
        src = Source(f"models/{model}.m", f"fma={n}, neab={neab}, frmode=rz, min_exp_limit={floor}")
        t[f"{gpu}_{infmt}"] = (n, p, acc, "toward_zero", floor, infmt, src)
        if out16_floor is not None:
            f16 = out16_floor if not fp8 else floor
            src16 = Source(f"models/{model}.m", f"fma={n}, neab={neab}, outformat=fp16: frmode=rne, "
                                                f"min_exp_limit={f16}")
            t[f"{gpu}_{infmt}_out_fp16"] = (n, p, _FP16, "nearest", f16, infmt, src16)

    add("v100", "V100TC", "fp16", 4, 0, None, out16_floor=-19)
    for gpu, model in (("a100", "A100TC"), ("ada", "AdaTC")):
        add(gpu, model, "fp16", 8, 1, -132, out16_floor=-20)
        add(gpu, model, "bf16", 8, 1, -132)
        add(gpu, model, "tf32", 4, 1, -132)
    add("ada", "AdaTC", "fp8_e4m3", 16, -10, -132, out16_floor=-132, fp8=True)
    add("ada", "AdaTC", "fp8_e5m2", 16, -10, -132, out16_floor=-132, fp8=True)
    for gpu, model in (("h100", "H100TC"), ("b200", "B200TC")):
        add(gpu, model, "fp16", 16, 2, -133, out16_floor=-21)
        add(gpu, model, "bf16", 16, 2, -133)
        add(gpu, model, "tf32", 8, 2, -133)
    add("h100", "H100TC", "fp8_e4m3", 32, -10, -133)
    add("h100", "H100TC", "fp8_e5m2", 32, -10, -133)
    return t


TABLE = _table()
#: B200 fp8: terms and final rounding from models/B200TCRN.m (fma=32, frmode=rne); its neab=2 (align_bits 25)
#: misses 246/5,000 (E4M3) of the measured vectors, so the alignment here is fitted to the data instead: no
#: alignment loss (the exact sum of 32 products and c, rounded once to nearest) matches 5,000/5,000 (E4M3) and
#: 4,999/5,000 (E5M2; vector 3935 differs by one ulp). Fitted, not published: see docs/mad_units.md's table.
UNVALIDATED = {
    "b200_fp8_e4m3": (32, None, _FP32, "nearest", None, "fp8_e4m3",
                      Source("models/B200TCRN.m + fit to model_validation/B200",
                             "fma=32, frmode=rne; alignment lossless (fitted: 5000/5000 matched)")),
    "b200_fp8_e5m2": (32, None, _FP32, "nearest", None, "fp8_e5m2",
                      Source("models/B200TCRN.m + fit to model_validation/B200",
                             "fma=32, frmode=rne; alignment lossless (fitted: 4999/5000 matched)")),
}
PRESETS = tuple(sorted(TABLE)) + tuple(sorted(UNVALIDATED))


def canonical(name: str) -> str:
    """The preset name with a GPU alias resolved (a2/a30 -> a100, l40s -> ada, h200 -> h100)."""
    if not isinstance(name, str):
        raise TypeError(f"preset name must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    gpu, _, rest = key.partition("_")
    return f"{ALIASES.get(gpu, gpu)}_{rest}" if rest else key


def preset_kwargs(name: str) -> dict:
    """The ``MADUnit`` keyword arguments of a tensor-core preset (``MADUnit.preset(name)`` builds it; see the
    module docstring for sources and validation). This module is data only: it imports nothing from mad."""
    key = canonical(name)
    row = TABLE.get(key) or UNVALIDATED.get(key)
    if row is None:
        raise ValueError(f"unknown MAD unit preset {name!r}; known: {', '.join(PRESETS)} "
                         f"(GPU aliases: {', '.join(f'{a}->{b}' for a, b in ALIASES.items())})")
    return _tc(*row[:6])


def source(name: str) -> Source:
    key = canonical(name)
    row = TABLE.get(key) or UNVALIDATED.get(key)
    if row is None:
        preset_kwargs(name)
    return row[6]


def describe() -> list[tuple[str, str]]:
    """(name, source) for every preset, for ``emunum units``."""
    out = []
    for name in PRESETS:
        src = source(name)
        note = "" if name in TABLE else " [alignment fitted to measured data]"
        out.append((name, f"{src.model}: {src.params}{note}"))
    return out
