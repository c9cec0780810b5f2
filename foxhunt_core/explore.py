"""Exploration: per-branch Boltzmann selection, the liquid-tau modulation and iqn_readiness.

Boltzmann: in branch ``d`` an action is drawn with probability ``softmax(values_d / T_d)`` with
``T_d = tau_t * liquid_mod[d]``; ``tau_t`` anneals linearly from ``tau`` to ``tau_min`` over the
first ``tau_decay_fraction`` of training.

Liquid tau: every stats interval, for each branch, with ``g_d`` its Q gap (see
:func:`foxhunt_core.qpipe.q_statistics`)::

    ema_d   <- adaptive EMA of g_d   (rate |g - ema| / (|g - ema| + max(ema, 1e-3)), in [0.01, 0.3])
    v_d      = g_d - ema_d                                  (gap velocity)
    tau_d    = tau_lo + (tau_hi - tau_lo) * sigmoid(v_d / max(q_std, 0.01))
    dx/dt    = (1 - x) / tau_d                              (x = liquid_mod[d])

The ODE is linear with eigenvalue ``-1/tau_d``; explicit Euler and RK4 are stable only for
``h / tau_d`` below 2 and about 2.79, and with ``tau_d`` as small as 0.01 a unit step is far
outside that. We take the exact solution over the step instead,
``x(t + h) = 1 - (1 - x(t)) exp(-h / tau_d)``, which is stable for every ``h`` and ``tau_d``.
``liquid_mod`` starts at ``liquid_init`` and relaxes towards 1 — fast while a branch's gaps
shrink (its decision is in flux), slowly while they grow. ``h`` is ``liquid_dt``.

iqn_readiness: ``min(1, step / (iqn_ramp_fraction * total_steps))`` — a ramp from 0 (early,
exploring) to 1 (late, exploiting) that plugins such as quantile selection read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .net.layers import _xp

Array = Any


def boltzmann_select(
    values: Array, offsets: tuple[int, ...], temperatures: Array, uniforms: Array
) -> Array:
    """Sample one action per branch by inverse CDF.

    Args:
        values: [B, A] selection values.
        offsets: branch boundaries in the action axis.
        temperatures: [num_branches] per-branch temperature.
        uniforms: [B, num_branches] uniform draws in [0, 1).

    Returns:
        [B, num_branches] int64 actions.
    """
    xp = _xp(values)
    out = []
    for d in range(len(offsets) - 1):
        v = values[:, offsets[d] : offsets[d + 1]] / temperatures[d]
        p = xp.exp(v - v.max(axis=1, keepdims=True))
        cdf = xp.cumsum(p, axis=1)
        cdf = cdf / cdf[:, -1:]
        a = (cdf < uniforms[:, d : d + 1]).sum(axis=1)
        out.append(xp.minimum(a, offsets[d + 1] - offsets[d] - 1))
    return xp.stack(out, axis=1).astype(xp.int64)


def annealed_tau(step: int, total_steps: int, tau: float, tau_min: float, fraction: float) -> float:
    frac = min(1.0, step / max(1.0, fraction * total_steps))
    return float(tau + (tau_min - tau) * frac)


def iqn_readiness(step: int, total_steps: int, ramp_fraction: float) -> float:
    return float(min(1.0, step / max(1.0, ramp_fraction * total_steps)))


def liquid_exact_step(x: np.ndarray, tau: np.ndarray, h: float) -> np.ndarray:
    """Exact solution of ``dx/dt = (1 - x) / tau`` over a step ``h``."""
    return 1.0 - (1.0 - x) * np.exp(-h / tau)


def adaptive_ema(ema: float, value: float, first: bool) -> float:
    """The plan's adaptive-rate EMA: initialised from the first reading."""
    if not np.isfinite(value):
        return float(ema)  # a non-finite reading is skipped, not allowed to poison the EMA
    if first:
        return float(value)
    err = abs(value - ema)
    alpha = min(max(err / (err + max(ema, 1e-3)), 0.01), 0.3)
    return float((1.0 - alpha) * ema + alpha * value)


class LiquidTau:
    """State of the liquid-tau modulation (host side; four floats per quantity)."""

    def __init__(self, num_branches: int, init: float, tau_lo: float, tau_hi: float, dt: float) -> None:
        self.mod = np.full(num_branches, float(init))
        self.gap_ema = np.zeros(num_branches)
        self.seen = False
        self.tau_lo, self.tau_hi, self.dt = tau_lo, tau_hi, dt
        self.last_tau = np.full(num_branches, tau_hi)

    def time_constants(self, gaps: np.ndarray, q_std: float) -> np.ndarray:
        """Update the gap EMAs and return this step's ``tau_d``."""
        gaps = np.asarray(gaps, dtype=np.float64)
        for d, g in enumerate(gaps):
            self.gap_ema[d] = adaptive_ema(self.gap_ema[d], g, first=not self.seen)
        self.seen = True
        velocity = gaps - self.gap_ema
        sig = 1.0 / (1.0 + np.exp(-velocity / max(q_std, 0.01)))
        self.last_tau = self.tau_lo + (self.tau_hi - self.tau_lo) * sig
        return self.last_tau

    def step(self, gaps: np.ndarray, q_std: float) -> np.ndarray:
        tau = self.time_constants(gaps, q_std)
        self.mod = np.clip(liquid_exact_step(self.mod, tau, self.dt), 0.1, 2.0)
        return self.mod

    def state(self) -> dict[str, Any]:
        return {"mod": self.mod.tolist(), "gap_ema": self.gap_ema.tolist(), "seen": self.seen,
                "last_tau": self.last_tau.tolist()}

    def load(self, s: dict[str, Any]) -> None:
        self.mod = np.asarray(s["mod"], dtype=np.float64)
        self.gap_ema = np.asarray(s["gap_ema"], dtype=np.float64)
        self.seen = bool(s["seen"])
        self.last_tau = np.asarray(s["last_tau"], dtype=np.float64)
