"""32-bit-lane cores of the float32 element-wise loops (kernels/cpu.py ``f32_*``): round to nearest-even and
stochastic rounding of float32 bits to a FloatFormat, on uint32 integers (16 lanes of AVX-512 where the old
cores used 8 of float64 or int64). Each gives the bits of the core it stands in for, wherever its ``*_ok``
holds (tests/kernels/test_elementwise_f32.py checks every float32 code point class; ``-m exhaustive`` all 2**32).

**Nearest** (``nearest_f32``; stands in for ``round_nearest_value`` in float64 with its result rounded to
float32, i.e. Veltkamp's split). For |x| >= 2**emin (x a float32 normal, since emin >= -126) Veltkamp's split is
x rounded to man + 1 significant bits, ties to even; on x's bits a (sign cleared) that is
``(a + 2**(s-1) - 1 + bit s of a) & ~(2**s - 1)``, s = 23 - man: the carry out of the significand is the next
binade's encoding, and inf (a = 0x7F800000, low bits zero) stays inf. No float overflow can occur (a float32
Veltkamp split would overflow c = x * split above 2**(104 + man), inside bf16's range). For |x| < 2**emin:
(|x| + magic) - magic in float32, magic = 1.5 * 2**(23 + q) (q = emin - man, or emin without subnormals): |x| <
2**(q + 22) so the sum lies in [2**(23+q), 2**(24+q)] where float32's step is 2**q, and magic is an even multiple
of 2**q: |x| rounded to a multiple of 2**q, ties to even, exactly (the float64 magic does the same). Then on
bits: a result above max's bits (max a float32 value) becomes the overflow value (inf or max with x's sign, or
the positive quiet NaN); x's sign goes back on, except on a zero where the format has no -0; a NaN input comes
back quietened (``u | 0x400000``, as the float64 round trip gives).

**Stochastic** (``sr_f32``; stands in for ``round_f32_fast(..., STOCHASTIC, rnd, nbits)``, whose rules are
``round_float_bits``'s: round away iff rem / 2**shift, rounded to nbits bits ties to even, plus rnd / 2**nbits
reaches 1). Normal range (|x| >= 2**emin): the quantum is 2**s units of x's last place (s = 23 - man <= nbits), so
rem * 2**(nbits - s) + rnd >= 2**nbits iff rem + (rnd >> (nbits - s)) >= 2**s: the result is
``(a + (rnd >> (nbits - s))) & ~(2**s - 1)``, the carry again the right encoding. Below 2**emin the quantum 2**q
is fixed: t = |x| * 2**-q is exact (a power of two; t < 2**man), and with k = floor(t) and the fraction f = t - k
(exact), rem / 2**shift = f, so drnd = rint(f * 2**nbits) (f * 2**nbits exact; rint ties to even; drnd <=
2**nbits) and the result is (k + up) * 2**q, up iff drnd + rnd >= 2**nbits, decided on 2**(32 - nbits)-scaled
uint32 words with the carries of two additions (drnd = 2**nbits only as (2**nbits - 1) + 1). Overflow, zeros,
inf and NaN as ``round_f32_fast``: an overflowed result becomes max (saturating formats) or inf with x's sign,
or the positive quiet NaN; an inf input becomes max or inf with its sign, or that NaN; a NaN comes back
quietened.

**Where they apply** (``nearest_ok``, ``sr_ok``; elsewhere kernels/cpu.py runs the previous cores): float32 input
and emin >= -126 (as for every f32_* loop), 1 <= man <= 22 (man = 0 has its own tie rule, man = 23 rounds
nothing), max a finite float32 value (its bits are the overflow threshold), and for nearest q <= 100 (magic
finite), for stochastic q <= 0 (t exact). The float32 steps assume IEEE arithmetic on subnormals, as the float64
cores do: a process that flushes them (``torch.set_flush_denormal(True)``) changes results below 2**-126.
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _cache, scalar
from .scalar import GOLDEN, ONE, OVF_INF, OVF_NAN
from .shares import launcher
from .wide import prefer_wide_vectors

_cache.guard(__file__, scalar.SOURCES)

U32 = np.uint32
U64 = np.uint64
F32 = np.float32
ABS = U32(0x7FFFFFFF)
SIGN = U32(0x80000000)
INF_BITS = U32(0x7F800000)
QUIET = U32(0x400000)
NAN32 = U32(0x7FC00000)
NEG_INF32 = U32(0xFF800000)


@njit(inline="always")
def _fits_f32(max_value):
    return 0.0 < max_value <= 3.4028234663852886e38 and np.float64(np.float32(max_value)) == max_value


@njit(inline="always")
def nearest_ok(man, emin, sub, max_value):
    """Whether ``nearest_f32`` holds for this FloatFormat (float32 input, emin >= -126 as f32_* require)."""
    q = emin - man if sub != 0 else emin
    return 1 <= man <= 22 and -126 <= emin and q <= 100 and _fits_f32(max_value)


@njit(inline="always")
def nearest_params(man, emin, sub, max_bits, ovf):
    """(2**s, half - 1, mask, magic, bits of 2**emin, overflow bits, overflow is NaN) for ``nearest_f32``."""
    s = 23 - man
    q = emin - man if sub != 0 else emin
    magic = F32(1.5 * math.ldexp(1.0, 23 + q))
    big = INF_BITS if ovf == OVF_INF else (NAN32 if ovf == OVF_NAN else U32(max_bits))
    return (U32(1 << s), U32((1 << (s - 1)) - 1), U32(~((1 << s) - 1) & 0xFFFFFFFF), magic, U32((emin + 127) << 23),
            big, ovf == OVF_NAN)


@njit(inline="always")
def _finish(u, a, r, max_bits, big, ovf_nan, negzero):
    """The result's bits from |result| bits r of input bits u (a = |u|): overflow past max_bits to ``big``, x's
    sign (dropped from a zero without -0 and from an overflow NaN), an input NaN quietened."""
    over = r > max_bits
    r = big if over else r
    keep = ((r != U32(0)) | (negzero != 0)) & ~(over & ovf_nan)
    out = U32(r | (U32(u & SIGN) if keep else U32(0)))
    return U32(u | QUIET) if a > INF_BITS else out


@njit(inline="always")
def nearest_f32(u, lsb, half_m1, mask, magic, mn_bits, max_bits, big, ovf_nan, negzero):
    """Round-to-nearest-even of the float32 with bits ``u`` (uint32): the result's bits (module doc)."""
    a = U32(u & ABS)
    rn = U32(U32(U32(a + half_m1) + (U32(1) if U32(a & lsb) != U32(0) else U32(0))) & mask)  # each step on uint32
    v = a.view(F32)
    lo = F32((v + magic) - magic).view(U32)
    return _finish(u, a, lo if a < mn_bits else rn, max_bits, big, ovf_nan, negzero)


