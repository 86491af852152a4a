"""Block-scaled GEMMs for patched Linear, Conv, ConvTranspose and MultiheadAttention layers (OCP MX / NVFP4).

When a Policy gives the ``input``, ``weight`` or ``grad_output`` role a ``BlockFormat``, each of the layer's
three GEMMs quantises its two operands along that GEMM's own reduction dimension K, as MX hardware and
torchao's MX linear do (re-quantising per GEMM from the high-precision tensors):

- forward      y  = x @ W.T:    x (tokens, in) and W (out, in) in blocks along ``in``;
- grad-input   gx = gy @ W:     gy (tokens, out) and W (out, in) in blocks along ``out``;
- grad-weight  gW = gy.T @ x:   gy and x in blocks along the tokens (every leading dimension, flattened).

x takes the input role's format, W the weight role's, gy the grad_output role's (each with its role's rounding).
An operand role holding an element format (FloatFormat/FixedFormat) rounds that operand element-wise in each
GEMM instead; a role that is None leaves it unquantised. A weight format with 2-D tiles
(``BlockFormat(..., block_size=(16, 16))``) quantises W once, as tiles, for both of its GEMMs. A convolution
(Conv1d/2d/3d) is the same GEMM on its im2col matrix: K is in_channels/groups * kernel size, one GEMM per group
(group g: input channels g*C/groups.., output channels g*O/groups..); string padding is torch's ("same" with an
even total pads its extra zero at the end). A transposed convolution
(ConvTranspose1d/2d/3d) is the GEMM x2 @ W2 with K = in_channels/groups, then an overlap-add of each kernel
tap's columns into the output (``block_conv_transpose``). The GEMMs themselves are torch's, in
the tensors' dtype (MX hardware accumulates in fp32). The layer's other roles round element-wise around the GEMMs
(``emunum.nn.layers``): ``output`` the forward result, ``grad_input`` / ``grad_weight`` the gradients
leaving for x and W (and the bias); these roles never take a block format (``Policy`` refuses it). The bias
is added after the GEMM, unrounded (its gradient follows grad_weight). Stochastic rounding draws a fresh seed
per GEMM operand from torch's generator.

MultiheadAttention: its projections are block GEMMs as above (K = embed_dim forward); its two batched
products, scores = q k^T (K = head_dim) and context = probs v (K = source length), quantise both activation
operands with the input role's format along K and, backward, the incoming gradient with the grad_output
role's (grad-a = g b^T along N, grad-b = a^T g along M; ``block_bmm``).

Matrix instructions (``Policy.mad`` a block-scaled ``emunum.mad.MMAUnit``, e.g. "b200_mxf4nvf4_ue4m3"): each of
the three GEMMs runs ``emunum.mad.block_mma.block_scaled_mm``: its operands quantised as above, the elements and
block scales fed to the instruction (``emunum.mad.scaled_mm``), the tensor scales applied after.

MAD units (``Policy.mad``, ``mad_backward``): each of the three GEMMs runs ``emunum.mad.block_matmul`` on its
unit (block-pair sums exact, scaled, accumulated in the unit's accumulator; bias added after, in fp32); every
operand role must then hold a BlockFormat, and each GEMM's format pair must pass its exactness check.
MultiheadAttention's batched products run ``block_matmul`` on batches the same way (their format pairs:
input x input, grad_output x input, input x grad_output, checked when the layer is patched).

Random Hadamard transform (``Policy.hadamard``, NVFP4 recipe; ``emunum.hadamard``): with hadamard=n the
grad-weight GEMM becomes gW = Q(rht(gy)).T @ Q(rht(x)), both operands transformed along the tokens (zero-padded
to a multiple of n) before they are quantised; the forward and grad-input GEMMs are unchanged. Without
quantisation the transform cancels (M is orthogonal) up to the float rounding of the transformed values. A 2-D
convolution's transformed x operand is made from the image's distinct runs where that gives the same bits
(``emunum.nn.rht_columns``), and its im2col pass hands x2's block maxima to the forward quantiser.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..autograd import STE
from ..formats import BlockFormat, RoundMode, TableFormat
from ..block_quantize import quantize_block_checked
from ..hadamard import rht_scanned
from ..mad.block import block_matmul, check_pair, check_unit
from ..mad.functional import parse_backward_units
from ..policy import BLOCK_ROLES, Policy, Role, RoleSpec
from ..quantize import check_sr_bits, quantize, resolve_seed
from ..rng import seed_key
from .. import block_ops  # noqa: F401  (registers emunum::quantize_block)
from ..formats.interned import intern
from ..ops import eager_ok
from .im2col import im2col_rows_scanned
from . import rht_columns


@dataclass(frozen=True)
class BlockPlan:
    """The formats (as RoleSpecs, or None) of a layer's three GEMM operands, and sr_bits.

    ``trace``: the layer's ``emunum.trace`` observer while a tracer is attached (``Tracer`` swaps in a copy of
    the plan holding it), else None. A GEMM run in a sampled call (``trace.active`` when its forward ran)
    hands each operand's rounding to it, for both its forward and backward GEMMs: ``trace.round_operand``
    rounds as ``q`` does (the same bits and seed draws) and counts it under the operand's role, and
    ``trace.block_matmul_seed`` draws the seed ``block_matmul`` would draw and counts its operands."""

    input: Optional[RoleSpec]
    weight: Optional[RoleSpec]
    grad_output: Optional[RoleSpec]
    sr_bits: Optional[int] = None
    hadamard: Optional[int] = None
    hadamard_seed: int = 0
    units: Optional[tuple] = None  # (forward, grad-input, grad-weight) MAD units: emunum.mad.block_matmul
    trace: Optional[object] = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for spec in (self.input, self.weight, self.grad_output):
            if is_block(spec):
                intern(spec.fmt)  # now, not while torch.compile traces ``q`` (intern takes a lock on first sight)

    def observer(self):
        """The layer's trace if this call is sampled, else None (taken when a GEMM's forward runs)."""
        t = self.trace
        return t if t is not None and t.active else None

    def mm(self, a: Tensor, b: Tensor, ra: Role, rb: Role, axis_b: int, i: int, trace=None) -> Tensor:
        """a @ b, a in role ``ra``'s format and b in ``rb``'s: on MAD unit i (``block_matmul``, a along its last
        axis, b along its first), else torch's product of a quantised along its last axis and b along
        ``axis_b``."""
        if self.units is None:
            return self.q(a, ra, -1, trace) @ self.q(b, rb, axis_b, trace)
        sa, sb = getattr(self, ra.value), getattr(self, rb.value)
        from ..mad.block_mma import block_scaled_mm, is_mma_unit  # loaded with the first MAD-unit GEMM

        if is_mma_unit(self.units[i]):  # a block-scaled matrix instruction takes the elements and block scales
            return block_scaled_mm(a, b, sa.fmt, sb.fmt, self.units[i], rounding=sa.rounding,
                                   rounding_b=sb.rounding, sr_bits=self.sr_bits or 32).to(a.dtype)
        seed = None if trace is None else trace.block_matmul_seed(a, b, ra, sa, rb, sb, self.units[i], self.sr_bits)
        return block_matmul(a, b, sa.fmt, sb.fmt, self.units[i], rounding=sa.rounding, rounding_b=sb.rounding,
                            seed=seed, sr_bits=self.sr_bits or 32).to(a.dtype)

    def reuses_weight(self, trace=None) -> bool:
        """Whether the grad-input GEMM takes W as the forward GEMM quantised it: W in 2-D tiles (the same
        blocks for W and W^T), rounded without random bits (no seed drawn, the same bits every time), no
        MAD unit and no trace observer (which counts each rounding)."""
        spec = self.weight
        return (trace is None and self.units is None and is_block(spec) and spec.fmt.tile[0] != 0
                and spec.rounding != RoundMode.STOCHASTIC)

    def q(self, t: Tensor, role: Role, axis: int, trace=None, scan=None) -> Tensor:
        """t quantised to role's format: a block format along ``axis``, an element format element-wise. scan:
        t's block maxima from the pass that made t (``rht_scanned``), or None (the same bits and seed draw)."""
        spec = getattr(self, role.value)
        if spec is None:
            return t
        if trace is not None:
            return trace.round_operand(t, role, spec, axis, self.sr_bits)
        if isinstance(spec.fmt, BlockFormat):
            if not eager_ok(t):  # torch.compile, export and other tracers see the custom op
                return torch.ops.emunum.quantize_block(t, intern(spec.fmt), int(spec.rounding), None,
                                                       check_sr_bits(self.sr_bits), axis)
            if scan is not None:  # as ``quantize`` does for a block format, with the scan passed on
                mode = RoundMode.parse(spec.rounding)
                key = seed_key(resolve_seed(None)) if mode is RoundMode.STOCHASTIC else seed_key(0)
                return quantize_block_checked(t, spec.fmt, mode, key, check_sr_bits(self.sr_bits), axis, scan=scan)
            return quantize(t, spec.fmt, spec.rounding, axis=axis, sr_bits=self.sr_bits)
        return quantize(t, spec.fmt, spec.rounding, sr_bits=self.sr_bits)


