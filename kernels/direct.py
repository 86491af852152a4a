"""Calling a numba dispatcher through its compiled entry point: no per-call type dispatch (about 1 us for a
kernel of 15 arguments), for the runners that call one kernel with the same Python types every time."""


def entry_point(fn, args):
    """The compiled entry point of dispatcher ``fn`` for the argument types of ``args`` (a call with those types
    was made), or ``fn`` itself. The runners (kernels/cpu.py, kernels/counters.py) pass the same Python types
    every time (int addresses, sizes and codes, witness arrays, a bool, numpy scalars), so every call has that
    signature."""
    try:
        return fn.overloads[tuple(fn.typeof_pyval(a) for a in args)].entry_point
    except (KeyError, AttributeError, TypeError, ValueError):
        return fn


def direct_caller(fn):
    """``call(*args)``: fn(*args), through fn's compiled entry point (``entry_point``) from the second call on;
    for callers that pass the same Python types every time."""
    direct = [None]

    def call(*args) -> None:
        if direct[0] is None:
            fn(*args)
            direct[0] = entry_point(fn, args)
        else:
            direct[0](*args)

    return call
