"""``mad``, ``matmul`` and ``linear`` on an emulated MAD unit, with autograd whose GEMMs also run on units.

Backward (Wang et al. 2018: each GEMM of a layer may have its own unit): ``backward_units`` gives the
unit of the grad-input GEMM (backward-data) and of the grad-weight GEMM (backward-weight):
None -> both use ``unit``; a MADUnit -> both; a pair (grad_input_unit, grad_weight_unit).
For ``matmul(A, B)`` "input" is A and "weight" is B. The backward GEMMs take grad_output as it arrives (no
rounding: put a quantizer in front if it should be in a format); its values must be float32-representable.
Each backward GEMM is itself a datapath of ``emunum.mad`` (reduction order stated per function), with its
stochastic seed derived from the forward one (``derived_seed``).
"""
from __future__ import annotations

import math

import torch

from ..rng import mix64_int, seed_key
from . import backend
from .compile_boundary import graph_break
from .unit import MADUnit, as_unit

ROLE_GRAD_INPUT, ROLE_GRAD_WEIGHT, ROLE_GRAD_BIAS = 1, 2, 3


def derived_seed(seed: int, role: int) -> int:
    """The seed of a backward GEMM: mix64(seed_key(seed) + role) mod 2**63 (role 1 input, 2 weight, 3 bias)."""
    return mix64_int(seed_key(seed) + role) & (2**63 - 1)


def parse_backward_units(unit: MADUnit, backward_units) -> tuple[MADUnit, MADUnit]:
    if backward_units is None:
        return unit, unit
    if isinstance(backward_units, MADUnit):
        return backward_units, backward_units
    if isinstance(backward_units, (tuple, list)) and len(backward_units) == 2:
        return (as_unit(backward_units[0], "backward_units[0]"), as_unit(backward_units[1], "backward_units[1]"))
    raise TypeError("backward_units must be None, a MADUnit, or a pair (grad_input_unit, grad_weight_unit); "
                    f"got {backward_units!r}")


def _resolve_seed(units, seed) -> int:
    """The forward seed: given, or drawn from torch's generator when any of the units rounds stochastically."""
    return backend.resolve_seed(seed) if any(u.stochastic for u in units) else 0


def _bwd_seed(unit: MADUnit, seed: int, role: int) -> int:
    return derived_seed(seed, role) if unit.stochastic else 0


# ---- mad -------------------------------------------------------------------------------------------------

@graph_break
def mad(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, unit: MADUnit, *, seed: int | None = None) -> torch.Tensor:
    """One MAD step per element: round_acc(a*b + c) if ``unit.fused`` (correctly rounded: one rounding of the
    exact value), else round_acc(round_mul(a*b) + c). Broadcasts like ``a * b + c``.

    a, b: float32-representable values (used as given); c: any float values. Result: the promoted dtype of
    a, b, c (float16/bfloat16: computed in binary64, then cast round-to-nearest-even). Stochastic counters:
    the result's flat C-order index (streams 0 and 1 of ``emunum.mad``). Not differentiable; ``unit.order``
    is ignored (always the exact datapath).
    """
    unit = as_unit(unit)
    backend.check_operand(a, "a")
    backend.check_operand(b, "b")
    backend.check_tensor(c, "c")
    backend.check_same_device(a=a, b=b, c=c)
    dtype = backend.output_dtype(unit, a, b, c)
    return backend.elementwise(a, b, c, unit, backend.seed_for(unit, seed)).to(dtype)


# ---- matmul ----------------------------------------------------------------------------------------------

def _reduce_gemm(X: torch.Tensor, Y: torch.Tensor, keep_shape: tuple, unit: MADUnit, seed: int) -> torch.Tensor:
    """sum over the batch dims where ``keep_shape`` is 1 (but X's batch is not) of X @ Y, as one GEMM each.

    X: S + (P, R), Y: S + (R, Q) (S the full batch shape); keep_shape: len(S) dims, each S[d] or 1.
    The reduced batch dims move next to R: the reduction index runs over (reduced batch dims..., r) in C order.
    """
    S = X.shape[:-2]
    nd = len(S)
    red = [d for d in range(nd) if keep_shape[d] == 1 and S[d] != 1]
    keep = [d for d in range(nd) if d not in red]
    P, R = X.shape[-2:]
    Q = Y.shape[-1]
    nk = 1
    for d in keep:
        nk *= S[d]
    nr = 1
    for d in red:
        nr *= S[d]
    Xp = X.permute(*keep, nd, *red, nd + 1).reshape(nk, P, nr * R)
    Yp = Y.permute(*keep, *red, nd, nd + 1).reshape(nk, nr * R, Q)
    out = backend.gemm(Xp, Yp, unit, seed)
    return out.reshape(tuple(keep_shape) + (P, Q))