_I, _W, _G = Role.INPUT, Role.WEIGHT, Role.GRAD_OUTPUT


def is_block(spec: Optional[RoleSpec]) -> bool:
    return spec is not None and isinstance(spec.fmt, BlockFormat)


def no_block_path(module, policy: Policy) -> ValueError:
    """The error for a weight layer without a block-GEMM path under a policy with block formats."""
    roles = ", ".join(f"{r.value}={policy.spec(r).fmt.name}" for r in BLOCK_ROLES if is_block(policy.spec(r)))
    return ValueError(f"{type(module).__name__} has no block-GEMM path, and the policy gives it block formats "
                      f"({roles}); block formats are allowed for Linear, Conv*d, ConvTranspose*d and "
                      "MultiheadAttention; exclude this layer with filter= or give those roles element formats")


def block_plan(policy: Policy) -> Optional[BlockPlan]:
    """The plan, or None when no GEMM-operand role holds a BlockFormat."""
    if not policy.uses_block:
        return None
    units = None
    if policy.mad is not None:
        units = _mad_units(policy)
    if policy.ste != STE.IDENTITY:
        raise ValueError(f"ste={policy.ste.value!r} with block formats: the block GEMMs pass gradients straight "
                         "through their operands' quantisation; allowed: ste='identity'")
    return BlockPlan(*(policy.spec(r) for r in BLOCK_ROLES), sr_bits=policy.sr_bits, hadamard=policy.hadamard,
                     hadamard_seed=policy.hadamard_seed, units=units)


