"""The online learner: normalizer, training, skipped readings, state round trip, hostile inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from foxhunt_xlstm_context.learner import INPUT_KEYS, ContextLearner
from foxhunt_xlstm_context.normalizer import VAR_FLOOR, OnlineNormalizer
from foxhunt_xlstm_context.options import XlstmContextOptions

D = len(INPUT_KEYS)
OPTS = XlstmContextOptions()


# ----------------------------------------------------------------------------- normalizer
def test_normalizer_is_the_running_mean_and_variance_then_an_exponential_one():
    rng = np.random.default_rng(0)
    xs = rng.normal(3.0, 2.0, size=(80, D))
    norm = OnlineNormalizer(D, rate=0.02, input_clip=1e6, z_clip=50.0)
    for t, x in enumerate(xs[:50], start=1):  # t <= 1/rate: a plain running average
        z = norm.update(x)
        np.testing.assert_allclose(norm.mean, xs[:t].mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(norm.var, xs[:t].var(axis=0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(z, (x - xs[:t].mean(axis=0)) / np.sqrt(xs[:t].var(axis=0) + VAR_FLOOR),
                                   rtol=1e-9, atol=1e-12)
    mean, var = norm.mean.copy(), norm.var.copy()
    for x in xs[50:]:  # afterwards the rate stays at 0.02
        delta = x - mean
        mean = mean + 0.02 * delta
        var = 0.98 * (var + 0.02 * delta * delta)
        norm.update(x)
    np.testing.assert_allclose(norm.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(norm.var, var, rtol=1e-12)


def test_normalizer_clips_and_counts():
    norm = OnlineNormalizer(3, rate=0.1, input_clip=10.0, z_clip=2.0)
    assert (norm.update(np.array([1.0, 5.0, -1.0])) == 0.0).all()  # the first reading is its own mean
    z = norm.update(np.array([1.0, 1e9, -1e9]))  # two values beyond +-10
    assert norm.clipped == 2 and z[0] == 0.0  # a constant statistic reads 0
    assert np.abs(z).max() <= 2.0


# ----------------------------------------------------------------------------- learning
def _ar_sequence(steps: int, seed: int) -> np.ndarray:
    """Q-statistics-like readings: each statistic an AR(2) oscillation plus noise, on its own scale."""
    rng = np.random.default_rng(seed)
    scale = np.array([3.0, 0.5, 8.0, 1.0, 0.2, 0.9, 0.7, 0.05, 0.04, 0.02, 0.03])
    phase = rng.uniform(0, 2 * np.pi, size=D)
    t = np.arange(steps)[:, None]
    return scale * (1.0 + 0.5 * np.sin(2 * np.pi * t / 9.0 + phase) + 0.05 * rng.normal(size=(steps, D)))


def test_the_learner_beats_both_fixed_forecasts_on_a_predictable_sequence():
    """A period-9 oscillation: 'no change' and 'the running mean' are poor forecasts; the trained
    cell + head does much better (EMA of the loss after 3000 readings)."""
    learner = ContextLearner(OPTS)
    theta0 = learner.theta.copy()
    for x in _ar_sequence(3000, 1):
        assert learner.observe(x)
    ema = learner.loss_ema
    assert learner.updates == 2999 and learner.readings == 3000
    assert ema["model"] < 0.5 * ema["last"] and ema["model"] < 0.5 * ema["mean"], ema
    assert not np.array_equal(learner.theta, theta0)  # trained, not frozen at its init
    assert learner.context_norm > 0 and learner.divergence > 0


def test_nan_readings_are_skipped_and_counted_without_touching_the_state():
    learner = ContextLearner(OPTS)
    seq = _ar_sequence(30, 2)
    for x in seq[:20]:
        learner.observe(x)
    before = json.dumps(learner.state_dict())
    for bad in ([np.nan] * D, [*seq[20][:5], np.inf, *seq[20][6:]], [1.0] * (D - 1)):
        assert not learner.observe(bad)
    after = learner.state_dict()
    assert after["skipped"] == 3 and learner.divergence == 0.0
    after["skipped"], after["divergence"] = 0, json.loads(before)["divergence"]
    assert json.dumps(after) == before  # nothing else moved


def test_state_round_trip_is_exact_and_continues_bit_identically():
    a = ContextLearner(OPTS)
    seq = _ar_sequence(120, 3)
    for x in seq[:60]:
        a.observe(x)
    b = ContextLearner.from_state(OPTS, json.loads(json.dumps(a.state_dict())))
    assert json.dumps(b.state_dict()) == json.dumps(a.state_dict())
    for x in seq[60:]:
        a.observe(x)
        b.observe(x)
    assert np.array_equal(a.theta, b.theta) and np.array_equal(a.context, b.context)
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())


def test_a_state_for_other_options_is_refused_by_name():
    a = ContextLearner(OPTS)
    a.observe(_ar_sequence(1, 4)[0])
    with pytest.raises(ValueError, match="theta has shape \\(507,\\), expected \\(979,\\)"):
        ContextLearner.from_state(XlstmContextOptions(context_dim=16), a.state_dict())


# ----------------------------------------------------------------------------- hostile inputs
def _hostile(kind: str, steps: int, rng: np.random.Generator) -> np.ndarray:
    """``steps`` readings of one hostile kind, [steps, D]."""
    if kind == "constant":
        return np.full((steps, D), 0.37)
    if kind == "huge":  # beyond the input clip, up to the largest doubles, both signs
        return rng.choice([1e8, -1e15, 1e300, -1.7e308], size=(steps, D)) * rng.uniform(0.5, 1.0, size=(steps, D))
    if kind == "alternating":
        sign = np.where(np.arange(steps) % 2 == 1, 1.0, -1.0)[:, None]
        return 1e6 * sign + rng.normal(size=(steps, D))
    x = rng.normal(size=(steps, D))  # "nan": every third reading carries a NaN or an infinity
    rows = np.arange(0, steps, 3)
    x[rows, rng.integers(D, size=rows.size)] = rng.choice([np.nan, np.inf, -np.inf], size=rows.size)
    return x


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["constant", "huge", "alternating", "nan"])
def test_100000_hostile_readings_stay_finite(kind):
    learner = ContextLearner(OPTS)
    rng = np.random.default_rng(5)
    readings = _hostile(kind, 100_000, rng)
    for t, x in enumerate(readings):
        learner.observe(x)
        if t % 10_000 == 0:
            assert np.isfinite(learner.context).all() and np.isfinite(learner.theta).all(), t
    s = learner.state_dict()
    flat = [s["theta"], s["adam_m"], s["adam_v"], s["memory"]["c"], s["memory"]["n"], [s["memory"]["m"]],
            s["context"], s["normalizer"]["mean"], s["normalizer"]["var"], [learner.context_norm, learner.divergence]]
    assert all(np.isfinite(v).all() for v in flat)
    assert s["unfinished_updates"] == 0  # the guard against a non-finite gradient never fired
    if kind == "nan":
        assert s["skipped"] == 33_334 and s["readings"] == 66_666  # t % 3 == 0 for t < 100 000
    else:
        assert s["skipped"] == 0 and s["updates"] == 99_999
    if kind == "huge":
        assert s["normalizer"]["clipped"] > 0.7 * 100_000 * D
