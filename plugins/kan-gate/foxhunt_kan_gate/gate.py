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
of those cubics, one row of four power coefficients per (unit, slot), ``[W * (G + 1), 4]``
(:func:`.spline.power_map`; slot ``G`` continues the last cubic past ``hi``, so the located slot
needs no clamp), gathers each element's row with one ``take`` keyed by ``unit * (G + 1) + slot``
and evaluates the cubic by Horner's rule. The backward locates the elements again, gathers the
slope's rows from the same table scaled, and sums the moments ``md t^q`` per (unit, slot) in
float64, in index order, before mapping them back onto the K coefficients with the transposed
map. The cache holds no per-element array of its own: the forward's input, its output
(``0 < gate < 1`` exactly where ``0 < raw < 1``) and the small table, so what an update keeps
alive between the forward and the backward is what the sigmoid gate's would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .spline import DEGREE, PIECES, Grid, Located, locate, pieces, power_map

Array = Any


@dataclass(frozen=True)
class _Plan:
    """The constants of one grid, dtype and width on one array module."""

    lo: float
    hi: float
    inv_step: float
    slots: int  # G + 1
    offsets: Array  # [W] unit * (G + 1), in the float dtype where that is exact, else intp
    to_table: Array  # [K, (G + 1) 4] float64: coefficients to cubics, column slot * 4 + q
    to_coeff: Array  # [(G + 1) 4, K] float64: moments to coefficient gradients
    slope_scale: Array  # [4] in the dtype: (0, 1, 2, 3) / h, a cubic's coefficients to its slope's


def _plan(xp: Any, grid: Grid, dtype: Any, width: int) -> _Plan:
    """The plan, made once per (grid, dtype, width) on NumPy and on every call elsewhere (a CuPy
    array belongs to one device)."""
    if xp is np:
        return _numpy_plan(grid, np.dtype(dtype), width)
    return _make_plan(xp, grid, np.dtype(dtype), width)


@lru_cache(maxsize=64)
def _numpy_plan(grid: Grid, dtype: np.dtype, width: int) -> _Plan:
    return _make_plan(np, grid, dtype, width)


def _make_plan(xp: Any, grid: Grid, dtype: np.dtype, width: int) -> _Plan:
    slots = grid.intervals + 1
    exact = width * slots < 2 ** (np.finfo(dtype).nmant + 1)  # unit * slots + slot, added in float
    offsets = np.arange(width, dtype=dtype if exact else np.intp) * slots
    m = power_map(grid).reshape(grid.num_bases, slots * PIECES)
    scale = np.arange(PIECES, dtype=float) / grid.step
    arrays = [xp.asarray(a) for a in (offsets, m, np.ascontiguousarray(m.T), scale.astype(dtype))]
    if xp is np:
        for a in arrays:
            a.setflags(write=False)
    return _Plan(grid.lo, grid.hi, 1.0 / grid.step, slots, *arrays)


@dataclass(frozen=True)
class TwinCache:
    """What :func:`gate_backward` needs from the forward. ``inside_out``, ``loc``, ``first`` and
    ``basis`` are derived on demand for inspection (the backward does not use them)."""

    grid: Grid
    pre: Array  # [B, W] the forward's input
    gate: Array  # [B, W] the forward's output (read-only on NumPy)
    table: Array  # [W * (G + 1), 4] the units' cubics in t (:func:`cubic_table`)

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


def locate_keys(xp: Any, plan: _Plan, pre: Array) -> tuple[Array, Array, Array]:
    """``(key, t, inside)``: each element's row ``unit * (G + 1) + slot`` of :func:`cubic_table`,
    its local parameter and whether it lies in ``[lo, hi]``, with
    :func:`.spline.locate`'s arithmetic (a NaN input lands at ``lo``); in place on two arrays."""
    u = pre.clip(plan.lo, plan.hi)
    inside = u == pre  # the clamp left it alone; False for NaN
    if u.size and math.isnan(u.max()):  # the maximum of a clamped array is NaN only through a NaN
        u[xp.isnan(u)] = plan.lo  # as fmax in spline.locate and the kernels: a NaN input lands at lo
    u -= plan.lo
    u *= plan.inv_step
    slot = xp.floor(u)  # in [0, G]: u <= G (1 + rounding) after the clamp
    u -= slot  # now t
    if plan.offsets.dtype == slot.dtype:
        slot += plan.offsets
        return slot.astype(np.intp), u, inside
    key = slot.astype(np.intp)
    key += plan.offsets
    return key, u, inside


