"""A single-process reference of ``quantized_allreduce_hook``'s arithmetic, written plainly (a loop over ranks,
a loop over a ring's chunks) for the tests; it needs no process group."""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from ..quantize import quantize
from .spec import CommScaling, CommSpec, hop_seed, result_seed, wire_seed


def _scale_by_search(amax: float, limit: float) -> float:
    """The power of two of ``pow2_scale``, found by halving/doubling in exact rational arithmetic."""
    if not (amax > 0 and amax != float("inf")):
        return 1.0
    a, lim, e = Fraction(amax), Fraction(limit), 0
    while a * Fraction(2) ** (e + 1) <= lim and e < 127:
        e += 1
    while a * Fraction(2) ** e > lim and e > -126:
        e -= 1
    return 2.0 ** e


def reference_allreduce(per_rank, fmt, rounding="stochastic", *, seed: int = 0, scaling=None, ring=False,
                        error_feedback=False, result_fmt=None, step: int = 0, bucket: int = 0, residuals=None):
    """What every rank's ``quantized_allreduce_hook`` returns for one bucket, given the W ranks' float32
    buckets ``per_rank`` (rank order) at ``step`` and bucket index ``bucket``, and the ranks' residuals
    (a list, or None for zero). Returns ``(result, new_residuals)``; new_residuals is None without
    error_feedback. The arguments mean what they mean for the hook; ``seed`` must be an int here."""
    spec = CommSpec.make(fmt, rounding, seed, scaling, result_fmt, ring, error_feedback)
    w = len(per_rank)
    xs = [t.detach().float().reshape(-1).clone() for t in per_rank]
    if spec.plain:
        total = xs[0] / w
        for x in xs[1:]:
            total = total + x / w
        return _result(total, spec, step, bucket), None
    if residuals is not None and spec.error_feedback:
        xs = [x + r.reshape(-1).float() if r is not None and r.numel() == x.numel() else x
              for x, r in zip(xs, residuals)]
    mode = spec.rounding.name.lower()
    limit = float(spec.fmt.max)

    def amax(x):
        return float(x.abs().max()) if x.numel() else 0.0

    if spec.scaling == CommScaling.NONE:
        scales = [1.0] * w
    elif spec.ring:
        tops = [amax(x) for x in xs]
        top = max(tops) if all(math.isfinite(a) for a in tops) else math.inf
        scales = [_scale_by_search(top * w, limit)] * w
    else:
        scales = [_scale_by_search(amax(x), limit) for x in xs]
    qs = [quantize(x * s, spec.fmt, mode, seed=wire_seed(seed, r, step, bucket))
          for r, (x, s) in enumerate(zip(xs, scales))]
    new_res = None
    if spec.error_feedback:
        new_res = []
        for x, q, s in zip(xs, qs, scales):
            e = (x.double() - q.double() / s).float()
            new_res.append(torch.where(torch.isfinite(e), e, torch.zeros_like(e)))
    if not spec.ring:
        total = qs[0].double() / scales[0]  # (not 0 + ...: -0 + -0 is -0)
        for q, s in zip(qs[1:], scales[1:]):
            total = total + q.double() / s
    else:
        pieces = []
        for c, idx in enumerate(torch.tensor_split(torch.arange(xs[0].numel()), w)):
            acc = qs[c][idx].double()
            for j in range(1, w):  # rank c + j adds its own chunk at its hop j - 1
                r = (c + j) % w
                acc = quantize(acc + qs[r][idx].double(), spec.fmt, mode, seed=hop_seed(seed, r, step, bucket, j - 1))
            pieces.append(acc)
        total = torch.cat(pieces) / scales[0]
    out = total.float() / w
    return _result(out, spec, step, bucket), new_res


def _result(out, spec, step, bucket):
    if spec.result_fmt is None:
        return out
    seed = spec.seed if spec.seed is not None else 0
    return quantize(out, spec.result_fmt, spec.rounding.name.lower(), seed=result_seed(seed, step, bucket))
