"""Emulated layers: torch layers whose tensors are rounded by a ``Policy``, built from plain ones by ``from_float``.

``EmuLinear.from_float(linear, fmt="e5m2")`` returns a new module of a subclass of the original's class that
*shares* the original's state: the same ``_parameters``, ``_buffers``, ``_modules`` and hook dicts (so the same
Parameter objects, state_dict keys and hooks), plus the rounding plan. ``emunum.patch`` swaps such modules in
and ``emunum.unpatch`` swaps the originals back, copying attributes changed meanwhile (``training`` ...).

Where the rounding happens, per forward call (a role with no format is left alone):
- Linear, Conv1d/2d/3d, ConvTranspose1d/2d/3d: ``output = Q_out(op(Q_in(input), Q_w(weight), Q_w(bias)))``;
  in the backward pass the gradient arriving at the output is rounded to ``grad_output``, the gradient
  leaving for the input to ``grad_input`` and the weight and bias gradients to ``grad_weight``.
- Embedding: ``Q_out(embedding(indices, Q_w(weight)))`` (the whole table is rounded, so its gradient is the
  rounded gradient of the table; ``max_norm`` renormalises the stored weight first, as torch does).
- MultiheadAttention: see ``MultiheadAttentionEmu``.
- Norm layers and activations: ``Q_out(layer(input))``.
Each rounding is ``emunum.quantize_ste`` with the role's format and rounding: the forward value straight
through (``Policy.ste``), then an identity whose backward rounds the gradient. Stochastic rounding draws fresh
seeds from torch's default generator on every call, so ``torch.manual_seed`` makes runs repeatable.

Per-tensor scaling (a role whose ``RoleSpec.scaling`` is ``per_tensor``, see ``emunum.policy.Scaling``):
a forward role rounds ``x`` as ``quantize_ste(x * s) / s`` with ``s = per_tensor_scale(x, fmt)``, the
gradient passing straight through the scaling (so the straight-through estimator sees ``x * s``: the
clipped one zeroes only where ``x * s`` is beyond the format's range, i.e. at infinities); a gradient role
rounds the gradient ``g`` arriving in the backward pass as ``quantize(g * s_g) / s_g`` with
``s_g = per_tensor_scale(g, fmt)``. ``s`` is computed with torch ops on every call (no ``.item()``), so
scaled layers run under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .autograd import Quantizer
from .formats import get_format
from .ops import format_to_args
from .policy import FORWARD_ROLES, Policy, Role, Scaling, make_policy
from .quantize import check_sr_bits

_STATE_PREFIX = "_emunum_"


# ---- per-tensor scaling ---------------------------------------------------------------------------------
# the normal powers of two of each dtype: the scale and its reciprocal are exact there
_SCALE_EXPONENTS = {torch.float32: (-126, 127), torch.bfloat16: (-126, 127), torch.float16: (-14, 15),
                    torch.float64: (-1022, 1023)}


def per_tensor_scale(x: Tensor, fmt) -> Tensor:
    """The per-tensor scale of x for ``fmt``: a 0-dim tensor of x's dtype and device holding the power of two
    ``s = 2**floor(log2(fmt.max / amax))``, ``amax = max |x|`` (so ``amax * s`` lies in
    ``(fmt.max / 2, fmt.max]``), clamped to x's dtype's normal powers of two; ``s = 1`` when x is empty or
    amax is 0 or not finite. Computed exactly (frexp and integer compares; no division, no ``.item()``)."""
    fmt = get_format(fmt)
    return _pow2_scale(x, float(fmt.max))


def _pow2_scale(x: Tensor, max_value: float) -> Tensor:
    if x.dtype not in _SCALE_EXPONENTS:
        raise TypeError(f"per-tensor scaling: x.dtype={x.dtype} is not supported; allowed: "
                        f"{', '.join(str(d) for d in _SCALE_EXPONENTS)}")
    if x.numel() == 0:
        return torch.ones((), dtype=x.dtype, device=x.device)
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    amax = x.detach().abs().amax().to(wide)  # exact widening; NaN propagates
    mm, em = math.frexp(max_value)  # max = mm * 2**em, mm in [0.5, 1)
    ma, ea = torch.frexp(amax)  # amax = ma * 2**ea
    # max / amax = (mm / ma) * 2**(em - ea) with mm / ma in (1/2, 2): floor(log2) is em - ea, less 1 if ma > mm
    e = (em - ea.to(torch.int64)) - (ma > mm).to(torch.int64)
    lo, hi = _SCALE_EXPONENTS[x.dtype]
    ok = (amax > 0) & (amax < math.inf)  # False for 0, inf and NaN: then e = 0, s = 1
    e = e.clamp(lo, hi) * ok  # (cheaper than isfinite/where on 0-dim CPU tensors)
    if wide == torch.float64:
        s = ((e + 1023) << 52).view(torch.float64)  # the bits of 2**e
    else:
        s = ((e + 127).to(torch.int32) << 23).view(torch.float32)
    return s.to(x.dtype)


class _MulStraightThrough(torch.autograd.Function):
    """``x * s`` for a power of two s, with the gradient passed unchanged (the scaling is part of the
    straight-through rounding, whose derivative is taken to be 1)."""

    @staticmethod
    def forward(ctx, x, s):
        return x * s

    @staticmethod
    def backward(ctx, g):
        return g, None


class ScaledQuantizer:
    """A forward-role quantiser with per-tensor scaling: ``x -> q(x * s) / s``, ``s = per_tensor_scale(x)``,
    where q is the role's ``Quantizer``; the gradient passes straight through the scaling into q's."""

    def __init__(self, quantizer: Quantizer, fmt):
        self.quantizer, self.max_value = quantizer, float(get_format(fmt).max)

    def __call__(self, x: Tensor) -> Tensor:
        s = _pow2_scale(x, self.max_value)
        y = self.quantizer(_MulStraightThrough.apply(x, s))
        return _MulStraightThrough.apply(y, torch.reciprocal(s))


class _ScaledGradRound(torch.autograd.Function):
    """Forward: x unchanged. Backward: the gradient g rounded as ``quantize(g * s) / s``,
    ``s = per_tensor_scale(g)``, through the ``emunum::quantize`` op with a fresh seed."""

    @staticmethod
    def forward(ctx, x, max_value, fmt_args, mode, sr_bits):
        ctx.max_value, ctx.fmt_args, ctx.mode, ctx.sr_bits = max_value, fmt_args, mode, sr_bits
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        s = _pow2_scale(g, ctx.max_value)
        gq = torch.ops.emunum.quantize(g * s, ctx.fmt_args, ctx.mode, None, ctx.sr_bits)
        return gq * torch.reciprocal(s), None, None, None, None


class ScaledGradQuantizer:
    """A gradient-role quantiser with per-tensor scaling of the gradient (see ``_ScaledGradRound``)."""

    def __init__(self, fmt, rounding, sr_bits):
        fmt = get_format(fmt)
        self.args = (float(fmt.max), format_to_args(fmt), int(rounding), check_sr_bits(sr_bits))

    def __call__(self, x: Tensor) -> Tensor:
        return _ScaledGradRound.apply(x, *self.args)


def _make_quantizers(policy: Policy, role: Role):
    """(forward-value quantiser or None, gradient quantiser or None) for a forward role."""
    spec, gspec = policy.spec(role), policy.spec(role.gradient)
    fq = bq = None
    if spec is not None:
        fq = Quantizer(forward=spec.fmt, backward=None, forward_rounding=spec.rounding, ste=policy.ste.value,
                       sr_bits=policy.sr_bits)
        if spec.scaling == Scaling.PER_TENSOR:
            fq = ScaledQuantizer(fq, spec.fmt)
    if gspec is not None:
        if gspec.scaling == Scaling.PER_TENSOR:
            bq = ScaledGradQuantizer(gspec.fmt, gspec.rounding, policy.sr_bits)
        else:
            bq = Quantizer(forward=None, backward=gspec.fmt, backward_rounding=gspec.rounding,
                           sr_bits=policy.sr_bits)
    return fq, bq


def _merged_quantizer(policy: Policy, role: Role):
    """One straight-through node rounding values forward and gradients backward, where that is the same as
    the pair from ``_make_quantizers`` (both roles present and unscaled): half the autograd nodes per role."""
    spec, gspec = policy.spec(role), policy.spec(role.gradient)
    if spec is None or gspec is None or Scaling.PER_TENSOR in (spec.scaling, gspec.scaling):
        return None
    return Quantizer(forward=spec.fmt, backward=gspec.fmt, forward_rounding=spec.rounding,
                     backward_rounding=gspec.rounding, ste=policy.ste.value, sr_bits=policy.sr_bits)


class EmuLayer:
    """Mixin of every emulated layer. ``ROLES``: the forward roles the layer rounds (gradients follow)."""

    ROLES: tuple = FORWARD_ROLES
    HAS_WEIGHT: bool = True  # a GEMM/lookup layer (counts for Policy.keep_first_last)
    _emunum_base: type = nn.Module  # the torch class this emulated class derives from

    @classmethod
    def from_float(cls, module: nn.Module, fmt=None, **policy) -> "EmuLayer":
        """An emulated twin of ``module`` sharing its parameters, buffers, submodules and hooks.

        ``fmt``/``policy``: an ``emunum.Policy`` or its keyword form (``Policy.make``)."""
        pol = make_policy(fmt, **policy)
        if not issubclass(cls, nn.Module):
            raise TypeError(f"{cls.__name__} is a mixin; call Emu<Type>.from_float or emunum.nn.from_float")
        if not isinstance(module, cls._emunum_base):
            raise TypeError(f"{cls.__name__}.from_float needs a {cls._emunum_base.__name__}, "
                            f"got {type(module).__name__}")
        if isinstance(module, EmuLayer):
            raise ValueError(f"module is already emulated ({type(module).__name__}); "
                             "call emunum.unpatch first")
        cls._emunum_check(module, pol)
        emu = cls.__new__(cls)
        emu.__dict__.update(module.__dict__)
        d = emu.__dict__
        d["_emunum_policy"] = pol
        d["_emunum_trace"] = None
        d["_emunum_q"] = {role: _make_quantizers(pol, role) for role in cls.ROLES}
        d["_emunum_q1"] = {role: _merged_quantizer(pol, role) for role in cls.ROLES}
        return emu

    @classmethod
    def _emunum_check(cls, module: nn.Module, policy: Policy) -> None:
        """Raise if the layer cannot be emulated under ``policy`` (overridden where needed)."""

    @property
    def emunum_policy(self) -> Policy:
        return self._emunum_policy

    @property
    def emunum_roles(self) -> tuple:
        """Every role this layer rounds: its forward roles, then their gradients."""
        return tuple(self.ROLES) + tuple(r.gradient for r in self.ROLES)

    def _emu_begin(self) -> None:
        """Called first in every forward: lets a tracer decide whether to observe this call."""
        trace = self._emunum_trace
        if trace is not None:
            trace.begin()

    def _emu_round(self, x: Tensor, role: Role) -> Tensor:
        fq, bq = self._emunum_q[role]
        trace = self._emunum_trace
        if trace is not None and trace.active:  # a sampled call; the others take the untraced path below
            if isinstance(bq, ScaledGradQuantizer):  # the tracer's gradient rounding is unscaled: not traced
                return bq(trace.round(x, role, fq, None))
            return trace.round(x, role, fq, bq)
        merged = self.__dict__.get("_emunum_q1", {}).get(role)
        if merged is not None:
            return merged(x)
        if fq is not None:
            x = fq(x)
        if bq is not None:
            x = bq(x)
        return x

    def extra_repr(self) -> str:
        base = super().extra_repr()
        emu = self._emunum_policy.describe(self.emunum_roles)
        return f"{base}, {emu}" if base else emu


# ---- GEMM helpers (torch's, or an emulated MAD unit's) -------------------------------------------------
def _mad():
    from . import mad  # noqa: PLC0415  (imported only when a policy names a MAD unit)

    return mad


def _linear(x: Tensor, w: Tensor, b: Optional[Tensor], policy: Policy) -> Tensor:
    if policy.mad is None:
        return F.linear(x, w, b)
    return _mad().linear(x, w, b, unit=policy.mad, backward_units=policy.mad_backward)


def _bmm(a: Tensor, b: Tensor, policy: Policy) -> Tensor:
    if policy.mad is None:
        return torch.bmm(a, b)
    return _mad().matmul(a, b, unit=policy.mad, backward_units=policy.mad_backward)


# ---- Linear ---------------------------------------------------------------------------------------------
class LinearEmu(EmuLayer):
    def forward(self, input: Tensor) -> Tensor:
        self._emu_begin()
        x = self._emu_round(input, Role.INPUT)
        w = self._emu_round(self.weight, Role.WEIGHT)
        b = None if self.bias is None else self._emu_round(self.bias, Role.WEIGHT)
        return self._emu_round(_linear(x, w, b, self._emunum_policy), Role.OUTPUT)


# ---- Conv -----------------------------------------------------------------------------------------------
class ConvEmu(EmuLayer):
    _MAD_FUNCTIONS = {1: "conv1d", 2: "conv2d"}

    @classmethod
    def _emunum_check(cls, module, policy):
        if policy.mad is not None:
            nd = len(module.kernel_size)
            if nd not in cls._MAD_FUNCTIONS or not hasattr(_mad(), cls._MAD_FUNCTIONS[nd]):
                raise ValueError(f"Policy.mad: emunum.mad has no emulated {type(module).__name__} GEMM; "
                                 "exclude these layers with filter=")

    def forward(self, input: Tensor) -> Tensor:
        self._emu_begin()
        x = self._emu_round(input, Role.INPUT)
        w = self._emu_round(self.weight, Role.WEIGHT)
        b = None if self.bias is None else self._emu_round(self.bias, Role.WEIGHT)
        pol = self._emunum_policy
        if pol.mad is None:
            y = self._conv_forward(x, w, b)
        else:
            padding = self.padding
            if self.padding_mode != "zeros":
                x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
                padding = 0
            fn = getattr(_mad(), self._MAD_FUNCTIONS[len(self.kernel_size)])
            y = fn(x, w, b, self.stride, padding, self.dilation, self.groups, unit=pol.mad,
                   backward_units=pol.mad_backward)
        return self._emu_round(y, Role.OUTPUT)


class ConvTransposeEmu(EmuLayer):
    _FUNCTIONS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

    @classmethod
    def _emunum_check(cls, module, policy):
        if policy.mad is not None:
            raise ValueError(f"Policy.mad: emunum.mad has no emulated {type(module).__name__} GEMM; "
                             "exclude these layers with filter=")

    def forward(self, input: Tensor, output_size: Optional[list] = None) -> Tensor:
        self._emu_begin()
        if self.padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for {type(self).__name__}")
        nd = len(self.kernel_size)
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              nd, self.dilation)
        x = self._emu_round(input, Role.INPUT)
        w = self._emu_round(self.weight, Role.WEIGHT)
        b = None if self.bias is None else self._emu_round(self.bias, Role.WEIGHT)
        y = self._FUNCTIONS[nd](x, w, b, self.stride, self.padding, output_padding, self.groups, self.dilation)
        return self._emu_round(y, Role.OUTPUT)


# ---- Embedding ------------------------------------------------------------------------------------------
class EmbeddingEmu(EmuLayer):
    ROLES = (Role.WEIGHT, Role.OUTPUT)

    @classmethod
    def _emunum_check(cls, module, policy):
        if module.sparse and policy.grad_weight is not None:
            raise ValueError("Embedding(sparse=True): rounding its sparse weight gradient (grad_weight) is not "
                             "supported; set grad_weight=None or exclude it with filter=")

    def forward(self, input: Tensor) -> Tensor:
        self._emu_begin()
        if self.max_norm is not None:  # torch renormalises the stored rows in place, before the lookup
            with torch.no_grad():
                torch.embedding_renorm_(self.weight, input.contiguous(), self.max_norm, self.norm_type)
        w = self._emu_round(self.weight, Role.WEIGHT)
        y = F.embedding(input, w, self.padding_idx, None, self.norm_type, self.scale_grad_by_freq, self.sparse)
        return self._emu_round(y, Role.OUTPUT)


# ---- layers rounded at their output (norms, activations) -----------------------------------------------
class OutputEmu(EmuLayer):
    ROLES = (Role.OUTPUT,)
    HAS_WEIGHT = False

    def forward(self, *args, **kwargs):
        self._emu_begin()
        return self._emu_round(super().forward(*args, **kwargs), Role.OUTPUT)


# ---- MultiheadAttention ---------------------------------------------------------------------------------
class MultiheadAttentionEmu(EmuLayer):
    """nn.MultiheadAttention with every operand and product rounded.

    torch's MultiheadAttention hands its weights to a functional call (its ``out_proj`` module is never
    called), so it is emulated as a whole: query/key/value are rounded as inputs; ``in_proj_weight`` (or
    ``q/k/v_proj_weight``), the biases, ``bias_k/v`` and ``out_proj``'s weight and bias as weights; the
    projections q, k, v, the scaled query, the scores q k^T, the softmax probabilities, the context
    probs v and the final projection as outputs. Masks are added after rounding the scores (a mask is a
    select in hardware, and -inf has no code in finite formats). The attention always takes the explicit
    bmm/softmax path (torch takes it for ``need_weights=True``; for ``need_weights=False`` torch would use
    its fused SDPA kernel, whose summation order differs). ``out_proj`` is left as a plain child module.
    """

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        self._emu_begin()
        is_batched = query.dim() == 3
        key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                             other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                             target_type=query.dtype)
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=query.dtype, check_other=False)
        if any(t.is_nested for t in (query, key, value)):
            raise ValueError("emulated MultiheadAttention does not take nested tensors")
        # round each distinct input once, keeping the identities (query is key, key is value) that select
        # torch's packed projections, then transpose as torch does
        R = self._emu_round
        q_in = R(query, Role.INPUT)
        k_in = q_in if key is query else R(key, Role.INPUT)
        v_in = k_in if value is key else (q_in if value is query else R(value, Role.INPUT))
        query, key, value = q_in, k_in, v_in
        if self.batch_first and is_batched:
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
                if v_in is q_in:
                    value = query
        out, weights = self._attention(query, key, value, key_padding_mask, need_weights, attn_mask,
                                       average_attn_weights, is_causal)
        if self.batch_first and is_batched:
            return out.transpose(1, 0), weights
        return out, weights

    def _lin(self, x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
        return self._emu_round(_linear(x, w, b, self._emunum_policy), Role.OUTPUT)

    def _in_projection(self, query, key, value):
        """Rounded q, k, v projections of the (rounded) inputs, with torch's GEMM shapes (one packed GEMM
        for self-attention)."""
        R, E = self._emu_round, self.embed_dim
        x_q, x_k, x_v = query, key, value
        bias = None if self.in_proj_bias is None else R(self.in_proj_bias, Role.WEIGHT)
        if not self._qkv_same_embed_dim:
            b_q, b_k, b_v = (None, None, None) if bias is None else bias.chunk(3)
            return (self._lin(x_q, R(self.q_proj_weight, Role.WEIGHT), b_q),
                    self._lin(x_k, R(self.k_proj_weight, Role.WEIGHT), b_k),
                    self._lin(x_v, R(self.v_proj_weight, Role.WEIGHT), b_v))
        w = R(self.in_proj_weight, Role.WEIGHT)
        if key is value:
            if query is key:
                proj = self._lin(x_q, w, bias)
                proj = proj.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
                return proj[0], proj[1], proj[2]
            w_q, w_kv = w.split([E, E * 2])
            b_q, b_kv = (None, None) if bias is None else bias.split([E, E * 2])
            q = self._lin(x_q, w_q, b_q)
            kv = self._lin(x_k, w_kv, b_kv)
            kv = kv.unflatten(-1, (2, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
            return q, kv[0], kv[1]
        w_q, w_k, w_v = w.chunk(3)
        b_q, b_k, b_v = (None, None, None) if bias is None else bias.chunk(3)
        return self._lin(x_q, w_q, b_q), self._lin(x_k, w_k, b_k), self._lin(x_v, w_v, b_v)

    def _attention(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                   is_causal):
        """torch.nn.functional.multi_head_attention_forward (math path), with roundings."""
        R, pol = self._emu_round, self._emunum_policy
        num_heads, embed_dim = self.num_heads, self.embed_dim
        is_batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, e = query.shape
        if e != embed_dim:
            raise ValueError(f"query has embedding dimension {e}; this layer expects {embed_dim}")
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as torch's MultiheadAttention)")
        head_dim = embed_dim // num_heads
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not match value's "
                             f"{tuple(value.shape[:2])}")

        q, k, v = self._in_projection(query, key, value)

        if attn_mask is not None:
            src_len0 = key.shape[0]
            if attn_mask.dim() == 2:
                if attn_mask.shape != (tgt_len, src_len0):
                    raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be "
                                       f"{(tgt_len, src_len0)}.")
                attn_mask = attn_mask.unsqueeze(0)
            elif attn_mask.shape != (bsz * num_heads, tgt_len, src_len0):
                raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                                   f"{(bsz * num_heads, tgt_len, src_len0)}.")
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, R(self.bias_k, Role.WEIGHT).repeat(1, bsz, 1)])
            v = torch.cat([v, R(self.bias_v, Role.WEIGHT).repeat(1, bsz, 1)])
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))

        q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
        k = k.view(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
        v = v.view(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
        if self.add_zero_attn:
            zeros = torch.zeros((bsz * num_heads, 1, head_dim), dtype=k.dtype, device=k.device)
            k, v = torch.cat([k, zeros], dim=1), torch.cat([v, zeros], dim=1)
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))
        src_len = k.size(1)
        if key_padding_mask is not None:
            if key_padding_mask.shape != (bsz, src_len):
                raise RuntimeError(f"expected key_padding_mask of shape {(bsz, src_len)}, "
                                   f"got {tuple(key_padding_mask.shape)}")
            key_padding_mask = (key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1)
                                .reshape(bsz * num_heads, 1, src_len))
            attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
        dropout_p = self.dropout if self.training else 0.0

        q_scaled = R(q * math.sqrt(1.0 / float(head_dim)), Role.OUTPUT)
        scores = R(_bmm(q_scaled, k.transpose(-2, -1), pol), Role.OUTPUT)
        if attn_mask is not None:
            scores = scores + attn_mask
        probs = R(F.softmax(scores, dim=-1), Role.OUTPUT)
        if dropout_p > 0.0:
            probs = F.dropout(probs, p=dropout_p)
        ctx = R(_bmm(probs, v, pol), Role.OUTPUT)
        ctx = ctx.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        w_o = R(self.out_proj.weight, Role.WEIGHT)
        b_o = None if self.out_proj.bias is None else R(self.out_proj.bias, Role.WEIGHT)
        out = self._lin(ctx, w_o, b_o).view(tgt_len, bsz, embed_dim)
        if not is_batched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        weights = probs.view(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            weights = weights.squeeze(0)
        return out, weights

    @classmethod
    def _emunum_check(cls, module, policy):
        if policy.mad is not None and not hasattr(_mad(), "matmul"):
            raise ValueError("Policy.mad: emunum.mad has no matmul for the attention scores; "
                             "exclude MultiheadAttention layers with filter=")


# ---- emulated classes -----------------------------------------------------------------------------------
_CLASSES: dict = {}


def emu_class(base: type, mixin: type) -> type:
    """The emulated subclass ``Emu<Base>`` of ``base`` with ``mixin``'s forward (created once, cached).

    The class is placed in this module's namespace so that pickling finds it."""
    key = (base, mixin)
    cls = _CLASSES.get(key)
    if cls is None:
        name = f"Emu{base.__name__}"
        if name in globals():  # another class of that name: qualify with its module
            name = f"Emu_{base.__module__.replace('.', '_')}_{base.__name__}"
        cls = type(name, (mixin, base), {"_emunum_base": base, "__module__": __name__, "__qualname__": name})
        _CLASSES[key] = cls
        globals()[name] = cls
    return cls


