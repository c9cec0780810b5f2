"""Uniform cubic B-splines on a clamped input range: the basis, its slopes, the sigmoid fit.

``K`` basis functions cover ``[lo, hi]`` with ``G = K - 3`` knot intervals of width
``h = (hi - lo) / G``; the knots are ``lo + (j - 3) h`` for ``j = 0 .. K + 3`` (three beyond each
end), so basis ``k`` is supported on ``[lo + (k - 3) h, lo + (k + 1) h]``. On interval ``s``
(``x = lo + (s + t) h``, ``t`` in [0, 1]) exactly the bases ``s .. s + 3`` are nonzero, with the
uniform cubic pieces (de Boor 1978, ch. IX; ``t`` is the local parameter)::

    P0 = (1 - t)^3 / 6      P1 = (3t^3 - 6t^2 + 4) / 6      P2 = (-3t^3 + 3t^2 + 3t + 1) / 6      P3 = t^3 / 6

``P0 + P1 + P2 + P3 = 1`` for every ``t``: the basis is a partition of unity on the whole of
``[lo, hi]``, its ends included (DESIGN.md defect 3: the plan put 8 bases on 9 unit-spaced knots
and dropped the out-of-range ones, so near both ends its basis summed to less than 1). The slopes
are ``dP/dt = (-(1 - t)^2 / 2, (3t^2 - 4t) / 2, (-3t^2 + 2t + 1) / 2, t^2 / 2)`` (defect 2: the plan
wrote ``-3t^2 + 2t + 0.5`` for the third), and ``d/dx = (1 / h) d/dt``.

Inputs outside ``[lo, hi]`` are clamped to it, so there the spline is constant and its
derivative with respect to the input is 0 (defect 3). All functions take the array module ``xp``
(NumPy or CuPy) and keep the dtype of their input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

Array = Any
DEGREE = 3
PIECES = DEGREE + 1  # nonzero bases at any point


@dataclass(frozen=True)
class Grid:
    """The spline's input range and basis count."""

    lo: float = -4.0
    hi: float = 4.0
    num_bases: int = 8

    def __post_init__(self) -> None:
        if not self.hi > self.lo:
            raise ValueError(f"grid: hi ({self.hi}) must be above lo ({self.lo})")
        if self.num_bases < PIECES:
            raise ValueError(f"grid: a cubic spline needs at least {PIECES} bases, got {self.num_bases}")

    @property
    def intervals(self) -> int:
        """Knot intervals inside ``[lo, hi]`` (``G = K - 3``)."""
        return self.num_bases - DEGREE

    @property
    def step(self) -> float:
        """Knot spacing ``h``."""
        return (self.hi - self.lo) / self.intervals

    def knots(self) -> np.ndarray:
        """All ``K + 4`` knots, three beyond each end of the range."""
        return self.lo + (np.arange(self.num_bases + PIECES) - DEGREE) * self.step


def pieces(xp: Any, t: Array) -> tuple[Array, Array, Array, Array]:
    """The four nonzero basis values ``(P0, P1, P2, P3)`` at local parameter ``t``."""
    t2 = t * t
    t3 = t2 * t
    u = 1 - t
    return u * u * u / 6, (3 * t3 - 6 * t2 + 4) / 6, (-3 * t3 + 3 * t2 + 3 * t + 1) / 6, t3 / 6


def piece_slopes(xp: Any, t: Array) -> tuple[Array, Array, Array, Array]:
    """``d/dt`` of :func:`pieces` (the third is ``(-3t^2 + 2t + 1) / 2``, defect 2)."""
    t2 = t * t
    u = 1 - t
    return -u * u / 2, (3 * t2 - 4 * t) / 2, (-3 * t2 + 2 * t + 1) / 2, t2 / 2


# The pieces as cubics in t, row p = (P_p's coefficients of 1, t, t^2, t^3): the same four
# polynomials as :func:`pieces`, in the power basis that the twin evaluates by Horner's rule.
PIECE_POWERS = np.array([[1.0, -3.0, 3.0, -1.0],
                         [4.0, 0.0, -6.0, 3.0],
                         [1.0, 3.0, 3.0, -3.0],
                         [0.0, 0.0, 0.0, 1.0]]) / 6


