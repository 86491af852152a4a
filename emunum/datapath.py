"""The datapath units of a policy: ``Units``, the emulated multiply-accumulate units its GEMMs run on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Units:
    """``mad``: an ``emunum.mad.MADUnit`` or ``MMAUnit`` (or a preset or instruction name, parsed here) for
    the GEMMs of Linear, Conv and attention layers and the functional GEMMs; ``mad_backward``: the units of
    their backward GEMMs (one unit or a tuple, passed to ``emunum.mad`` as ``backward_units``). None: torch's
    GEMMs."""

    mad: Any = None
    mad_backward: Any = None

    def __post_init__(self):
        if isinstance(self.mad, str):  # a preset name: MADUnit.preset (emunum units) or a matrix instruction
            from .mad import MMA_PRESETS, MADUnit  # noqa: PLC0415  (imported only when a policy names a unit)

            try:
                unit = MMA_PRESETS.get(self.mad.strip().lower()) or MADUnit.preset(self.mad)
            except ValueError as e:
                raise ValueError(f"mad={self.mad!r}: {e}; or a matrix instruction: {', '.join(MMA_PRESETS)}") from None
            object.__setattr__(self, "mad", unit)
        if self.mad is not None:
            check_unit(self.mad, "mad")
        if self.mad_backward is not None:
            units = self.mad_backward if isinstance(self.mad_backward, tuple) else (self.mad_backward,)
            for u in units:
                check_unit(u, "mad_backward")

    def check_element_gemms(self) -> None:
        """Raise ValueError if a unit is a matrix instruction (``MMAUnit``): patched layers run those on block
        formats only (their operands are blocks' elements and scales); element-format GEMMs take MAD units."""
        if self.mad is None and self.mad_backward is None:
            return
        from .mad import MMA_PRESETS, MMAUnit  # noqa: PLC0415

        backward = self.mad_backward if isinstance(self.mad_backward, tuple) else (self.mad_backward,)
        for field, unit in (("mad", self.mad), *(("mad_backward", u) for u in backward)):
            if isinstance(unit, MMAUnit):
                scaled = ", ".join(n for n, u in MMA_PRESETS.items() if u.block)
                raise ValueError(f"{field}={unit.name!r} is a matrix instruction; patched layers run matrix "
                                 f"instructions on block formats only (the block-scaled ones: {scaled}); allowed "
                                 "with element formats: an emunum.MADUnit or a MAD preset (`emunum units`, e.g. "
                                 "'h100_fp8_e4m3'), or emunum.mad.scaled_mm for a single GEMM")


def check_unit(unit, field: str) -> None:
    from .mad import MADUnit, MMAUnit  # noqa: PLC0415

    if not isinstance(unit, (MADUnit, MMAUnit)):
        raise TypeError(f"{field} must be an emunum.mad.MADUnit or MMAUnit, got {type(unit).__name__}")
