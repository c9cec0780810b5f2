"""Golden tests of the C51 projection (Eq. 7, Bellemare et al. 2017) and of the C51 loss."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt_core.c51 import loss_and_grad, project, support

# A support with dz = 1 whose atoms and shifts are exact in binary floating point.
Z5 = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])


def _project1(p, r, discount, z=Z5):
    return project(np.asarray([p], dtype=np.float64), np.array([r]), np.array([discount]), z)[0]


def reference_project(next_probs, rewards, discounts, z):
    """Eq. 7 written out: m_i = sum_j [1 - |clip(T z_j) - z_i| / dz]_0^1 p_j(x', a*)."""
    B, N = next_probs.shape
    v_min, v_max = float(z[0]), float(z[-1])
    dz = (v_max - v_min) / (N - 1)
    m = np.zeros((B, N), dtype=np.float64)
    for b in range(B):
        for j in range(N):
            tz = min(max(rewards[b] + discounts[b] * z[j], v_min), v_max)
            for i in range(N):
                m[b, i] += max(0.0, 1.0 - abs(tz - z[i]) / dz) * next_probs[b, j]
    return m


# --------------------------------------------------------------------------- project: golden


def test_support_atoms():
    z = support(-10.0, 10.0, 51)
    assert z.dtype == np.float32 and z.shape == (51,)
    np.testing.assert_allclose(z[[0, 25, 50]], [-10.0, 0.0, 10.0], atol=1e-6)
    np.testing.assert_allclose(np.diff(z), 0.4, rtol=1e-5)


def test_identity_shift_keeps_distribution():
    # r = 0, discount = 1: every atom lands on itself (low == up for every j).
    p = [0.1, 0.2, 0.3, 0.25, 0.15]
    np.testing.assert_array_equal(_project1(p, 0.0, 1.0), p)


def test_shift_by_one_atom_lands_on_grid_and_clips_at_v_max():
    # r = 1, discount = 1: T z = [-1, 0, 1, 2, 3] -> clipped [-1, 0, 1, 2, 2]; every shifted
    # atom sits exactly on a grid point (low == up), the last two pile onto v_max.
    p = [0.1, 0.2, 0.3, 0.25, 0.15]
    np.testing.assert_allclose(_project1(p, 1.0, 1.0), [0.0, 0.1, 0.2, 0.3, 0.4], atol=1e-15)


def test_single_atom_on_grid_point_gets_all_mass():
    # One-hot at z = -1, r = 2, discount = 1 -> T z = 1 exactly: all mass on atom 3.
    m = _project1([0.0, 1.0, 0.0, 0.0, 0.0], 2.0, 1.0)
    np.testing.assert_array_equal(m, [0.0, 0.0, 0.0, 1.0, 0.0])


def test_shift_halfway_splits_mass_evenly():
    # One-hot at z = 0, r = 0.5 -> T z = 0.5, halfway between atoms 2 and 3.
    m = _project1([0.0, 0.0, 1.0, 0.0, 0.0], 0.5, 1.0)
    np.testing.assert_allclose(m, [0.0, 0.0, 0.5, 0.5, 0.0], atol=1e-15)


def test_contraction_by_half():
    # r = 0, discount = 0.5: T z = [-1, -0.5, 0, 0.5, 1]
    # m1 = a + b/2, m2 = b/2 + c + d/2, m3 = d/2 + e.
    a, b, c, d, e = 0.1, 0.2, 0.3, 0.25, 0.15
    m = _project1([a, b, c, d, e], 0.0, 0.5)
    np.testing.assert_allclose(m, [0.0, a + b / 2, b / 2 + c + d / 2, d / 2 + e, 0.0], atol=1e-15)


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        (-5.0, [1.0, 0, 0, 0, 0]),
        (-2.0, [1.0, 0, 0, 0, 0]),
        (5.0, [0, 0, 0, 0, 1.0]),
        (2.0, [0, 0, 0, 0, 1.0]),
    ],
)
def test_clipping_piles_mass_on_end_atom(reward, expected):
    # discount 0.9 keeps |discount * z| <= 1.8, so r = +-5 sends every atom past the ends; the
    # terminal r = +-2 case (discount 0) hits the end atom exactly.
    p = [0.1, 0.2, 0.3, 0.25, 0.15]
    disc = 0.9 if abs(reward) > 2 else 0.0
    np.testing.assert_allclose(_project1(p, reward, disc), expected, atol=1e-15)


