"""Exploration: Boltzmann selection, the annealed temperature, iqn_readiness and liquid tau."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core.explore import (
    LiquidTau,
    adaptive_ema,
    annealed_tau,
    boltzmann_select,
    iqn_readiness,
    liquid_exact_step,
)

X0 = np.array([0.1, 0.5, 1.0, 1.5, 2.0])


def _f(x, tau):
    return (1.0 - x) / tau


def _rk4_step(x, tau, h):
    k1 = _f(x, tau)
    k2 = _f(x + 0.5 * h * k1, tau)
    k3 = _f(x + 0.5 * h * k2, tau)
    k4 = _f(x + h * k3, tau)
    return x + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


def _euler_step(x, tau, h):
    return x + h * _f(x, tau)


def _rk4_fine(x, tau, h, substeps=10_000):
    dh = h / substeps
    for _ in range(substeps):
        x = _rk4_step(x, tau, dh)
    return x


# ------------------------------------------------------------------------------- liquid tau


@pytest.mark.parametrize("tau", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("h", [0.05, 1.0])
def test_liquid_exact_step_is_exact_solution(tau, h):
    got = liquid_exact_step(X0, np.full_like(X0, tau), h)
    np.testing.assert_allclose(got, 1.0 - (1.0 - X0) * np.exp(-h / tau), rtol=0, atol=1e-15)
    np.testing.assert_allclose(got, _rk4_fine(X0.copy(), tau, h), rtol=0, atol=1e-9)


def test_liquid_exact_step_per_branch_tau():
    tau = np.array([0.01, 0.1, 1.0, 0.5, 2.0])
    got = liquid_exact_step(X0, tau, 0.3)
    for i in range(X0.size):
        assert got[i] == pytest.approx(1.0 - (1.0 - X0[i]) * np.exp(-0.3 / tau[i]), abs=1e-15)


def test_explicit_schemes_blow_up_where_exact_step_does_not():
    # Defect 4: tau = 0.01 and h = 1 gives h * lambda = 100, far outside the stability regions
    # of explicit Euler (2) and RK4 (~2.79).
    tau, h = np.full_like(X0, 0.01), 1.0
    x = X0[X0 != 1.0]  # x = 1 is the fixed point, which every scheme keeps
    tau = tau[: x.size]
    euler = _euler_step(x, tau, h)
    rk4 = _rk4_step(x, tau, h)
    exact = liquid_exact_step(x, tau, h)
    assert ((euler < 0) | (euler > 2)).all()
    assert ((rk4 < 0) | (rk4 > 2)).all()
    assert ((exact >= 0) & (exact <= 2)).all()
    np.testing.assert_allclose(exact, 1.0, atol=1e-40)
    # Exact steps are monotone: never overshoot 1, distance to 1 shrinks.
    assert (np.sign(exact - 1) * np.sign(x - 1) >= 0).all()
    assert (np.abs(exact - 1) <= np.abs(x - 1)).all()


def test_euler_is_fine_in_its_stable_range():
    # Sanity of the reference schemes: with h / tau = 0.05 both agree with the exact step.
    tau = np.full_like(X0, 1.0)
    exact = liquid_exact_step(X0, tau, 0.05)
    np.testing.assert_allclose(_rk4_step(X0, tau, 0.05), exact, atol=1e-9)
    np.testing.assert_allclose(_euler_step(X0, tau, 0.05), exact, atol=2e-3)


@pytest.mark.parametrize("init", [0.1, 0.3, 1.0, 1.8, 2.0])
def test_liquid_tau_step_stays_in_bounds_for_adversarial_gaps(init):
    rng = np.random.default_rng(int(init * 10))
    lt = LiquidTau(num_branches=4, init=init, tau_lo=0.01, tau_hi=1.0, dt=1.0)
    seqs = [
        np.array([0.0, 1e6, 0.0, 1e6]),
        np.array([1e6, 0.0, 1e-9, 0.0]),
        np.zeros(4),
        np.full(4, 1e-12),
        np.array([-5.0, 5.0, -1e3, 1e3]),
    ]
    prev = lt.mod.copy()
    with np.errstate(over="ignore"):
        for i in range(200):
            if i < 100:
                gaps = seqs[i % len(seqs)]
            else:
                gaps = rng.exponential(10.0 ** rng.integers(-6, 6), 4)
            q_std = [0.0, 1e-9, 1.0, 1e4][i % 4]
            mod = lt.step(gaps, q_std)
            assert np.isfinite(mod).all()
            assert ((mod >= 0.1) & (mod <= 2.0)).all()
            assert ((lt.last_tau >= 0.01 - 1e-12) & (lt.last_tau <= 1.0 + 1e-12)).all()
            # relaxation towards 1 without overshoot
            assert (np.abs(mod - 1.0) <= np.abs(prev - 1.0) + 1e-15).all()
            prev = mod.copy()


def test_liquid_tau_state_round_trip():
    a = LiquidTau(4, 0.5, 0.05, 1.0, 1.0)
    a.step(np.array([0.1, 0.2, 0.3, 0.4]), 1.0)
    b = LiquidTau(4, 0.5, 0.05, 1.0, 1.0)
    b.load(a.state())
    gaps = np.array([0.3, 0.1, 0.0, 0.9])
    np.testing.assert_array_equal(a.step(gaps, 0.5), b.step(gaps, 0.5))
    np.testing.assert_array_equal(a.gap_ema, b.gap_ema)


@pytest.mark.parametrize(
    ("ema", "value", "first", "expected"),
    [
        (123.0, 0.5, True, 0.5),  # the first reading initialises
        (0.5, 1.0, False, 0.65),  # alpha = 0.5 / 1.0 = 0.5 -> clamped to 0.3
        (0.65, 0.66, False, 42.91 / 66),  # alpha = 0.01 / 0.66 = 1/66, inside [0.01, 0.3]
        (1.0, 1.001, False, 0.99 * 1.0 + 0.01 * 1.001),  # alpha ~ 0.000999 -> floor 0.01
        (0.0, 1e-3, False, 3e-4),  # ema below 1e-3 uses 1e-3: alpha = 0.5 -> 0.3
    ],
)
def test_adaptive_ema_table(ema, value, first, expected):
    assert adaptive_ema(ema, value, first) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_adaptive_ema_sequence():
    readings = [0.5, 1.0, 0.66]
    ema, out = 0.0, []
    for i, r in enumerate(readings):
        ema = adaptive_ema(ema, r, first=i == 0)
        out.append(ema)
    np.testing.assert_allclose(out, [0.5, 0.65, 42.91 / 66], rtol=1e-12)


# ----------------------------------------------------------------------------- boltzmann


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


OFFSETS = (0, 3, 5, 9)
VALUES = np.array([0.2, -0.5, 1.0, 3.0, 2.5, 0.0, 0.1, -0.2, 0.4])


def _draws(temps, n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    values = np.broadcast_to(VALUES, (n, VALUES.size)).copy()
    return boltzmann_select(values, OFFSETS, np.asarray(temps, float), rng.random((n, 3)))


def _freqs(actions, d):
    width = OFFSETS[d + 1] - OFFSETS[d]
    return np.bincount(actions[:, d], minlength=width) / actions.shape[0]


def test_boltzmann_output_shape_and_range():
    a = _draws([1.0, 1.0, 1.0], n=500)
    assert a.shape == (500, 3) and a.dtype == np.int64
    for d in range(3):
        assert a[:, d].min() >= 0 and a[:, d].max() < OFFSETS[d + 1] - OFFSETS[d]


def test_boltzmann_huge_temperature_is_uniform():
    a = _draws([1e9, 1e9, 1e9])
    for d in range(3):
        width = OFFSETS[d + 1] - OFFSETS[d]
        np.testing.assert_allclose(_freqs(a, d), 1.0 / width, atol=0.015)


def test_boltzmann_tiny_temperature_is_greedy():
    a = _draws([1e-6, 1e-6, 1e-6], n=2000)
    np.testing.assert_array_equal(a, np.broadcast_to([2, 0, 3], a.shape))


@pytest.mark.parametrize("temps", [[1.0, 0.5, 2.0], [0.3, 1.0, 0.1]])
def test_boltzmann_frequencies_match_softmax(temps):
    a = _draws(temps, seed=1)
    for d in range(3):
        v = VALUES[OFFSETS[d] : OFFSETS[d + 1]]
        np.testing.assert_allclose(_freqs(a, d), _softmax(v / temps[d]), atol=0.01)


def test_boltzmann_inverse_cdf_by_hand():
    # Two equal values: cdf = [0.5, 1.0]; u < 0.5 -> 0, u >= 0.5 -> 1, u -> 1 stays in range.
    values = np.zeros((4, 2))
    u = np.array([[0.0], [0.49], [0.51], [1.0 - 1e-12]])
    a = boltzmann_select(values, (0, 2), np.array([1.0]), u)
    np.testing.assert_array_equal(a[:, 0], [0, 0, 1, 1])


# ------------------------------------------------------------------ schedules (endpoints, mid)


@pytest.mark.parametrize(
    ("step", "expected"), [(0, 1.0), (25, 0.55), (50, 0.1), (100, 0.1), (10_000, 0.1)]
)
def test_annealed_tau(step, expected):
    assert annealed_tau(step, 100, tau=1.0, tau_min=0.1, fraction=0.5) == pytest.approx(expected)


@pytest.mark.parametrize(("step", "expected"), [(0, 0.0), (20, 0.5), (40, 1.0), (100, 1.0)])
def test_iqn_readiness(step, expected):
    assert iqn_readiness(step, 100, ramp_fraction=0.4) == pytest.approx(expected)


def test_schedules_with_zero_length_ramp_do_not_divide_by_zero():
    assert iqn_readiness(0, 0, 0.5) == 0.0
    assert iqn_readiness(3, 0, 0.5) == 1.0
    assert annealed_tau(5, 10, 1.0, 0.2, 0.0) == pytest.approx(0.2)