def _mad_units(policy: Policy) -> tuple:
    """(forward, grad-input, grad-weight) units for block GEMMs on MAD units, after checking that every GEMM's
    operand pair can run ``emunum.mad.block_matmul``."""
    specs = {r.value: policy.spec(r) for r in BLOCK_ROLES}
    if not all(is_block(s) for s in specs.values()):
        got = ", ".join(f"{k}={s.fmt.name if s else None}" for k, s in specs.items())
        raise ValueError(f"Policy.mad with block formats ({got}): a MAD unit runs block GEMMs on block-scaled "
                         "operands only; allowed: a BlockFormat in each of input, weight and grad_output")
    fin, fw, fgo = specs["input"].fmt, specs["weight"].fmt, specs["grad_output"].fmt
    if fw.tile[0] not in (0, fw.tile[1]):
        raise ValueError(f"Policy.mad with weight={fw.name}: W and W^T must share their tiles; allowed: square "
                         "tiles or 1-D blocks")
    from ..mad.block_mma import check_formats, is_mma_unit  # loaded when a policy names a unit

    if is_mma_unit(policy.mad):  # a matrix instruction runs all three GEMMs (mad_backward: not for these)
        if policy.mad_backward is not None:
            raise ValueError(f"Policy.mad={policy.mad.name} (a matrix instruction) with mad_backward: allowed: "
                             "mad_backward=None (the instruction runs every GEMM)")
        for a, b in ((fin, fw), (fgo, fw), (fgo, fin)):
            check_formats(a, b, policy.mad)
        return (policy.mad,) * 3
    for a, b in ((fin, fw), (fgo, fw), (fgo, fin)):  # forward, grad-input, grad-weight
        check_pair(a, b)
    units = (policy.mad, *parse_backward_units(policy.mad, policy.mad_backward))
    for u in units:
        check_unit(u)
    return units


