"""The block-format presets (``BLOCK_PRESETS``, by name) and their short aliases (``BLOCK_ALIASES``); the sources
of each are in ``emunum/formats/block.py``'s module docstring and the comments below."""
from __future__ import annotations

from .block import PRESET_NAMES, BlockFormat
from .fixed import FixedFormat
from .float import FloatFormat
from .nvfp4 import UE5M3, FourOverSix
from .table import TABLE_PRESETS

_E2M1 = FloatFormat(2, 1, special="none")
_E4M3FN = FloatFormat(4, 3, special="fn")

BLOCK_PRESETS: dict[str, BlockFormat] = {
    "mxfp8_e4m3": BlockFormat(_E4M3FN, 32),
    "mxfp8_e5m2": BlockFormat(FloatFormat(5, 2), 32),
    "mxfp6_e3m2": BlockFormat(FloatFormat(3, 2, special="none"), 32),
    "mxfp6_e2m3": BlockFormat(FloatFormat(2, 3, special="none"), 32),
    "mxfp4_e2m1": BlockFormat(_E2M1, 32),
    "mxint8": BlockFormat(FixedFormat(8, 6), 32),
    "nvfp4": BlockFormat(_E2M1, 16, _E4M3FN, scale_rule="amax", tensor_scale=True),
    # NVFP4 with 16x16 2-D tiles, for weights (NVIDIA's NVFP4 pretraining recipe, section 4.2)
    "nvfp4_2d": BlockFormat(_E2M1, (16, 16), _E4M3FN, scale_rule="amax", tensor_scale=True),
    "msfp12": BlockFormat(FloatFormat(1, 2, special="none"), 16),
    "msfp16": BlockFormat(FloatFormat(1, 6, special="none"), 16),
    # Integer elements (their sources: docs/formats_2026.md): MXINT4, two's-complement int4 read as 2 fractional
    # bits (-2..1.75, as mxint8 reads int8 with 6), E8M0 scales over 32; NVINT4, int4 (-8..7) under NVFP4's
    # scaling (e4m3 scales over 16, scale rule amax, fp32 tensor scale).
    "mxint4": BlockFormat(FixedFormat(4, 2), 32),
    "nvint4": BlockFormat(FixedFormat(4, 0), 16, _E4M3FN, scale_rule="amax", tensor_scale=True),
    # QLoRA's weight storage (Dettmers et al. 2023, section 3 / bitsandbytes quantize_4bit, blocksize 64):
    # NF4 codes in blocks of 64 sharing one fp32 absmax, x -> nf4(x / absmax) * absmax. emunum divides in
    # float64; bitsandbytes multiplies by the float32 reciprocal, which can differ next to a midpoint.
    "nf4_b64": BlockFormat(TABLE_PRESETS["nf4"], 64, FloatFormat(8, 23), scale_rule="amax"),
}

# The NVFP4 family (docs/nvfp4.md; emunum/formats/nvfp4.py)
BLOCK_PRESETS.update({
    "nvfp4_1l": BlockFormat(_E2M1, 16, _E4M3FN, scale_rule="amax"),  # single level: block scales only
    "nvfp4_row": BlockFormat(_E2M1, 16, _E4M3FN, scale_rule="amax", outer_scale="row"),  # fp32 per row of blocks
    "nvfp4_b32": BlockFormat(_E2M1, 32, _E4M3FN, scale_rule="amax", tensor_scale=True),
    "nvfp4_ue5m3": BlockFormat(_E2M1, 16, UE5M3, scale_rule="amax"),  # UE5M3 block scales, single level
    # 4/6 with TransformerEngine's defaults (MAE, bound 256) and with fouroversix's (MSE, bound 256)
    "nvfp4_4over6": BlockFormat(_E2M1, 16, _E4M3FN, scale_rule="amax", tensor_scale=True,
                                four_over_six=FourOverSix("mae", 256)),
    "nvfp4_4over6_2d": BlockFormat(_E2M1, (16, 16), _E4M3FN, scale_rule="amax", tensor_scale=True,
                                   four_over_six=FourOverSix("mae", 256)),
    "nvfp4_4over6_mse": BlockFormat(_E2M1, 16, _E4M3FN, scale_rule="amax", tensor_scale=True,
                                    four_over_six=FourOverSix("mse", 256)),
})

BLOCK_ALIASES: dict[str, str] = {"mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e3m2", "mxfp4": "mxfp4_e2m1"}

for _name, _fmt in BLOCK_PRESETS.items():
    PRESET_NAMES.setdefault(_fmt, _name)
