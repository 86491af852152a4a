"""Per-layer numerics counters for patched models: overflow, underflow, NaN and SQNR per tensor role.

Usage::

    with emunum.trace.collect(model) as t:      # or t = emunum.trace.enable(model); ...; t.close()
        for step in range(n):
            train_step(model)
            if step % 100 == 0:
                t.to_tensorboard(writer, step)  # rates since the last export, then cleared
    print(t.to_json())

Off by default; a patched model without a tracer pays nothing. For every emulated layer (``emunum.patch``; the
model's functional GEMMs count as one more, ``"functional GEMMs"``, sampled per GEMM call) and
every role it rounds, each sampled rounding of a tensor ``x`` to ``q`` adds up:

- ``values``: elements seen (in sampled calls, see below);
- ``overflow``: finite elements outside the format's finite range (beyond +-max for floats, outside
  [min, max] for fixed point), which became +-inf, NaN, +-max or wrapped by the format's overflow rule;
- ``underflow``: nonzero elements that became zero;
- ``nan``: NaN results (NaN inputs included);
- ``signal`` / ``noise``: sum of x**2 and of (q - x)**2 over elements where both are finite, accumulated in
  float64; on CPU (``kernels/counters.py``) a chunk of 4096 finite float32 values is summed in float32 lanes
  (relative error below 2.5e-4, 0.0011 dB), other chunks and other devices in float64;
  ``sqnr_db = 10 log10(signal / noise)`` (inf when nothing was lost).

Block-format GEMM operands (the ``input``, ``weight`` and ``grad_output`` roles of a block-GEMM layer,
``emunum.nn.block_gemm``) are rounded inside each GEMM, once per GEMM that takes them (input: forward and
grad-weight; weight: forward and grad-input; grad_output: grad-input and grad-weight), each along that GEMM's
K; every such rounding is counted under its role, in the forward and backward passes of sampled calls, on MAD
units too. ``overflow`` there counts the finite elements whose block-scaled value x / (S*T) lay beyond the
element format's range (``trace_count.round_block_observed``); the other counters are as above.

Forward roles are observed in the forward pass, gradient roles in the backward pass (a traced gradient
rounding, which calls the same ``emunum::quantize`` op as ``quantize_ste``'s backward, sees the gradient
before and after it). Counters accumulate in float64 tensors on the layer's device (the CPU kernels add into
them through their address); nothing synchronises until an export.

Sampling: ``every=k`` observes forward calls 0, k, 2k, ... of each layer, with all their roundings (forward
and backward); the counts are exact for those calls (``sampled`` of ``calls``), and the fractions estimate
the rates. every=1 counts every value.

Cost: on CPU, for float32/float64 tensors and Float/FixedFormats, a sampled rounding is counted in the rounding
kernel's own pass (``round_observed``; ``kernels/counters.py``: each chunk of 4096 elements is rounded, then
counted while in L1 cache), by one autograd node per role (``_TracedSTE``): no second pass over memory, no
copy, no extra node; the counts and sums are bit for bit those of rounding, then ``accumulate``. Elsewhere
(CUDA, 16-bit dtypes, posits, tables, per-tensor-scaled roles) a tensor is rounded, then counted by
``accumulate``. The counting functions live in ``emunum/trace_count.py``. Figures:
``benchmarks/trace_overhead.py``, RESULTS.md.

Tracing never changes results: it draws no random numbers and only reads tensors. Eager mode only (a
compiled model is not traced).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from typing import Optional

import torch
from torch import Tensor, nn

from .autograd import Quantizer, _unwrap_if_dead
from .ops import eager_ok, format_to_args, in_range_mask
from .patch import FUNCTIONAL_SITE, emulation_sites
from .policy import Role
from .formats import BlockFormat, RoundMode
from .quantize import check_sr_bits, resolve_seed
from .rng import seed_key
from .trace_count import (STATS, _range, accumulate, block_stats, round_block_observed,  # noqa: F401  (public here)
                          round_observed, stats_torch)


# ---- traced rounding nodes ------------------------------------------------------------------------------
class _TracedGradRound(torch.autograd.Function):
    """What the gradient half of ``quantize_ste`` does (forward: a copy; backward: ``emunum::quantize`` of the
    gradient with a fresh seed), with the layer observing the gradient before and after the rounding. Used
    where ``_TracedSTE`` is not (a per-tensor-scaled forward quantiser, or outside ``ops.eager_ok``)."""

    @staticmethod
    def forward(ctx, x, layer, role, fmt_args, mode, sr_bits):
        ctx.layer, ctx.role, ctx.fmt_args, ctx.mode, ctx.sr_bits = layer, role, fmt_args, mode, sr_bits
        return x.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, g):
        gq = torch.ops.emunum.quantize(g, ctx.fmt_args, ctx.mode, None, ctx.sr_bits)
        ctx.layer.observe(ctx.role, g, gq)
        return gq, None, None, None, None, None


class _TracedSTE(torch.autograd.Function):
    """One node for a traced role: the forward quantiser's rounding counted in the same pass (``round_observed``)
    and, backward, the gradient quantiser's rounding counted likewise, then the forward quantiser's clipping
    mask (``ste="clipped"``). Values, gradients and seed draws are those of the untraced pair ``fq``, ``bq``
    (and of the former path: ``fq``, then ``_TracedGradRound``, which rounded the gradient before the mask, as
    here); the counters see the same tensors (x -> y forward, the incoming gradient -> its rounding backward),
    and the fused kernels count them exactly as ``accumulate`` does (kernels/counters.py)."""

    @staticmethod
    def forward(ctx, x, layer, role, fplan, bplan):
        ctx.layer, ctx.role, ctx.fplan, ctx.bplan = layer, role, fplan, bplan
        clipped = fplan is not None and fplan.clipped
        ctx.save_for_backward(x if clipped else None)
        return layer.round_forward(x, role, fplan)

    @staticmethod
    def backward(ctx, g):
        b, f = ctx.bplan, ctx.fplan
        if b is not None:
            g = ctx.layer.round_counted(g, ctx.role.gradient, b.backward, b.backward_mode, b.backward_seed, b.sr_bits)
        if f is not None and f.clipped:
            (x,) = ctx.saved_tensors
            g = torch.where(in_range_mask(x, f.forward), g, torch.zeros_like(g))
        return g, None, None, None, None


# ``_TracedSTE.apply`` less its Python preamble, as ``autograd._eager_ste_apply`` (called only where
# ``ops.eager_ok`` holds: no functorch transform active)
_traced_ste_apply = super(torch.autograd.Function, _TracedSTE).apply


def _plan(q):
    """A plain ``Quantizer``'s parsed plan (None for None); False for anything else (a scaled quantiser)."""
    if q is None:
        return None
    return q._plan if type(q) is Quantizer else False


