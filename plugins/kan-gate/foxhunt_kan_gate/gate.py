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
Only the four bases ``span .. span + 3`` are nonzero at any input, so the forward gathers four
coefficients per element and the backward scatters four terms per element (``bincount``: a
fixed-order sum on NumPy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .spline import Grid, Located, locate, piece_slopes, pieces

Array = Any


@dataclass
class TwinCache:
    """What :func:`gate_backward` needs from the forward."""

    pre: Array  # [B, W]
    loc: Located
    first: Array  # [B, W] flat index (unit * K + span) of the first nonzero coefficient
    basis: tuple[Array, Array, Array, Array]  # the four nonzero basis values
    inside_out: Array  # [B, W] bool, m: 0 < raw < 1


def gate_forward(xp: Any, grid: Grid, coeff: Array, residual: Array, pre: Array) -> tuple[Array, TwinCache]:
    """Gate values [B, W] from ``pre`` [B, W], ``coeff`` [W, K] and ``residual`` [W]."""
    width, k = coeff.shape
    if k != grid.num_bases or pre.shape[-1] != width or residual.shape != (width,):
        raise ValueError(f"kan_gate: coeff {coeff.shape}, residual {residual.shape} and pre {pre.shape} "
                         f"do not fit {grid.num_bases} bases")
    loc = locate(xp, pre, grid)
    first = loc.span + xp.arange(width, dtype=np.int64) * k
    flat = coeff.reshape(-1)
    basis = pieces(xp, loc.t)
    raw = residual * pre
    for j, b in enumerate(basis):
        raw = raw + flat[first + j] * b
    inside_out = (raw > 0) & (raw < 1)
    return xp.clip(raw, 0, 1), TwinCache(pre, loc, first, basis, inside_out)


def gate_backward(xp: Any, grid: Grid, coeff: Array, residual: Array, cache: TwinCache,
                  dgate: Array) -> tuple[Array, Array, Array]:
    """``(dpre [B, W], dcoeff [W, K], dresidual [W])`` from the gate's gradient ``dgate`` [B, W]."""
    width, k = coeff.shape
    dt = dgate.dtype
    md = xp.where(cache.inside_out, dgate, 0).astype(dt, copy=False)
    dres = (md * cache.pre).sum(axis=0)
    dflat = xp.zeros(width * k, dtype=np.float64)
    flat = coeff.reshape(-1)
    slope = xp.zeros_like(md)
    for j, (b, s) in enumerate(zip(cache.basis, piece_slopes(xp, cache.loc.t))):
        at = (cache.first + j).reshape(-1)
        dflat += xp.bincount(at, weights=(md * b).reshape(-1), minlength=width * k)
        slope = slope + flat[cache.first + j] * s
    slope = xp.where(cache.loc.inside, slope * (1.0 / grid.step), 0).astype(dt, copy=False)
    dpre = md * (slope + residual)
    return dpre, dflat.reshape(width, k).astype(dt), dres