def _shift32(name):
    @intrinsic
    def shift(typingctx, x, s):
        """x shifted by s & 31 bits on uint32 (numba's own operators promote to 64 bits, and LLVM then ran
        variable shifts and the truncations in 64-bit lanes, half as many to a vector)."""
        if x != types.uint32 or s != types.uint32:
            return None

        def codegen(context, builder, signature, args):
            amount = builder.and_(args[1], ir.Constant(ir.IntType(32), 31))
            return getattr(builder, name)(args[0], amount)

        return types.uint32(x, s), codegen

    return shift


shr32, shl32 = _shift32("lshr"), _shift32("shl")


@intrinsic
def opaque(typingctx, x):
    """x unchanged, its value hidden from LLVM (an empty inline asm). For a loop invariant that LLVM would
    otherwise know to be one of a few constants and fold into the loop's vector code, at a cost
    (kernels/hifloat8_cpu.py: the overflow bits of the stochastic loop)."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        return builder.asm(ir.FunctionType(ty, [ty]), "", "=r,0", [args[0]], side_effect=False)

    return x(x), codegen


@njit(inline="always")
def sr_ok(man, emin, sub, max_value):
    """Whether ``sr_f32`` holds for this FloatFormat (float32 input, emin >= -126)."""
    q = emin - man if sub != 0 else emin
    return 1 <= man <= 22 and -126 <= emin and q <= 0 and _fits_f32(max_value)


@njit(inline="always")
def sr_params(man, emin, sub, max_bits, ovf, nbits):
    """(d, half - 1 at bit d, lsb on/off, mask below d, k, mask below s, 2**-q in two factors, 2**q, 2**nbits mod
    2**32, overflow bits, overflow is NaN) for ``sr_f32``."""
    s = 23 - man
    q = emin - man if sub != 0 else emin
    d = max(s - nbits, 0)
    k = max(nbits - s, 0)
    c1 = min(-q, 100)
    big = INF_BITS if ovf == OVF_INF else (NAN32 if ovf == OVF_NAN else U32(max_bits))
    return (U32(d), U32(((1 << d) >> 1) - (1 if d > 0 else 0)), U32(1 if d > 0 else 0),
            U32(~((1 << d) - 1) & 0xFFFFFFFF), U32(k), U32(~((1 << s) - 1) & 0xFFFFFFFF),
            U32((emin + 127) << 23), F32(math.ldexp(1.0, c1)), F32(math.ldexp(1.0, -q - c1)),
            F32(math.ldexp(1.0, q)), F32(math.ldexp(1.0, nbits)), U32((1 << nbits) & 0xFFFFFFFF), big, ovf == OVF_NAN)


@njit(inline="always")
def sr_f32(u, rnd, d, hm1_d, lsb_d, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n, max_bits, big, ovf_nan,
           negzero):
    """Stochastic rounding of the float32 with bits ``u`` (uint32) with the random word ``rnd`` (< 2**nbits,
    uint32): the result's bits (module doc)."""
    a = U32(u & ABS)
    a1 = U32(U32(U32(a + hm1_d) + U32(U32(a >> (d & U32(31))) & lsb_d)) & mask_d)  # each step on uint32
    rn = U32(U32(a1 + shl32(shr32(U32(rnd), U32(k)), U32(d))) & mask_s)
    t = (a.view(F32) * p1) * p2
    # kf is used only where a lies below the smallest normal, so t < 2**man <= 2**22: the signed conversions, which
    # AVX2 has in vector lanes (the unsigned ones are emulated there: 2.27 -> 1.95 ms per 2**20 e5m2, one thread)
    kf = F32(np.int32(t))
    dr = U32(np.rint((t - kf) * pn))
    up = (dr != U32(0)) & (rnd >= U32(two_n - dr))
    lo = F32(F32(kf + F32(1.0 if up else 0.0)) * pq).view(U32)
    return _finish(u, a, lo if a < mn_bits else rn, max_bits, big, ovf_nan, negzero)


