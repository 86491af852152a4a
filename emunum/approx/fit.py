"""Design-time coefficient fitting, in float64 / exact rationals (numpy; never traced, never on the data path).

- ``tanh_taylor(n)``: the first n odd Taylor coefficients of tanh (exact, from Bernoulli numbers).
- ``lambert_tanh(depth)``: numerator/denominator of the depth-n truncation of Lambert's continued fraction
  tanh x = x / (1 + x^2 / (3 + x^2 / (5 + ...))), which is a Pade approximant of tanh.
- ``remez(f, powers, lo, hi)``: the minimax (equioscillating) polynomial sum c_j x**powers[j] on [lo, hi].
- ``best_clip(model, target, candidates)``: the input clamp c that minimises the overall max error of
  ``sign(x) * min(model(min(|x|, c)), 1)`` against a target saturating at 1.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np


def _bernoulli(n: int) -> list[Fraction]:
    b = [Fraction(0)] * (n + 1)
    b[0] = Fraction(1)
    for m in range(1, n + 1):
        b[m] = -sum(math.comb(m + 1, k) * b[k] for k in range(m)) / (m + 1)
    return b


@lru_cache(maxsize=None)
def tanh_taylor(n: int) -> tuple[float, ...]:
    """Coefficients c_k of x**(2k+1), k = 0..n-1, in tanh x = sum c_k x**(2k+1) (|x| < pi/2)."""
    b = _bernoulli(2 * n)
    out = []
    for k in range(1, n + 1):
        c = Fraction(2 ** (2 * k) * (2 ** (2 * k) - 1)) * b[2 * k] / math.factorial(2 * k)
        out.append(float(c))
    return tuple(out)


@lru_cache(maxsize=None)
def lambert_tanh(depth: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(p, q): tanh x ~ x * P(x^2) / Q(x^2), P = sum p_k u^k, Q = sum q_k u^k, normalised to q_0 = 1.

    Convergents of K = 1 + u/(3 + u/(5 + ... + u/(2*depth-1))): A_j = b_j A_{j-1} + u A_{j-2},
    B_j likewise, and tanh x ~ x * B / A."""
    a_prev, a = [1], [1]  # A_{-1}, A_0 as integer coefficient lists in u
    b_prev, b = [0], [1]
    for j in range(1, depth):
        bj = 2 * j + 1
        a_prev, a = a, _poly_add([bj * c for c in a], [0] + a_prev)
        b_prev, b = b, _poly_add([bj * c for c in b], [0] + b_prev)
    while len(b) > 1 and b[-1] == 0:
        b.pop()
    q0 = Fraction(a[0])
    return tuple(float(Fraction(c) / q0) for c in b), tuple(float(Fraction(c) / q0) for c in a)


def _poly_add(p, q):
    n = max(len(p), len(q))
    return [(p[i] if i < len(p) else 0) + (q[i] if i < len(q) else 0) for i in range(n)]


def remez(f, powers, lo: float, hi: float, grid: int = 4001, iters: int = 60):
    """Minimax coefficients of sum c_j x**powers[j] for f on [lo, hi] (absolute error); returns (c, max_err).

    Exchange algorithm on a dense grid (Chebyshev-spaced); stops when the levelled error and the grid
    maximum agree to 1e-9 relative."""
    powers = np.asarray(powers)
    n = len(powers)
    t = np.linspace(0.0, np.pi, grid)
    xs = lo + (hi - lo) * (1 - np.cos(t)) / 2
    if powers.min() > 0 and lo == 0.0:
        xs = xs[1:]  # every basis function vanishes at 0: so does the error
    fx = f(xs)
    vander = xs[:, None] ** powers[None, :]
    ref = np.unique(np.linspace(0, len(xs) - 1, n + 1).round().astype(int))
    best = (None, np.inf)
    for _ in range(iters):
        a = np.hstack([vander[ref], ((-1.0) ** np.arange(len(ref)))[:, None]])
        sol = np.linalg.lstsq(a, fx[ref], rcond=None)[0]
        c, lev = sol[:n], abs(sol[n])
        err = fx - vander @ c
        emax = np.abs(err).max()
        if emax < best[1]:
            best = (c, emax)
        if emax - lev <= 1e-9 * emax:
            break
        # one extremum per run of equal sign, then trim to n+1 alternating points
        sign = np.sign(err)
        cuts = np.flatnonzero(np.diff(sign) != 0) + 1
        runs = np.split(np.arange(len(xs)), cuts)
        ext = [r[np.argmax(np.abs(err[r]))] for r in runs]
        while len(ext) > n + 1:
            ext.pop(0 if abs(err[ext[0]]) < abs(err[ext[-1]]) else -1)
        if len(ext) < n + 1:
            break
        ref = np.array(ext)
    return best


def saturating_error(model, target, c: float, hi: float = 16.0, grid: int = 8193) -> float:
    """Max |target(a) - min(model(min(a, c)), 1)| over a in [0, hi] (float64 model, no rounding)."""
    a = np.linspace(0.0, hi, grid)
    a = np.union1d(a, np.linspace(0.0, c, grid))
    y = np.minimum(model(np.minimum(a, c)), 1.0)
    return float(np.abs(target(a) - y).max())


def best_clip(model_for_clip, target, lo: float = 0.25, hi: float = 8.0, step: float = 1 / 32) -> float:
    """The clamp c in [lo, hi] (a multiple of ``step``) minimising ``saturating_error``.

    ``model_for_clip(c)`` returns the model fitted for that clamp (the fit may depend on c)."""
    cands = np.arange(lo, hi + step / 2, step)
    errs = [saturating_error(model_for_clip(c), target, c) for c in cands]
    return float(cands[int(np.argmin(errs))])
