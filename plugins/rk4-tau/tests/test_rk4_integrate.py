"""Sub-stepped RK4 on the liquid-tau ODE against its exact solution, and the plan's unstable step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from foxhunt_rk4_tau.integrate import plan_rk4_step, rk4, rk4_factor, rk4_substepped, substeps

from foxhunt_core.explore import liquid_exact_step

X0 = np.linspace(0.1, 2.0, 20)


def test_the_rk4_factor_is_what_one_step_does():
    for r in (0.1, 1.0, 2.0, 5.0, 100.0):
        tau = 0.01
        x = 0.3
        assert 1.0 - rk4(x, tau, r * tau, 1) == pytest.approx(rk4_factor(r) * (1.0 - x), rel=1e-12)
    assert rk4_factor(100.0) == pytest.approx(4_004_901.0)
    assert abs(rk4_factor(2.78)) < 1.0 < abs(rk4_factor(2.80))  # the stability limit, ~2.785


def test_error_against_the_exact_solution_at_tau_001_h_1_is_below_1e_6():
    """h / tau = 100: 1000 sub-steps of dt / tau = 0.1."""
    tau = np.full(X0.size, 0.01)
    got, ns = rk4_substepped(X0, tau, 1.0, ratio=0.1)
    assert ns == [1000] * X0.size
    exact = liquid_exact_step(X0, tau, 1.0)
    assert np.abs(got - exact).max() < 1e-6


@pytest.mark.parametrize("h", [0.05, 0.2, 1.0, 3.0])
def test_error_below_1e_6_across_time_constants_and_steps(h):
    """Every tau of the core's range [0.01, 1] (and a few steps h), x over [0.1, 2]: the worst
    case of the sub-stepped RK4 is where the sub-steps add up to about tau."""
    worst = 0.0
    for tau_v in np.geomspace(0.01, 1.0, 25):
        tau = np.full(X0.size, tau_v)
        got, _ = rk4_substepped(X0, tau, h, ratio=0.1)
        worst = max(worst, float(np.abs(got - liquid_exact_step(X0, tau, h)).max()))
    assert worst < 1e-6
    assert worst > 1e-12  # it is an approximation, and the check can see it


def test_the_plans_single_step_is_unstable_at_tau_001_h_1():
    """One RK4 step over h = 1 at tau = 0.01 multiplies 1 - x by 4e6 instead of exp(-100): after
    three intervals liquid_mod is of order 1e19 where the exact solution is 1; the core's clamp to
    [0.1, 2] only hides it (the clamped value is pinned at a bound, 0.9 away from the solution)."""
    tau = np.full(X0.size, 0.01)
    x = X0.copy()
    for _ in range(3):
        x = plan_rk4_step(x, tau, 1.0)
    away = np.abs(X0 - 1.0) > 0.01  # (one start sits within rounding of the fixed point 1)
    assert (np.abs(x[away] - 1.0) > 1e17).all()
    clamped = X0.copy()
    for _ in range(3):
        clamped = np.clip(plan_rk4_step(clamped, tau, 1.0), 0.1, 2.0)
    assert np.abs(clamped[away] - 1.0).min() >= 0.9 - 1e-12
    # the sub-stepped step from the same start stays within 1e-6 of the exact one at every interval
    x, ex = X0.copy(), X0.copy()
    for _ in range(3):
        x, _ = rk4_substepped(x, tau, 1.0, ratio=0.1)
        ex = liquid_exact_step(ex, tau, 1.0)
        assert np.abs(x - ex).max() < 1e-6


def test_substep_counts():
    assert substeps(1.0, 0.01, 0.1) == 1000
    assert substeps(0.05, 0.01, 0.1) == 50  # 0.05 / 0.001 is 50.000000000000004 in floats
    assert substeps(0.05, 1.0, 0.1) == 1
    assert substeps(0.05, 0.01, 2.0) == 3  # the h / tau <= 2 per sub-step
    for h, tau, ratio in ((0.05, 0.013, 0.1), (1.0, 0.37, 0.07), (2.5, 0.01, 2.0)):
        n = substeps(h, tau, ratio)
        assert h / n / tau <= ratio * (1 + 1e-12) and h / (n - 1) / tau > ratio if n > 1 else True


def test_a_coarse_ratio_is_stable_but_less_accurate():
    """At the stability-motivated ratio 2 the step never blows up, but its error is ~0.2 |1 - x|:
    stability is not accuracy, so the default ratio is 0.1."""
    tau = np.full(X0.size, 0.01)
    got, _ = rk4_substepped(X0, tau, 0.02, ratio=2.0)  # one sub-step of r = 2
    err = np.abs(got - liquid_exact_step(X0, tau, 0.02))
    assert err.max() == pytest.approx(abs(rk4_factor(2.0) - math.exp(-2.0)) * np.abs(1 - X0).max(), rel=1e-9)
    big, _ = rk4_substepped(X0, tau, 1.0, ratio=2.0)  # 50 sub-steps of r = 2: stable, tiny, both ~exp(-100)
    assert np.abs(big - 1.0).max() < 1e-20