class _MatmulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, B, unit, units_bwd, seed, dtype):
        S = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        M, K = A.shape[-2:]
        N = B.shape[-1]
        nb = 1
        for s in S:
            nb *= s
        A3 = A.reshape(1, M, K) if A.shape[:-2].numel() == 1 else A.expand(S + (M, K)).reshape(nb, M, K)
        B3 = B.reshape(1, K, N) if B.shape[:-2].numel() == 1 else B.expand(S + (K, N)).reshape(nb, K, N)
        out = backend.gemm(A3, B3, unit, seed, nb=nb, dtype=dtype)
        ctx.save_for_backward(A, B)
        ctx.units_bwd, ctx.seed, ctx.S = units_bwd, seed, S
        return out.reshape(S + (M, N)).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        A, B = ctx.saved_tensors
        u_in, u_w = ctx.units_bwd
        S = ctx.S
        grad_a = grad_b = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            backend.check_operand(grad, "grad_output")
            g = grad.expand(S + grad.shape[-2:])
        if ctx.needs_input_grad[0]:
            keep = (1,) * (len(S) - (A.dim() - 2)) + tuple(A.shape[:-2])
            Bt = B.expand(S + B.shape[-2:]).transpose(-1, -2)
            ga = _reduce_gemm(g, Bt, keep, u_in, _bwd_seed(u_in, ctx.seed, ROLE_GRAD_INPUT))
            grad_a = ga.reshape(A.shape).to(A.dtype)
        if ctx.needs_input_grad[1]:
            keep = (1,) * (len(S) - (B.dim() - 2)) + tuple(B.shape[:-2])
            At = A.expand(S + A.shape[-2:]).transpose(-1, -2)
            gb = _reduce_gemm(At, g, keep, u_w, _bwd_seed(u_w, ctx.seed, ROLE_GRAD_WEIGHT))
            grad_b = gb.reshape(B.shape).to(B.dtype)
        return grad_a, grad_b, None, None, None, None


@graph_break
def matmul(A: torch.Tensor, B: torch.Tensor, unit: MADUnit, *, backward_units=None,
           seed: int | None = None) -> torch.Tensor:
    """``torch.matmul`` on a MAD unit: C[..., m, n] = sum_k A[..., m, k] B[..., k, n], every multiply-accumulate
    by ``unit`` in increasing k (lanes and chunks as in ``emunum.mad``). Batch dims broadcast; 1-D operands
    are treated as torch.matmul does. Operands: float32-representable values, used as given.
    Result: the promoted dtype (float16/bfloat16 computed in binary64 and cast round-to-nearest-even).
    Stochastic counters: the flat C-order index of the (broadcast, 2-D-per-batch) output.
    Backward: grad_A = grad @ B^T (K = n) on the grad-input unit, grad_B = A^T @ grad (K = m) on the
    grad-weight unit; a broadcast batch dim is summed inside the same GEMM (reduction index (batch, n) or
    (batch, m) in C order).
    """
    unit = as_unit(unit)
    units_bwd = parse_backward_units(unit, backward_units)
    backend.check_operand(A, "A")
    backend.check_operand(B, "B")
    backend.check_same_device(A=A, B=B)
    if A.dim() == 0 or B.dim() == 0:
        raise ValueError(f"matmul needs operands of at least 1 dimension, got A {tuple(A.shape)}, B {tuple(B.shape)}")
    squeeze = []
    if A.dim() == 1:
        A = A.unsqueeze(0)
        squeeze.append(-2)
    if B.dim() == 1:
        B = B.unsqueeze(-1)
        squeeze.append(-1)
    if A.shape[-1] != B.shape[-2]:
        raise ValueError(f"matmul: A's last dim {A.shape[-1]} differs from B's second-to-last {B.shape[-2]}")
    torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])  # raises on incompatible batch shapes
    seed = _resolve_seed((unit, *units_bwd), seed)
    out = _MatmulFn.apply(A, B, unit, units_bwd, seed, backend.output_dtype(unit, A, B))
    for d in sorted(squeeze):
        out = out.squeeze(d)
    return out


# ---- linear ----------------------------------------------------------------------------------------------

