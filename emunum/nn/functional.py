"""Emulated functional GEMMs: ``matmul``/``@``, ``mm``, ``bmm``, ``mv``, ``addmm``, ``baddbmm``, ``F.linear``,
``einsum``, ``F.conv1d/2d/3d`` and ``F.scaled_dot_product_attention``, rounded by a ``Policy`` as the emulated
layers round theirs (``GemmEmulator``; ``emunum.nn.gemm_mode`` routes the calls of a patched model here).

Roles: an operand that is a Parameter (or a view of one, such as ``weight.t()``) takes the ``weight`` role,
any other operand the ``input`` role (so both operands of an attention product are inputs); the product
takes the ``output`` role; in the backward pass the gradients take the matching gradient roles, exactly as
in ``emunum.nn.layers``: ``output = Q_out(op(Q_a(a), Q_b(b)))``. The additive term of ``addmm``/``baddbmm``
and a linear or convolution bias are rounded as ``weight`` when they are Parameters and left as they are
otherwise (an additive attention mask, say, holds -inf, which finite formats cannot hold).

How the product itself runs, per policy:
- element formats: torch's GEMM on the rounded operands;
- ``Policy.mad`` (element formats): ``emunum.mad.matmul``/``linear``/``conv1d``/``conv2d`` on the unit; an
  ``addmm``/``baddbmm`` term is added after the GEMM in the tensor's dtype, ``alpha * (a @ b) + beta * c``;
- block formats (MX, NVFP4): both operands quantised along the GEMM's reduction dimension K, per GEMM, forward
  and backward (``BlockPlan``, as ``emunum.nn.block_gemm`` does for layers). The Hadamard transform of the
  NVFP4 recipe (``Policy.hadamard``) applies to the weight-gradient GEMM of a product with a weight operand
  (two-dimensional, as every such product is run: GPT-2's ``Conv1D``, a functional ``F.linear``): both of its
  operands are transformed along its reduction dimension, the tokens, as a layer's are; attention's products
  (two activations) are not transformed.
``einsum`` with two or more operands runs as a chain of batched products, left to right (each contraction one
emulated GEMM, its result rounded as ``output``); an index summed within one operand is summed first. As in
torch's own einsum, a summed index of size 1 in either operand is no GEMM dimension (the other operand is summed
over it first), and a pair left without a summed index of size > 1 in both is torch's element-wise product:
no GEMM, nothing rounded (longformer's sliding-window mask is such a product).
``scaled_dot_product_attention`` runs as its math: ``S = Q K^T`` (an emulated GEMM), ``S * scale``, the mask
(boolean: -inf where False; float: added; ``is_causal``: lower-triangular), softmax (rows that are fully
masked give zeros, as torch's math path), dropout with ``dropout_p``, then ``P V`` with P rounded as a GEMM
operand, after the dropout. ``enable_gqa`` repeats K and V across the query heads first.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import gemm_listener
from ..hadamard import rht_scanned
from ..ops import has_values
from ..policy import Policy, Role
from .base import EmuLayer, _mad, rounding_state
from .block_gemm import BlockPlan, block_conv, block_conv_transpose

EMULATED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def operand_role(t: Tensor) -> Role:
    """``weight`` for a Parameter or a view of one, else ``input``."""
    return Role.WEIGHT if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) else Role.INPUT


class Unsupported(Exception):
    """A GEMM call that this policy cannot emulate; its message is the reason (``GemmMode`` passes it through)."""


def no_out(out) -> None:
    """Raise ``Unsupported`` for a GEMM called with ``out=``."""
    if out is not None:
        raise Unsupported("out= (the emulated product is a new tensor)")


def _per_dim(v, nd: int) -> tuple:
    """A convolution argument (an int or one per spatial dimension) as a tuple of nd."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd


