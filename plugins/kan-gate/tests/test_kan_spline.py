"""The spline basis (DESIGN.md defects 2 and 3) and the least-squares sigmoid fit.

Each defect test runs its check on the plugin's math and on a model of the plan's
(``kan_plan_versions.py``), and requires the check to pass on the first and to fail on the second.
"""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_kan_gate.spline import (
    Grid,
    basis_matrix,
    basis_slope_matrix,
    fit_sigmoid,
    knot_middle,
    knot_power_map,
    knot_power_value,
    knot_terms,
    locate,
    piece_slopes,
    pieces,
    power_map,
)
from kan_plan_versions import PLAN_SIGMOID_COEFFS, plan_basis, plan_piece_slopes

GRIDS = [Grid(), Grid(-4.0, 4.0, 4), Grid(-4.0, 4.0, 5), Grid(-2.5, 3.0, 12), Grid(-1.0, 1.0, 32)]


def _grid_points(grid: Grid, n: int = 2001) -> np.ndarray:
    """Evenly spaced points of [lo, hi], every knot inside it and both ends exactly."""
    return np.unique(np.concatenate([np.linspace(grid.lo, grid.hi, n), grid.knots()[3:-3], [grid.lo, grid.hi]]))


def _partition_problems(basis: np.ndarray, slopes: np.ndarray | None = None) -> list[str]:
    """Where a basis [n, K] fails to sum to 1, or its slopes fail to sum to 0."""
    out = []
    worst = float(np.abs(basis.sum(-1) - 1).max())
    if worst > 1e-12:
        out.append(f"basis sum off 1 by {worst:.3g}")
    if slopes is not None:
        worst = float(np.abs(slopes.sum(-1)).max())
        if worst > 1e-12:
            out.append(f"slope sum off 0 by {worst:.3g}")
    return out


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_basis_sums_to_one_and_slopes_to_zero_everywhere_on_the_grid(grid):
    """Defect 3: a partition of unity on all of [lo, hi], both ends included."""
    x = _grid_points(grid)
    assert x[0] == grid.lo and x[-1] == grid.hi
    b = basis_matrix(np, x, grid)
    assert (b >= 0).all()
    assert _partition_problems(b, basis_slope_matrix(np, x, grid)) == []


def test_the_check_fails_on_the_plans_basis():
    """The plan's 8 bases on unit-spaced knots, the out-of-range ones dropped: at both ends of
    [-4, 4] they sum to 1/6 .. 5/6, not 1."""
    grid = Grid()
    x = _grid_points(grid)
    problems = _partition_problems(plan_basis(x))
    assert problems and "basis sum off 1" in problems[0]
    s = plan_basis(np.array([grid.lo, 3.5, grid.hi])).sum(-1)
    assert s[0] == pytest.approx(5 / 6) and s[1] < 0.6 and s[2] < 0.2


def _slope_problems(slope_fn) -> list[str]:
    """Where the slopes of the four pieces differ from central differences of :func:`pieces`."""
    t = np.linspace(0.0, 1.0, 101)
    h = 1e-6
    num = [(a - b) / (2 * h) for a, b in zip(pieces(np, t + h), pieces(np, t - h))]
    return [f"piece {j}: off by {np.abs(s - n).max():.3g}"
            for j, (s, n) in enumerate(zip(slope_fn(t), num)) if np.abs(s - n).max() > 1e-8]