@lru_cache(maxsize=32)
def power_map(grid: Grid) -> np.ndarray:
    """The linear map from a unit's K coefficients to its spline on each interval as a cubic in
    ``t``: ``[K, G + 1, 4]``, so that on interval ``s`` the spline is ``sum_q (c @ M)[s, q] t^q``.
    Slot ``G`` is the last interval's cubic continued past ``hi`` (re-expanded about ``t = 1``), so
    that ``u = (x - lo) / h`` lands in slot ``floor(u)`` at ``t = u - floor(u)`` for every clamped
    ``x``, ``x = hi`` included, with no clamp of the slot. The transpose maps per-slot moments
    ``sum md t^q`` back to coefficient gradients."""
    g = grid.intervals
    m = np.zeros((grid.num_bases, g + 1, PIECES))
    for s in range(g):
        m[s : s + PIECES, s, :] = PIECE_POWERS
    # p(1 + t) = sum_j t^j sum_q C(q, j) a_q
    shift = np.array([[math.comb(q, j) for j in range(PIECES)] for q in range(PIECES)], dtype=float)
    m[:, g, :] = m[:, g - 1, :] @ shift
    m.setflags(write=False)
    return m


# ---- the knot-power form: what the fused GLU kernels evaluate (kernels/kan_fragment.cuh) ----
# The same spline space written without a search for the interval. With u = (clamp(x) - lo) / h in
# [0, G] and the middle interval [m, m + 1], m = (G - 1) // 2, centre c = m + 1/2:
#
#     S(u) = a0 + a1 (u - c) + a2 (u - c)^2 + a3 (u - c)^3
#            + sum_{i = m+1}^{G-1} d_i (u - i)_+^3 + sum_{i = 1}^{m} e_i (i - u)_+^3
#
# G + 3 = K coefficients a unit, like the B-spline's: (a0..a3, d_{m+1}..d_{G-1}, e_m..e_1). Each
# truncated cube is 0 on the middle interval and is a cubic everywhere else, one-sided at its knot,
# so that the sum is a cubic on every interval with continuous second derivative: the uniform cubic
# spline again. Centring the polynomial and opening the cubes outwards from the middle keeps every
# term small on [0, G] (|u - c| <= G / 2 and a cube's argument at most G / 2), so float32 loses
# little to cancellation. An element then needs no interval: no data-dependent loads of its
# coefficients, which a GEMM epilogue reads once per unit for all its rows.


def knot_middle(grid: Grid) -> int:
    """``m``: the middle interval's first knot (in units of ``h`` from ``lo``)."""
    return (grid.intervals - 1) // 2


def knot_terms(xp: Any, u: Array, grid: Grid) -> list[Array]:
    """The knot-power basis at ``u`` (``(clamp(x) - lo) / h``): the K functions whose coefficients
    :func:`knot_power_map` gives, in that order."""
    g, m = grid.intervals, knot_middle(grid)
    s = u - (m + 0.5)
    out = [xp.ones_like(u), s, s * s, s * s * s]
    out += [xp.maximum(u - i, 0) ** 3 for i in range(m + 1, g)]
    out += [xp.maximum(i - u, 0) ** 3 for i in range(m, 0, -1)]
    return out


@lru_cache(maxsize=32)
def knot_power_map(grid: Grid) -> np.ndarray:
    """``[K, K]`` float64: a unit's B-spline coefficients ``c`` in the knot-power form are
    ``c @ M``. Solved on four points of every interval, where both bases are exact cubics (the
    spaces are the same; the tests check the map reproduces the B-spline everywhere)."""
    g = grid.intervals
    u = (np.arange(g)[:, None] + np.array([0.125, 0.375, 0.625, 0.875])).reshape(-1)
    phi = np.stack(knot_terms(np, u, grid), axis=1)  # [4G, K]
    bsp = basis_matrix(np, grid.lo + u * grid.step, grid)  # [4G, K]
    m, *_ = np.linalg.lstsq(phi, bsp, rcond=None)  # phi @ m = bsp: row k of m.T is B_k's form
    out = np.ascontiguousarray(m.T)
    out.setflags(write=False)
    return out