class _BlockGemm(torch.autograd.Function):
    """y = x2 @ W.T for x2 (tokens, K); operands quantised per GEMM along its reduction dimension. image: None,
    or (x, geometry) when x2 is the im2col matrix of image x (``rht_columns.rht_columns``'s arguments after x),
    from which the grad-weight GEMM's transformed operand is made where ``rht_columns`` holds; scan: None, or
    x2's block maxima along K from the im2col pass (``BlockPlan.q``'s scan)."""

    @staticmethod
    def forward(ctx, x2: Tensor, w: Tensor, plan: BlockPlan, image=None, scan=None) -> Tensor:
        ctx.plan, ctx.trace = plan, plan.observer()
        ctx.geometry = None
        if image is not None and plan.hadamard is not None and plan.units is None and ctx.trace is None:
            ctx.geometry = image[1]
            image = image[0]
        if plan.units is not None:
            ctx.save_for_backward(x2, w)
            return plan.mm(x2, w.t(), _I, _W, 0, 0, ctx.trace)
        qx = plan.q(x2, _I, -1, ctx.trace, scan)  # before W: the order of the seed draws
        qw = plan.q(w, _W, 1, ctx.trace)
        ctx.save_for_backward(x2, w, qw if plan.reuses_weight(ctx.trace) else None,
                              image if ctx.geometry is not None else None)
        return qx @ qw.t()

    @staticmethod
    def backward(ctx, gy: Tensor):
        x2, w, *qw = ctx.saved_tensors
        image = qw.pop() if len(qw) == 2 else None
        p, tr = ctx.plan, ctx.trace
        gx = gw = None
        if ctx.needs_input_grad[0]:
            if qw and qw[0] is not None:  # W's tiles, quantised in forward: the same bits as quantising again
                gx = p.q(gy, _G, -1, tr) @ qw[0]
            else:
                gx = p.mm(gy, w, _G, _W, 0, 1, tr)  # K = out_features
        if ctx.needs_input_grad[1]:
            sg = sx = None
            if p.hadamard is not None:  # the NVFP4 recipe's RHT on both Wgrad operands, along K = tokens
                scan = p.units is None and tr is None  # block maxima for the quantisers below, taken in the RHT
                gy, sg = rht_scanned(gy, p.hadamard, p.hadamard_seed, 0, scan)
            if p.units is None:
                qg = p.q(gy, _G, 0, tr, sg).t()  # before x's rounding: the order of the seed draws
                qx = None
                if image is not None:  # from the image's distinct runs, where that holds (the same bits)
                    qx = rht_columns.rht_columns(image, *ctx.geometry, p.hadamard, p.hadamard_seed,
                                                 lambda t, s: p.q(t, _I, 0, None, s))
                if qx is None:
                    if p.hadamard is not None:
                        x2, sx = rht_scanned(x2, p.hadamard, p.hadamard_seed, 0, tr is None)
                    qx = p.q(x2, _I, 0, tr, sx)
                gw = qg @ qx  # K = tokens
            else:
                if p.hadamard is not None:
                    x2, _ = rht_scanned(x2, p.hadamard, p.hadamard_seed, 0, False)
                gw = p.mm(gy.t(), x2, _G, _I, 0, 2, tr)
        return gx, gw, None, None, None