def test_clipping_partial():
    # r = 1.5, discount = 1: T z = [-0.5, 0.5, 1.5, 2.5, 3.5] -> [-0.5, 0.5, 1.5, 2, 2].
    a, b, c, d, e = 0.1, 0.2, 0.3, 0.25, 0.15
    m = _project1([a, b, c, d, e], 1.5, 1.0)
    expected = [0.0, a / 2, a / 2 + b / 2, b / 2 + c / 2, c / 2 + d + e]
    np.testing.assert_allclose(m, expected, atol=1e-15)


@pytest.mark.parametrize("p", [[0.2] * 5, [0.0, 0.0, 0.0, 0.0, 1.0], [0.7, 0.1, 0.1, 0.05, 0.05]])
def test_terminal_on_grid_is_point_mass_at_reward(p):
    np.testing.assert_allclose(_project1(p, 1.0, 0.0), [0, 0, 0, 1.0, 0], atol=1e-15)
    np.testing.assert_allclose(_project1(p, 0.0, 0.0), [0, 0, 1.0, 0, 0], atol=1e-15)


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(0.25, [0, 0, 0.75, 0.25, 0]), (-0.75, [0, 0.75, 0.25, 0, 0]), (1.5, [0, 0, 0, 0.5, 0.5])],
)
def test_terminal_off_grid_splits_between_neighbours(reward, expected):
    p = [0.7, 0.1, 0.1, 0.05, 0.05]
    np.testing.assert_allclose(_project1(p, reward, 0.0), expected, atol=1e-15)


def test_rows_are_independent_and_dtype_kept():
    z = Z5.astype(np.float32)
    p = np.array([[0, 0, 1, 0, 0], [0.2] * 5, [0, 1, 0, 0, 0]], dtype=np.float32)
    m = project(p, np.array([0.5, 1.0, -3.0], np.float32), np.array([1.0, 0.0, 1.0], np.float32), z)
    assert m.dtype == np.float32 and m.shape == (3, 5)
    expected = [[0, 0, 0.5, 0.5, 0], [0, 0, 0, 1, 0], [1, 0, 0, 0, 0]]
    np.testing.assert_allclose(m, expected, atol=1e-7)


# ------------------------------------------------------------------ project: random properties


def _random_case(rng, B, N):
    logits = rng.normal(size=(B, N)) * 3
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    rewards = rng.uniform(-15, 15, size=B)
    discounts = rng.choice([0.0, 0.5, 0.9, 0.99, 1.0], size=B) * rng.uniform(0.5, 1.0, size=B)
    discounts[rng.random(B) < 0.2] = 0.0
    return p, rewards, discounts