@intrinsic
def _prefetch(typingctx, arr, idx):
    """A read hint for the cache line of ``arr[idx]`` (``llvm.prefetch``; no effect on any value, lowered to
    nothing on targets without prefetch instructions). idx must lie in arr (not checked)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), cgutils.voidptr_t)
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32,
                                                                                           i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all cache levels, data cache
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


# The loops run over chunks of CHUNK elements, and before each chunk hint the lines of the chunk AHEAD elements
# further on. In training the source (a fresh gradient, a weight) is seldom in cache, and each step of the
# stochastic loop holds too many instructions for the out-of-order window to keep enough loads in flight:
# measured (one thread, 2**16 float32 not in cache, e5m2) 2.1 -> 1.2 ns/element, the in-cache time being 1.15;
# nearest 0.85 -> 0.35. Indices are unsigned: numba's negative-index wraparound otherwise turns the contiguous
# loads into gathers. Called on one array when src is dst: LLVM's overlap check between two arrays fails there
# and runs the scalar loop (8x slower, measured). Compiled functions of their own, called from kernels/cpu.py's
# f32_* loops (inlined there, each extra loop multiplied numba's compile time of those functions: 7 s -> 40 s).
CHUNK = 256  # 1 KiB of float32: 16 cache lines of 64 bytes
AHEAD = 1024  # 4 KiB
LINE = 16  # float32 values per 64-byte line


@njit(inline="always")
def hint(src, c0, n):
    """Prefetch the lines of src[c0 + AHEAD : c0 + AHEAD + CHUNK] that lie inside src's n elements."""
    p = c0 + U64(AHEAD)
    end = min(p + U64(CHUNK), n)
    while p < end:
        _prefetch(src, p)
        p += U64(LINE)


