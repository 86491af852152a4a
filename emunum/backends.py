"""Which kernel rounds a number system on a device: ``register(FormatType, device, factory)`` and
``runner(fmt, device, dtype)``.

A factory is called once per (format, device, dtype) and returns the bound kernel (cached):
- device "cpu": ``run(src_ptr, dst_ptr, n, mode, key, nbits)`` rounding ``n`` contiguous elements of a
  float32/float64 array at ``src_ptr`` into ``dst_ptr`` (which may equal ``src_ptr``); ``mode`` a ``RoundMode``
  code, ``key`` the stochastic generator's key (``rng.seed_key``), ``nbits`` the random bits per rounding;
- device "cuda": ``launch(src, dst, mode, key, nbits)`` on flat contiguous CUDA tensors of one dtype.
A format type without a factory of its own takes its nearest registered base class's. ``quantize`` validates,
allocates, then calls ``runner(fmt, device, dtype)``; a new number system is one spec module (its
``to_kernel_args`` record in ``kernels/abi.py``) and one ``register`` call per device
(``emunum/kernel_backends.py`` registers the built-in ones).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

DEVICES = ("cpu", "cuda")
_FACTORIES: dict = {d: {} for d in DEVICES}


def register(format_type: type, device: str, factory: Callable, *, replace: bool = False) -> None:
    """Round ``format_type`` on ``device`` ("cpu" or "cuda") with ``factory(fmt, dtype) -> kernel`` (module doc)."""
    if not isinstance(format_type, type):
        raise TypeError(f"format_type must be a format class, got {format_type!r}")
    if device not in DEVICES:
        raise ValueError(f"device={device!r}: allowed: {', '.join(DEVICES)}")
    if not callable(factory):
        raise TypeError(f"factory must be callable as factory(fmt, dtype), got {factory!r}")
    table = _FACTORIES[device]
    if format_type in table and not replace:
        raise ValueError(f"{format_type.__name__} already has a {device} kernel; pass replace=True to overwrite it")
    table[format_type] = factory
    _clear()


def unregister(format_type: type, device: str) -> None:
    """Remove ``format_type``'s own ``device`` kernel (its base class's, if any, applies again)."""
    table = _FACTORIES.get(device)
    if table is None or format_type not in table:
        raise ValueError(f"{getattr(format_type, '__name__', format_type)!r} has no {device!r} kernel of its own")
    del table[format_type]
    _clear()


def registered(device: str) -> tuple:
    """The format types with a kernel on ``device``."""
    return tuple(_FACTORIES[device])


@functools.lru_cache(maxsize=1024)
def runner(fmt, device: str, dtype: torch.dtype):
    """The kernel rounding ``fmt`` on ``device`` for ``dtype`` (module doc); ValueError when none is registered."""
    table = _FACTORIES.get(device)
    if table is None:
        raise ValueError(f"device={device!r}: allowed: {', '.join(DEVICES)}")
    for base in type(fmt).__mro__:
        factory = table.get(base)
        if factory is not None:
            return factory(fmt, dtype)
    raise ValueError(f"{type(fmt).__name__} has no {device} kernel; registered: "
                     f"{', '.join(t.__name__ for t in table) or 'none'} (emunum.backends.register)")


@functools.lru_cache(maxsize=512)
def cpu_runner(fmt, dtype: torch.dtype):
    """``runner(fmt, "cpu", dtype)``, with a cache of its own: the eager rounding paths call it per rounding."""
    return runner(fmt, "cpu", dtype)


GENERATION = [0]  # bumped whenever the registered kernels change (for caches of runners kept elsewhere)


def _clear() -> None:
    runner.cache_clear()
    cpu_runner.cache_clear()
    GENERATION[0] += 1