class _BlockBmm(torch.autograd.Function):
    """c = a @ b for batches of activations a (B, M, K), b (B, K, N) (attention's two products): both operands
    take the input role's format along K, the incoming gradient the grad_output role's."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, plan: BlockPlan) -> Tensor:
        ctx.plan, ctx.trace = plan, plan.observer()
        ctx.save_for_backward(a, b)
        return plan.mm(a, b, _I, _I, -2, 0, ctx.trace)

    @staticmethod
    def backward(ctx, g: Tensor):
        a, b = ctx.saved_tensors
        p, tr = ctx.plan, ctx.trace
        ga = gb = None
        if ctx.needs_input_grad[0]:  # K = N
            ga = p.mm(g, b.transpose(-1, -2), _G, _I, -2, 1, tr)
        if ctx.needs_input_grad[1]:  # K = M
            gb = p.mm(a.transpose(-1, -2), g, _I, _G, -2, 2, tr)
        return ga, gb, None


def block_bmm(a: Tensor, b: Tensor, plan: BlockPlan) -> Tensor:
    """Batched a @ b with block-quantised activations (``_BlockBmm``)."""
    return _BlockBmm.apply(a, b, plan)


def block_gemm(x2: Tensor, w: Tensor, plan: BlockPlan, image=None, scan=None) -> Tensor:
    return _BlockGemm.apply(x2, w, plan, image, scan)


def _scan_block(spec: Optional[RoleSpec], groups: int) -> int:
    """The block size of x2's forward quantisation if the im2col pass can hand it its block maxima (the
    quantiser's amax-pass branch: a tensor-scaled plain BlockFormat in 1-D blocks, one group), else 0."""
    fmt = spec.fmt if spec is not None else None
    if groups != 1 or type(fmt) is not BlockFormat or not fmt.tensor_scale or fmt.tile[0] != 0 \
            or fmt.nvfp4_path or isinstance(fmt.element, TableFormat):
        return 0
    return fmt.tile[1]