class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, unit, units_bwd, seed, dtype):
        out_f, in_f = weight.shape
        X = x.reshape(1, math.prod(x.shape[:-1]), in_f)  # no -1: it cannot be inferred beside in_f = 0
        # each tensor scanned once for the fast kernel's planner, forward and backward (saved tensors)
        sx, sw = backend.scan(x, unit), backend.scan(weight, unit)
        y = backend.gemm(X, weight.t().reshape(1, in_f, out_f), unit, seed,
                         bias=None if bias is None else bias.reshape(1, 1, out_f), dtype=dtype, scans=(sx, sw))
        ctx.save_for_backward(x, weight)
        ctx.scans = (sx, sw)
        ctx.has_bias, ctx.units_bwd, ctx.seed = bias is not None, units_bwd, seed
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.reshape(x.shape[:-1] + (out_f,)).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        u_in, u_w = ctx.units_bwd
        out_f, in_f = weight.shape
        g = grad.reshape(1, math.prod(grad.shape[:-1]), out_f)
        if any(ctx.needs_input_grad[:3]):
            backend.check_operand(grad, "grad_output")
        grad_x = grad_w = grad_b = None
        sx, sw, sg = backend.backward_scans(*ctx.scans, x, weight, grad, u_in, u_w, ctx.needs_input_grad)
        if ctx.needs_input_grad[0]:
            gx = backend.gemm(g, weight.reshape(1, out_f, in_f), u_in, _bwd_seed(u_in, ctx.seed, ROLE_GRAD_INPUT),
                              scans=(sg, sw))
            grad_x = gx.reshape(x.shape).to(x.dtype)
        if ctx.needs_input_grad[1]:
            gw = backend.gemm(g.transpose(1, 2), x.reshape(1, math.prod(x.shape[:-1]), in_f), u_w,
                              _bwd_seed(u_w, ctx.seed, ROLE_GRAD_WEIGHT), scans=(sg, sx))
            grad_w = gw.reshape(out_f, in_f).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            ones = torch.ones((1, 1, g.shape[1]), dtype=torch.float32, device=g.device)
            gb = backend.gemm(ones, g, u_w, _bwd_seed(u_w, ctx.seed, ROLE_GRAD_BIAS), flops=0,
                              scans=(None, sg))  # torch: a sum
            grad_b = gb.reshape(out_f).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None