def test_piece_slopes_are_the_derivatives_of_the_pieces():
    """Defect 2: dB2/dt = (-3t^2 + 2t + 1) / 2; the plan wrote -3t^2 + 2t + 0.5."""
    assert _slope_problems(lambda t: piece_slopes(np, t)) == []
    t = np.linspace(0, 1, 5)
    np.testing.assert_allclose(piece_slopes(np, t)[2], (-3 * t**2 + 2 * t + 1) / 2, rtol=0, atol=1e-15)
    plan = _slope_problems(plan_piece_slopes)
    assert [p.split(":")[0] for p in plan] == ["piece 2"]


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_basis_slopes_are_derivatives_inside_and_zero_where_clamped(grid):
    rng = np.random.default_rng(4)
    span = grid.hi - grid.lo
    x = rng.uniform(grid.lo - span, grid.hi + span, 4000)
    knots = grid.knots()
    x = x[(np.abs(x[:, None] - knots[None, :]).min(1) > 1e-4)]  # away from the knots and the ends
    h = 1e-7
    num = (basis_matrix(np, x + h, grid) - basis_matrix(np, x - h, grid)) / (2 * h)
    ana = basis_slope_matrix(np, x, grid)
    np.testing.assert_allclose(ana, num, rtol=0, atol=1e-6)
    outside = (x < grid.lo) | (x > grid.hi)
    assert outside.sum() > 100 and not ana[outside].any()
    assert np.abs(ana[~outside]).max() > 0.4 / grid.step  # (the largest slope of a piece is 1/2 per knot step)
    # outside the range the basis is its value at the nearest end
    np.testing.assert_array_equal(basis_matrix(np, x[outside], grid),
                                  basis_matrix(np, np.clip(x[outside], grid.lo, grid.hi), grid))


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_basis_and_slopes_are_continuous_across_interior_knots(grid):
    """A cubic B-spline is C2: value and slope agree from both sides of every interior knot."""
    inner = grid.knots()[4:-4]
    eps = 1e-9 * grid.step
    for f in (basis_matrix, basis_slope_matrix):
        left, right = f(np, inner - eps, grid), f(np, inner + eps, grid)
        np.testing.assert_allclose(left, right, rtol=0, atol=1e-7)


def test_locate_puts_the_upper_end_in_the_last_interval():
    grid = Grid()
    loc = locate(np, np.array([grid.lo, grid.hi, grid.hi + 3, grid.lo - 3, 0.0]), grid)
    assert loc.span.tolist() == [0, grid.intervals - 1, grid.intervals - 1, 0, 2]
    np.testing.assert_allclose(loc.t, [0.0, 1.0, 1.0, 0.0, 0.5])
    assert loc.inside.tolist() == [True, True, False, False, True]
    assert grid.step == pytest.approx(8 / 5)


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_power_map_is_the_basis_as_cubics_and_continues_the_last_one(grid):
    """Each interval's cubic in t from :func:`power_map` is the dense basis's spline there, and
    slot G is the last interval's cubic continued past hi: p_G(t) = p_{G-1}(1 + t)."""
    rng = np.random.default_rng(5)
    m = power_map(grid)
    g = grid.intervals
    assert m.shape == (grid.num_bases, g + 1, 4)
    c = rng.normal(size=grid.num_bases)
    cubics = np.einsum("k,ksq->sq", c, m)  # [G + 1, 4] power coefficients
    x = np.concatenate([_grid_points(grid, 501), rng.uniform(grid.lo, grid.hi, 500)])
    loc = locate(np, x, grid)
    value = (cubics[loc.span] * loc.t[:, None] ** np.arange(4)).sum(-1)
    np.testing.assert_allclose(value, basis_matrix(np, x, grid) @ c, rtol=0, atol=1e-12 * np.abs(c).sum())
    tt = np.linspace(-1.0, 0.2, 25)
    beyond = (cubics[g] * tt[:, None] ** np.arange(4)).sum(-1)
    last = (cubics[g - 1] * (1 + tt)[:, None] ** np.arange(4)).sum(-1)
    np.testing.assert_allclose(beyond, last, rtol=0, atol=1e-12 * np.abs(c).sum())
    # at t = 0 slot G holds the spline's value at hi, and its t-slope the one-sided slope there
    at_hi = basis_matrix(np, np.array([grid.hi]), grid) @ c
    slope_hi = basis_slope_matrix(np, np.array([grid.hi]), grid) @ c * grid.step
    np.testing.assert_allclose([cubics[g, 0], cubics[g, 1]], [at_hi[0], slope_hi[0]],
                               rtol=0, atol=1e-12 * np.abs(c).sum())


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_knot_power_form_is_the_b_spline_everywhere(grid):
    """The knot-power coefficients c @ knot_power_map give the B-spline's value and slope at every
    point: on the knots, between them, at and past both ends (where both are constant); the form
    has K terms, and its middle interval holds the centre."""
    rng = np.random.default_rng(11)
    m = knot_power_map(grid)
    assert m.shape == (grid.num_bases, grid.num_bases)
    g, mid = grid.intervals, knot_middle(grid)
    assert 0 <= mid < g and len(knot_terms(np, np.zeros(3), grid)) == grid.num_bases
    c = rng.normal(size=(6, grid.num_bases))
    p = c @ m
    x = np.concatenate([_grid_points(grid, 701), rng.uniform(grid.lo - 3, grid.hi + 3, 400),
                        [grid.lo - 50.0, grid.hi + 50.0]])
    want = basis_matrix(np, x, grid) @ c.T  # [n, 6]
    got = knot_power_value(np, x[:, None], p[None], grid)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11 * np.abs(c).sum())
    # the slope, by central differences of the form, inside the grid away from its ends
    inside = x[(x > grid.lo + 1e-3) & (x < grid.hi - 1e-3)]
    e = 1e-6
    slope = (knot_power_value(np, (inside + e)[:, None], p[None], grid)
             - knot_power_value(np, (inside - e)[:, None], p[None], grid)) / (2 * e)
    np.testing.assert_allclose(slope, basis_slope_matrix(np, inside, grid) @ c.T, rtol=0,
                               atol=1e-6 * np.abs(c).sum())
    # a unit basis maps to its own row: B_k's form
    for k in range(grid.num_bases):
        np.testing.assert_allclose(knot_power_value(np, x, m[k], grid), basis_matrix(np, x, grid)[:, k],
                                   rtol=0, atol=1e-11)