def knot_power_value(xp: Any, x: Array, p: Array, grid: Grid) -> Array:
    """The spline at ``x`` from knot-power coefficients ``p`` [..., K] (broadcast against ``x``):
    the fragment's arithmetic in array operations."""
    u = (xp.fmin(xp.fmax(x, grid.lo), grid.hi) - grid.lo) * (1.0 / grid.step)
    return sum(p[..., j] * f for j, f in enumerate(knot_terms(xp, u, grid)))


@dataclass
class Located:
    """Where inputs fall on the grid: interval ``span`` (first nonzero basis), local ``t``,
    and whether the input was inside ``[lo, hi]`` (where the spline's input slope is not 0)."""

    span: Array  # int, in [0, G - 1]
    t: Array  # in [0, 1]
    inside: Array  # bool


def locate(xp: Any, x: Array, grid: Grid) -> Located:
    """Clamp ``x`` to ``[lo, hi]`` and split it into interval and local parameter.

    ``x = hi`` lands in the last interval at ``t = 1`` (not in a nonexistent interval ``G``). A NaN
    input lands at ``lo`` (``fmax`` drops a NaN operand), as in the kernels; the gate stays NaN
    through the residual term."""
    u = (xp.fmin(xp.fmax(x, grid.lo), grid.hi) - grid.lo) * (1.0 / grid.step)
    span = xp.clip(xp.floor(u), 0, grid.intervals - 1)
    t = u - span
    return Located(span.astype(np.int64), t, (x >= grid.lo) & (x <= grid.hi))


def basis_matrix(xp: Any, x: Array, grid: Grid) -> Array:
    """Every basis function at every input: ``[..., K]`` (dense; the tests' oracle)."""
    loc = locate(xp, x, grid)
    out = xp.zeros(x.shape + (grid.num_bases,), dtype=x.dtype)
    for j, p in enumerate(pieces(xp, loc.t)):
        for k in range(grid.num_bases):
            out[..., k] += xp.where(loc.span + j == k, p, 0)
    return out


def basis_slope_matrix(xp: Any, x: Array, grid: Grid) -> Array:
    """``d B_k / dx`` at every input, ``[..., K]``: 0 where ``x`` is clamped (outside ``[lo, hi]``)."""
    loc = locate(xp, x, grid)
    out = xp.zeros(x.shape + (grid.num_bases,), dtype=x.dtype)
    for j, p in enumerate(piece_slopes(xp, loc.t)):
        for k in range(grid.num_bases):
            out[..., k] += xp.where((loc.span + j == k) & loc.inside, p, 0)
    return out / grid.step


@dataclass(frozen=True)
class SigmoidFit:
    """Least-squares coefficients of the sigmoid on ``[lo, hi]`` and how well they fit."""

    coefficients: np.ndarray  # [K]
    max_error: float  # max |spline - sigmoid| on [lo, hi] (on a grid 10x denser than the fit's)
    rms_error: float  # root mean square of the same
    tail_error: float  # max |spline - sigmoid| over all reals: at +-infinity, sigmoid(lo) and 1 - sigmoid(hi)


def fit_sigmoid(grid: Grid, points: int = 4001) -> SigmoidFit:
    """Least-squares fit of ``sum_k c_k B_k(x)`` to ``sigmoid(x)`` at ``points`` evenly spaced
    inputs of ``[lo, hi]`` (the initial coefficients of every unit; the plan typed eight values)."""
    x = np.linspace(grid.lo, grid.hi, points)
    c, *_ = np.linalg.lstsq(basis_matrix(np, x, grid), _sigmoid(x), rcond=None)
    xe = np.linspace(grid.lo, grid.hi, 10 * points - 9)
    err = basis_matrix(np, xe, grid) @ c - _sigmoid(xe)
    s = basis_matrix(np, np.array([grid.lo, grid.hi]), grid) @ c  # the clamped values beyond the ends
    tail = max(abs(s[0] - 0.0), abs(s[1] - 1.0))
    return SigmoidFit(c, float(np.abs(err).max()), float(np.sqrt(np.mean(err**2))), float(max(tail, np.abs(err).max())))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))
