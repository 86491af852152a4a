"""The functional half of ``emunum.patch``: a ``GemmMode`` entered around the model's forward, and the first
forward's coverage check, which warns once (or raises, with ``strict=True``) naming every GEMM that ran off the
format, its module and the reason (GEMMs that the policy itself leaves out, through its filter,
``keep_first_last`` or an unrounded operand role, are reported by ``emunum.coverage`` only). A forward traced by
``torch.compile`` is not checked (the next eager one is)."""
from __future__ import annotations

import warnings

import torch

from .gemm_coverage import GemmCounter
from .nn.functional import GemmEmulator
from .nn.gemm_context import CHOSEN
from .nn.gemm_mode import FUNCTIONAL_OPS, GemmMode, GemmModeError, ModelHooks
from .policy import Policy


class FunctionalPatch(ModelHooks):
    """Forward hooks of a patched model (see ``ModelHooks``) plus the first forward's check."""

    def __init__(self, policy: Policy, strict: bool, expects_emulated: bool = False):
        """expects_emulated: ``patch`` swapped no layer (its filter and keep_first_last left none) and relies on
        the functional GEMMs alone; the first forward then also checks that some GEMM ran emulated."""
        super().__init__(GemmMode(GemmEmulator(policy), strict))
        self.policy, self.strict, self.expects_emulated = policy, strict, expects_emulated
        self._counter = None
        self.checked = False

    def _enter(self, mod, args):
        if not self.checked and self.mode.depth == 0 and not torch.compiler.is_compiling():
            self.checked = True
            self._counter = GemmCounter(mod).__enter__()
        super()._enter(mod, args)

    def _nest_recomputed(self, model, records) -> None:
        """The mode around each module that ran emulated functional GEMMs in this first forward, too: an activation
        checkpoint (transformers' gradient checkpointing, ``torch.utils.checkpoint``) recomputes a block in
        backward, outside the model's forward, and its GEMMs must run emulated again, as in the forward (the
        recomputation must save the same tensors, and the gradients come from its values)."""
        names = {r.module for r in records
                 if r.emulated and r.phase == "forward" and r.module and r.op in FUNCTIONAL_OPS}
        done = set()
        for name, m in model.named_modules(remove_duplicate=False):
            if name in names and id(m) not in done:
                done.add(id(m))
                self.attach_nested(m)

    def _exit(self, mod, args, out):
        super()._exit(mod, args, out)
        counter = self._counter
        if counter is None or self.mode.depth:
            return
        self._counter = None
        counter.__exit__(None, None, None)
        records = counter.records()
        self._nest_recomputed(mod, records)
        total = sum(f for f, _ in counter.totals.values())
        if self.expects_emulated and total and not any(r.emulated for r in records):
            msg = (f"no GEMM of the forward ran emulated ({total:,} FLOPs): the policy's filter and keep_first_last "
                   "left out every layer, and no functional GEMM of the modules they accept ran")
            if self.strict:
                raise GemmModeError(f"emunum.patch(strict=True): {msg}")
            warnings.warn(f"emunum.patch: {msg}", RuntimeWarning, stacklevel=2)
            return
        missed = [r for r in records if not r.emulated and r.flops and r.reason not in CHOSEN]
        if not missed:
            return
        off = sum(r.flops for r in missed)
        lines = "; ".join(f"{r.module or '<model>'}: {r.op} ({r.flops:,} FLOPs, {r.reason})"
                          for r in sorted(missed, key=lambda r: -r.flops)[:20])
        msg = (f"{off / total:.1%} of the forward GEMM FLOPs ran off the format ({off:,} of {total:,}): {lines}"
               f"{' ...' if len(missed) > 20 else ''}")
        if self.strict:
            raise GemmModeError(f"emunum.patch(strict=True): {msg}")
        warnings.warn(f"emunum.patch: {msg}; emunum.coverage(model, *inputs) gives the details", RuntimeWarning,
                      stacklevel=2)
