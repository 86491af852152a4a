"""The module selection of a policy: ``Selection``, which layers ``emunum.patch`` emulates."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from torch import nn


@dataclass(frozen=True)
class Selection:
    """``filter(module, qualified_name) -> bool``: only layers it accepts are emulated (None: all);
    ``keep_first_last``: the model's first and last weight layers (Linear, Conv*, Embedding, attention, in
    ``named_modules`` order) stay in full precision, as Wang et al. (2018) did."""

    filter: Optional[Callable[[nn.Module, str], bool]] = field(default=None)
    keep_first_last: bool = False

    def __post_init__(self):
        if self.filter is not None and not callable(self.filter):
            raise TypeError(f"filter must be callable as filter(module, name) -> bool, got {self.filter!r}")
        if not isinstance(self.keep_first_last, bool):
            raise TypeError(f"keep_first_last must be a bool, got {self.keep_first_last!r}")
