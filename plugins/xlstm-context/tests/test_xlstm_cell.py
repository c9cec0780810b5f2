"""The stabilized mLSTM cell: the exact recurrence it stabilizes, the plan's clamp, the backward."""

from __future__ import annotations

import math

import numpy as np
import pytest
from foxhunt_xlstm_context.cell import Layout, State, init_params, prediction_loss, step, step_backward

LAYOUT = Layout(inputs=11, dim=8)
D, d = LAYOUT.inputs, LAYOUT.dim


def _params(seed: int, i_bias: float = 0.0, f_bias: float = 3.0, scale: float = 1.0) -> np.ndarray:
    flat = init_params(LAYOUT, np.random.default_rng(seed), f_bias)
    p = LAYOUT.views(flat)
    p.w *= scale
    p.b[4 * d] = i_bias
    return flat


def naive_step(flat: np.ndarray, z: np.ndarray, c: np.ndarray, n: np.ndarray, clamp: float | None = None):
    """The paper's mLSTM without the stabilizer: exp input gate, sigmoid forget gate, max(|n q|, 1).
    ``clamp`` caps the exponential input gate as the plan did (1e6)."""
    p = LAYOUT.views(flat)
    pre = p.w @ z + p.b
    q, k, v = pre[:d], pre[d : 2 * d] / math.sqrt(d), pre[2 * d : 3 * d]
    o = 1.0 / (1.0 + np.exp(-pre[3 * d : 4 * d]))
    with np.errstate(over="ignore", invalid="ignore"):
        i = np.exp(pre[4 * d])
        if clamp is not None:
            i = min(i, clamp)
        f = 1.0 / (1.0 + np.exp(-pre[4 * d + 1]))
        c = f * c + i * np.outer(v, k)
        n = f * n + i * k
        h = o * (c @ q) / max(abs(n @ q), 1.0)
    return h, c, n


def _inputs(seed: int, steps: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(steps, D))