def test_knot_power_terms_stay_small_on_the_grid():
    """Centred and opened outwards, no term of the default grid's form exceeds (G / 2)^3 on [0, G]
    (what keeps float32's cancellation small: the fragment's tests bound it per element)."""
    grid = Grid()
    u = np.linspace(0.0, grid.intervals, 2001)
    worst = max(float(np.abs(t).max()) for t in knot_terms(np, u, grid))
    assert worst <= (grid.intervals / 2) ** 3 + 1e-12


@pytest.mark.parametrize(("lo", "hi", "k", "msg"), [(1.0, 1.0, 8, "must be above"), (2.0, -2.0, 8, "must be above"),
                                                    (-4.0, 4.0, 3, "at least 4 bases")])
def test_grid_rejects_bad_ranges_and_counts(lo, hi, k, msg):
    with pytest.raises(ValueError, match=msg):
        Grid(lo, hi, k)


def test_sigmoid_fit_is_least_squares_and_small():
    """The initial coefficients: a least-squares fit of the sigmoid (computed, not typed)."""
    grid = Grid()
    fit = fit_sigmoid(grid)
    # the README's figures
    assert fit.max_error < 1.2e-3 and fit.rms_error < 6e-4
    assert fit.tail_error < 0.02  # beyond the ends the gate holds its end value (sigmoid(+-4) is 0.018 from 0 / 1)
    # least squares: the residual is orthogonal to every basis function at the fit's points
    x = np.linspace(grid.lo, grid.hi, 4001)
    b = basis_matrix(np, x, grid)
    r = b @ fit.coefficients - 1 / (1 + np.exp(-x))
    assert np.abs(b.T @ r).max() < 1e-9 * len(x)
    # it fits better than the plan's typed coefficients, on the plan's basis or this one
    sig = 1 / (1 + np.exp(-x))
    assert np.abs(plan_basis(x) @ PLAN_SIGMOID_COEFFS - sig).max() > 0.1
    assert np.abs(b @ PLAN_SIGMOID_COEFFS - sig).max() > 10 * fit.max_error
    # symmetric like the sigmoid: c_k + c_{K-1-k} = 1
    np.testing.assert_allclose(fit.coefficients + fit.coefficients[::-1], 1.0, atol=1e-9)


@pytest.mark.parametrize("k", [6, 8, 12, 16])
def test_more_bases_fit_the_sigmoid_better(k):
    small, large = fit_sigmoid(Grid(num_bases=k)), fit_sigmoid(Grid(num_bases=k + 4))
    assert large.max_error < small.max_error < 3e-3
