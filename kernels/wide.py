"""``prefer_wide_vectors()``: called at the top of a compiled function, asks LLVM to vectorise that function's
loops with the widest vector registers the CPU has (512-bit ones where it has AVX-512). numba compiles for the
host CPU, whose tuning on AVX-512 parts says 256-bit, for every kernel; this function attribute
("prefer-vector-width") changes only the function it is placed in, and only its speed: on a CPU without
AVX-512 the widest registers are 256-bit (or 128) and the code is what it would have been.

Place it in the function that holds the loop. A function numba inlines (``inline="always"``) is typed into its
caller, so the caller's mark covers it; but a plain ``njit`` callee, ``inline_in_llvm`` ones included, is
optimised and vectorised on its own before LLVM inlines it, and keeps the width it was vectorised with
(``gemm_fast``'s row loops ran at 256 bits under a marked caller: 5.1 GMAC/s against 6.6-7.3 marked, 512**3,
one thread). Measured before marking: a kernel bound by float64 division or by gathers can run slower at 512
bits (``block_sr``, ``gemm_vec``, im2col), so only the loops where it paid carry it (benchmarks/RESULTS.md)."""
from numba import types
from numba.extending import intrinsic


@intrinsic
def prefer_wide_vectors(typingctx):
    """Marks the calling function (LLVM's function attribute, added once; llvmlite's checked ``add`` knows only
    attributes without a value)."""
    def codegen(context, builder, signature, args):
        attrs = builder.function.attributes
        if '"prefer-vector-width"="512"' not in attrs:
            set.add(attrs, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return types.void(), codegen
