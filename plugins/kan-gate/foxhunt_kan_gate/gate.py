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
of those cubics, ``[W, 4, G]`` (:func:`.spline.power_map`), gathers each element's four
coefficients from it (``take`` keyed by ``unit * 4G + span``) and evaluates the cubic by Horner's
rule. The backward locates the elements again, gathers the slope's three coefficients from the
same table, and sums the moments ``md t^q`` per (unit, interval) in float64, in index order,
before mapping them back onto the K coefficients with the transposed map. The cache holds no
per-element array of its own: the forward's input, its output (``0 < gate < 1`` exactly where
``0 < raw < 1``) and the small table; per-update memory stays that of the sigmoid gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .spline import DEGREE, PIECES, Grid, Located, locate, pieces, power_map

Array = Any


@dataclass(frozen=True)
class TwinCache:
    """What :func:`gate_backward` needs from the forward. ``inside_out``, ``loc``, ``first`` and
    ``basis`` are derived on demand for inspection (the backward does not use them)."""

    grid: Grid
    pre: Array  # [B, W] the forward's input
    gate: Array  # [B, W] the forward's output (read-only on NumPy)
    table: Array  # [W * 4 * G] the units' cubics in t (:func:`cubic_table`)

    @property
    def inside_out(self) -> Array:
        """``m``: where the output clamp passes the gradient (``0 < raw < 1``, so ``0 < gate < 1``)."""
        return (self.gate > 0) & (self.gate < 1)

    @property
    def loc(self) -> Located:
        return locate(_module(self.pre), self.pre, self.grid)

    @property
    def first(self) -> Array:
        """[B, W] flat index (unit * K + span) of each element's first nonzero coefficient."""
        xp = _module(self.pre)
        return self.loc.span + xp.arange(self.pre.shape[-1], dtype=np.int64) * self.grid.num_bases

    @property
    def basis(self) -> tuple[Array, Array, Array, Array]:
        """The four nonzero basis values of each element."""
        return pieces(None, self.loc.t)


def _module(a: Array) -> Any:
    """NumPy, or CuPy for a CuPy array (without importing CuPy on the CPU path)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def locate_keys(xp: Any, grid: Grid, pre: Array, width: int) -> tuple[Array, Array, Array]:
    """``(key, t, inside)``: the element's place ``unit * 4G + span`` in :func:`cubic_table`, its local parameter
    and whether it lies in ``[lo, hi]``, with :func:`.spline.locate`'s arithmetic (a NaN input
    lands at ``lo``; ``x = hi`` in the last interval at ``t = 1``), in place on two work arrays."""
    u = pre.clip(grid.lo, grid.hi)
    inside = u == pre  # the clamp left it alone; False for NaN
    if u.size and xp.isnan(u.max()):  # the maximum of a clamped array is NaN only through a NaN
        u[xp.isnan(u)] = grid.lo
    u -= grid.lo
    u *= 1.0 / grid.step
    span = xp.floor(u)
    span.clip(0, grid.intervals - 1, out=span)
    u -= span  # now t
    stride = PIECES * grid.intervals
    if width * stride < 2 ** (np.finfo(span.dtype).nmant + 1):  # unit * 4G + span is exact in float
        span += _unit_offsets(xp, span.dtype, width, stride)
        return span.astype(np.intp), u, inside
    key = span.astype(np.intp)
    key += _unit_offsets(xp, np.intp, width, stride)
    return key, u, inside


def _unit_offsets(xp: Any, dtype: Any, width: int, stride: int) -> Array:
    """``unit * stride`` for ``unit = 0 .. width - 1``."""
    if xp is np:
        return _numpy_offsets(np.dtype(dtype), width, stride)
    return xp.arange(width, dtype=dtype) * stride


@lru_cache(maxsize=64)
def _numpy_offsets(dtype: np.dtype, width: int, stride: int) -> np.ndarray:
    out = np.arange(width, dtype=dtype) * stride
    out.setflags(write=False)
    return out


@lru_cache(maxsize=64)
def _maps(grid: Grid, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """:func:`.spline.power_map` as ``[K, 4 * G]`` in ``dtype`` (coefficients to cubics, the
    ``t^q`` coefficient of interval ``s`` in column ``q * G + s``) and as ``[4 * G, K]`` in float64
    (moments to coefficient gradients)."""
    m = power_map(grid).transpose(0, 2, 1).reshape(grid.num_bases, PIECES * grid.intervals)
    fwd, bwd = m.astype(dtype), np.ascontiguousarray(m.T)
    fwd.setflags(write=False)
    bwd.setflags(write=False)
    return fwd, bwd


def cubic_table(xp: Any, grid: Grid, coeff: Array) -> Array:
    """``[W * 4 * G]``: the ``t^q`` coefficient of unit ``w``'s spline on interval ``s`` at
    ``w * 4G + q * G + s``, so that an element's four lie at ``key + q * G``."""
    m = _maps(grid, np.dtype(coeff.dtype))[0]
    return (coeff @ (m if xp is np else xp.asarray(m))).reshape(-1)


