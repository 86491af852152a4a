"""Exact reference of the multi-term (tensor-core) datapath of ``MADUnit``, in Python integers and fractions.

Slow and obviously right: a second, independent implementation of the datapath written out in
``emunum.mad.unit`` (terms, alignment, carries, promotion, exact accumulation), for the tests and the
hardware-validation script. It shares no code with the kernels: its own exponent extraction, its own
alignment by integer division, its own rounding of rationals (deterministic modes only).
"""
from __future__ import annotations

from fractions import Fraction

from ..formats import FloatFormat, RoundMode, Special


def floor_log2(a: Fraction) -> int:
    """floor(log2(a)) for a > 0."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return e


def _round_int(y: Fraction, neg: bool, mode: RoundMode) -> int:
    """|x| / quantum = y >= 0 rounded to an integer in mode (sign neg of x)."""
    k = y.numerator // y.denominator
    r = y - k
    if r == 0:
        return k
    half = Fraction(1, 2)
    up = {RoundMode.NEAREST: r > half or (r == half and k % 2 == 1),
          RoundMode.NEAREST_AWAY: r >= half,
          RoundMode.TOWARD_ZERO: False,
          RoundMode.UP: not neg,
          RoundMode.DOWN: neg,
          RoundMode.ODD: k % 2 == 0}[mode]
    return k + 1 if up else k


def round_fraction(x: Fraction, fmt: FloatFormat, mode: RoundMode) -> Fraction | float:
    """x rounded once to ``fmt`` in a deterministic ``mode``; overflow by the format's rules (±inf as float)."""
    mode = RoundMode.parse(mode)
    if mode == RoundMode.STOCHASTIC:
        raise ValueError("the multi-term reference covers deterministic rounding modes only")
    if x == 0:
        return Fraction(0)
    neg = x < 0
    a = -x if neg else x
    e = max(floor_log2(a), fmt.emin if fmt.subnormals else floor_log2(a))
    q = Fraction(2) ** (e - fmt.man)
    k = _round_int(a / q, neg, mode)
    r = k * q
    if not fmt.subnormals and r < Fraction(fmt.min_normal):
        r = Fraction(fmt.min_normal) if k > 0 and mode != RoundMode.TOWARD_ZERO else r
    mx = Fraction(fmt.max)
    if r > mx:
        directed_in = {RoundMode.TOWARD_ZERO: True, RoundMode.ODD: True, RoundMode.UP: neg, RoundMode.DOWN: not neg}
        if fmt.saturate or directed_in.get(mode, False) or fmt.special == Special.NONE:
            r = mx
        else:
            return float("-inf") if (neg and fmt.special == Special.IEEE) else (
                float("inf") if fmt.special == Special.IEEE else float("nan"))
    return -r if neg else r


def operand_exponent(x: Fraction, emin: int) -> int:
    """The exponent the datapath gives a nonzero operand: floor(log2|x|), at least ``emin`` (subnormals keep
    the format's minimum exponent and a significand below 1)."""
    return max(floor_log2(abs(x)), emin)


def _align(t: Fraction, quantum: Fraction, mode: RoundMode) -> Fraction:
    neg = t < 0
    k = _round_int(abs(t) / quantum, neg, mode)
    return (-k if neg else k) * quantum


def fused_step(terms: list[tuple[Fraction, int]], c: Fraction, c_exp_min: int, *, align_bits: int | None,
               align_rounding: RoundMode, align_floor: int | None, carry_bits: int | None,
               acc_fmt: FloatFormat | None, acc_rounding: RoundMode) -> Fraction:
    """One multi-term step: terms (value, exponent) of the products and the accumulator c.

    E = max(exponents of the nonzero terms and of c, align_floor); each term aligned to a multiple of
    2**(E - align_bits) in align_rounding (None: no alignment loss); the aligned sum wrapped to
    1 + 2 + carry_bits + align_bits bits (two's complement; None: no wrap); rounded to acc_fmt (None: exact).
    """
    items = [(v, e) for v, e in terms if v != 0]
    if c != 0:
        items.append((c, operand_exponent(c, c_exp_min)))
    if not items:
        return Fraction(0)
    E = max(e for _, e in items)
    if align_floor is not None:
        E = max(E, align_floor)
    if align_bits is None:
        s = sum(v for v, _ in items)
    else:
        quantum = Fraction(2) ** (E - align_bits)
        s = sum(_align(v, quantum, align_rounding) for v, _ in items)
        if carry_bits is not None:
            width = 3 + carry_bits + align_bits
            k = s / quantum
            k = (int(k) + 2 ** (width - 1)) % 2**width - 2 ** (width - 1)
            s = k * quantum
    return s if acc_fmt is None else round_fraction(s, acc_fmt, acc_rounding)


