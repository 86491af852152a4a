"""``prefer_wide_vectors`` marks only the compiled function that calls it with LLVM's "prefer-vector-width"
attribute, and leaves its results alone (a loop of float32 compares and selects, against numpy); and it reaches
the hot loops it is meant for.

numba optimises (and vectorises) each compiled function on its own before LLVM inlines it into a caller
(``llvm_inline``), so the attribute has to sit in the function that holds the loop: on the caller only, the
callee's loop stays at the host tuning's 256 bits (the last test pins that rule). The hot loops checked: the fp8
recipe's MAD GEMM rows (``gemm_fast``) and the amax-scaled block kernel (``block_fast._table_blocks``), compiled
for the signatures their callers use. Their bits are checked against the reference kernels in
tests/kernels/test_gemm_cpu.py and test_block_fast.py: the vector width changes no operation, only how many lanes
run at once."""
import llvmlite.binding as llvm
import numpy as np
import pytest
from numba import njit, types

from emunum.kernels import block_fast, gemm_fast
from emunum.kernels.llvm_inline import inline_in_llvm
from emunum.kernels.wide import prefer_wide_vectors

ATTR = '"prefer-vector-width"="512"'


def _body(a, b, out):
    for i in range(a.size):
        out[i] = a[i] * b[i] if a[i] > np.float32(0.5) else b[i]


def test_marks_the_calling_function_only_and_keeps_results():
    plain = njit(_body)

    @njit
    def wide(a, b, out):
        prefer_wide_vectors()
        _body_jit(a, b, out)

    _body_jit = njit(inline="always")(_body)
    rng = np.random.default_rng(0)
    a, b = rng.random(1000).astype(np.float32), rng.random(1000).astype(np.float32)
    want = np.where(a > np.float32(0.5), a * b, b)
    for f in (plain, wide):
        out = np.empty_like(a)
        f(a, b, out)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    ir_wide = wide.inspect_llvm(wide.signatures[0])
    ir_plain = plain.inspect_llvm(plain.signatures[0])
    assert ATTR in ir_wide and ATTR not in ir_plain


F32 = types.Array(types.float32, 1, "C")
U32 = types.Array(types.uint32, 1, "C")
F64 = types.Array(types.float64, 1, "C")
I64, D = types.int64, types.float64


def _lit(v):
    return types.literal(v)


CASES = {
    # the fp8 recipe's unit: float32 work, no subnormal products or sums, no checks
    "gemm_fast._mac_row": (gemm_fast._mac_row, (F32, F32, types.float32, F32, F32, _lit(False), _lit(False),
                                                _lit(False))),
    "gemm_fast._add_row": (gemm_fast._add_row, (F32, F32, types.float32, F32, types.float32, _lit(False))),
    # the same unit's four terms on two rows per pass (exact products)
    "gemm_fast._add_rows_2x4": (gemm_fast._add_rows_2x4, (F32,) * 6 + (types.float32,) * 8 + (F32,)),
    # NVFP4's 1-D blocks of 16 that tile the rows
    "block_fast._table_blocks": (block_fast._table_blocks, (I64, I64, U32, U32, F64, types.boolean, I64, I64,
                                                            _lit(1), _lit(16), _lit(True), U32, U32, I64, I64, D,
                                                            I64, D, D, D, D, D, D)),
}


def _compiles_for_avx512() -> bool:
    """Whether numba compiles for a CPU with AVX-512: the host's features, or those NUMBA_CPU_FEATURES names (a
    NUMBA_CPU_NAME without features: not known here, so no)."""
    from numba.core import config

    if config.CPU_FEATURES is not None:
        return "+avx512f" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME is not None:
        return False
    return bool(llvm.get_host_cpu_features().get("avx512f", False))


@pytest.mark.parametrize("name", sorted(CASES))
def test_hot_loop_carries_the_wide_vector_attribute_and_uses_512_bit_registers(name):
    fn, sig = CASES[name]
    fn.compile(sig)
    compiled = [s for s in fn.signatures if tuple(s) == sig]
    assert compiled, f"{name}: no signature {sig}"
    assert ATTR in fn.inspect_llvm(compiled[0]), f"{name}: the function lacks {ATTR}"
    if _compiles_for_avx512():
        assert "zmm" in fn.inspect_asm(compiled[0]), f"{name}: no 512-bit register in its code on an AVX-512 host"


def test_a_callee_inlined_by_llvm_keeps_the_width_it_was_vectorised_with():
    """The placement rule of kernels/wide.py: a marked caller does not widen the loop of an ``inline_in_llvm``
    callee (vectorised in its own module first); the callee's own mark does."""
    def body(a, b, out):
        for i in range(a.size):
            out[i] = a[i] * b[i] if a[i] > np.float32(0.5) else b[i]

    @njit
    def plain_callee(a, b, out):
        inline_in_llvm()
        body_jit(a, b, out)

    @njit
    def marked_callee(a, b, out):
        inline_in_llvm()
        prefer_wide_vectors()
        body_jit(a, b, out)

    @njit
    def over_plain(a, b, out):
        prefer_wide_vectors()
        plain_callee(a, b, out)

    @njit
    def over_marked(a, b, out):
        prefer_wide_vectors()
        marked_callee(a, b, out)

    body_jit = njit(inline="always")(body)
    a = np.linspace(0, 1, 100, dtype=np.float32)
    want = np.where(a > np.float32(0.5), a * a, a)
    for f in (over_plain, over_marked):
        out = np.empty_like(a)
        f(a, a, out)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    if not _compiles_for_avx512():
        pytest.skip("numba does not compile for an AVX-512 CPU here: both loops are as wide as they can be")
    assert "zmm" not in over_plain.inspect_asm(over_plain.signatures[0])
    assert "zmm" in over_marked.inspect_asm(over_marked.signatures[0])
