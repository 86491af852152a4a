"""The emulated ``nn.MultiheadAttention``, computed as torch's math path in named steps: input projections,
masks and extra keys, scaled scores, softmax, context and output projection."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..policy import Role
from .base import EmuLayer, _bmm, _linear, _mad
from ..mad.block import check_pair
from .block_gemm import block_bmm, block_linear, block_plan

class MultiheadAttentionMixin(EmuLayer):
    """nn.MultiheadAttention with every operand and product rounded.

    torch's MultiheadAttention hands its weights to a functional call (its ``out_proj`` module is never
    called), so it is emulated as a whole: query/key/value are rounded as inputs; ``in_proj_weight`` (or
    ``q/k/v_proj_weight``), the biases, ``bias_k/v`` and ``out_proj``'s weight and bias as weights; the
    projections q, k, v, the scaled query, the scores q k^T, the softmax probabilities (after dropout, so
    that the P of P v is on the grid), the context probs v and the final projection as outputs. Masks are added after rounding the scores (a mask is a
    select in hardware, and -inf has no code in finite formats). The attention always takes the explicit
    bmm/softmax path (torch takes it for ``need_weights=True``; for ``need_weights=False`` torch would use
    its fused SDPA kernel, whose summation order differs). ``out_proj`` is left as a plain child module.
    Block formats (``emunum.nn.block_gemm``): the projections are block GEMMs and the two batched products
    quantise their activation operands along their reduction dims; the element-wise roles (output,
    grad_input, grad_weight) round around them as above.
    """

    BLOCK_GEMM = True

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
        plan = self._emunum_block
        y = _linear(x, w, b, self._emunum_policy) if plan is None else block_linear(x, w, b, plan)
        return self._emu_round(y, Role.OUTPUT)

    def _mm(self, a: Tensor, b: Tensor) -> Tensor:
        plan = self._emunum_block
        return _bmm(a, b, self._emunum_policy) if plan is None else block_bmm(a, b, plan)

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
        """torch.nn.functional.multi_head_attention_forward (math path), with roundings, in named steps."""
        is_batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, self.num_heads)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        self._check_shapes(query, key, value, attn_mask, is_causal)
        tgt_len, bsz = query.shape[:2]

        q, k, v = self._in_projection(query, key, value)
        attn_mask = self._canonical_attn_mask(attn_mask, tgt_len, bsz, key.shape[0])
        q, k, v, attn_mask, key_padding_mask = self._split_heads(q, k, v, attn_mask, key_padding_mask, bsz)
        attn_mask = self._merge_padding_mask(attn_mask, key_padding_mask, bsz, k.size(1))

        scores = self._scores(q, k, attn_mask)
        probs = self._softmax(scores)
        out = self._output(probs, v, tgt_len, bsz)
        if not is_batched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        weights = probs.view(bsz, self.num_heads, tgt_len, k.size(1))
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            weights = weights.squeeze(0)
        return out, weights

    # ---- the steps, in the order _attention takes them ------------------------------------------------------
    def _check_shapes(self, query, key, value, attn_mask, is_causal) -> None:
        e = query.shape[2]
        if e != self.embed_dim:
            raise ValueError(f"query has embedding dimension {e}; this layer expects {self.embed_dim}")
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as torch's MultiheadAttention)")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not match value's "
                             f"{tuple(value.shape[:2])}")

    def _canonical_attn_mask(self, attn_mask, tgt_len: int, bsz: int, src_len: int):
        """A 2-D mask gains a leading dim; a 3-D one must be (bsz * heads, tgt_len, src_len)."""
        if attn_mask is None:
            return None
        if attn_mask.dim() == 2:
            if attn_mask.shape != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be "
                                   f"{(tgt_len, src_len)}.")
            return attn_mask.unsqueeze(0)
        if attn_mask.shape != (bsz * self.num_heads, tgt_len, src_len):
            raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                               f"{(bsz * self.num_heads, tgt_len, src_len)}.")
        return attn_mask

    def _split_heads(self, q, k, v, attn_mask, key_padding_mask, bsz: int):
        """Append bias_k/v (rounded as weights) and the zero attention slot, widening the masks to match, and
        fold the heads into the batch: q, k, v become (bsz * heads, len, head_dim)."""
        R, H = self._emu_round, self.num_heads
        head_dim = self.embed_dim // H
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, R(self.bias_k, Role.WEIGHT).repeat(1, bsz, 1)])
            v = torch.cat([v, R(self.bias_v, Role.WEIGHT).repeat(1, bsz, 1)])
            attn_mask, key_padding_mask = _pad_masks(attn_mask, key_padding_mask)
        q = q.view(q.shape[0], bsz * H, head_dim).transpose(0, 1)
        k = k.view(k.shape[0], bsz * H, head_dim).transpose(0, 1)
        v = v.view(v.shape[0], bsz * H, head_dim).transpose(0, 1)
        if self.add_zero_attn:
            zeros = torch.zeros((bsz * H, 1, head_dim), dtype=k.dtype, device=k.device)
            k, v = torch.cat([k, zeros], dim=1), torch.cat([v, zeros], dim=1)
            attn_mask, key_padding_mask = _pad_masks(attn_mask, key_padding_mask)
        return q, k, v, attn_mask, key_padding_mask

    def _merge_padding_mask(self, attn_mask, key_padding_mask, bsz: int, src_len: int):
        if key_padding_mask is None:
            return attn_mask
        if key_padding_mask.shape != (bsz, src_len):
            raise RuntimeError(f"expected key_padding_mask of shape {(bsz, src_len)}, "
                               f"got {tuple(key_padding_mask.shape)}")
        key_padding_mask = (key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, self.num_heads, -1, -1)
                            .reshape(bsz * self.num_heads, 1, src_len))
        return key_padding_mask if attn_mask is None else attn_mask + key_padding_mask

    def _scores(self, q, k, attn_mask):
        """Rounded q / sqrt(head_dim), rounded q k^T, then the mask added (after rounding)."""
        R = self._emu_round
        head_dim = self.embed_dim // self.num_heads
        q_scaled = R(q * math.sqrt(1.0 / float(head_dim)), Role.OUTPUT)
        scores = R(self._mm(q_scaled, k.transpose(-2, -1)), Role.OUTPUT)
        return scores if attn_mask is None else scores + attn_mask

    def _softmax(self, scores):
        """Softmax probabilities, dropout (training only), then rounded: the P of P v is on the grid."""
        probs = F.softmax(scores, dim=-1)
        dropout_p = self.dropout if self.training else 0.0
        if dropout_p > 0.0:
            probs = F.dropout(probs, p=dropout_p)
        return self._emu_round(probs, Role.OUTPUT)

    def _output(self, probs, v, tgt_len: int, bsz: int):
        """Rounded context probs v, heads unfolded, then the rounded output projection."""
        R = self._emu_round
        ctx = R(self._mm(probs, v), Role.OUTPUT)
        ctx = ctx.transpose(0, 1).reshape(tgt_len * bsz, self.embed_dim)
        w_o = R(self.out_proj.weight, Role.WEIGHT)
        b_o = None if self.out_proj.bias is None else R(self.out_proj.bias, Role.WEIGHT)
        return self._lin(ctx, w_o, b_o).view(tgt_len, bsz, self.embed_dim)

    @classmethod
    def _emunum_check(cls, module, policy):
        if policy.mad is not None and policy.uses_block:  # the batched products' operand pairs
            block_plan(policy)  # raises unless input, weight and grad_output all hold BlockFormats
            fin, fgo = policy.input.fmt, policy.grad_output.fmt
            for a, b in ((fin, fin), (fgo, fin), (fin, fgo)):
                check_pair(a, b)
        if policy.mad is not None and not hasattr(_mad(), "matmul"):
            raise ValueError("Policy.mad: emunum.mad has no matmul for the attention scores; "
                             "exclude MultiheadAttention layers with filter=")


def _pad_masks(attn_mask, key_padding_mask):
    """Both masks widened by one key position (for an appended key), as torch does."""
    if attn_mask is not None:
        attn_mask = F.pad(attn_mask, (0, 1))
    if key_padding_mask is not None:
        key_padding_mask = F.pad(key_padding_mask, (0, 1))
    return attn_mask, key_padding_mask
