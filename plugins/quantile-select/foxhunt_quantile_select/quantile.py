"""Quantile Q-select: ``Q_select = (1 - alpha) Q_hi + alpha Q_lo`` from each action's atom CDF.

Plan Task 2. For every sample ``b`` and action ``a`` the C51 distribution ``p[b, a, :]`` on the
support ``z_j = z_0 + j dz`` gives two quantiles, at the levels ``tau_lo < tau_hi`` (options,
default 0.1 and 0.9), and the values collection's Boltzmann draw chooses by are::

    alpha       = clip(iqn_readiness, 0, 1)
    Q_select    = (1 - alpha) * Q(tau_hi) + alpha * Q(tau_lo)

``alpha = 0`` (early in training) is optimistic, ``alpha = 1`` pessimistic. ``dQ_select/dalpha =
Q(tau_lo) - Q(tau_hi) <= 0``, so the values never rise with readiness.

How a quantile is read off the atoms (cell interpolation)
---------------------------------------------------------
Each atom's mass is spread uniformly over its cell ``[z_j - dz/2, z_j + dz/2]``, which makes the
CDF continuous and piecewise linear, ``F(z_j + dz/2) = F_j = p_0 + ... + p_j``. With ``T`` the
total mass (1 up to rounding) and ``t = tau T``::

    j         = the first atom with F_j >= t
    Q(tau)    = z_j + dz * ((t - F_{j-1}) / p_j - 1/2)          (F_{-1} = 0)

So a point mass on ``z_k`` reads ``z_k + (tau - 1/2) dz``; the uniform distribution on N atoms
reads ``z_0 - dz/2 + tau N dz``; the mean of the cell distribution is E[Q] exactly. The values are
continuous in the probabilities wherever no zero-mass cell lies at the level (the plan's "first
atom with CDF >= tau" instead moves in steps of dz, so near-equal actions tie). The fraction is
clipped to [0, 1] against rounding, and where rounding leaves no atom at the level the top of the
last cell is taken.

Three implementations of one function:

* :func:`quantile_reference` — one distribution at a time in plain Python floats (the oracle of
  the tests, written for reading, not speed);
* :func:`quantile_select_xp` — array operations on NumPy or CuPy (float64 inside; the CPU product
  path and the twin of the kernel);
* :func:`foxhunt_quantile_select.kernel.quantile_select_cuda` — ``kernels/quantile_select.cu``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Array = Any


def quantile_reference(p: Sequence[float], z0: float, dz: float, tau: float) -> float:
    """``Q(tau)`` of one distribution ``p`` [N] on atoms ``z0 + j dz`` (module docstring)."""
    t = tau * sum(float(x) for x in p)
    cdf = 0.0
    for j, pj in enumerate(p):
        pj = float(pj)
        if cdf + pj >= t:
            frac = min(max((t - cdf) / pj, 0.0), 1.0) if pj > 0 else 1.0
            return z0 + dz * (j + frac - 0.5)
        cdf += pj
    return z0 + dz * (len(p) - 0.5)


def select_reference(p: Sequence[float], z0: float, dz: float, alpha: float, lower: float, upper: float) -> float:
    """``Q_select`` of one distribution (module docstring), with ``alpha`` clipped to [0, 1]."""
    a = min(max(float(alpha), 0.0), 1.0)
    return (1.0 - a) * quantile_reference(p, z0, dz, upper) + a * quantile_reference(p, z0, dz, lower)


def support_spacing(xp: Any, support: Array) -> tuple[Array, Array]:
    """``(z_0, dz)`` of a uniform support [N] (N >= 2), as 0-d arrays of the support's module."""
    z = support.astype(xp.float64)
    return z[0], (z[-1] - z[0]) / (z.shape[0] - 1)


def quantiles_xp(xp: Any, probs: Array, support: Array, tau: float) -> Array:
    """``Q(tau)`` [...] of every distribution ``probs`` [..., N] (float64)."""
    p = probs.astype(xp.float64)
    return _quantiles(xp, p, xp.cumsum(p, axis=-1), support, tau)


def _quantiles(xp: Any, p: Array, cdf: Array, support: Array, tau: float) -> Array:
    """:func:`quantiles_xp` from float64 probabilities ``p`` and their running sums ``cdf``."""
    n = p.shape[-1]
    t = tau * cdf[..., -1:]
    j = xp.minimum((cdf < t).sum(axis=-1, keepdims=True), n - 1)  # first atom with F_j >= t
    pj = xp.take_along_axis(p, j, axis=-1)
    before = xp.where(j > 0, xp.take_along_axis(cdf, xp.maximum(j - 1, 0), axis=-1), 0.0)  # F_{j-1}
    frac = xp.where(pj > 0, xp.clip((t - before) / xp.where(pj > 0, pj, 1.0), 0.0, 1.0), 1.0)
    z0, dz = support_spacing(xp, support)
    return (z0 + dz * (j + frac - 0.5))[..., 0]


def blend_weight(xp: Any, iqn_readiness: Any) -> Array:
    """``alpha = clip(iqn_readiness, 0, 1)`` as a 0-d float64 array (a device scalar stays on the
    device: no host read, so a captured step sees the value it is replayed with)."""
    return xp.clip(xp.asarray(iqn_readiness, dtype=xp.float64), 0.0, 1.0)


def quantile_select_xp(xp: Any, probs: Array, support: Array, iqn_readiness: Any,
                       lower: float, upper: float) -> Array:
    """``Q_select`` [B, A] from ``probs`` [B, A, N], in ``probs``' dtype."""
    alpha = blend_weight(xp, iqn_readiness)
    p = probs.astype(xp.float64)
    cdf = xp.cumsum(p, axis=-1)  # one pass for both levels
    q_hi = _quantiles(xp, p, cdf, support, upper)
    q_lo = _quantiles(xp, p, cdf, support, lower)
    return ((1.0 - alpha) * q_hi + alpha * q_lo).astype(probs.dtype, copy=False)
