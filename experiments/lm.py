"""A small decoder-only (GPT-style) byte-level language model, built only from torch.nn modules that
``emunum.patch`` emulates: ``nn.Embedding`` (tokens and learned positions), ``nn.LayerNorm``,
``nn.MultiheadAttention`` (causal: a -inf mask above the diagonal, added after the scores are rounded),
``nn.Linear`` and ``nn.GELU``. Pre-norm residual blocks; the output head is a separate Linear (untied).

``ByteLM(idx)`` maps int64 tokens (N, T), T <= context, to float logits (N, T, vocab)."""
from __future__ import annotations

import torch
from torch import nn


class DecoderBlock(nn.Module):
    """x + attn(ln1(x)) under a causal mask, then x + mlp(ln2(x)); attention dropout 0."""

    def __init__(self, d_model: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(),
                                 nn.Linear(mlp_ratio * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.mlp(self.norm2(x))


class ByteLM(nn.Module):
    def __init__(self, vocab: int, context: int, d_model: int = 64, heads: int = 4, layers: int = 2,
                 mlp_ratio: int = 4):
        super().__init__()
        for field, v in (("model.d_model", d_model), ("model.heads", heads), ("model.layers", layers),
                         ("model.mlp_ratio", mlp_ratio), ("data.context", context)):
            if v < 1:
                raise ValueError(f"{field}={v} is out of range; allowed: >= 1")
        if d_model % heads:
            raise ValueError(f"model.d_model={d_model} must be divisible by model.heads={heads}")
        self.context = context
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, heads, mlp_ratio) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        mask = torch.full((context, context), float("-inf")).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)
        self.apply(_init)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"a sequence of {t} tokens is longer than the model's context {self.context}")
        pos = torch.arange(t, device=idx.device)
        h = self.tok(idx) + self.pos(pos)
        mask = self.causal_mask[:t, :t]
        for block in self.blocks:
            h = block(h, mask)
        return self.head(self.norm(h))


def _init(m: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights and zero biases for Linear and Embedding."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)
