"""The settings of an emulated low-precision all-reduce (``CommSpec``), parsed once, and the seeds and scales
its arithmetic uses. Shared by the DDP hook (``hook.py``); the reference (``reference.py``) recomputes the
scale its own way."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from ..formats import BlockFormat, Format, RoundMode, get_format
from ..formats.base import parse_enum
from ..optim import derive_seed

# derive_seed streams: the rank's own wire rounding, a ring hop's rounding, the result rounding
STREAM_WIRE, STREAM_HOP, STREAM_RESULT = 0, 1, 2
# float32's normal powers of two: the range of a per-bucket scale
SCALE_EXP_MIN, SCALE_EXP_MAX = -126, 127


class CommScaling(enum.Enum):
    """NONE: the bucket is rounded as it is. PER_BUCKET: multiplied first by the power of two ``s`` that maps
    its amax to at most ``fmt.max`` (see ``pow2_scale``), and divided by ``s`` after the sum."""

    NONE = "none"
    PER_BUCKET = "per_bucket"


@dataclass(frozen=True)
class CommSpec:
    """A checked, parsed configuration of ``quantized_allreduce_hook`` (see there for the semantics).
    ``fmt`` None: no wire rounding (plain fp32 all-reduce; with ``ring`` the hops round to fp32)."""

    fmt: Format | None
    rounding: RoundMode
    seed: int | None
    scaling: CommScaling
    result_fmt: Format | None
    ring: bool
    error_feedback: bool

    @classmethod
    def make(cls, fmt, rounding="stochastic", seed=0, scaling=None, result_fmt=None, ring=False,
             error_feedback=False) -> "CommSpec":
        fmt = _scalar_format(fmt, "fmt")
        result_fmt = _scalar_format(result_fmt, "result_fmt")
        mode = RoundMode.parse(rounding, field="rounding")
        scaling = CommScaling.NONE if scaling is None else parse_enum(
            CommScaling, scaling, "scaling", "a bucket scaling (or None)")
        for name, v in (("ring", ring), ("error_feedback", error_feedback)):
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be a bool, got {v!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        if seed is not None and not 0 <= seed < 2**63:
            raise ValueError(f"seed={seed} is out of range; allowed: 0 .. 2**63-1 or None")
        if fmt is None and ring:
            fmt = get_format("fp32")  # a ring's partial sums cross the wire in fp32
        if fmt is None and (scaling != CommScaling.NONE or error_feedback):
            what = "scaling='per_bucket'" if scaling != CommScaling.NONE else "error_feedback=True"
            raise ValueError(f"{what} needs a wire format: fmt=None sends fp32 gradients unrounded")
        return cls(fmt, mode, seed, scaling, result_fmt, ring, error_feedback)

    @property
    def plain(self) -> bool:
        """Whether the hook is DDP's own all-reduce (mean), optionally with the result rounded."""
        return self.fmt is None


def _scalar_format(fmt, field: str) -> Format | None:
    if fmt is None:
        return None
    try:
        spec = get_format(fmt)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{field}: {e}") from None
    if isinstance(spec, BlockFormat):
        raise ValueError(f"{field}={fmt!r} is a block-scaled format; allowed: an element format "
                         "(a float, fixed-point, posit, ... format; use scaling='per_bucket' for a scale)")
    return spec


def pow2_scale(amax: float, limit: float) -> float:
    """The largest power of two ``s = 2**e`` with ``amax * s <= limit`` (so ``amax * s`` lies in
    ``(limit / 2, limit]``), ``e`` clamped to ``SCALE_EXP_MIN .. SCALE_EXP_MAX``; 1 when amax is 0 or not
    finite. Exact: from the frexp exponents and mantissas, no division."""
    if not (amax > 0 and math.isfinite(amax)):
        return 1.0
    mm, em = math.frexp(limit)
    ma, ea = math.frexp(amax)
    e = em - ea - (1 if ma > mm else 0)
    return math.ldexp(1.0, min(max(e, SCALE_EXP_MIN), SCALE_EXP_MAX))


def wire_seed(seed: int, rank: int, step: int, bucket: int) -> int:
    """The stochastic-rounding seed of ``rank``'s own rounding of bucket ``bucket`` at ``step``."""
    return derive_seed(seed, STREAM_WIRE, rank, step, bucket)


def hop_seed(seed: int, rank: int, step: int, bucket: int, hop: int) -> int:
    """The seed of the partial sum that ``rank`` rounds at ring hop ``hop`` (0-based)."""
    return derive_seed(seed, STREAM_HOP, rank, step, bucket, hop)


def result_seed(seed: int, step: int, bucket: int) -> int:
    """The seed of the result rounding; the same on every rank, so that the replicas stay identical."""
    return derive_seed(seed, STREAM_RESULT, step, bucket)
