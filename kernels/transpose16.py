"""``transpose16(src, s, dst, d, stride)``: a 16 x 16 tile of uint32 transposed in vector registers, each
element's sign bit cleared on the way: dst[d + k * stride + r] = src[s + 16 * r + k] & 0x7FFFFFFF for r, k < 16.

The 16 source rows are 256 consecutive values (16 blocks of 16 elements); each destination row is 16
consecutive values. A loop over the elements of the tile written in numba is vectorised by LLVM with gathers of
one element per lane (measured in kernels/nvfp4_fos_fast.py: ~0.2 ms per 2**20 elements, in cache or not);
here it is vector loads, two-source shuffles and vector stores, in one of two networks of the same result, by
the vector registers of the CPU numba compiles for: with AVX-512, 16 rows of 16 (64 shuffles; in a function
that asks for 512-bit vectors, kernels/wide.py, a row is one register); without, four 8 x 8 sub-tiles of 8 rows
of 8 (96 shuffles, 8 registers live at a time), since 16 rows split into 32 halves outgrow AVX2's 16 registers
and spill (measured: the 16-row network took ~20% of the 4/6 kernel on an AVX2 host). Generic LLVM IR, either
network on any CPU (``transpose16_rows``, for tests). Bounds are not checked: the caller keeps both tiles inside
their arrays."""
import llvmlite.binding as ll
from llvmlite import ir
from numba import types
from numba.core import config
from numba.extending import intrinsic

_I32 = ir.IntType(32)


def _masks(n: int, m: int):
    """The shuffles of rows of n that swap bit m of the row index with bit m of the column index, for rows r (bit m
    clear) and r | m: out[r][c] = A[(r & ~m) | (c & m)][(c & ~m) | (r & m)], the second row's elements numbered
    from n."""
    row = ir.VectorType(_I32, n)
    lo = [c if c & m == 0 else n + c - m for c in range(n)]
    hi = [c + m if c & m == 0 else n + c for c in range(n)]
    return ir.Constant(row, lo), ir.Constant(row, hi)


def _host_width() -> int:
    """16 where numba's target CPU has AVX-512 (its CPU_FEATURES if set, else the host's), else 8."""
    feats = config.CPU_FEATURES if config.CPU_FEATURES else ll.get_host_cpu_features().flatten()
    return 16 if "+avx512f" in feats.split(",") else 8


def _make(width: int):
    """The intrinsic with rows of ``width`` (16 or 8: sub-tiles of width x width)."""
    row = ir.VectorType(_I32, width)

    @intrinsic
    def transpose(typingctx, src, s, dst, d, stride):
        """(module doc)"""
        ok = all(isinstance(a, types.Array) and a.dtype == types.uint32 and a.ndim == 1 for a in (src, dst))
        if not ok or not all(isinstance(i, types.Integer) for i in (s, d, stride)):
            return None

        def codegen(context, builder, signature, args):
            sa = context.make_array(signature.args[0])(context, builder, args[0])
            da = context.make_array(signature.args[2])(context, builder, args[2])
            i64 = ir.IntType(64)
            s0 = context.cast(builder, args[1], signature.args[1], types.int64)
            d0 = context.cast(builder, args[3], signature.args[3], types.int64)
            st = context.cast(builder, args[4], signature.args[4], types.int64)
            absmask = ir.Constant(row, [0x7FFFFFFF] * width)
            for r0 in range(0, 16, width):  # sub-tile: source rows r0.., columns k0..
                for k0 in range(0, 16, width):
                    rows = []
                    for r in range(width):
                        p = builder.gep(sa.data, [builder.add(s0, i64(16 * (r0 + r) + k0))])
                        rows.append(builder.load(builder.bitcast(p, row.as_pointer()), align=4))
                    m = width // 2
                    while m:
                        lo, hi = _masks(width, m)
                        new = list(rows)
                        for r in range(width):
                            if r & m == 0:
                                new[r] = builder.shuffle_vector(rows[r], rows[r | m], lo)
                                new[r | m] = builder.shuffle_vector(rows[r], rows[r | m], hi)
                        rows = new
                        m //= 2
                    for k in range(width):
                        p = builder.gep(da.data, [builder.add(builder.add(d0, i64(r0)), builder.mul(st, i64(k0 + k)))])
                        builder.store(builder.and_(rows[k], absmask), builder.bitcast(p, row.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(src, s, dst, d, stride), codegen

    return transpose


transpose16_rows = {16: _make(16), 8: _make(8)}
transpose16 = transpose16_rows[_host_width()]
