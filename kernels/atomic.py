"""``fetch_add(a, i, v)``: a[i] += v as one atomic operation (sequentially consistent) on an int64 array inside a
compiled function, returning the value a[i] held before: the threads of a ``prange`` take work items from a shared
counter with it, so a thread slowed by other load takes fewer items (numba's workqueue layer splits a ``prange``
into equal static parts, one per thread). Bounds are not checked."""
from numba import types
from numba.extending import intrinsic


@intrinsic
def fetch_add(typingctx, arr, i, v):
    """(module doc)"""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(i, types.Integer)
            and isinstance(v, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.int64)
        val = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", builder.gep(a.data, [idx]), val, "seq_cst")

    return types.int64(arr, i, v), codegen
