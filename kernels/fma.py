"""``fma(a, b, c)``: a * b + c rounded once to a's type (float32 or float64), as IEEE 754's fusedMultiplyAdd and
LLVM's ``llvm.fma``; and ``compiles_with_fma()``: whether numba's target CPU has the instruction.

A kernel uses it for speed only, where the product is exact in the type (then fma(a, b, c) is fl(fl(a * b) + c),
zeros' signs included: IEEE 754 gives an exact zero sum of the fused operation the sign it gives the sum of the
two addends). On a CPU without FMA instructions LLVM calls libm's ``fma`` per element (the same value, many times
slower), so kernels pick it where ``compiles_with_fma()`` holds."""
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c with one rounding; a, b and c of one float type."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None
    sig = a(a, b, c)

    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [ty], ir.FunctionType(ty, [ty, ty, ty]))
        return builder.call(fn, args)

    return sig, codegen


def compiles_with_fma() -> bool:
    """Whether numba compiles for a CPU with FMA instructions: the host's features, or those NUMBA_CPU_FEATURES
    names (a NUMBA_CPU_NAME without features: not known here, so no)."""
    from numba.core import config

    if config.CPU_FEATURES is not None:
        return "+fma" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME is not None:
        return False
    return bool(llvm.get_host_cpu_features().get("fma", False))