# ---- per-layer state ------------------------------------------------------------------------------------
class LayerTrace:
    """The counters of one emulated layer: ``acc[role]`` float64 [6] on the layer's device."""

    def __init__(self, name: str, module: nn.Module, every: int, sqnr: bool):
        self.name, self.every, self.sqnr = name, every, sqnr
        pol = module.emunum_policy
        self.roles = tuple(module.emunum_roles)
        self.range = {r: _range(pol.spec(r).fmt) for r in self.roles if pol.spec(r) is not None}
        self.grad_args = {r: (format_to_args(pol.spec(r).fmt), int(pol.spec(r).rounding), check_sr_bits(pol.sr_bits))
                          for r in self.roles if r.is_gradient and pol.spec(r) is not None
                          and not isinstance(pol.spec(r).fmt, BlockFormat)}
        self.acc: dict = {}
        self.calls = self.sampled = 0  # forward calls of the layer, and those observed
        self.active = False
        self.watch = None  # called as watch(name, role, x, q) after each observed rounding (``emunum.nan_origin``)

    def _watched(self, role: Role, x: Tensor, q: Tensor) -> Tensor:
        if self.watch is not None:
            self.watch(self.name, role, x, q)
        return q

    def begin(self) -> None:
        """A forward call starts: observe it (all its roundings, forward and backward) if it is sampled."""
        self.active = self.calls % self.every == 0
        self.calls += 1
        self.sampled += self.active

    def _acc(self, role: Role, device) -> Tensor:
        acc = self.acc.get(role)
        if acc is None or acc.device != device:
            acc = self.acc[role] = torch.zeros(6, dtype=torch.float64, device=device) if acc is None \
                else acc.to(device)
        return acc

    def observe(self, role: Role, x: Tensor, q: Tensor) -> None:
        lo, hi = self.range[role]
        with torch.no_grad():
            accumulate(self._acc(role, x.device), x, q, lo, hi, self.sqnr)
        self._watched(role, x, q)

    def round_counted(self, x: Tensor, role: Role, fmt, mode, seed, nbits: int) -> Tensor:
        """x rounded (``quantize_checked``) and observed in ``role``, in one pass where a fused kernel exists."""
        lo, hi = self.range[role]
        acc = self._acc(role, x.device)
        if not torch.is_grad_enabled():  # inside _TracedSTE's forward or backward: no context to enter
            return self._watched(role, x, round_observed(x, fmt, mode, seed, nbits, acc, lo, hi, self.sqnr))
        with torch.no_grad():
            return self._watched(role, x, round_observed(x, fmt, mode, seed, nbits, acc, lo, hi, self.sqnr))

    def round_forward(self, x: Tensor, role: Role, fplan) -> Tensor:
        """The forward value of plan ``fplan`` (``_Plan.forward_value``), observed in ``role``."""
        if fplan is None or fplan.forward is None:
            return x.clone(memory_format=torch.contiguous_format)
        return self.round_counted(x, role, fplan.forward, fplan.forward_mode, fplan.seed, fplan.sr_bits)

    def round(self, x: Tensor, role: Role, fq, bq) -> Tensor:
        """The layer's rounding of x in ``role`` (as ``EmuLayer._emu_round``), observed."""
        fplan, bplan = _plan(fq), _plan(bq)
        if fplan is not False and bplan is not False and eager_ok(x):  # one node, counted in the rounding pass
            if x.requires_grad and torch.is_grad_enabled() and (fplan is not None or bplan is not None):
                return _traced_ste_apply(_unwrap_if_dead(x), self, role, fplan, bplan)
            return x if fplan is None else self.round_forward(x, role, fplan)
        if fq is not None:
            y = fq(x)
            if self.active:
                self.observe(role, x, y)
        else:
            y = x
        if bq is None:
            return y
        grole = role.gradient
        if not (self.active and torch.is_grad_enabled() and y.requires_grad):
            return bq(y)
        return _TracedGradRound.apply(y, self, grole, *self.grad_args[grole])

    def round_operand(self, t: Tensor, role: Role, spec, axis: int, sr_bits) -> Tensor:
        """A block GEMM's operand t rounded as ``BlockPlan.q`` rounds it (a BlockFormat along ``axis``, an
        element format element-wise; the same bits and seed draw), and counted under ``role``."""
        nbits = check_sr_bits(sr_bits)
        acc = self._acc(role, t.device)
        with torch.no_grad():
            if isinstance(spec.fmt, BlockFormat):
                q = round_block_observed(t, spec.fmt, spec.rounding, nbits, axis, acc, self.sqnr)
            else:
                lo, hi = self.range[role]
                q = round_observed(t, spec.fmt, spec.rounding, None, nbits, acc, lo, hi, self.sqnr)
        return self._watched(role, t, q)

    def block_matmul_seed(self, a: Tensor, b: Tensor, ra: Role, sa, rb: Role, sb, unit, sr_bits) -> Optional[int]:
        """The seed ``emunum.mad.block_matmul(a, b, sa.fmt, sb.fmt, unit, ...)`` would draw (drawn here the same
        way, once, only if anything rounds stochastically; None otherwise), after counting the roundings of a
        (along its last axis, role ``ra``) and b (along its first, role ``rb``) that it makes with that seed."""
        from .mad.block import _SEED_A, _SEED_B, _derived  # the operand keys block_matmul derives from its seed

        stochastic = RoundMode.STOCHASTIC in (sa.rounding, sb.rounding, unit.acc_rounding)
        seed = resolve_seed(None) if stochastic else None
        nbits = check_sr_bits(sr_bits)
        for t, role, spec, axis, off in ((a, ra, sa, -1, _SEED_A), (b, rb, sb, -2, _SEED_B)):
            key = seed_key(_derived(seed, off)) if spec.rounding == RoundMode.STOCHASTIC else seed_key(0)
            with torch.no_grad():  # block_matmul rounds its operands in float64
                t64 = t.detach().to(torch.float64)
                self._watched(role, t64, round_block_observed(t64, spec.fmt, spec.rounding, nbits, axis,
                                                              self._acc(role, t.device), self.sqnr, key=key))
        return seed

    def reset(self) -> None:
        for acc in self.acc.values():
            acc.zero_()
        self.calls = self.sampled = 0

    def to_dict(self) -> dict:
        out = {}
        for role in self.roles:
            if role not in self.range:
                continue
            v = self.acc[role].tolist() if role in self.acc else [0.0] * 6
            d = {k: int(v[i]) for i, k in enumerate(STATS[:4])}
            d["signal"], d["noise"] = v[4], v[5]
            d["sqnr_db"] = _sqnr_db(v[4], v[5]) if self.sqnr else None
            d["calls"], d["sampled"] = self.calls, self.sampled
            out[role.value] = d
        return out


