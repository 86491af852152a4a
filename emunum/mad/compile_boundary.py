"""The MAD-unit entry points as graph breaks under torch.compile.

Their GEMMs are numba kernels, which dynamo cannot trace (it raised ``InternalTorchDynamoError`` inside them).
``graph_break(fn)`` makes each call of fn ``torch.compiler.disable(fn)``'s: under torch.compile the call is a graph
break, run eagerly, with eager's bits (``fullgraph=True``, which forbids graph breaks, refuses it, and torch.export,
which hands it fake tensors, gets a TypeError that says so); in eager mode it is fn's call. The wrapping is made on
the first call, not at import: ``torch.compiler.disable`` imports ``torch._dynamo`` (about a second), which a
process that never compiles should not pay."""
from __future__ import annotations

import functools

import torch


def graph_break(fn):
    """fn, a graph break under torch.compile (module doc); TypeError for fake tensors (torch.export)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if any(_without_values(a) for a in args):
            raise TypeError(f"emunum.mad.{fn.__name__}: a MAD unit's GEMMs are numba kernels that need real "
                            "tensors, and this call got fake ones (torch.export, or another tracer); run "
                            "such a model eagerly or under torch.compile without fullgraph (each GEMM a graph break)")
        return _disabled(fn)(*args, **kwargs)

    return call


def _without_values(a) -> bool:
    return isinstance(a, torch.Tensor) and type(a).__name__ == "FakeTensor"  # (meta: each function's own check)


@functools.lru_cache(maxsize=None)
def _disabled(fn):
    return torch.compiler.disable(fn)