# torch class -> the mixin that emulates it. Subclasses that keep their parent's forward use the same mixin.
MIXINS: dict = {nn.Linear: LinearEmu, nn.Embedding: EmbeddingEmu, nn.MultiheadAttention: MultiheadAttentionEmu}
MIXINS.update({c: ConvEmu for c in (nn.Conv1d, nn.Conv2d, nn.Conv3d)})
MIXINS.update({c: ConvTransposeEmu for c in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)})
NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LayerNorm, nn.GroupNorm,
         nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LocalResponseNorm, nn.RMSNorm)
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
               nn.Mish, nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish, nn.Softplus, nn.Softsign,
               nn.Tanhshrink, nn.LogSigmoid, nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.GLU, nn.Threshold)
MIXINS.update({c: OutputEmu for c in NORMS + ACTIVATIONS})

EmuLinear = emu_class(nn.Linear, LinearEmu)
EmuConv1d, EmuConv2d, EmuConv3d = (emu_class(c, ConvEmu) for c in (nn.Conv1d, nn.Conv2d, nn.Conv3d))
EmuConvTranspose1d, EmuConvTranspose2d, EmuConvTranspose3d = (
    emu_class(c, ConvTransposeEmu) for c in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d))
EmuEmbedding = emu_class(nn.Embedding, EmbeddingEmu)
EmuMultiheadAttention = emu_class(nn.MultiheadAttention, MultiheadAttentionEmu)
for _c in NORMS + ACTIVATIONS:
    emu_class(_c, OutputEmu)
del _c


def mixin_for(module_type: type):
    """(mixin, base) emulating ``module_type``: its own entry, or an ancestor's if it keeps that forward."""
    if module_type in MIXINS:
        return MIXINS[module_type], module_type
    for base in module_type.__mro__[1:]:
        if base in MIXINS:
            return (MIXINS[base], base) if module_type.forward is base.forward else (None, base)
    return None, None


def from_float(module: nn.Module, policy: Policy) -> nn.Module:
    """The emulated twin of a built-in layer (or a subclass keeping its forward): ``Emu<Type>.from_float``."""
    mixin, base = mixin_for(type(module))
    if mixin is None:
        raise TypeError(f"no emulated layer for {type(module).__name__}")
    return emu_class(type(module), mixin).from_float(module, policy)
