"""The NumPy twin's own machinery: inputs at and around the grid's ends (slot G of the cubic
table), NaN inputs, float32 against float64, the array-module-generic branch (the one CuPy
takes) against the NumPy one, and what the cache keeps between forward and backward."""

from __future__ import annotations

import types

import numpy as np
import pytest
from foxhunt_kan_gate import gate as twin
from foxhunt_kan_gate.gate import gate_backward, gate_forward
from foxhunt_kan_gate.spline import Grid, basis_matrix, basis_slope_matrix
from foxhunt_kan_gate.stage import KanGateStage

GRIDS = [Grid(), Grid(-2.5, 3.0, 12), Grid(-4.0, 4.0, 4), Grid(-1.0, 1.0, 32)]


def _params(grid: Grid, width: int, seed: int, spread: float = 0.4):
    """Coefficients off the sigmoid fit by ``spread``, residual weights, and the generator."""
    rng = np.random.default_rng(seed)
    p = KanGateStage(grid=grid).init_params((width,), rng)
    return (p["b0.coeff"] + rng.normal(0, spread, p["b0.coeff"].shape), rng.normal(0, 0.15, width), rng)


def _oracle(grid: Grid, c, r, pre, w):
    """The gate and its gradients from the dense basis matrices (float64)."""
    b = basis_matrix(np, pre, grid)
    raw = np.einsum("bwk,wk->bw", b, c) + r * pre
    md = np.where((raw > 0) & (raw < 1), w, 0)
    slope = np.einsum("bwk,wk->bw", basis_slope_matrix(np, pre, grid), c)
    return np.clip(raw, 0, 1), md * (slope + r), np.einsum("bw,bwk->wk", md, b), (md * pre).sum(0)


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_inputs_at_and_around_the_ends_match_the_dense_oracle(grid):
    """lo, hi, the floats next to them, the knots and points beyond: hi and whatever rounds onto
    it land in slot G of the table (the last cubic continued), inputs beyond are clamped."""
    ends = []
    for e in (grid.lo, grid.hi):
        ends += [e, np.nextafter(e, -np.inf), np.nextafter(e, np.inf), e - 1e-9, e + 1e-9, e - 3.0, e + 3.0]
    x = np.concatenate([ends, grid.knots()])
    width = x.size
    c, r, rng = _params(grid, width, 11, spread=0.02)
    r *= 0.01  # raw inside (0, 1) at the ends: the output clamp passes the spline's slope there
    pre = np.tile(x, (6, 1)) + np.array([0.0, 0.0, 1e-12, -1e-12, 0.0, 0.0])[:, None]
    w = rng.normal(size=pre.shape)
    gate, cache = gate_forward(np, grid, c, r, pre)
    dpre, dc, dr = gate_backward(np, grid, c, r, cache, w)
    ref = _oracle(grid, c, r, pre, w)
    for name, got, want in zip(("gate", "dpre", "dcoeff", "dresidual"), (gate, dpre, dc, dr), ref):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13, err_msg=name)
    at_hi = (pre == grid.hi) & (gate > 0) & (gate < 1)
    assert at_hi.any() and np.abs(dpre[at_hi] - (w * r)[at_hi]).min() > 1e-6, \
        "the spline's slope at x = hi is its one-sided slope there, not 0"


def test_nan_input_gives_nan_gate_and_finite_coefficient_gradients():
    """A NaN input lands at lo (as in spline.locate and the kernels): its gate is NaN, so the
    output clamp stops its gradient; the coefficient gradients stay finite and equal those
    of the same batch with that element's gradient zeroed."""
    grid = Grid()
    c, r, rng = _params(grid, 5, 2)
    pre = rng.normal(0, 2, (7, 5))
    pre[3, 2] = np.nan
    w = rng.normal(size=pre.shape)
    gate, cache = gate_forward(np, grid, c, r, pre)
    assert np.isnan(gate[3, 2]) and np.isfinite(np.delete(gate.ravel(), 3 * 5 + 2)).all()
    dpre, dc, dr = gate_backward(np, grid, c, r, cache, w)
    assert dpre[3, 2] == 0 and np.isfinite(dpre).all() and np.isfinite(dc).all()
    w0 = w.copy()
    w0[3, 2] = 0
    _, dc0, _ = gate_backward(np, grid, c, r, cache, w0)
    np.testing.assert_array_equal(dc, dc0)