@graph_break
def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, unit: MADUnit = None, *,
           backward_units=None, seed: int | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear`` on a MAD unit: y[..., o] = round_acc(sum_i x[..., i] w[o, i] + b[o]).

    The dot product runs over i = 0..in_features-1 on ``unit`` (lanes, chunks as in ``emunum.mad``); the
    bias is added last with one rounding to acc_fmt. Operands (input, weight): float32-representable
    values, used as given; bias: any values. Stochastic counters: the output's flat C-order index.
    Backward: grad_input = grad @ W (K = out_features, in order) on the grad-input unit; grad_weight =
    grad^T @ x (K = the flattened batch rows, in C order) and grad_bias = the same rows of grad summed as a
    GEMM against ones (products 1*g are rounded to mul_fmt) on the grad-weight unit.
    """
    if unit is None:
        raise TypeError("linear() needs unit=MADUnit(...)")
    unit = as_unit(unit)
    units_bwd = parse_backward_units(unit, backward_units)
    backend.check_operand(input, "input")
    backend.check_operand(weight, "weight")
    if bias is not None:
        backend.check_tensor(bias, "bias")
    backend.check_same_device(input=input, weight=weight, bias=bias)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"input's last dim must be in_features={weight.shape[1]}, got shape {tuple(input.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    seed = _resolve_seed((unit, *units_bwd), seed)
    return _LinearFn.apply(input, weight, bias, unit, units_bwd, seed, backend.output_dtype(unit, input, weight, bias))


# ---- addmm / baddbmm -------------------------------------------------------------------------------------

class _AddmmFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, C, A, B, unit, units_bwd, seed, dtype):
        nb, M, N = A.shape[0], A.shape[1], B.shape[2]
        out = backend.gemm(A, B, unit, seed, nb=nb, c=C.expand(nb, M, N), dtype=dtype)
        ctx.save_for_backward(A, B)
        ctx.units_bwd, ctx.seed, ctx.c_shape = units_bwd, seed, C.shape
        return out.to(dtype)

    @staticmethod
    def backward(ctx, grad):
        A, B = ctx.saved_tensors
        u_in, u_w = ctx.units_bwd
        grad_c = grad_a = grad_b = None
        if any(ctx.needs_input_grad[:3]):
            backend.check_operand(grad, "grad_output")
        if ctx.needs_input_grad[0]:
            grad_c = grad.sum_to_size(ctx.c_shape)
        if ctx.needs_input_grad[1]:
            grad_a = backend.gemm(grad, B.transpose(1, 2), u_in,
                                  _bwd_seed(u_in, ctx.seed, ROLE_GRAD_INPUT)).to(A.dtype)
        if ctx.needs_input_grad[2]:
            grad_b = backend.gemm(A.transpose(1, 2), grad, u_w,
                                  _bwd_seed(u_w, ctx.seed, ROLE_GRAD_WEIGHT)).to(B.dtype)
        return grad_c, grad_a, grad_b, None, None, None, None


def _check_scale(beta, alpha) -> None:
    for name, v in (("beta", beta), ("alpha", alpha)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != 1:
            raise ValueError(f"{name}={v!r}: emunum's addmm/baddbmm model D = A.B + C on the unit; allowed: "
                             f"{name}=1 (scale the operands first)")


@graph_break
def baddbmm(input: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, unit: MADUnit, *, beta=1, alpha=1,
            backward_units=None, seed: int | None = None) -> torch.Tensor:
    """``torch.baddbmm`` on a MAD unit: out[b] = batch1[b] @ batch2[b] + input[b], as D = A.B + C.

    ``input`` (broadcast to (b, n, p) as in torch) is the accumulator's initial value: the C of D = A.B + C,
    entering the first step of every dot product together with that step's products (not added at the end
    like ``linear``'s bias). Units: multi-term and exact units, or one-product units with lanes=1, chunk=None
    and deterministic float roundings (run as terms=1 lossless steps: matmul's bits with c = 0).
    batch1 (b, n, m), batch2 (b, m, p): float32-representable values, used as given; input: any float values
    (hardware C is a value of acc_fmt). beta/alpha other than 1: ValueError. Result: the promoted dtype.
    Backward (grad_input = grad summed to input's shape; grad_batch1 = grad @ batch2^T on the grad-input unit,
    grad_batch2 = batch1^T @ grad on the grad-weight unit, both with c = +0).
    """
    _check_scale(beta, alpha)
    unit = as_unit(unit)
    units_bwd = parse_backward_units(unit, backward_units)
    backend.check_operand(batch1, "batch1")
    backend.check_operand(batch2, "batch2")
    backend.check_tensor(input, "input")
    backend.check_same_device(input=input, batch1=batch1, batch2=batch2)
    if batch1.dim() != 3 or batch2.dim() != 3:
        raise ValueError(f"baddbmm needs 3-D batch1 and batch2, got {tuple(batch1.shape)} and {tuple(batch2.shape)}")
    if batch1.shape[0] != batch2.shape[0] or batch1.shape[2] != batch2.shape[1]:
        raise ValueError(f"baddbmm: batch1 {tuple(batch1.shape)} and batch2 {tuple(batch2.shape)} do not chain "
                         "as (b, n, m) @ (b, m, p)")
    shape = (batch1.shape[0], batch1.shape[1], batch2.shape[2])
    try:
        torch.broadcast_shapes(input.shape, shape)
        if torch.broadcast_shapes(input.shape, shape) != torch.Size(shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"baddbmm: input of shape {tuple(input.shape)} does not broadcast to {shape}") from None
    backend.check_accumulator_input(unit)
    seed = _resolve_seed((unit, *units_bwd), seed)
    dtype = backend.output_dtype(unit, input, batch1, batch2)
    return _AddmmFn.apply(input, batch1, batch2, unit, units_bwd, seed, dtype)


@graph_break
def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, unit: MADUnit, *, beta=1, alpha=1,
          backward_units=None, seed: int | None = None) -> torch.Tensor:
    """``torch.addmm`` on a MAD unit: out = mat1 @ mat2 + input (input broadcast to (n, p)), as D = A.B + C with
    ``input`` entering the first step; everything else as ``baddbmm``."""
    _check_scale(beta, alpha)
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise ValueError(f"addmm needs 2-D mat1 and mat2, got {tuple(mat1.shape)} and {tuple(mat2.shape)}")
    if input.dim() > 2:
        raise ValueError(f"addmm: input must broadcast to {(mat1.shape[0], mat2.shape[1])}, got {tuple(input.shape)}")
    return baddbmm(input.unsqueeze(0) if input.dim() == 2 else input, mat1.unsqueeze(0), mat2.unsqueeze(0), unit,
                   backward_units=backward_units, seed=seed).squeeze(0)
