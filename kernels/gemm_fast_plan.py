"""The host side of ``gemm_fast`` (``kernels/gemm_fast.py``): which units it runs (``fast_applies``), the constants
of its roundings (``fast_params``, ``fast_consts``), and the plan for the operands of a call (``fast_plan``: work
dtype and the flags that drop work which provably cannot change a result). Pure numpy; nothing here is compiled."""
import functools
import math

import numpy as np

from . import operand_scan
from .gemm_scalar import P_EMIN, P_KIND, P_MAN, P_MAXBITS, P_MODE, P_NEGZERO, P_OVF, P_SUB
from .scalar import NEAREST


def fast_params(p: np.ndarray, dtype=np.float64) -> np.ndarray:
    """(split, magic, min_normal, max, overflow value) of ``round_nearest_fast`` for a float parameter vector,
    then the zero ``gemm_cpu``'s roundings add to a zero result (-0.0 keeps a -0, +0.0 where the format has
    no -0), in ``dtype`` arithmetic (float64: 53-bit significands; float32: 24)."""
    t = 53 if np.dtype(dtype) == np.float64 else 24
    man, emin, sub = int(p[P_MAN]), int(p[P_EMIN]), int(p[P_SUB])
    max_value = float(np.array(p[P_MAXBITS], dtype=np.int64).view(np.float64))
    q = emin - man if sub else emin
    ovf = (np.inf, np.nan, max_value)[int(p[P_OVF])]
    zero = -0.0 if p[P_NEGZERO] else 0.0
    return np.array([2.0 ** (t - 1 - man) + 1.0, 1.5 * 2.0 ** (t - 1 + q), 2.0**emin, max_value, ovf, zero],
                    dtype=dtype)


def fast_applies(fused: int, mulp: np.ndarray, accp: np.ndarray) -> bool:
    """Whether ``gemm_fast`` can run the unit's datapath exactly: both roundings to nearest-even FloatFormats,
    not fused, the product format no wider than the accumulator (see the module docstring), and at least one
    mantissa bit in each (with none, ties go to the even *code*, i.e. the even exponent, which Veltkamp's
    split does not see)."""
    return bool(not fused and mulp[P_KIND] == 0 and accp[P_KIND] == 0 and mulp[P_MODE] == NEAREST
                and accp[P_MODE] == NEAREST and 1 <= mulp[P_MAN] <= accp[P_MAN])


def _abs_range(x: np.ndarray) -> tuple[float, float]:
    """(max |x|, smallest nonzero |x|) as float64; (0, inf) when x holds no nonzero value. The numpy reading
    that ``operand_scan.scan`` reproduces in one pass (``fast_plan`` uses the scan; tests compare the two)."""
    a = np.abs(x.astype(np.float64, copy=False))
    nz = a[a != 0]
    return (float(a.max()) if a.size else 0.0), (float(nz.min()) if nz.size else np.inf)


