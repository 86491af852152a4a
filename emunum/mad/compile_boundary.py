"""The MAD-unit entry points as graph breaks under torch.compile.

Their GEMMs are numba kernels, which dynamo cannot trace (it raised ``InternalTorchDynamoError`` inside them).
``graph_break(fn)`` makes each call of fn ``torch.compiler.disable(fn)``'s: under torch.compile the call is a graph
break, run eagerly, with eager's bits (``fullgraph=True``, which forbids graph breaks, refuses it); in eager mode it
is fn's call. The wrapping is made on the first call, not at import: ``torch.compiler.disable`` imports
``torch._dynamo`` (about a second), which a process that never compiles should not pay."""
from __future__ import annotations

import functools

import torch


def graph_break(fn):
    """fn, a graph break under torch.compile (module doc)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return _disabled(fn)(*args, **kwargs)

    return call


@functools.lru_cache(maxsize=None)
def _disabled(fn):
    return torch.compiler.disable(fn)
