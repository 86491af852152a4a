"""The emulated layers rounded role by role: Linear, Conv, ConvTranspose, Embedding, and the layers rounded at
their output (norms, activations). See ``emunum.nn`` for where each rounds."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import grid
from ..elide import input_grid, relu_eliding
from ..formats import BlockFormat
from ..policy import Role
from .base import EmuLayer, _linear, _mad
from .block_gemm import block_conv, block_conv_transpose, block_linear
from .fused import fused_conv, fused_linear

# ---- Linear ---------------------------------------------------------------------------------------------
class LinearMixin(EmuLayer):
    BLOCK_GEMM = True

    def forward(self, input: Tensor) -> Tensor:
        self._emu_begin()
        if self._emunum_block is not None:  # operands rounded in the GEMMs; the other roles around them
            R = self._emu_round
            b = None if self.bias is None else R(self.bias, Role.WEIGHT)
            y = block_linear(R(input, Role.INPUT), R(self.weight, Role.WEIGHT), b, self._emunum_block)
            return R(y, Role.OUTPUT)
        y = fused_linear(self, input)  # one autograd node for the roundings and the GEMM, where it applies
        if y is not None:
            return y
        x = self._emu_round(input, Role.INPUT)
        w = self._emu_round(self.weight, Role.WEIGHT)
        b = None if self.bias is None else self._emu_round(self.bias, Role.WEIGHT)
        return self._emu_round(_linear(x, w, b, self._emunum_policy), Role.OUTPUT)


# ---- Conv -----------------------------------------------------------------------------------------------
def no_mad_gemm(module, policy) -> ValueError:
    """The error for a layer whose GEMM has no MAD-unit emulation (Conv3d, ConvTranspose*) under ``policy.mad``."""
    kind = type(module).__name__
    return ValueError(
        f"Policy.mad={getattr(policy.mad, 'name', policy.mad)!r}: a {kind} layer has no GEMM emulated on MAD units "
        "(emunum.mad runs Linear, Conv1d, Conv2d and attention layers); leave these layers out (unemulated) with "
        f"filter=lambda m, name: not isinstance(m, {kind}), or patch without mad=")


class ConvMixin(EmuLayer):
    _MAD_FUNCTIONS = {1: "conv1d", 2: "conv2d"}
    BLOCK_GEMM = True

    @classmethod
    def _emunum_check(cls, module, policy):
        if policy.mad is not None:
            nd = len(module.kernel_size)
            if nd not in cls._MAD_FUNCTIONS or not hasattr(_mad(), cls._MAD_FUNCTIONS[nd]):
                raise no_mad_gemm(module, policy)

    def forward(self, input: Tensor) -> Tensor:
        self._emu_begin()
        if self._emunum_block is not None:  # operands rounded in the GEMMs; the other roles around them
            R = self._emu_round
            b = None if self.bias is None else R(self.bias, Role.WEIGHT)
            y = block_conv(self, R(input, Role.INPUT), R(self.weight, Role.WEIGHT), b, self._emunum_block)
            return R(y, Role.OUTPUT)
        y = fused_conv(self, input)
        if y is not None:
            return y
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


class ConvTransposeMixin(EmuLayer):
    _FUNCTIONS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
    BLOCK_GEMM = True

    @classmethod
    def _emunum_check(cls, module, policy):
        if policy.mad is not None:
            raise no_mad_gemm(module, policy)

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
        if self._emunum_block is not None:  # operands rounded in the GEMM (x, w above: gradient rounding only)
            y = block_conv_transpose(self, x, w, b, self._emunum_block, output_padding)
            return self._emu_round(y, Role.OUTPUT)
        y = self._FUNCTIONS[nd](x, w, b, self.stride, self.padding, output_padding, self.groups, self.dilation)
        return self._emu_round(y, Role.OUTPUT)


# ---- Embedding ------------------------------------------------------------------------------------------
class EmbeddingMixin(EmuLayer):
    """Under block formats (GEMM-operand formats) the lookup is left unrounded: a table row is not a GEMM
    operand. A tied output projection (``lm_head``) is a Linear and is emulated as one."""

    ROLES = (Role.WEIGHT, Role.OUTPUT)
    LOOKUP = True

    def extra_repr(self) -> str:
        base = super().extra_repr()
        spec = self._emunum_policy.weight
        if spec is not None and isinstance(spec.fmt, BlockFormat):
            base += f", weight not rounded (a lookup; the block format {spec.fmt.name} applies to GEMM operands)"
        return base

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
        if grid._enabled[0] and self._emunum_elide and not torch.compiler.is_compiling():
            have = grid.grid_of(w)  # a lookup keeps its table's grid: every output element is a table element
            if have is not None and y.dtype == w.dtype:
                grid.mark(y, have)
        return self._emu_round(y, Role.OUTPUT)


# ---- layers rounded at their output (norms, activations) -----------------------------------------------
class OutputMixin(EmuLayer):
    ROLES = (Role.OUTPUT,)
    HAS_WEIGHT = False

    def forward(self, *args, **kwargs):
        self._emu_begin()
        if isinstance(self, nn.ReLU) and args and grid._enabled[0] and self._emunum_elide \
                and not torch.compiler.is_compiling():
            have = input_grid(args[0])  # ReLU keeps its input's grid: max(x, 0) is x or +0 (or x's NaN)
            if have is not None and len(args) == 1 and not kwargs:
                plan = self._eliding_plan(Role.OUTPUT)
                y = None if plan is None else relu_eliding(plan, args[0], have, self.inplace)
                if y is not None:  # one node, relu's own result: no copy of it
                    return y
            y = super().forward(*args, **kwargs)
            if have is not None:
                grid.mark(y, have)
            return self._emu_round(y, Role.OUTPUT)
        return self._emu_round(super().forward(*args, **kwargs), Role.OUTPUT)
