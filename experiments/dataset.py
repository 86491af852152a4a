"""``Dataset``: what every loader of ``experiments/data.py`` and ``experiments/text_data.py`` returns."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Dataset:
    """x_*: float32 (N, C, L); y_*: int64 class labels (classification) or float32 (N, 1) targets.
    language_model: x_* and y_* are int64 byte tokens (N, context), y the next byte of each position.
    sha256: the digest of the source text, where the data is a corpus."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    task: str  # "classification" | "regression" | "language_model"
    num_outputs: int
    sha256: str | None = None

    @property
    def input_shape(self) -> tuple[int, int]:
        return tuple(self.x_train.shape[1:])