@pytest.mark.parametrize(
    ("v_min", "v_max", "N"), [(-10.0, 10.0, 51), (-2.0, 2.0, 5), (-3.0, 7.0, 11)]
)
def test_matches_naive_eq7_reference(v_min, v_max, N):
    rng = np.random.default_rng(N)
    z = support(v_min, v_max, N, dtype=np.float64)
    p, r, d = _random_case(rng, 64, N)
    # Include rewards that land exactly on atoms with discount 0 and with discount 1.
    r[:4] = z[[0, N // 2, N - 1, 1]]
    d[:2] = 0.0
    d[2:4] = 1.0
    np.testing.assert_allclose(project(p, r, d, z), reference_project(p, r, d, z), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.sampled_from([(-10.0, 10.0, 51), (-2.0, 2.0, 5), (-1.0, 1.0, 21)]),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_mass_sums_to_one_and_is_nonnegative(seed, shape, dtype):
    v_min, v_max, N = shape
    rng = np.random.default_rng(seed)
    z = support(v_min, v_max, N, dtype=dtype)
    p, r, d = _random_case(rng, 16, N)
    m = project(p.astype(dtype), r.astype(dtype), d.astype(dtype), z)
    assert m.shape == (16, N)
    assert (m >= -1e-7).all()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=tol)


@pytest.mark.parametrize(
    ("v_min", "v_max", "N", "dtype"), [(-1.0, 1.0, 62, np.float32), (-25.0, 25.0, 30, np.float64)]
)
def test_mass_clipped_at_v_max_stays_in_row(v_min, v_max, N, dtype):
    z = support(v_min, v_max, N, dtype=dtype)
    p = np.full((2, N), 1.0 / N, dtype=dtype)
    # Row 0 is shifted far above v_max: all its mass must go to z[N-1]; row 1 is a point mass
    # at r = 0, away from atom 0.
    m = project(p, np.array([5 * v_max, 0.0], dtype), np.array([0.5, 0.0], dtype), z)
    np.testing.assert_allclose(m[0, -1], 1.0, atol=1e-6)
    np.testing.assert_allclose(m[1, 0], 0.0, atol=1e-12)  # nothing leaked from row 0
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-6)
    # The same clipping on the last row must not index past the batch.
    m = project(p, np.array([0.0, 5 * v_max], dtype), np.array([0.5, 0.5], dtype), z)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-6)


# ------------------------------------------------------------------------- loss and gradient


def _log_softmax(logits):
    s = logits - logits.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def _direct_loss(logits, target, c):
    logp = _log_softmax(logits)
    p = np.exp(logp)
    return -(target * logp).sum(-1) - c * (-(p * logp).sum(-1))


def _targets(rng, shape):
    t = rng.random(shape) ** 3
    return t / t.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("c", [0.0, 0.01, 0.5])
def test_loss_equals_direct_computation(c):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 3, 11)) * 2
    target = _targets(rng, logits.shape)
    loss, dl, ent = loss_and_grad(_log_softmax(logits), target, c)
    assert loss.shape == ent.shape == (4, 3) and dl.shape == logits.shape
    np.testing.assert_allclose(loss, _direct_loss(logits, target, c), rtol=1e-12)
    p = np.exp(_log_softmax(logits))
    np.testing.assert_allclose(ent, -(p * np.log(p)).sum(-1), rtol=1e-12)


def test_entropy_of_uniform_is_log_n():
    _, _, ent = loss_and_grad(_log_softmax(np.zeros((2, 7))), np.full((2, 7), 1 / 7), 0.1)
    np.testing.assert_allclose(ent, np.log(7), rtol=1e-12)


@pytest.mark.parametrize("c", [0.0, 0.05, 1.0])
def test_gradient_matches_central_differences(c):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 9)) * 1.5
    target = _targets(rng, logits.shape)
    _, dl, _ = loss_and_grad(_log_softmax(logits), target, c)
    h = 1e-6
    num = np.zeros_like(logits)
    for idx in np.ndindex(logits.shape):
        lp, lm = logits.copy(), logits.copy()
        lp[idx] += h
        lm[idx] -= h
        num[idx] = (_direct_loss(lp, target, c).sum() - _direct_loss(lm, target, c).sum()) / (2 * h)
    np.testing.assert_allclose(dl, num, atol=1e-8, rtol=1e-6)


def test_gradient_zero_when_target_equals_prediction():
    rng = np.random.default_rng(3)
    logp = _log_softmax(rng.normal(size=(5, 13)))
    _, dl, _ = loss_and_grad(logp, np.exp(logp), 0.0)
    np.testing.assert_allclose(dl, 0.0, atol=1e-15)
    # ...but the entropy bonus still pushes a non-uniform prediction.
    _, dl, _ = loss_and_grad(logp, np.exp(logp), 0.1)
    assert np.abs(dl).max() > 1e-4