def block_linear(x: Tensor, w: Tensor, b: Optional[Tensor], plan: BlockPlan) -> Tensor:
    y = block_gemm(x.reshape(x.shape[:-1].numel(), x.shape[-1]), w, plan).reshape(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b


def _im2col(x: Tensor, k, s, p, d):
    """(n, C*prod(k), L) columns of x (n, C, *spatial), channel-major then kernel offsets in C order (F.unfold's
    layout, for any number of spatial dims), and the output's spatial sizes."""
    nd = len(k)
    x = F.pad(x, [q for i in reversed(range(nd)) for q in (p[i], p[i])])
    out = [(x.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    taps = []
    for offs in itertools.product(*(range(ki) for ki in k)):
        idx = tuple(slice(o * d[i], o * d[i] + s[i] * (out[i] - 1) + 1, s[i]) for i, o in enumerate(offs))
        taps.append(x[(slice(None), slice(None)) + idx])
    cols = torch.stack(taps, dim=2)  # (n, C, prod(k), *out)
    return cols.reshape(x.shape[0], -1, math.prod(out)), out


def block_conv(module, x: Tensor, w: Tensor, b: Optional[Tensor], plan: BlockPlan) -> Tensor:
    """Conv1d/2d/3d as im2col + the block GEMM, one per group, K = in_channels/groups * kernel size."""
    nd = len(module.kernel_size)
    padding = module.padding
    if module.padding_mode != "zeros":
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
        padding = (0,) * nd
    k, st, dil = module.kernel_size, module.stride, module.dilation
    if isinstance(padding, str):  # "valid" or "same"; an uneven "same" pads the extra zero at the end, as torch
        from ..mad.conv import explicit_padding
        pads = explicit_padding(padding, k, dil, st, nd)
        padding = tuple(lo for lo, _ in pads)
        if any(lo != hi for lo, hi in pads):
            x = F.pad(x, [q for pair in reversed(pads) for q in pair])
            padding = (0,) * nd
    image = scan = None
    if nd == 3:
        cols, out = _im2col(x, k, st, padding, dil)
    else:
        if nd == 1:  # as a 2-D convolution of height 1
            x = x.unsqueeze(-2)
            k, st, padding, dil = (1, k[0]), (1, st[0]), (0, padding[0]), (1, dil[0])
        out = [(x.shape[-2 + i] + 2 * padding[i] - dil[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(2)]
        cols, scan = im2col_rows_scanned(x, k, st, padding, dil, _scan_block(plan.input, module.groups))
        if cols is not None and module.groups == 1 and plan.hadamard is not None \
                and rht_columns.applies(plan.input, x, st, out[1], plan.hadamard):
            image = (x, (k, st, padding, dil, out[0], out[1]))
        if cols is None:
            cols = F.unfold(x, k, dilation=dil, padding=padding, stride=st)  # (n, C*kh*kw, L), channel-major
    n = x.shape[0]
    x2 = cols if cols.dim() == 2 else cols.transpose(1, 2).reshape(-1, cols.shape[1])
    w2 = w.reshape(w.shape[0], -1)  # (out, C/groups*prod(k))
    g = module.groups
    kg, og = w2.shape[1], w2.shape[0] // g
    ys = [block_gemm(x2[:, i * kg:(i + 1) * kg], w2[i * og:(i + 1) * og], plan, image, scan) for i in range(g)]
    y = ys[0] if g == 1 else torch.cat(ys, dim=1)  # (n*L, out)
    y = y.reshape(n, -1, w2.shape[0]).transpose(1, 2).reshape(n, w2.shape[0], *out)
    if b is not None:
        y = y + b.view(1, -1, *([1] * len(out)))
    return y.squeeze(-2) if nd == 1 else y


def block_conv_transpose(module, x: Tensor, w: Tensor, b: Optional[Tensor], plan: BlockPlan,
                         output_padding) -> Tensor:
    """ConvTranspose1d/2d/3d as the block GEMM cols = x2 @ W2 (K = in_channels/groups, x2 the input's channel
    vectors, W2 (C_in/groups, C_out/groups * kernel size) per group) followed by col2im: each kernel tap's
    columns added into the output at i*stride + tap*dilation - padding (an fp32 overlap-add outside the GEMM,
    as a convolution's grad-input is its GEMM followed by unfold's adjoint)."""
    nd = len(module.kernel_size)
    k, st, dil, pad = module.kernel_size, module.stride, module.dilation, module.padding
    n, cin, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
    g = module.groups
    cg, og = cin // g, w.shape[1]
    x2 = x.movedim(1, -1).reshape(-1, cin)  # (n * prod(spatial), C_in)
    ys = [block_gemm(x2[:, i * cg:(i + 1) * cg], w[i * cg:(i + 1) * cg].reshape(cg, -1).t(), plan)
          for i in range(g)]
    cols = torch.cat([c.reshape(n, *spatial, og, *k) for c in ys], dim=1 + nd)  # (n, *spatial, C_out, *k)
    out = [(spatial[i] - 1) * st[i] - 2 * pad[i] + dil[i] * (k[i] - 1) + output_padding[i] + 1 for i in range(nd)]
    full = [max(pad[i] + out[i], (spatial[i] - 1) * st[i] + dil[i] * (k[i] - 1) + 1) for i in range(nd)]
    buf = cols.new_zeros((n, g * og, *full))
    for offs in itertools.product(*(range(ki) for ki in k)):
        tap = cols[(slice(None),) * (2 + nd) + offs].movedim(1 + nd, 1)  # (n, C_out, *spatial)
        idx = tuple(slice(o * dil[i], o * dil[i] + st[i] * (spatial[i] - 1) + 1, st[i]) for i, o in enumerate(offs))
        buf[(slice(None), slice(None)) + idx] += tap
    y = buf[(slice(None), slice(None)) + tuple(slice(pad[i], pad[i] + out[i]) for i in range(nd))]
    if b is not None:
        y = y + b.view(1, -1, *([1] * nd))
    return y

