"""numpy reference of ``BlockFormat.encode`` for the NVFP4 family's per-row outer scales and 4/6 selection (the
formats with ``nvfp4_path``), written from the semantics that emunum/nvfp4_quantize.py and
kernels/nvfp4_scalar.py state:

- per-row outer scales (plain amax rule): T_r = float32(amax_r / (element max * scale max)) per row of blocks
  (amax_r its largest finite |x|, T_r = 1 if that is 0), then each block as ``BlockFormat`` with T_r for T;
- 4/6: in float32 (x read as float32), the outer encode/decode scales ges, gds from the tensor's or the row's
  largest finite |x|, the two candidate scales S6 and S4, each element rounded under both, the block errors
  added in element order (16 x 16 tiles: their row errors as a tree), S4 kept only if its error is smaller.

The third item ``encode`` returns is the outer scale that ``decode`` multiplies in: a float (one per tensor,
or 1.0) or, per row, an array of x's shape with the block axis of length 1 (1-D blocks only).
"""
from __future__ import annotations

import numpy as np

from .nvfp4 import TENSOR_SCALE_MIN, Metric, OuterScale

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def _row_amax(v, row_axes):
    """Largest finite |v| per row of blocks (keepdims over ``row_axes``) or of the whole array (0-d)."""
    a = np.where(np.isfinite(v), np.abs(v), 0.0)
    return a.max(axis=row_axes, keepdims=True) if row_axes else (a.max() if a.size else a.dtype.type(0))


def row_outer_scale(fmt, blocks):
    """T_r for blocks (P, 1, 1, nbc, tc) of rows of 1-D blocks (float64, keepdims)."""
    amax = _row_amax(blocks, (-2, -1))
    t = (amax / (fmt.element.max * fmt.scale.max)).astype(F32).astype(np.float64)
    return np.where(amax == 0, 1.0, np.maximum(t, TENSOR_SCALE_MIN))


def _outer_fos(fmt, b32):
    """(ges, gds, gamax, denom) of 4/6 in float32 for blocks (P, nbr, tr, nbc, tc) of float32 values."""
    denom = F32(6 * fmt.four_over_six.bound)
    if fmt.outer_scale == OuterScale.NONE:
        one = F32(1.0)
        return one, one, denom, denom
    per_row = fmt.outer_scale == OuterScale.ROW
    gamax = F32(_row_amax(b32, (-2, -1) if per_row else None))
    with np.errstate(divide="ignore", over="ignore"):
        ges = np.minimum(denom / gamax, FLT_MAX).astype(F32)
    ges = np.where(ges == 0, F32(1.0), ges).astype(F32)
    return ges, (F32(1.0) / ges).astype(F32), gamax, denom


def _scale_of(sc, v):
    """float32 v clamped to the scale format's max and rounded to nearest-even into it (0 stays 0)."""
    w = np.minimum(v.astype(np.float64), sc.max)
    return sc.decode(sc.encode(w, "nearest")).astype(F32)


def _errors(q, S, x, gamax, denom, metric, tile_rows):
    """The float32 block error of element values q under scale S (x: the float32 blocks)."""
    with np.errstate(over="ignore", invalid="ignore"):
        val = ((q * S).astype(F32) * gamax).astype(F32) / denom
        d = (val.astype(F32) - x).astype(F32)
    term = np.abs(d) if metric != Metric.MSE else (d * d).astype(F32)
    err = np.zeros(term.shape[:-1] + (1,), F32)
    for j in range(term.shape[-1]):  # in element order, as the kernel adds them
        err = np.maximum(err, term[..., j:j + 1]) if metric == Metric.ABSMAX else (err + term[..., j:j + 1]).astype(F32)
    if tile_rows == 16:  # the 16 row errors of a tile as a tree: (r_i + r_i+8), then +4, +2, +1
        for h in (8, 4, 2, 1):
            a, b = err[:, :, :h], err[:, :, h:2 * h]
            err = np.maximum(a, b) if metric == Metric.ABSMAX else (a + b).astype(F32)
    return err


def encode_fos(fmt, blocks, rounding):
    """(element values q, block scales S, outer decode scale gds) of 4/6 for float64 blocks (P, nbr, tr, nbc, tc)
    (zero-padded; a padded element adds an exact 0 to its block's error)."""
    el, sc = fmt.element, fmt.scale
    x = blocks.astype(F32)
    nan = np.any(np.isnan(x), axis=(2, 4), keepdims=True)
    ges, gds, gamax, denom = _outer_fos(fmt, x)
    vmax = np.max(np.abs(np.where(np.isnan(x), F32(0), x)), axis=(2, 4), keepdims=True)
    with np.errstate(over="ignore"):
        base = ((vmax / F32(6.0)).astype(F32) * ges).astype(F32)
        cands = []
        for S in (_scale_of(sc, base), _scale_of(sc, (base * F32(1.5)).astype(F32))):
            sg = (S * gds).astype(F32)
            with np.errstate(divide="ignore"):
                enc = np.where(sg == 0, FLT_MAX, np.minimum(1.0 / sg.astype(np.float64), FLT_MAX)).astype(F32)
            v = np.where(nan, F32(0), (x * enc).astype(F32)).astype(np.float64)
            q = el.decode(el.encode(np.clip(v, -el.max, el.max), rounding))
            cands.append((S, q, _errors(q.astype(F32), S, x, gamax, denom, fmt.four_over_six.metric, fmt.tile[0])))
    (s6, q6, e6), (s4, q4, e4) = cands
    pick4 = e4 < e6  # a tie keeps S6
    S = np.where(nan, np.nan, np.where(pick4, s4, s6).astype(np.float64))
    return np.where(pick4, q4, q6), S, gds
