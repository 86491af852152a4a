"""``inline_in_llvm()``: called at the top of a compiled function, marks that function ``alwaysinline`` for LLVM.

Why: numba's own ``inline="always"`` copies a callee's IR into every caller and types it there again, which costs
far more compile time than the code it makes (a ``gemm_vec`` variant spent ~9 of its ~12 CPU-s in that inliner).
A plain ``njit`` callee is typed once per signature, literal flags included (numba compiles a specialisation per
``Literal`` argument and prunes its dead branches), shared by every caller, and linked into each caller's module;
with this mark LLVM's always-inliner then puts its body into each call site: the same operations, hence the same
bits. numba optimises the callee's own module first, so its loops are vectorised there, under its own function
attributes (a callee that wants 512-bit vectors carries ``prefer_wide_vectors`` itself: kernels/wide.py). A
caller that passes its flags as plain values (``np.int64(MODE)``, ``np.bool_(CHK)``: not ``Literal``) gets one
compile for all of them, with every branch; the flags are constants at each inlined call site and LLVM folds the
branches there (``gemm_vec._round``, ``block_sr._sr_blocks``, ``nvfp4_fos_fast._row_errors``: same speed; their
test files compiled 21, 19 and 15 CPU-s less).
"""
from numba import types
from numba.core.cpu import CPUContext
from numba.extending import intrinsic


@intrinsic
def inline_in_llvm(typingctx):
    """Marks the calling function ``alwaysinline`` (once) where it is compiled for the CPU; elsewhere (a CUDA
    device function) it does nothing."""
    def codegen(context, builder, signature, args):
        attrs = builder.function.attributes
        if isinstance(context, CPUContext) and "alwaysinline" not in attrs:
            attrs.add("alwaysinline")
        return context.get_dummy_value()

    return types.void(), codegen