@njit(inline="always")
def _nearest_loop(lo, hi, src, dst, man, emin, sub, max_bits, ovf, negzero):
    """dst[i] = ``nearest_f32``(src[i]) for i in lo..hi-1, in chunks of CHUNK from lo."""
    s, hm1, mask, magic, mn_bits, big, ovf_nan = nearest_params(man, emin, sub, max_bits, ovf)
    mb = U32(max_bits)
    n = U64(src.size)
    end = U64(hi)
    for c0 in range(U64(lo), end, U64(CHUNK)):
        prefer_wide_vectors()
        hint(src, c0, n)
        for i in range(c0, min(c0 + U64(CHUNK), end)):
            dst[i] = nearest_f32(src[i], s, hm1, mask, magic, mn_bits, mb, big, ovf_nan, negzero)


@njit(inline="always")
def _mix64_high(z):
    """The top 32 bits of ``mix64(z)`` before its last xor-shift (z ^ z >> 31), which reaches them only through
    bit 63: the loops apply it to this half alone, as h ^ h >> 31 on 32-bit lanes (twice as many to a vector)."""
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    return U32(((z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)) >> U64(32))


@intrinsic
def stack_words(typingctx, tag):
    """A C-contiguous uint32 array of CHUNK elements in the calling compiled function's stack frame (allocated
    once at its entry; no meminfo, so nothing to free). ``tag`` is unused (the range kernels pass their first
    index; called inside a prange body, the chunk index would give every thread its own frame and buffer)."""
    if not isinstance(tag, types.Integer):
        return None
    arrty = types.Array(types.uint32, 1, "C")

    def codegen(context, builder, signature, args):
        intp = context.get_value_type(types.intp)
        buf = cgutils.alloca_once(builder, ir.IntType(32), size=CHUNK)
        ary = context.make_array(arrty)(context, builder)
        context.populate_array(ary, data=buf, shape=[intp(CHUNK)], strides=[intp(4)], itemsize=intp(4),
                               meminfo=None)
        return ary._getvalue()

    return arrty(tag), codegen


@njit(inline="always")
def fill_words(words, key, base, c0, m):
    """words[j] for j < m: the top half of element base + c0 + j's generator word before its last xor-shift
    (``_mix64_high``); the counter computed once and advanced by one add per element."""
    ctr = U64(key) + (U64(base) + c0 + ONE) * GOLDEN
    for j in range(m):
        words[j] = _mix64_high(ctr)
        ctr += GOLDEN


@njit(inline="always")
def word_bits(h, drop):
    """``scalar.random_bits``'s value from a word of ``fill_words`` (drop = 32 - nbits, uint32)."""
    return shr32(U32(h ^ shr32(h, U32(31))), drop)