class _BlockMatmul(torch.autograd.Function):
    """c = a @ b for a (..., M, K), b (..., K, N) with the same batch dims (or b 2-D with a 2-D): a quantised to
    role ``ra``'s format along K, b to ``rb``'s; backward, the incoming gradient to grad_output's along each
    backward GEMM's own K (grad-a = g b^T along N, grad-b = a^T g along M)."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, plan: BlockPlan, ra: Role, rb: Role) -> Tensor:
        ctx.plan, ctx.roles, ctx.trace = plan, (ra, rb), plan.observer()
        ctx.save_for_backward(a, b)
        return plan.mm(a, b, ra, rb, -2, 0, ctx.trace)

    @staticmethod
    def backward(ctx, g: Tensor):
        a, b = ctx.saved_tensors
        p, (ra, rb), tr = ctx.plan, ctx.roles, ctx.trace
        ga = gb = None
        if ctx.needs_input_grad[0]:
            gg, bb = g, b
            if p.hadamard is not None and ra is Role.WEIGHT and g.dim() == 2:  # a weight's gradient: K = N
                gg, bb = (rht_scanned(t, p.hadamard, p.hadamard_seed, 1, False)[0] for t in (g, b))
            ga = p.mm(gg, bb.transpose(-1, -2), Role.GRAD_OUTPUT, rb, -2, 1, tr)
        if ctx.needs_input_grad[1]:
            aa, gg = a, g
            if p.hadamard is not None and rb is Role.WEIGHT and g.dim() == 2:  # a weight's gradient: K = M
                aa, gg = (rht_scanned(t, p.hadamard, p.hadamard_seed, 0, False)[0] for t in (a, g))
            gb = p.mm(aa.transpose(-1, -2), gg, ra, Role.GRAD_OUTPUT, -2, 2, tr)
        return ga, gb, None, None, None


class GemmEmulator(EmuLayer):
    """The rounding state of a patched model's functional GEMMs (the same roles and quantisers as an emulated
    layer's) and the emulated ops. Each op raises ``Unsupported`` (before rounding anything) where the policy
    cannot emulate the call."""

    ROLES = (Role.INPUT, Role.WEIGHT, Role.OUTPUT)

    def __init__(self, policy: Policy):
        self.__dict__.update(rounding_state(policy, self.ROLES, block_gemm=True))
        plan = self._emunum_block
        self._pair_error = None
        if plan is not None and plan.units is not None:
            from ..mad.block import check_pair  # noqa: PLC0415  (MAD units only)

            try:  # two activations, forward and both backward GEMMs
                fin, fgo = plan.input.fmt, plan.grad_output.fmt
                for x, y in ((fin, fin), (fgo, fin), (fin, fgo)):
                    check_pair(x, y)
            except (TypeError, ValueError) as e:
                self._pair_error = str(e)

    @property
    def operands_rounded(self) -> bool:
        """Whether GEMM operands land on a grid at all (input and weight roles hold formats, or a MAD unit)."""
        pol = self._emunum_policy
        return pol.mad is not None or (pol.input is not None and pol.weight is not None)

    # ---- the product of rounded operands ------------------------------------------------------------------
    def _check(self, *ts) -> None:
        for t in ts:
            if t is not None and t.dtype not in EMULATED_DTYPES:
                raise Unsupported(f"dtype {t.dtype} (emulated: float32, float64, float16, bfloat16)")

    def _product(self, a: Tensor, b: Tensor, ra: Role, rb: Role) -> Tensor:
        """a @ b (torch.matmul's shapes) of operands already rounded role by role."""
        plan, pol = self._emunum_block, self._emunum_policy
        if plan is not None:
            return self._block_product(a, b, ra, rb)
        if pol.mad is not None:
            return _mad().matmul(a.float(), b.float(), unit=pol.mad, backward_units=pol.mad_backward).to(
                torch.promote_types(a.dtype, b.dtype))
        return torch.matmul(a, b)

    def _block_product(self, a: Tensor, b: Tensor, ra: Role, rb: Role) -> Tensor:
        plan = self._emunum_block
        if plan.units is not None and Role.WEIGHT not in (ra, rb) and self._pair_error:
            raise Unsupported(f"block formats on MAD units for two activations: {self._pair_error}")
        squeeze = []
        if a.dim() == 1:
            a, squeeze = a.unsqueeze(0), squeeze + [-2]
        if b.dim() == 1:
            b, squeeze = b.unsqueeze(-1), squeeze + [-1]
        if b.dim() == 2:  # every row of a against one matrix: one GEMM over the flattened rows
            y = _BlockMatmul.apply(a.reshape(-1, a.shape[-1]), b, plan, ra, rb).reshape(*a.shape[:-1], b.shape[-1])
        else:
            batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
            a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
            b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
            y = _BlockMatmul.apply(a3, b3, plan, ra, rb).reshape(*batch, a.shape[-2], b.shape[-1])
        for d in sorted(squeeze):
            y = y.squeeze(d)
        return y

    def _bias(self, c: Optional[Tensor]) -> Optional[Tensor]:
        return self._emu_round(c, Role.WEIGHT) if c is not None and operand_role(c) is Role.WEIGHT else c

    # ---- ops ----------------------------------------------------------------------------------------------
    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """torch.matmul / mm / bmm / mv."""
        self._check(a, b)
        ra, rb = operand_role(a), operand_role(b)
        R = self._emu_round
        return R(self._product(R(a, ra), R(b, rb), ra, rb), Role.OUTPUT)

    def addmm(self, c: Tensor, a: Tensor, b: Tensor, beta=1, alpha=1) -> Tensor:
        """torch.addmm / baddbmm: ``beta * c + alpha * (a @ b)``."""
        self._check(c, a, b)
        ra, rb = operand_role(a), operand_role(b)
        R = self._emu_round
        a, b, c = R(a, ra), R(b, rb), self._bias(c)
        pol = self._emunum_policy
        if self._emunum_block is None and pol.mad is None:
            fn = torch.addmm if a.dim() == 2 else torch.baddbmm
            return R(fn(c, a, b, beta=beta, alpha=alpha), Role.OUTPUT)
        y = self._product(a, b, ra, rb)
        y = y if alpha == 1 else y * alpha
        y = y + (c if beta == 1 else c * beta) if beta != 0 else y
        return R(y, Role.OUTPUT)

    def linear(self, x: Tensor, w: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """F.linear: ``x @ w^T + bias``."""
        self._check(x, w, bias)
        rx, rw = operand_role(x), operand_role(w)
        R = self._emu_round
        x, w, bias = R(x, rx), R(w, rw), self._bias(bias)
        pol = self._emunum_policy
        if self._emunum_block is not None:
            y = self._product(x, w.t(), rx, rw)
            y = y if bias is None else y + bias
        elif pol.mad is not None:
            y = _mad().linear(x, w, bias, unit=pol.mad, backward_units=pol.mad_backward)
        else:
            y = F.linear(x, w, bias)
        return R(y, Role.OUTPUT)

    def einsum(self, equation: str, *operands: Tensor) -> Tensor:
        """torch.einsum as a chain of emulated products (module docstring)."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        self._check(*operands)
        ins, out = _parse_einsum(equation, operands)
        if len(operands) < 2:
            raise Unsupported("einsum of one operand (no product)")
        ts = list(operands)
        while len(ts) > 1:
            rest = set("".join(ins[2:])) | set(out)
            keep = "".join(dict.fromkeys(c for c in ins[0] + ins[1] if c in rest))
            ts[:2] = [self._contract(ins[0], ins[1], keep, ts[0], ts[1])]
            ins[:2] = [keep]
        y, have = ts[0], ins[0]
        return y.permute([have.index(c) for c in out]) if have != out else y

    def bilinear(self, x1: Tensor, x2: Tensor, w: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """F.bilinear, ``y[..., o] = sum_ij x1[..., i] w[o, i, j] x2[..., j] + bias[o]``: two emulated products
        (x1 with w over i, then with x2 over j, each rounded as the output), then the bias added and the sum
        rounded as the output. ``emunum.coverage`` counts torch's forward FLOPs for it (2 * rows * w.numel())."""
        self._check(x1, x2, w, bias)
        if w.dim() != 3 or x1.shape[:-1] != x2.shape[:-1]:
            raise Unsupported("bilinear with other than (..., I), (..., J), (O, I, J) operands")
        a, b = x1.reshape(-1, x1.shape[-1]), x2.reshape(-1, x2.shape[-1])
        with gemm_listener.native("bilinear", 2 * a.shape[0] * w.numel()):
            y = self.einsum("bi,oij,bj->bo", a, w, b)
        if bias is not None:
            y = self._emu_round(y + self._bias(bias), Role.OUTPUT)
        return y.reshape(*x1.shape[:-1], w.shape[0])

    def _contract(self, sa: str, sb: str, out: str, a: Tensor, b: Tensor) -> Tensor:
        """One two-operand contraction as a batched product: (batch, M, K) @ (batch, K, N)."""
        for s, t in ((sa, a), (sb, b)):
            if len(set(s)) != len(s):
                raise Unsupported(f"einsum with a repeated index in one operand ({s!r})")
        if not any(c in sb and c not in out and a.shape[sa.index(c)] != 1 and b.shape[sb.index(c)] != 1
                   for c in sa):  # torch's einsum multiplies element-wise here: no GEMM, nothing rounded
            return torch.einsum(f"{sa},{sb}->{out}", a, b)
        a, sa = _sum_out(a, sa, sb + out)
        b, sb = _sum_out(b, sb, sa + out)
        a, sa, b, sb = _unit_reductions(a, sa, b, sb, out)
        batch = [c for c in sa if c in sb and c in out]
        red = [c for c in sa if c in sb and c not in out]
        m = [c for c in sa if c not in sb]
        n = [c for c in sb if c not in sa]
        size = {}
        for s, t in ((sa, a), (sb, b)):
            for c, d in zip(s, t.shape):
                size[c] = max(size.get(c, 1), d)
        shp = lambda idx: [size[c] for c in idx]  # noqa: E731
        a3 = a.permute([sa.index(c) for c in batch + m + red]).expand(*shp(batch + m + red))
        b3 = b.permute([sb.index(c) for c in batch + red + n]).expand(*shp(batch + red + n))
        B, M, K, N = (math.prod(shp(x)) for x in (batch, m, red, n))
        ra, rb = operand_role(a), operand_role(b)
        R = self._emu_round
        y = self._product(R(a3.reshape(B, M, K), ra), R(b3.reshape(B, K, N), rb), ra, rb)
        y = R(y, Role.OUTPUT).reshape(*shp(batch + m + n))
        have = "".join(batch + m + n)
        return y.permute([have.index(c) for c in out])

    def conv(self, nd: int, x: Tensor, w: Tensor, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
        """F.conv1d/2d/3d."""
        self._check(x, w, bias)
        rx, rw = operand_role(x), operand_role(w)
        R = self._emu_round
        x, w, bias = R(x, rx), R(w, rw), self._bias(bias)
        pol, plan = self._emunum_policy, self._emunum_block
        if plan is not None:
            geo = SimpleNamespace(kernel_size=tuple(w.shape[2:]), stride=_per_dim(stride, nd),
                                  padding=padding if isinstance(padding, str) else _per_dim(padding, nd),
                                  dilation=_per_dim(dilation, nd), groups=groups,
                                  padding_mode="zeros")
            y = block_conv(geo, x, w, bias, plan)
        elif pol.mad is not None:
            fn = getattr(_mad(), f"conv{nd}d", None)
            if fn is None:
                raise Unsupported(f"F.conv{nd}d on a MAD unit (emunum.mad has conv1d and conv2d)")
            y = fn(x, w, bias, stride, padding, dilation, groups, unit=pol.mad, backward_units=pol.mad_backward)
        else:
            y = (F.conv1d, F.conv2d, F.conv3d)[nd - 1](x, w, bias, stride, padding, dilation, groups)
        return R(y, Role.OUTPUT)

    def conv_transpose(self, nd: int, x: Tensor, w: Tensor, bias=None, stride=1, padding=0, output_padding=0,
                       groups=1, dilation=1) -> Tensor:
        """F.conv_transpose1d/2d/3d, as the ConvTranspose layers run it: element formats round x and w, the
        convolution, then the output; block formats run ``block_conv_transpose``. Not on MAD units (as the
        layers: emunum.mad has no transposed-convolution GEMM)."""
        self._check(x, w, bias)
        if self._emunum_policy.mad is not None:
            raise Unsupported(f"F.conv_transpose{nd}d on a MAD unit (emunum.mad has no transposed-convolution GEMM)")
        rx, rw = operand_role(x), operand_role(w)
        R = self._emu_round
        x, w, bias = R(x, rx), R(w, rw), self._bias(bias)
        plan = self._emunum_block
        if plan is not None:
            geo = SimpleNamespace(kernel_size=tuple(w.shape[2:]), stride=_per_dim(stride, nd),
                                  padding=_per_dim(padding, nd), dilation=_per_dim(dilation, nd), groups=groups)
            y = block_conv_transpose(geo, x, w, bias, plan, _per_dim(output_padding, nd))
        else:
            fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
            y = fn(x, w, bias, stride, padding, output_padding, groups, dilation)
        return R(y, Role.OUTPUT)

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False) -> Tensor:
        """F.scaled_dot_product_attention as its math (module docstring)."""
        self._check(q, k, v)
        if any(t.is_nested for t in (q, k, v)):
            raise Unsupported("nested tensors in scaled_dot_product_attention")
        L, S = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        if enable_gqa and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            rep = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
        s = self.matmul(q, k.transpose(-2, -1)) * scale
        if is_causal:
            if attn_mask is not None:
                raise ValueError("scaled_dot_product_attention: attn_mask and is_causal=True cannot both be given")
            s = _masked(s, torch.ones(L, S, dtype=torch.bool, device=q.device).tril())
        elif attn_mask is not None:
            s = _masked(s, attn_mask) if attn_mask.dtype == torch.bool else s + attn_mask
        p = torch.softmax(s, -1)
        if is_causal or attn_mask is not None:  # a row masked whole gives zeros, as torch's math path does
            p = _rows_masked_whole_zeroed(p, s)
        if dropout_p > 0.0:
            p = F.dropout(p, dropout_p, training=True)
        return self.matmul(p, v)


def _masked(s: Tensor, keep: Tensor) -> Tensor:
    """``s.masked_fill(~keep, -inf)``, in place: s is the fresh product of the scores and the scale, which no
    autograd node saves (one pass over s instead of a copy and a pass)."""
    return s.masked_fill_(~keep, float("-inf"))


def _rows_masked_whole_zeroed(p: Tensor, s: Tensor) -> Tensor:
    """p with the rows where s is -inf throughout set to 0 (softmax gives NaN there). Where s's values are at
    hand, its row maxima find them (-inf exactly there: a NaN makes a maximum NaN) and p is returned as it is
    when there are none (the same values and gradients, two passes over s fewer and no node); elsewhere
    (tracing, fake or batched tensors, an empty key axis) ``masked_fill`` runs on every row."""
    if s.shape[-1] and has_values(s):
        dead = torch.isneginf(s.detach().amax(-1, keepdim=True))
        return p.masked_fill(dead, 0.0) if dead.any() else p
    return p.masked_fill(torch.isneginf(s).all(-1, keepdim=True), 0.0)


def _sum_out(t: Tensor, s: str, others: str):
    """t with the indices of s that appear nowhere else summed out."""
    drop = [i for i, c in enumerate(s) if c not in others]
    if not drop:
        return t, s
    return t.sum(dim=drop), "".join(c for c in s if c not in others)


def _unit_reductions(a: Tensor, sa: str, b: Tensor, sb: str, out: str):
    """torch.einsum's rule for a summed index of size 1 in an operand: it is no dimension of the GEMM; the other
    operand is summed over it first (where it is larger than 1 there) and the index dropped from both."""
    for c in [c for c in sa if c in sb and c not in out]:
        ia, ib = sa.index(c), sb.index(c)
        if a.shape[ia] != 1 and b.shape[ib] != 1:
            continue
        a = a.squeeze(ia) if a.shape[ia] == 1 else a.sum(ia)
        b = b.squeeze(ib) if b.shape[ib] == 1 else b.sum(ib)
        sa, sb = sa.replace(c, ""), sb.replace(c, "")
    return a, sa, b, sb


def _parse_einsum(equation: str, operands) -> tuple:
    """(input subscripts per operand, output subscripts), with ``...`` spelled out as upper-case letters that the
    equation does not use, and the implicit output (indices seen once, sorted) made explicit."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise Unsupported(f"einsum equation {equation!r} names {len(ins)} operands, got {len(operands)}")
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    ranks = [t.dim() - (len(s) - 3) if "..." in s else 0 for s, t in zip(ins, operands)]
    n_ell = max(ranks, default=0)
    for i, k in enumerate(ranks):  # broadcast dims align on the right
        ins[i] = ins[i].replace("...", "".join(free[n_ell - k:n_ell]))
    ell = "".join(free[:n_ell])
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {}
        for s in ins:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    for s, t in zip(ins, operands):
        if len(s) != t.dim() or not s.isalpha():
            raise Unsupported(f"einsum subscripts {s!r} for an operand of {t.dim()} dims")
    return ins, out
