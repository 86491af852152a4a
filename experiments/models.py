"""Models for (N, channels, length) inputs, built from plain torch modules so that ``emunum.patch`` can swap
their Linear/Conv1d layers. ``build(cfg, input_shape, num_outputs)`` picks one by ``cfg.name``."""
from __future__ import annotations

import math

import torch
from torch import nn


def _conv_len(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: list[int], num_outputs: int):
        super().__init__()
        layers, width = [], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x.flatten(1))


class CNN1d(nn.Module):
    """The MNIST-1D paper's CNN (Greydanus 2020, ``ConvBase``): conv(5, stride 2, pad 1) and two conv(3,
    stride 2, pad 1), each followed by ReLU, then one linear layer on the flattened features."""

    def __init__(self, in_channels: int, length: int, num_outputs: int, channels: int = 25):
        super().__init__()
        self.conv1 = nn.Conv1d(in_channels, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        n = _conv_len(_conv_len(_conv_len(length, 5, 2, 1), 3, 2, 1), 3, 2, 1)
        if n < 1:
            raise ValueError(f"cnn1d needs inputs of length >= 5, got {length}")
        self.linear = nn.Linear(channels * n, num_outputs)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        h = torch.relu(self.conv2(h))
        h = torch.relu(self.conv3(h))
        return self.linear(h.flatten(1))


class BasicBlock1d(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, batchnorm: bool):
        super().__init__()
        norm = (lambda c: nn.BatchNorm1d(c)) if batchnorm else (lambda c: nn.Identity())
        self.conv1 = nn.Conv1d(cin, cout, 3, stride=stride, padding=1, bias=not batchnorm)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv1d(cout, cout, 3, padding=1, bias=not batchnorm)
        self.bn2 = norm(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv1d(cin, cout, 1, stride=stride, bias=not batchnorm), norm(cout))

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet1d(nn.Module):
    """A small 1-D ResNet: stem conv, ``blocks`` basic blocks at ``channels``, ``blocks`` more at twice the
    channels and half the length, global average pooling, linear head."""

    def __init__(self, in_channels: int, num_outputs: int, channels: int = 32, blocks: int = 2,
                 batchnorm: bool = True):
        super().__init__()
        if blocks < 1:
            raise ValueError(f"model.blocks={blocks} must be >= 1")
        norm = nn.BatchNorm1d(channels) if batchnorm else nn.Identity()
        self.stem = nn.Sequential(nn.Conv1d(in_channels, channels, 3, padding=1, bias=not batchnorm), norm,
                                  nn.ReLU())
        stage1 = [BasicBlock1d(channels, channels, 1, batchnorm) for _ in range(blocks)]
        stage2 = [BasicBlock1d(channels, 2 * channels, 2, batchnorm)]
        stage2 += [BasicBlock1d(2 * channels, 2 * channels, 1, batchnorm) for _ in range(blocks - 1)]
        self.stages = nn.Sequential(*stage1, *stage2)
        self.head = nn.Linear(2 * channels, num_outputs)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean(dim=2))


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"model.d_model={d_model} must be divisible by model.heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(n, t, d))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(),
                                 nn.Linear(mlp_ratio * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer1d(nn.Module):
    """A small pre-norm transformer encoder: the signal is cut into tokens of ``patch`` samples (zero-padded
    at the end), embedded linearly with a learned position embedding, mean-pooled, then a linear head."""

    def __init__(self, in_channels: int, length: int, num_outputs: int, patch: int = 4, d_model: int = 32,
                 heads: int = 2, layers: int = 2, mlp_ratio: int = 2):
        super().__init__()
        if patch < 1:
            raise ValueError(f"model.patch={patch} must be >= 1")
        self.patch = patch
        self.tokens = -(-length // patch)
        self.pad = self.tokens * patch - length
        self.embed = nn.Linear(in_channels * patch, d_model)
        self.pos = nn.Parameter(torch.randn(1, self.tokens, d_model) * 0.02)
        self.blocks = nn.Sequential(*[TransformerBlock(d_model, heads, mlp_ratio) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_outputs)

    def forward(self, x):
        if self.pad:
            x = nn.functional.pad(x, (0, self.pad))
        n, c, _ = x.shape
        tok = x.view(n, c, self.tokens, self.patch).permute(0, 2, 1, 3).reshape(n, self.tokens, c * self.patch)
        h = self.blocks(self.embed(tok) + self.pos)
        return self.head(self.norm(h).mean(dim=1))


def build(cfg, input_shape: tuple[int, int], num_outputs: int) -> nn.Module:
    """The model named by ``cfg.name`` (a ``ModelConfig``) for inputs of shape (N, *input_shape)
    (``lm``: int64 tokens (N, context), ``num_outputs`` the vocabulary size)."""
    if cfg.name == "lm":
        from .lm import ByteLM

        if len(input_shape) != 1:
            raise ValueError(f"model=lm needs token data (data=stdlib or data=text); got inputs of shape {input_shape}")
        return ByteLM(num_outputs, input_shape[0], d_model=int(cfg.d_model), heads=int(cfg.heads),
                      layers=int(cfg.layers), mlp_ratio=int(cfg.mlp_ratio))
    if len(input_shape) != 2:
        raise ValueError(f"model={cfg.name} needs (channels, length) inputs; got {input_shape} (token data "
                         f"goes with model=lm)")
    c, length = input_shape
    if cfg.name == "mlp":
        return MLP(c * length, list(cfg.hidden), num_outputs)
    if cfg.name == "cnn1d":
        return CNN1d(c, length, num_outputs, channels=int(cfg.channels))
    if cfg.name == "resnet":
        return ResNet1d(c, num_outputs, channels=int(cfg.channels), blocks=int(cfg.blocks),
                        batchnorm=bool(cfg.batchnorm))
    if cfg.name == "transformer":
        return Transformer1d(c, length, num_outputs, patch=int(cfg.patch), d_model=int(cfg.d_model),
                             heads=int(cfg.heads), layers=int(cfg.layers), mlp_ratio=int(cfg.mlp_ratio))
    raise ValueError(f"model.name={cfg.name!r} is not a model; allowed: mlp, cnn1d, resnet, transformer, lm")