def dot_multiterm(a: list, b: list, c, *, terms: int, in_emin: int, align_bits: int | None,
                  align_rounding=RoundMode.TOWARD_ZERO, align_floor: int | None = None,
                  carry_bits: int | None = None, acc_fmt: FloatFormat, acc_rounding=RoundMode.TOWARD_ZERO,
                  promote_every: int | None = None, outer_fmt: FloatFormat | None = None,
                  outer_rounding=RoundMode.NEAREST, mul_fmt: FloatFormat | None = None,
                  mul_rounding=RoundMode.NEAREST):
    """d = a.b + c on the chained multi-term datapath (c enters the first step); returns a Fraction or ±inf/NaN.

    Steps take ``terms`` products in increasing k; each step's result is the next step's accumulator. Products
    are exact with exponent ea + eb (each at least ``in_emin``), or rounded to ``mul_fmt`` (then exponent
    floor(log2|p|), at least mul_fmt.emin). With ``promote_every`` P, the running step accumulator is added
    into an outer accumulator (rounded to ``outer_fmt`` in ``outer_rounding``) after every P products and
    after the last, and restarts at +0; c enters the first step only.
    Specials (an overflow to ±inf or NaN in a step, a promotion or a rounded product) follow IEEE arithmetic
    from there on, as in the kernels: later finite values leave them as they are, and later specials add to
    them (+inf + -inf = NaN). That needs acc_fmt (and outer_fmt) with IEEE infinities; with other formats an
    overflow gives NaN or a saturated value, and the first special is returned.
    """
    a = [Fraction(x) for x in a]
    b = [Fraction(x) for x in b]
    acc = Fraction(c)
    outer = Fraction(0)
    K = len(a)
    align_rounding, acc_rounding = RoundMode.parse(align_rounding), RoundMode.parse(acc_rounding)
    ieee = acc_fmt is not None and acc_fmt.special == Special.IEEE and not acc_fmt.saturate and (
        promote_every is None or (outer_fmt is not None and outer_fmt.special == Special.IEEE
                                  and not outer_fmt.saturate))
    for s0 in range(0, max(K, 1), terms):
        items, specials = [], []
        for k in range(s0, min(K, s0 + terms)):
            if a[k] == 0 or b[k] == 0:
                continue
            if mul_fmt is None:
                items.append((a[k] * b[k], operand_exponent(a[k], in_emin) + operand_exponent(b[k], in_emin)))
            else:
                p = round_fraction(a[k] * b[k], mul_fmt, mul_rounding)
                if not isinstance(p, Fraction):
                    if not ieee:
                        return p
                    specials.append(p)
                elif p != 0:
                    items.append((p, operand_exponent(p, mul_fmt.emin)))
        if specials or not isinstance(acc, Fraction):  # a special step: finite terms cannot change it
            acc = sum(specials, 0.0 if isinstance(acc, Fraction) else acc)
        else:
            acc = fused_step(items, acc, acc_fmt.emin, align_bits=align_bits, align_rounding=align_rounding,
                             align_floor=align_floor, carry_bits=carry_bits, acc_fmt=acc_fmt,
                             acc_rounding=acc_rounding)
        if not isinstance(acc, Fraction) and not ieee:
            return acc
        end = min(K, s0 + terms)
        if promote_every is not None and (end % promote_every == 0 or end == K):
            if isinstance(outer, Fraction) and isinstance(acc, Fraction):
                outer = round_fraction(outer + acc, outer_fmt, outer_rounding)
            else:
                outer = float(outer) + float(acc)
            if not isinstance(outer, Fraction) and not ieee:
                return outer
            acc = Fraction(0)
    return outer if promote_every is not None else acc


def dot_exact(a: list, b: list, c, out_fmt: FloatFormat, rounding=RoundMode.NEAREST):
    """Kulisch accumulation: the exact a.b + c rounded once to out_fmt in ``rounding``."""
    s = Fraction(c) + sum(Fraction(x) * Fraction(y) for x, y in zip(a, b))
    return round_fraction(s, out_fmt, RoundMode.parse(rounding))