def gate_forward(xp: Any, grid: Grid, coeff: Array, residual: Array, pre: Array) -> tuple[Array, TwinCache]:
    """Gate values [B, W] from ``pre`` [B, W], ``coeff`` [W, K] and ``residual`` [W]."""
    width, k = coeff.shape
    if k != grid.num_bases or pre.shape[-1] != width or residual.shape != (width,):
        raise ValueError(f"kan_gate: coeff {coeff.shape}, residual {residual.shape} and pre {pre.shape} "
                         f"do not fit {grid.num_bases} bases")
    key, t, _ = locate_keys(xp, grid, pre, width)
    table = cubic_table(xp, grid, coeff)
    raw = _horner(table, key, t, grid.intervals)
    raw += residual * pre
    gate = raw.clip(0, 1, out=raw)
    if xp is np:
        gate.flags.writeable = False  # the cache reads it in the backward
    return gate, TwinCache(grid, pre, gate, table)


def _horner(table: Array, key: Array, t: Array, g: int, scale: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0),
            first: int = 0) -> Array:
    """``sum_q scale[q] table[key + (first + q) G] t^q`` by Horner's rule over ``len(scale)`` terms,
    gathering one coefficient at a time (``table[key + q G]`` is ``table[q G:][key]``)."""
    n = len(scale) - 1
    out = table[(first + n) * g:].take(key)
    if scale[n] != 1.0:
        out *= scale[n]
    for q in range(n - 1, -1, -1):
        out *= t
        a = table[(first + q) * g:].take(key)
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
    key, t, inside = locate_keys(xp, grid, cache.pre, width)
    md = xp.where(cache.inside_out, dgate, 0).astype(dt, copy=False)
    dres = (md * cache.pre).sum(axis=0)
    # the spline's input slope, (a1 + 2 a2 t + 3 a3 t^2) / h, and 0 where the input was clamped
    inv = 1.0 / grid.step
    slope = _horner(cache.table, key, t, g, (inv, 2 * inv, 3 * inv), first=1)
    slope *= inside
    dpre = md * (slope.astype(dt, copy=False) + residual)
    # per (unit, interval): the moments sum md t^q, q = 0..3, then back onto the K coefficients
    keys = key.reshape(-1)
    w = md.reshape(-1).astype(np.float64)
    t64 = t.reshape(-1).astype(np.float64)
    moments = xp.zeros(width * PIECES * g, dtype=np.float64)  # laid out as the table
    for q in range(PIECES):
        _scatter_add(xp, moments[q * g:], keys, w)
        if q < DEGREE:
            w *= t64
    m = _maps(grid, np.dtype(coeff.dtype))[1]
    dcoeff = moments.reshape(width, PIECES * g) @ (m if xp is np else xp.asarray(m))
    return dpre, dcoeff.astype(dt), dres


def _scatter_add(xp: Any, out: Array, keys: Array, weights: Array) -> None:
    """``out[keys[i]] += weights[i]`` for every ``i``, in index order on NumPy (``ufunc.at``, whose
    fast path wants ``out`` and ``weights`` of one dtype); ``bincount`` elsewhere."""
    if xp is np:
        np.add.at(out, keys, weights)
    else:
        out += xp.bincount(keys, weights=weights, minlength=out.size)
