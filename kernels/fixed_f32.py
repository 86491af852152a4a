"""Round to nearest of float32 data to a saturating fixed-point format in float32 lanes (kernels/cpu.py's
``fixed_range``, where ``nearest_ok`` holds): the bits of ``scalar.round_fixed_value``'s NEAREST branch, which
works in float64 and whose result is stored to float32; 16 lanes of AVX-512 instead of 8 of float64.

Why the same bits, for a float32 x (not NaN), frac_bits f with |f| <= 100, codes lo..hi with -2**24 <= lo <= 0 <=
hi <= 2**24 (every code a float32 integer):
- y = x * 2**f in float32 is the float64 product (a power of two only moves the exponent) unless it leaves
  float32's normal range. Above it, y is +-inf, and the float64 |y| >= 2**128 lies far beyond hi: both saturate
  to lo or hi. Below 2**-126 (only for f < 0 or a subnormal x) the float32 product may be rounded, but both it and
  the float64 |y| lie below 2**-126, far below 1/2: both round to the code 0.
- For |y| < 2**23, (|y| + 2**23) - 2**23 in float32 is |y| rounded to an integer, ties to even (the sum lies in
  [2**23, 2**24), where float32's step is 1): the float64 core's floor plus its tie rule. From 2**23 on every
  float32 is an integer (inf too): k = |y|.
- The code is -k for x < 0, else k (+0 for a zero, as the core's ``(0.0 - k) + 0.0``), clamped to [lo, hi]
  (exact float32 values; +-inf clamps to lo or hi, as the core saturates infinities); times 2**-f it is
  exact in float32 (at most 24 significant bits, |f| <= 100 keeps it inside the normal range or zero), so equal
  to the core's float64 result rounded to float32.
- A NaN comes back quietened with its sign and payload (``u | 0x400000``), as the float64 round trip gives.
The float32 steps assume IEEE arithmetic without flushing subnormals (the float64 core's assumption too: a
flushed subnormal x rounds to 0 in both). tests/kernels/test_cpu.py compares the two over random bit patterns;
``-m exhaustive`` over all 2**32 float32 values.
"""
import math

from numba import njit

from . import _cache
from .elementwise_f32 import ABS, F32, INF_BITS, QUIET, U32, U64
from .wide import prefer_wide_vectors

_cache.guard(__file__, [])

TWO23 = F32(8388608.0)
CODE_LIMIT = 1 << 24


@njit(inline="always")
def nearest_ok(frac_bits, code_min, code_max, saturate):
    """Whether ``nearest_range`` gives ``round_fixed_value``'s bits for this format (module doc)."""
    return saturate != 0 and -100 <= frac_bits <= 100 and -CODE_LIMIT <= code_min <= 0 <= code_max <= CODE_LIMIT


@njit(inline="always")
def nearest_f32(u, sc, usc, lo, hi):
    """The bits of x = u's float32 rounded to nearest (ties to even) to codes lo..hi times usc = 2**-f (sc =
    2**f), saturating (module doc)."""
    x = U32(u).view(F32)
    a = abs(x * sc)
    k = (a + TWO23) - TWO23
    k = a if a >= TWO23 else k
    q = (-k if x < F32(0.0) else k) + F32(0.0)
    v = min(max(q, lo), hi) * usc
    return u | QUIET if (u & ABS) > INF_BITS else F32(v).view(U32)


@njit(inline="always")
def _nearest_loop(lo, hi, src, dst, frac_bits, code_min, code_max):
    sc = F32(math.ldexp(1.0, frac_bits))
    usc = F32(math.ldexp(1.0, -frac_bits))
    cl, ch = F32(code_min), F32(code_max)
    for i in range(U64(lo), U64(hi)):
        dst[i] = nearest_f32(src[i], sc, usc, cl, ch)


@njit(cache=True, nogil=True)
def nearest_range(lo, hi, src, dst, frac_bits, code_min, code_max):
    """dst[i] = ``nearest_f32``(src[i]) for i in lo..hi-1 (src, dst: uint32 views of float32 data). In place, the
    loop reads and writes one array, so LLVM needs no overlap check (which fell back to scalar code: 4x slower,
    as kernels/elementwise_f32.py found)."""
    prefer_wide_vectors()
    if src.ctypes.data == dst.ctypes.data:
        _nearest_loop(lo, hi, dst, dst, frac_bits, code_min, code_max)
    else:
        _nearest_loop(lo, hi, src, dst, frac_bits, code_min, code_max)
