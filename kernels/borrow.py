"""``borrow(a)``: a view of array a inside a compiled function that numba does not reference-count.

numba counts references to every array variable: binding one (an inlined call's argument, a tuple unpacked)
adds 1 to its owner's count and the end of its life takes 1 off, each an atomic operation on the owner. In a
loop that calls inlined helpers with many array arguments this costs per call, not per element (measured in
kernels/nvfp4_fos_fast.py: ~260 ns per unit of 1024 elements, 0.27 ms per 2**20 elements, for the buffers
alone). A borrowed view has the same data, shape and strides and no owner (numba's meminfo NULL), so those
counts become a test of a null pointer. It is valid only while ``a`` itself is alive: borrow the arguments and
buffers of a function for use inside that function, never to return or to keep."""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def borrow(typingctx, arr):
    """The array arr without its owner (module doc)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        src = context.make_array(signature.args[0])(context, builder, args[0])
        view = context.make_array(signature.return_type)(context, builder)
        for field in ("data", "shape", "strides", "itemsize", "nitems"):
            setattr(view, field, getattr(src, field))
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return arr(arr), codegen
