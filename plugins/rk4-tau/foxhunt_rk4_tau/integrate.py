"""Integrating the liquid-tau ODE ``dx/dt = (1 - x) / tau`` over one stats interval ``h``.

The exact solution over a step is ``x(t + h) = 1 - (1 - x) exp(-h / tau)`` (the core's step,
:func:`foxhunt_core.explore.liquid_exact_step`). One classical RK4 step of size ``dt`` maps
``1 - x`` to ``R(-dt / tau) (1 - x)`` with ``R(z) = 1 + z + z^2/2 + z^3/6 + z^4/24``; the exact
factor is ``exp(-dt / tau)``. ``|R(-r)| <= 1`` only for ``r`` below about 2.785, and the plan
took one step of ``dt = 1`` with ``tau`` down to 0.01, ``r = 100``: ``R(-100) = 4 004 901``,
so ``1 - x`` grows four-million-fold per interval and only the clamp to [0.1, 2] hides it
(DESIGN.md, defect 4; :func:`plan_rk4_step` is that step, kept for the tests).

:func:`rk4_substepped` splits ``h`` into ``N = ceil(h / (ratio * tau))`` equal sub-steps, so each
has ``dt / tau <= ratio``. For the linear ODE the error after ``N`` sub-steps is
``|R(-r)^N - exp(-N r)| * |1 - x|``; over all ``N`` it is largest near ``N r ~ 1`` and below
3.4e-7 ``|1 - x|`` for ``r <= 0.1`` (2.0e-8 at 0.05, 5.8e-6 at 0.2, 0.20 at 2), so the default
ratio 0.1 keeps the error under 1e-6 for every ``h`` and ``tau`` with ``x`` in [0.1, 2].
"""

from __future__ import annotations

import math

import numpy as np


def rk4_factor(r: float) -> float:
    """``R(-r)``: what one RK4 step of ``dt = r * tau`` multiplies ``1 - x`` by."""
    z = -r
    return 1.0 + z + z * z / 2.0 + z**3 / 6.0 + z**4 / 24.0


def substeps(h: float, tau: float, ratio: float) -> int:
    """The number of equal sub-steps that keeps ``dt / tau <= ratio`` (a quotient a rounding error
    above a whole number does not add a sub-step)."""
    return max(1, math.ceil(h / (ratio * tau) * (1.0 - 1e-12)))


def rk4(x: float, tau: float, h: float, n: int) -> float:
    """``n`` classical RK4 steps of ``dt = h / n`` on ``dx/dt = (1 - x) / tau``."""
    dt = h / n
    for _ in range(n):
        k1 = (1.0 - x) / tau
        k2 = (1.0 - (x + 0.5 * dt * k1)) / tau
        k3 = (1.0 - (x + 0.5 * dt * k2)) / tau
        k4 = (1.0 - (x + dt * k3)) / tau
        x = x + dt * (k1 + 2.0 * k2 + 2.0 * k3 + k4) / 6.0
    return x


def rk4_substepped(mod: np.ndarray, tau: np.ndarray, h: float, ratio: float) -> tuple[np.ndarray, list[int]]:
    """Advance every branch's ``liquid_mod`` over ``h``; returns the new values and each branch's
    number of sub-steps."""
    ns = [substeps(h, float(t), ratio) for t in tau]
    out = np.array([rk4(float(x), float(t), h, n) for x, t, n in zip(mod, tau, ns)])
    return out, ns


def plan_rk4_step(x: np.ndarray, tau: np.ndarray, h: float = 1.0) -> np.ndarray:
    """The plan's step: one RK4 step over the whole interval, whatever ``h / tau`` (unstable)."""
    def f(y: np.ndarray) -> np.ndarray:
        return (1.0 - y) / tau

    k1 = f(x)
    k2 = f(x + 0.5 * h * k1)
    k3 = f(x + 0.5 * h * k2)
    k4 = f(x + h * k3)
    return x + h * (k1 + 2.0 * k2 + 2.0 * k3 + k4) / 6.0