@pytest.mark.parametrize("grid", GRIDS[:3], ids=str)
def test_float32_twin_agrees_with_float64_to_rounding(grid):
    """The training dtype: float32 results within float32 rounding of the float64 twin on the
    same (float32) inputs; elements next to a clamp edge of raw are left out of dpre (there the
    clamp decision itself may round either way)."""
    c, r, rng = _params(grid, 64, 8)
    span = grid.hi - grid.lo
    pre = rng.uniform(grid.lo - 0.3 * span, grid.hi + 0.3 * span, (96, 64))
    w = rng.normal(size=pre.shape)
    args32 = [a.astype(np.float32) for a in (c, r, pre, w)]
    args64 = [a.astype(np.float64) for a in args32]
    g32, k32 = gate_forward(np, grid, *args32[:3])
    g64, k64 = gate_forward(np, grid, *args64[:3])
    out32 = gate_backward(np, grid, args32[0], args32[1], k32, args32[3])
    out64 = gate_backward(np, grid, args64[0], args64[1], k64, args64[3])
    assert g32.dtype == out32[0].dtype == out32[1].dtype == out32[2].dtype == np.float32
    np.testing.assert_allclose(g32, g64, rtol=0, atol=2e-6)
    raw = np.einsum("bwk,wk->bw", basis_matrix(np, args64[2], grid), args64[0]) + args64[1] * args64[2]
    keep = (np.abs(raw) > 1e-5) & (np.abs(raw - 1) > 1e-5)
    assert keep.mean() > 0.99 and (k32.inside_out == k64.inside_out)[keep].all()
    assert 0.1 < k64.inside_out.mean() < 0.9, "both sides of the output clamp"
    np.testing.assert_allclose(out32[0][keep], out64[0][keep], rtol=1e-5, atol=1e-6)
    for got, want in zip(out32[1:], out64[1:]):
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def _generic_numpy() -> types.SimpleNamespace:
    """NumPy's functions under a module that is not ``numpy``: the twin takes its generic branch
    (plans made per call, bincount scatters), the one it takes on CuPy."""
    return types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("_")})


@pytest.mark.parametrize("grid", GRIDS[:3], ids=str)
def test_generic_array_module_branch_matches_the_numpy_branch(grid):
    c, r, rng = _params(grid, 9, 4)
    pre = rng.uniform(grid.lo - 2, grid.hi + 2, (33, 9))
    w = rng.normal(size=pre.shape)
    xp = _generic_numpy()
    g_np, k_np = gate_forward(np, grid, c, r, pre)
    g_xp, k_xp = gate_forward(xp, grid, c, r, pre)
    np.testing.assert_array_equal(g_np, g_xp)
    for a, b in zip(gate_backward(np, grid, c, r, k_np, w), gate_backward(xp, grid, c, r, k_xp, w)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


def test_cache_keeps_no_per_element_array_of_its_own():
    """Between forward and backward the cache holds the input, the output (read-only, since the
    backward reads it) and the small cubic table: nothing else of the batch's size, so an update
    keeps alive what it would with the sigmoid gate."""
    grid = Grid()
    c, r, rng = _params(grid, 16, 1)
    pre = rng.normal(0, 2, (64, 16))
    gate, cache = gate_forward(np, grid, c, r, pre)
    big = [v for v in vars(cache).values() if isinstance(v, np.ndarray) and v.size >= pre.size]
    assert sorted(map(id, big)) == sorted([id(pre), id(gate)])
    assert cache.table.size == 16 * (grid.intervals + 1) * 4
    assert not gate.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        gate[0, 0] = 0.5


def test_plans_are_made_once_per_grid_dtype_and_width():
    twin._numpy_plan.cache_clear()
    grid = Grid()
    c, r, rng = _params(grid, 8, 0)
    for _ in range(3):
        gate_forward(np, grid, c, r, rng.normal(size=(4, 8)))
        gate_forward(np, grid, c.astype(np.float32), r.astype(np.float32), rng.normal(size=(4, 8)).astype(np.float32))
    info = twin._numpy_plan.cache_info()
    assert info.misses == 2 and info.hits == 4
