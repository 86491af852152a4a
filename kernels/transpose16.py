"""``transpose16(src, s, dst, d, stride)``: a 16 x 16 tile of uint32 transposed in vector registers, each
element's sign bit cleared on the way: dst[d + k * stride + r] = src[s + 16 * r + k] & 0x7FFFFFFF for r, k < 16.

The 16 source rows are 256 consecutive values (16 blocks of 16 elements); each destination row is 16
consecutive values. A loop over the elements of the tile written in numba is vectorised by LLVM with gathers of
one element per lane (measured in kernels/nvfp4_fos_fast.py: ~0.2 ms per 2**20 elements, in cache or not);
here it is 16 vector loads, 64 two-source shuffles and 16 vector stores. Generic LLVM IR: on a CPU with 512-bit
vectors in a function that asks for them (kernels/wide.py) a row is one register, elsewhere LLVM splits it.
Bounds are not checked: the caller keeps both tiles inside their arrays."""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I32 = ir.IntType(32)
_ROW = ir.VectorType(_I32, 16)


def _masks(m: int):
    """The shuffles that swap bit m of the row index with bit m of the column index, for rows r (bit m clear) and
    r | m: out[r][c] = A[(r & ~m) | (c & m)][(c & ~m) | (r & m)], the second row's elements numbered from 16."""
    lo = [c if c & m == 0 else 16 + c - m for c in range(16)]
    hi = [c + m if c & m == 0 else 16 + c for c in range(16)]
    return ir.Constant(_ROW, lo), ir.Constant(_ROW, hi)


@intrinsic
def transpose16(typingctx, src, s, dst, d, stride):
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
        rows = []
        for r in range(16):
            p = builder.gep(sa.data, [builder.add(s0, i64(16 * r))])
            rows.append(builder.load(builder.bitcast(p, _ROW.as_pointer()), align=4))
        for m in (8, 4, 2, 1):
            lo, hi = _masks(m)
            new = list(rows)
            for r in range(16):
                if r & m == 0:
                    new[r] = builder.shuffle_vector(rows[r], rows[r | m], lo)
                    new[r | m] = builder.shuffle_vector(rows[r], rows[r | m], hi)
            rows = new
        absmask = ir.Constant(_ROW, [0x7FFFFFFF] * 16)
        for k in range(16):
            p = builder.gep(da.data, [builder.add(d0, builder.mul(st, i64(k)))])
            builder.store(builder.and_(rows[k], absmask), builder.bitcast(p, _ROW.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(src, s, dst, d, stride), codegen