@njit(inline="always")
def _sr_loop(lo, hi, src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base, neg_nan):
    """dst[i] = ``sr_f32``(src[i]) for i in lo..hi-1, in chunks of CHUNK from lo; element i gets
    ``scalar.random_bits(key, base + i, nbits)``: the generator's counter key + (base + i + 1) * golden is computed
    once per chunk and then advanced by one add (the same uint64 value, wrapping alike): one 64-bit vector
    multiply fewer per 8 elements, which LLVM does not strength-reduce (measured 1.57 -> 1.33 ns/element, 2**14
    float32, one thread). The chunk's random words are written to a stack buffer first, then read by the rounding
    loop: in one loop LLVM ran every shift of the words on 64-bit lanes and truncated them twice."""
    d, hm1, lsb, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n, big, ovf_nan = sr_params(man, emin, sub,
                                                                                           max_bits, ovf, nbits)
    mb = U32(max_bits)
    n = U64(src.size)
    end = U64(hi)
    drop = U32(32 - nbits)
    words = stack_words(lo)
    for c0 in range(U64(lo), end, U64(CHUNK)):
        prefer_wide_vectors()
        hint(src, c0, n)
        m = min(c0 + U64(CHUNK), end) - c0
        fill_words(words, key, base, c0, m)
        for j in range(m):
            rnd = word_bits(words[j], drop)  # scalar.random_bits(key, base + c0 + j, nbits)
            u = src[c0 + j]
            r = sr_f32(u, rnd, d, hm1, lsb, mask_d, k, mask_s, mn_bits, p1, p2, pq, pn, two_n, mb, big, ovf_nan,
                       negzero)
            if neg_nan:  # a constant where inlined: unsigned formats (kernels/p3109_cpu.py), x < 0 -> NaN
                r = NAN32 if (u > SIGN) & (u <= NEG_INF32) else r
            dst[c0 + j] = r


# One serial kernel per rounding over a range of elements (lo..hi-1, a multiple of CHUNK for lo where the range is
# a share of a parallel run); ``shares.launcher`` runs it over numba's threads. src and dst: uint32 arrays (float32
# bits; dst may be src, then the loop runs on one array: LLVM's overlap check between two arrays fails there and
# runs the scalar loop, 8x slower, measured).
@njit(cache=True, nogil=True)
def nearest_range(lo, hi, src, dst, man, emin, sub, max_bits, ovf, negzero):
    """dst[i] = ``nearest_f32``(src[i]) for i in lo..hi-1."""
    if src.ctypes.data == dst.ctypes.data:
        _nearest_loop(lo, hi, dst, dst, man, emin, sub, max_bits, ovf, negzero)
    else:
        _nearest_loop(lo, hi, src, dst, man, emin, sub, max_bits, ovf, negzero)


@njit(cache=True, nogil=True)
def sr_range(lo, hi, src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base):
    """dst[i] = ``sr_f32``(src[i]) with element base + i's random bits (``scalar.random_bits``), i in lo..hi-1."""
    if src.ctypes.data == dst.ctypes.data:
        _sr_loop(lo, hi, dst, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base, False)
    else:
        _sr_loop(lo, hi, src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base, False)


def nearest_serial(src, dst, man, emin, sub, max_bits, ovf, negzero):
    """``nearest_range`` over all of src."""
    nearest_range(0, src.size, src, dst, man, emin, sub, max_bits, ovf, negzero)


def nearest_parallel(src, dst, man, emin, sub, max_bits, ovf, negzero):
    """``nearest_serial`` in shares on numba's threads (``shares.launcher``; the caller holds parallel.py's lock)."""
    launcher(nearest_range)(src.size, src, dst, man, emin, sub, max_bits, ovf, negzero)


def sr_serial(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base):
    """``sr_range`` over all of src."""
    sr_range(0, src.size, src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, base)


def sr_parallel(src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits):
    """``sr_serial`` with base 0 in shares on numba's threads (see ``nearest_parallel``)."""
    launcher(sr_range)(src.size, src, dst, man, emin, sub, max_bits, ovf, negzero, key, nbits, 0)