def _significant_bits(x: np.ndarray) -> int:
    """Most significant bits (leading to last set bit) of any nonzero float32 value of x (0 if none)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).reshape(-1)
    sig = (u & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    sig = sig[(u & np.uint32(0x7FFFFFFF)) != 0]
    if sig.size == 0:
        return 0
    low = sig & (~sig + np.uint32(1))  # lowest set bit
    return int(24 - np.log2(low.astype(np.float64)).min())


def fast_plan(A, B, fused, mulp, accp, scans=None, lanes=None, chunk=None):
    """None when ``gemm_fast`` does not apply; else (work dtype, mul_sub, acc_sub, checks, mul_exact).

    scans: None, or (scan of A, scan of B), each None (scan the operand) or ``operand_scan.scan`` of an array
    that holds every nonzero value of that operand (other values and zeros may be there too: the plan is
    then at most more cautious, and every plan this function gives yields the same bits).

    The flags drop work that provably cannot change a result for these operands:
    mul_sub: some nonzero |a*b| may fall below the product format's min_normal;
    acc_sub: some sum may fall below the accumulator's min_normal and round differently there (never when
      the products' quantum, 2**(emin - man) of mul, is at least that min_normal: every sum is a multiple of
      it; nor when the accumulator has subnormals and that quantum is a multiple of the accumulator's
      smallest one: then every product and partial sum is a multiple of it, so an exact sum below min_normal
      has at most man significant bits, the work sum is exact and the normal-range rounding returns it,
      which is the subnormal it rounds to);
    checks: a product or sum may overflow, or an operand is not finite (bound: K terms of |round(a*b)| <=
      max|a| max|b| (1 + 2**-mul man), then at most ``accumulator_depth(K, lanes, chunk)`` accumulator
      roundings on any path from a product to the result, each growing a magnitude by a factor of at most
      1 + 2**-acc man; without lanes and chunk, 2K + 8, which bounds the depth of every datapath).
    mul_exact (never with checks): every product is a value of the product format, so its rounding can be
      skipped: a * b is exact in the work dtype and has at most (significant bits of a) + (those of b)
      <= man + 1 of mul significant bits, no nonzero |a*b| is above max (not checks, which bounds max|a| max|b|
      by it), and none is below min_normal (not mul_sub) or, where the format has subnormals, every product's
      last set bit is at or above the format's smallest quantum 2**(emin - man) (a nonzero value's last set
      bit lies at or above 2**(floor(log2 min|x|) - bits + 1)): a multiple of that quantum below min_normal is
      a subnormal of the format (the fp8 recipe's e5m2 operands and e6m9 products, for one).
    float32 work: exact when every product is exact in binary32 (significant bits of a plus those of b <= 24,
    no underflow), every product and partial sum stays below 2**100 (so Veltkamp's c = x * split cannot
    overflow), both formats' smallest quanta are >= 2**-100-ish, and 2 * (acc man + 1) <= 21, which keeps the
    binary32 sums as good as exact (module docstring's argument with 24-bit instead of 53-bit sums).
    """
    if not fast_applies(fused, mulp, accp):
        return None
    K = A.shape[2]
    sa, sb = (None, None) if scans is None else scans
    amax, amin, abits = operand_scan.scan(A) if sa is None else sa  # one pass each: _abs_range and
    bmax, bmin, bbits = operand_scan.scan(B) if sb is None else sb  # _significant_bits, same results
    (mul_man, mul_emin, mul_subn, mul_max, log_mul_ulp), (acc_man, acc_emin, acc_subn, acc_max, log_acc_ulp) = (
        _format_consts(mulp), _format_consts(accp))
    amax, amin, bmax, bmin = float(amax), float(amin), float(bmax), float(bmin)
    finite = math.isfinite(amax) and math.isfinite(bmax)
    mul_sub = not (amin * bmin >= 2.0**mul_emin)
    acc_sub = not (mul_emin - mul_man >= acc_emin
                   or (acc_subn and mul_emin - mul_man >= acc_emin - acc_man))
    top = amax * bmax
    log_bound = math.inf  # log2 of a bound on every |product| and |partial sum|
    if finite:
        log_bound = -math.inf if top == 0.0 else (math.log2(max(K, 1)) + math.log2(top) + log_mul_ulp
                                                  + accumulator_depth(K, lanes, chunk) * log_acc_ulp)
    checks = not (finite and top <= mul_max and log_bound < math.log2(acc_max) - 1e-9)
    dtype = np.float64
    if (2 * (acc_man + 1) <= 21 and log_bound <= 100 and amin * bmin >= 2.0**-100
            and mul_emin - (mul_man if mul_subn else 0) >= -100 and acc_emin >= -100
            and abits + bbits <= 24):
        dtype = np.float32
    mul_exact = not checks and abits + bbits <= mul_man + 1 and (
        not mul_sub or (mul_subn and _last_bit(amin, abits) + _last_bit(bmin, bbits) >= mul_emin - mul_man))
    return dtype, mul_sub, acc_sub, checks, mul_exact


def _last_bit(smallest: float, bits: int) -> int:
    """A lower bound on the exponent of the last set bit of every nonzero value of an operand whose smallest
    nonzero magnitude is ``smallest`` (finite, > 0) and whose values have at most ``bits`` significant bits."""
    return math.frexp(smallest)[1] - 1 - bits + 1


def accumulator_depth(K: int, lanes=None, chunk=None) -> int:
    """The most accumulator roundings on the way from one product to a dot product's result on the datapath of
    ``emunum.mad`` (``gemm_fast``'s loops) with ``lanes`` w and ``chunk`` C (0 or None: no chunking): the
    additions into the inner accumulator of the product's chunk (at most C, and at most the ceil(K / w) terms of
    the fullest lane), the chunk closes after it (one per remaining chunk of that lane), the pairwise lane sums
    (ceil(log2 w) levels) and the bias addition. Every partial sum holds products and gains at most one factor
    (1 + 2**-man) per rounding on its way, so its magnitude is at most K max|product| (1 + 2**-man)**depth.
    lanes None: the datapath is not given; 2K + 8 then bounds every one (each lane's terms, then each chunk's
    close, at most K of each; ceil(log2 64) lane levels and the bias)."""
    K = max(int(K), 1)
    if lanes is None:
        return 2 * K + 8
    lanes = int(lanes)
    per_lane = -(-K // lanes)  # terms of the fullest lane (lane 0)
    if chunk:
        inner, closes = min(int(chunk), per_lane), -(-per_lane // int(chunk))
    else:
        inner, closes = per_lane, 0
    return inner + closes + (lanes - 1).bit_length() + 1


def _format_consts(p) -> tuple:
    """(man, emin, subnormals, max, log2(1 + 2**-man)) of a float parameter vector, as Python numbers (numpy
    scalar arithmetic costs a microsecond an operation; ``fast_plan`` runs once per GEMM)."""
    return _format_consts_cached(np.asarray(p, np.int64).tobytes())


@functools.lru_cache(maxsize=256)
def _format_consts_cached(key: bytes) -> tuple:
    p = np.frombuffer(key, np.int64)
    man = int(p[P_MAN])
    return (man, int(p[P_EMIN]), bool(p[P_SUB]), float(np.array(p[P_MAXBITS], dtype=np.int64).view(np.float64)),
            float(np.log2(1.0 + 2.0**-man)))


def fast_consts(mulp: np.ndarray, accp: np.ndarray, dtype) -> tuple:
    """(fast_params(mulp, dtype), fast_params(accp, dtype), fast_params(accp)): the constants one ``gemm_fast``
    call takes, computed once per unit and work dtype (the arrays are shared: callers must not write to them)."""
    # keyed by the dtype as given (np.float32 or np.dtype("float32"): equal results); np.dtype(...).name costs
    # more than the rest of the lookup
    return _fast_consts(np.asarray(mulp, np.int64).tobytes(), np.asarray(accp, np.int64).tobytes(), dtype)


@functools.lru_cache(maxsize=256)
def _fast_consts(mul: bytes, acc: bytes, dtype) -> tuple:
    mulp, accp = np.frombuffer(mul, np.int64), np.frombuffer(acc, np.int64)
    return fast_params(mulp, np.dtype(dtype)), fast_params(accp, np.dtype(dtype)), fast_params(accp)
