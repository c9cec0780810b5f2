"""The KAN spline gate of one GLU unit, on any array module (the NumPy twin of the CUDA kernels).

For unit ``j`` with coefficients ``c_j`` [K] and residual weight ``r_j``, on pre-activation ``x``::

    raw  = sum_k c_jk B_k(clamp(x, lo, hi)) + r_j x          (B_k: :mod:`.spline`)
    gate = clamp(raw, 0, 1)

and, with ``m = [0 < raw < 1]`` (the output clamp passes the gradient only inside) and
``i = [lo <= x <= hi]`` (the input clamp: the spline is constant outside the range)::

    d gate / d x    = m (i sum_k c_jk B_k'(x) + r_j)
    d gate / d c_jk = m B_k(clamp(x, lo, hi))
    d gate / d r_j  = m x

A unit's residual gradient is summed over the batch into *its own* element ``dr[j]`` (DESIGN.md
defect 1: the plan's kernel added it at ``&d_residual_w + neuron``, the address of the pointer).

Only the four bases ``span .. span + 3`` are nonzero at any input, so on interval ``s`` the
unit's spline is one cubic in the local ``t``. The forward turns the coefficients into a table
of those cubics, ``[4, W * G]`` (:func:`.spline.power_map`), gathers each element's four
coefficients from it (``take`` keyed by ``unit * G + span``, located once and cached) and
evaluates the cubic by Horner's rule; the backward gathers the slope's three from the same
table, and sums the moments ``md t^q`` per (unit, interval) in float64, in index order, before
mapping them back onto the K coefficients with the transposed map.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .spline import DEGREE, PIECES, Grid, Located, pieces, power_map

Array = Any


@dataclass
class TwinCache:
    """What :func:`gate_backward` needs from the forward. ``inside_out``, ``loc``, ``first`` and
    ``basis`` are derived on demand (the backward does not use them; tests inspect them)."""

    grid: Grid
    pre: Array  # [B, W]
    key: Array  # [B, W] int, unit * G + span: the element's row of the cubic table
    t: Array  # [B, W] local parameter in [0, 1]
    inside: Array  # [B, W] bool, i: lo <= pre <= hi
    table: Array  # [4, W * G] the units' cubics in t (:func:`cubic_table`)
    raw: Array  # [B, W] the gate before its clamp to [0, 1]

    @property
    def inside_out(self) -> Array:
        """``m``: where the output clamp passes the gradient (``0 < raw < 1``)."""
        return (self.raw > 0) & (self.raw < 1)

    @property
    def span(self) -> Array:
        """Interval of each element (its first nonzero basis), in [0, G - 1]."""
        width = self.key.shape[-1]
        return self.key - _unit_offsets(self.key, width, self.grid.intervals)

    @property
    def loc(self) -> Located:
        return Located(self.span, self.t, self.inside)

    @property
    def first(self) -> Array:
        """[B, W] flat index (unit * K + span) of each element's first nonzero coefficient."""
        width = self.key.shape[-1]
        return self.span + _unit_offsets(self.key, width, self.grid.num_bases)

    @property
    def basis(self) -> tuple[Array, Array, Array, Array]:
        """The four nonzero basis values of each element."""
        return pieces(None, self.t)


def _unit_offsets(like: Array, width: int, stride: int) -> Array:
    """``unit * stride`` along the last axis, on the array module and int type of ``like``."""
    xp = _module(like)
    return xp.arange(width, dtype=like.dtype) * stride


def _module(a: Array) -> Any:
    """NumPy, or CuPy for a CuPy array (without importing CuPy on the CPU path)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def locate_keys(xp: Any, grid: Grid, pre: Array, width: int) -> tuple[Array, Array, Array]:
    """``(key, t, inside)``: the element's table row ``unit * G + span``, its local parameter and
    whether it lies in ``[lo, hi]``, with :func:`.spline.locate`'s arithmetic (a NaN input lands at
    ``lo``; ``x = hi`` in the last interval at ``t = 1``), in place on two work arrays."""
    u = xp.clip(pre, grid.lo, grid.hi)
    inside = u == pre  # the clamp left it alone; False for NaN
    nan = xp.isnan(u)
    if nan.any():
        u[nan] = grid.lo
    u -= grid.lo
    u *= 1.0 / grid.step
    span = xp.floor(u)
    xp.clip(span, 0, grid.intervals - 1, out=span)
    u -= span  # now t
    key = span.astype(np.intp)
    key += xp.arange(width, dtype=np.intp) * grid.intervals
    return key, u, inside


@lru_cache(maxsize=64)
def _table_map(grid: Grid, dtype: str) -> np.ndarray:
    """:func:`.spline.power_map` as ``[K, G * 4]`` in ``dtype``."""
    return power_map(grid).reshape(grid.num_bases, grid.intervals * PIECES).astype(dtype)


def cubic_table(xp: Any, grid: Grid, coeff: Array) -> Array:
    """``[W * G, 4]``: row ``unit * G + s`` holds the coefficients of ``1, t, t^2, t^3`` of the
    unit's spline on interval ``s``."""
    m = xp.asarray(_table_map(grid, np.dtype(coeff.dtype).str))
    return xp.ascontiguousarray((coeff @ m).reshape(coeff.shape[0] * grid.intervals, PIECES).T)