def cubic_table(xp: Any, plan: _Plan, coeff: Array) -> Array:
    """``[W * (G + 1), 4]``: row ``unit * (G + 1) + slot`` holds the coefficients of ``1, t, t^2,
    t^3`` of the unit's cubic on that slot. The product is taken in float64: it is small ([W, K] by
    [K, 4 (G + 1)]), and a float32 product on a GPU may run on TF32 tensor cores (10-bit mantissa),
    which put the CuPy twin 2e-4 away from the kernels."""
    table = coeff.astype(np.float64) @ plan.to_table
    return table.astype(coeff.dtype, copy=False).reshape(-1, PIECES)


def _horner(rows: Array, t: Array, first: int = 0) -> Array:
    """``sum_q rows[..., q] t^(q - first)`` for ``q = first .. 3`` by Horner's rule."""
    out = rows[..., DEGREE] * t
    for q in range(DEGREE - 1, first, -1):
        out += rows[..., q]
        out *= t
    out += rows[..., first]
    return out


def _check(grid: Grid, coeff: Array, residual: Array, pre: Array) -> None:
    width, k = coeff.shape
    if k != grid.num_bases or pre.shape[-1] != width or residual.shape != (width,):
        raise ValueError(f"kan_gate: coeff {coeff.shape}, residual {residual.shape} and pre {pre.shape} "
                         f"do not fit {grid.num_bases} bases")


def gate_forward(xp: Any, grid: Grid, coeff: Array, residual: Array, pre: Array) -> tuple[Array, TwinCache]:
    """Gate values [B, W] from ``pre`` [B, W], ``coeff`` [W, K] and ``residual`` [W]."""
    _check(grid, coeff, residual, pre)
    plan = _plan(xp, grid, pre.dtype, coeff.shape[0])
    key, t, _ = locate_keys(xp, plan, pre)
    table = cubic_table(xp, plan, coeff)
    raw = _horner(table.take(key, axis=0), t)  # one [B, W, 4] row gather
    raw += residual * pre
    gate = raw.clip(0, 1, out=raw)
    if xp is np:
        gate.flags.writeable = False  # the cache reads it in the backward
    return gate, TwinCache(grid, pre, gate, table)


def gate_backward(xp: Any, grid: Grid, coeff: Array, residual: Array, cache: TwinCache,
                  dgate: Array) -> tuple[Array, Array, Array]:
    """``(dpre [B, W], dcoeff [W, K], dresidual [W])`` from the gate's gradient ``dgate`` [B, W]."""
    width = coeff.shape[0]
    dt = dgate.dtype
    plan = _plan(xp, grid, cache.pre.dtype, width)
    key, t, inside = locate_keys(xp, plan, cache.pre)
    md = xp.where(cache.inside_out, dgate, 0).astype(dt, copy=False)
    dres = (md * cache.pre).sum(axis=0)
    # the spline's input slope, (a1 + 2 a2 t + 3 a3 t^2) / h, and 0 where the input was clamped
    slope = _horner((cache.table * plan.slope_scale).take(key, axis=0), t, first=1)
    slope *= inside
    slope += residual
    slope *= md
    dpre = slope.astype(dt, copy=False)
    # per (unit, slot): the moments sum md t^q, q = 0..3, then back onto the K coefficients
    keys = key.reshape(-1)
    w = md.reshape(-1).astype(np.float64)
    t64 = t.reshape(-1).astype(np.float64)
    moments = xp.zeros((width * plan.slots, PIECES), dtype=np.float64)  # laid out as the table
    for q in range(PIECES):
        _scatter_add(xp, moments[:, q], keys, w)
        if q < DEGREE:
            w *= t64
    dcoeff = moments.reshape(width, plan.slots * PIECES) @ plan.to_coeff
    return dpre, dcoeff.astype(dt), dres


def _scatter_add(xp: Any, out: Array, keys: Array, weights: Array) -> None:
    """``out[keys[i]] += weights[i]`` for every ``i``, in index order on NumPy (``ufunc.at``, whose
    fast path wants ``out`` and ``weights`` of one dtype); ``bincount`` elsewhere."""
    if xp is np:
        np.add.at(out, keys, weights)
    else:
        out += xp.bincount(keys, weights=weights, minlength=out.size)