def _sqnr_db(signal: float, noise: float) -> Optional[float]:
    if noise == 0.0:
        return math.inf if signal > 0 else None
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


# ---- the tracer -----------------------------------------------------------------------------------------
class Tracer:
    """Counters of every emulated layer of a model. Create with ``enable`` or ``collect``."""

    def __init__(self, model: nn.Module, *, every: int = 10, sqnr: bool = True):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r} must be an int >= 1 (observe one call in every)")
        if not isinstance(sqnr, bool):
            raise TypeError(f"sqnr must be a bool, got {sqnr!r}")
        mods = emulation_sites(model)
        if not mods:
            raise ValueError("emunum.trace: the model has no emulated layer; call emunum.patch(model, ...) first")
        busy = [n for n, m in mods if m._emunum_trace is not None]
        if busy:
            raise ValueError(f"emunum.trace: {busy[0]!r} is already traced; close that tracer first")
        self.every, self.sqnr = every, sqnr
        self.layers = {}
        self._modules = []
        for name, m in mods:
            name = name or "model"  # the model itself is the emulated layer
            lt = LayerTrace(name, m, every, sqnr)
            self.layers[name] = lt
            self._modules.append(m)
            m.__dict__["_emunum_trace"] = lt
            _set_plan_trace(m, lt)

    def close(self) -> None:
        """Detach from the model (counters stay readable)."""
        mine = {id(lt) for lt in self.layers.values()}
        for m in self._modules:
            if id(m.__dict__.get("_emunum_trace")) in mine:
                m.__dict__["_emunum_trace"] = None
                _set_plan_trace(m, None)
        self._modules = []

    def __enter__(self) -> "Tracer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self) -> None:
        """Zero every counter (call counts too)."""
        for lt in self.layers.values():
            lt.reset()

    def to_dict(self) -> dict:
        """``{layer: {role: {values, overflow, underflow, nan, signal, noise, sqnr_db, calls}}}``; the model's
        functional GEMMs (``patch.FUNCTIONAL_SITE``) appear once one has run."""
        return {name: lt.to_dict() for name, lt in self.layers.items()
                if lt.calls or name != FUNCTIONAL_SITE}

    summary = to_dict

    def to_json(self, path=None, indent: int = 2) -> str:
        """The ``to_dict`` as JSON (inf/-inf SQNR as the strings "inf"/"-inf"); written to ``path`` if given."""
        def fix(v):
            if isinstance(v, dict):
                return {k: fix(x) for k, x in v.items()}
            if isinstance(v, float) and math.isinf(v):
                return "inf" if v > 0 else "-inf"
            return v

        text = json.dumps(fix(self.to_dict()), indent=indent)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    def to_tensorboard(self, writer, step: int, *, prefix: str = "emunum", reset: bool = True) -> None:
        """Scalars ``<prefix>/<layer>/<role>/{overflow,underflow,nan}`` (fractions of the values seen) and
        ``.../sqnr_db`` for the counters since the last reset; then reset them (``reset=False`` keeps them)."""
        for name, roles in self.to_dict().items():
            for role, d in roles.items():
                n = d["values"]
                if n == 0:
                    continue
                tag = f"{prefix}/{name}/{role}"
                for k in ("overflow", "underflow", "nan"):
                    writer.add_scalar(f"{tag}/{k}", d[k] / n, step)
                if d["sqnr_db"] is not None and math.isfinite(d["sqnr_db"]):
                    writer.add_scalar(f"{tag}/sqnr_db", d["sqnr_db"], step)
        if reset:
            self.reset()


def enable(model: nn.Module, *, every: int = 10, sqnr: bool = True) -> Tracer:
    """Start tracing every emulated layer of ``model``; returns the ``Tracer`` (``close()`` stops it)."""
    return Tracer(model, every=every, sqnr=sqnr)


def disable(model: nn.Module) -> None:
    """Stop every tracer attached to ``model``'s layers."""
    for _, m in emulation_sites(model):
        m.__dict__["_emunum_trace"] = None
        _set_plan_trace(m, None)


def _set_plan_trace(module: nn.Module, lt: Optional[LayerTrace]) -> None:
    """Hand ``lt`` to the layer's block-GEMM plan (a copy of it holding ``lt``; None: the plain plan again)."""
    plan = module.__dict__.get("_emunum_block")
    if plan is not None:
        module.__dict__["_emunum_block"] = dataclasses.replace(plan, trace=lt)


@contextlib.contextmanager
def collect(model: nn.Module, *, every: int = 10, sqnr: bool = True):
    """``with emunum.trace.collect(model) as t:`` trace inside the block; ``t`` stays readable after it."""
    t = Tracer(model, every=every, sqnr=sqnr)
    try:
        yield t
    finally:
        t.close()