def gate_forward(xp: Any, grid: Grid, coeff: Array, residual: Array, pre: Array) -> tuple[Array, TwinCache]:
    """Gate values [B, W] from ``pre`` [B, W], ``coeff`` [W, K] and ``residual`` [W]."""
    width, k = coeff.shape
    if k != grid.num_bases or pre.shape[-1] != width or residual.shape != (width,):
        raise ValueError(f"kan_gate: coeff {coeff.shape}, residual {residual.shape} and pre {pre.shape} "
                         f"do not fit {grid.num_bases} bases")
    key, t, inside = locate_keys(xp, grid, pre, width)
    table = cubic_table(xp, grid, coeff)
    raw = _horner(table, key, t, (1.0, 1.0, 1.0, 1.0))
    raw += residual * pre
    return xp.clip(raw, 0, 1), TwinCache(grid, pre, key, t, inside, table, raw)


def _horner(table: Array, key: Array, t: Array, scale: tuple[float, ...]) -> Array:
    """``sum_q scale[q] table[q, key] t^q`` by Horner's rule, gathering one coefficient at a time."""
    n = len(scale) - 1
    out = table[n].take(key)
    if scale[n] != 1.0:
        out *= scale[n]
    for q in range(n - 1, -1, -1):
        out *= t
        a = table[q].take(key)
        if scale[q] != 1.0:
            a *= scale[q]
        out += a
    return out


def gate_backward(xp: Any, grid: Grid, coeff: Array, residual: Array, cache: TwinCache,
                  dgate: Array) -> tuple[Array, Array, Array]:
    """``(dpre [B, W], dcoeff [W, K], dresidual [W])`` from the gate's gradient ``dgate`` [B, W]."""
    width, k = coeff.shape
    g = grid.intervals
    dt = dgate.dtype
    md = xp.where(cache.inside_out, dgate, 0).astype(dt, copy=False)
    dres = (md * cache.pre).sum(axis=0)
    # the spline's input slope, (a1 + 2 a2 t + 3 a3 t^2) / h, and 0 where the input was clamped
    t, inv = cache.t, 1.0 / grid.step
    slope = _horner(cache.table[1:], cache.key, t, (inv, 2 * inv, 3 * inv))
    slope *= cache.inside
    dpre = md * (slope.astype(dt, copy=False) + residual)
    # per (unit, interval): the moments sum md t^q, q = 0..3, then back onto the K coefficients
    keys = cache.key.reshape(-1)
    w = md.reshape(-1).astype(np.float64)
    t64 = t.reshape(-1).astype(np.float64)
    moments = xp.zeros((PIECES, width * g), dtype=np.float64)
    for q in range(PIECES):
        _scatter_add(xp, moments[q], keys, w)
        if q < DEGREE:
            w *= t64
    dcoeff = moments.reshape(PIECES, width, g).transpose(1, 2, 0).reshape(width, g * PIECES) \
        @ xp.asarray(_table_map(grid, "<f8")).T
    return dpre, dcoeff.astype(dt), dres


def _scatter_add(xp: Any, out: Array, keys: Array, weights: Array) -> None:
    """``out[keys[i]] += weights[i]`` for every ``i``, in index order on NumPy (``ufunc.at``, whose
    fast path wants ``out`` and ``weights`` of one dtype); ``bincount`` elsewhere."""
    if xp is np:
        np.add.at(out, keys, weights)
    else:
        out += xp.bincount(keys, weights=weights, minlength=out.size)