def test_the_stabilized_step_is_the_exact_recurrence_where_that_is_representable():
    """60 steps with moderate gates: the stabilized cell equals the unstabilized float64 math, and its
    memory is the paper's memory times exp(-m)."""
    flat = _params(1)
    p = LAYOUT.views(flat)
    s = State.zeros(d)
    c, n = np.zeros((d, d)), np.zeros(d)
    for z in _inputs(2, 60):
        h, s, _ = step(p, z, s)
        h_ref, c, n = naive_step(flat, z, c, n)
        np.testing.assert_allclose(h, h_ref, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(s.c * math.exp(s.m), c, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(s.n * math.exp(s.m), n, rtol=1e-11, atol=1e-13)


def test_a_large_input_gate_is_exact_where_the_plans_clamp_is_not():
    """Input-gate pre-activation 20: exp(20) = 4.9e8 is representable, so the exact math is known.
    The plan's clamp at 1e6 (defect 7) changes the context; the stabilized cell does not."""
    flat = _params(3, i_bias=20.0)
    p = LAYOUT.views(flat)
    s = State.zeros(d)
    c, n, cc, nc = np.zeros((d, d)), np.zeros(d), np.zeros((d, d)), np.zeros(d)
    worst_clamped = 0.0
    for z in _inputs(4, 30):
        h, s, _ = step(p, z, s)
        h_ref, c, n = naive_step(flat, z, c, n)
        h_clamp, cc, nc = naive_step(flat, z, cc, nc, clamp=1e6)
        np.testing.assert_allclose(h, h_ref, rtol=1e-9, atol=1e-12)
        worst_clamped = max(worst_clamped, float(np.abs(h_clamp - h_ref).max() / np.abs(h_ref).max()))
    assert worst_clamped > 1e-3  # the clamp is not a harmless approximation


def test_input_gates_beyond_float64_stay_finite():
    """Pre-activations of +-800: exp overflows (the naive cell is NaN at once); the stabilized one is
    finite, with gates in (0, 1] and a bounded context."""
    for i_bias in (800.0, -800.0):
        flat = _params(5, i_bias=i_bias)
        p = LAYOUT.views(flat)
        s = State.zeros(d)
        c, n = np.zeros((d, d)), np.zeros(d)
        for z in _inputs(6, 200):
            h, s, cache = step(p, z, s)
            assert np.isfinite(h).all() and np.isfinite(s.c).all() and math.isfinite(s.m)
            assert 0.0 <= cache.a <= 1.0 and 0.0 <= cache.g <= 1.0  # exp(-800) may underflow to 0
        if i_bias > 0:
            h_ref, _, _ = naive_step(flat, _inputs(6, 1)[0], c, n)
            assert not np.isfinite(h_ref).all()


# ----------------------------------------------------------------------------- the backward
def _loss_of(flat: np.ndarray, z: np.ndarray, prev: State, target: np.ndarray) -> float:
    p = LAYOUT.views(flat)
    h, _, _ = step(p, z, prev)
    return prediction_loss(p, h, target, LAYOUT.views(np.zeros_like(flat)))[0]


def _analytic(flat: np.ndarray, z: np.ndarray, prev: State, target: np.ndarray):
    p = LAYOUT.views(flat)
    g = np.zeros_like(flat)
    h, _, cache = step(p, z, prev)
    _, dh = prediction_loss(p, h, target, LAYOUT.views(g))
    step_backward(p, cache, dh, LAYOUT.views(g))
    return g, cache


def _warm_state(flat: np.ndarray, steps: int, seed: int) -> State:
    p = LAYOUT.views(flat)
    s = State.zeros(d)
    for z in _inputs(seed, steps):
        _, s, _ = step(p, z, s)
    return s


def _case(i_bias: float, f_bias: float, warm_i_bias: float | None = None) -> tuple[np.ndarray, State]:
    """Parameters and a previous state from 6 steps of a cell (``warm_i_bias``: of another cell)."""
    flat = _params(7, i_bias=i_bias, f_bias=f_bias)
    warm = flat if warm_i_bias is None else _params(7, i_bias=warm_i_bias, f_bias=f_bias)
    return flat, _warm_state(warm, 6, 8)


CASES = {  # name: (params, previous state), (forget term wins the stabilizer, |n q| wins the normalizer)
    "forget wins m, |n q| wins": (lambda: _case(-1.0, 3.0, warm_i_bias=2.0), (True, True)),
    "forget wins m, exp(-m) wins": (lambda: _case(-1.0, 3.0), (True, False)),
    "input wins m, |n q| wins": (lambda: _case(2.0, 3.0, warm_i_bias=0.0), (False, True)),
    "input wins m, exp(-m) wins": (lambda: _case(-2.0, -3.0), (False, False)),
    "empty memory": (lambda: (_params(13), State.zeros(d)), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_backward_matches_central_differences_in_float64(case):
    """Every one of the 507 parameters, in each branch of the two maxima of the step."""
    make, branches = CASES[case]
    flat, prev = make()
    rng = np.random.default_rng(list(CASES).index(case))
    z, target = rng.normal(size=D), rng.normal(size=D)
    g, cache = _analytic(flat, z, prev, target)
    if branches is not None:
        assert (cache.forget_wins, cache.abs_wins) == branches
    h = 1e-6
    num = np.empty_like(flat)
    for j in range(flat.size):
        old = flat[j]
        flat[j] = old + h
        fp = _loss_of(flat, z, prev, target)
        flat[j] = old - h
        fm = _loss_of(flat, z, prev, target)
        flat[j] = old
        num[j] = (fp - fm) / (2 * h)
    # central differences of a loss of order 1 carry ~1e-10 of rounding: entries below 1e-4 are checked
    # against that absolute floor, the others relatively
    bad = np.abs(g - num) > 1e-9 + 1e-5 * np.maximum(np.abs(g), np.abs(num))
    assert not bad.any(), (case, np.flatnonzero(bad)[:5], g[bad][:5], num[bad][:5])
    assert np.linalg.norm(g - num) / np.linalg.norm(num) < 1e-6
    if branches is None:
        return  # C = n = 0: h = o * v * sign(k.q), so q, k and the gates carry (almost) no gradient
    gv = LAYOUT.views(g)
    for rows, what in ((slice(0, d), "q"), (slice(d, 2 * d), "k"), (slice(2 * d, 3 * d), "v"),
                       (slice(3 * d, 4 * d), "o"), (slice(4 * d, 4 * d + 1), "input gate"),
                       (slice(4 * d + 1, 4 * d + 2), "forget gate")):
        assert np.abs(gv.w[rows]).max() > 1e-6, (case, what)  # nothing is silently cut off


def test_layout_views_share_the_flat_vector():
    flat = np.arange(LAYOUT.size, dtype=np.float64)
    p = LAYOUT.views(flat)
    assert LAYOUT.size == (4 * d + 2) * (D + 1) + D * (d + 1) == 507
    p.bp[-1] = -5.0
    assert flat[-1] == -5.0 and p.w[0, 0] == 0.0 and p.b[0] == (4 * d + 2) * D
    with pytest.raises(ValueError, match="the layout needs"):
        LAYOUT.views(np.zeros(10))
