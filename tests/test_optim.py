"""Adam with global-norm clipping over a ``{owner: {name: array}}`` tree."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from foxhunt_core.optim import Adam, global_norm


def _params(rng):
    return {
        "core": {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=4)},
        "plug": {"s": rng.normal(size=2)},
    }


def _grads(rng, scale=1.0):
    return {
        "core": {"w": rng.normal(size=(3, 4)) * scale, "b": rng.normal(size=4) * scale},
        "plug": {"s": rng.normal(size=2) * scale},
    }


class RefAdam:
    """Textbook Adam (Kingma & Ba 2015, Algorithm 1) on flat dicts, clipping by global norm."""

    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8, clip_norm=None):
        self.lr, self.b1, self.b2, self.eps, self.clip = lr, b1, b2, eps, clip_norm
        self.m, self.v, self.t = {}, {}, 0

    def step(self, params, grads):
        keys = [(o, n) for o in params for n in params[o]]
        norm = np.sqrt(sum(np.sum(grads[o][n] ** 2) for o, n in keys))
        scale = self.clip / norm if self.clip is not None and norm > self.clip else 1.0
        self.t += 1
        for o, n in keys:
            g = grads[o][n] * scale
            m = self.b1 * self.m.get((o, n), 0.0) + (1 - self.b1) * g
            v = self.b2 * self.v.get((o, n), 0.0) + (1 - self.b2) * g * g
            self.m[(o, n)], self.v[(o, n)] = m, v
            m_hat = m / (1 - self.b1**self.t)
            v_hat = v / (1 - self.b2**self.t)
            params[o][n] = params[o][n] - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        return norm


def test_first_step_is_lr_times_sign():
    rng = np.random.default_rng(0)
    params = _params(rng)
    before = copy.deepcopy(params)
    grads = _grads(rng)
    Adam(params, lr=0.01).step(params, grads)
    for o in params:
        for n in params[o]:
            expected = before[o][n] - 0.01 * np.sign(grads[o][n])
            np.testing.assert_allclose(params[o][n], expected, atol=1e-8)


def test_updates_in_place():
    rng = np.random.default_rng(1)
    params = _params(rng)
    w = params["core"]["w"]
    Adam(params, lr=0.1).step(params, _grads(rng))
    assert params["core"]["w"] is w


def test_matches_reference_for_ten_steps():
    rng = np.random.default_rng(2)
    params = _params(rng)
    ref_params = copy.deepcopy(params)
    opt, ref = Adam(params, lr=3e-3, betas=(0.8, 0.99), eps=1e-6), RefAdam(3e-3, 0.8, 0.99, 1e-6)
    for _ in range(10):
        g = _grads(rng, scale=rng.uniform(0.01, 10))
        assert opt.step(params, g) == pytest.approx(ref.step(ref_params, g), rel=1e-12)
        for o in params:
            for n in params[o]:
                np.testing.assert_allclose(params[o][n], ref_params[o][n], rtol=1e-12, atol=1e-14)
    assert opt.t == 10


def test_clipping_matches_reference_above_and_below_threshold():
    rng = np.random.default_rng(3)
    params = _params(rng)
    ref_params = copy.deepcopy(params)
    opt, ref = Adam(params, lr=1e-2, clip_norm=1.0), RefAdam(1e-2, clip_norm=1.0)
    clipped = 0
    for i in range(10):
        g = _grads(rng, scale=[0.01, 5.0][i % 2])  # alternate below and above the threshold
        clipped += global_norm(g) > 1.0
        opt.step(params, g)
        ref.step(ref_params, g)
        for o in params:
            for n in params[o]:
                np.testing.assert_allclose(params[o][n], ref_params[o][n], rtol=1e-12, atol=1e-14)
    assert clipped == 5


def test_clipping_scales_the_first_moment_only_above_threshold():
    rng = np.random.default_rng(4)
    g = _grads(rng)
    norm = global_norm(g)
    for clip, scale in [(norm / 4, 0.25), (norm * 2, 1.0)]:
        params = _params(rng)
        opt = Adam(params, lr=1e-3, clip_norm=clip)
        returned = opt.step(params, g)
        assert returned == pytest.approx(norm, rel=1e-12)  # the norm before clipping
        np.testing.assert_allclose(opt.m["core"]["w"], 0.1 * g["core"]["w"] * scale, rtol=1e-9)
        np.testing.assert_allclose(
            opt.v["plug"]["s"], 1e-3 * (g["plug"]["s"] * scale) ** 2, rtol=1e-9
        )


def test_step_returns_global_norm():
    g = {"a": {"x": np.array([3.0, 0.0])}, "b": {"y": np.array([[4.0]])}}
    params = {"a": {"x": np.zeros(2)}, "b": {"y": np.zeros((1, 1))}}
    assert Adam(params, lr=1.0, clip_norm=1.0).step(params, g) == pytest.approx(5.0)


def test_parameter_without_gradient_is_left_alone():
    rng = np.random.default_rng(5)
    params = _params(rng)
    s0 = params["plug"]["s"].copy()
    g = _grads(rng)
    del g["plug"]
    Adam(params, lr=0.1).step(params, g)
    np.testing.assert_array_equal(params["plug"]["s"], s0)


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(6)
    grads = [_grads(rng, scale=s) for s in (1.0, 3.0, 0.2, 1.0, 2.0, 0.5)]
    params = _params(rng)
    opt = Adam(params, lr=1e-2, clip_norm=2.0)
    for g in grads[:3]:
        opt.step(params, g)
    saved_params = copy.deepcopy(params)
    saved = copy.deepcopy(opt.state_tree())
    saved_t = opt.t
    assert set(saved) == {"m", "v"}

    resumed_params = copy.deepcopy(saved_params)
    resumed = Adam(resumed_params, lr=1e-2, clip_norm=2.0)
    resumed.load_state(saved["m"], saved["v"], saved_t)
    assert resumed.t == 3
    for g in grads[3:]:
        opt.step(params, g)
        resumed.step(resumed_params, g)
    for o in params:
        for n in params[o]:
            np.testing.assert_array_equal(resumed_params[o][n], params[o][n])

    # A fresh optimizer that skipped load_state (t = 0, zero moments) diverges: the check bites.
    fresh_params = copy.deepcopy(saved_params)
    fresh = Adam(fresh_params, lr=1e-2, clip_norm=2.0)
    for g in grads[3:]:
        fresh.step(fresh_params, g)
    assert not np.allclose(fresh_params["core"]["w"], params["core"]["w"], rtol=1e-9, atol=0)
