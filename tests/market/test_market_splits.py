"""Time splits and causality: no feature looks at a later bar, the scaler sees only train."""

import numpy as np
import pytest

from foxhunt_core.config import MarketSettings
from foxhunt_core.market.data import ARRAY_FIELDS
from foxhunt_core.market.features import compute_features
from foxhunt_core.market.splits import split_by_time, synthetic_splits
from foxhunt_core.market.synthetic import simulate

_RAW = [f for f in ARRAY_FIELDS if f not in ("timestamp", "regime")]


@pytest.fixture(scope="module")
def market():
    return simulate(MarketSettings(bars=2000, seed=5))


def _perturbed_after(data, t, rng):
    """A copy of ``data`` whose every raw input after bar ``t`` is randomly rescaled."""
    changes = {}
    for name in _RAW:
        arr = getattr(data, name).copy()
        arr[t + 1:] *= rng.uniform(0.5, 1.5, size=arr.shape[0] - t - 1)
        changes[name] = arr
    changes["ask"] = np.maximum(changes["ask"], changes["bid"])
    return data.replace(**changes)


@pytest.mark.parametrize("t", [0, 1, 7, 63, 128, 500, 1998])
def test_no_look_ahead(market, t):
    rng = np.random.default_rng(t)
    base = compute_features(market)
    other = _perturbed_after(market, t, rng)
    moved = compute_features(other)
    np.testing.assert_array_equal(moved[: t + 1], base[: t + 1])  # bit for bit
    if t < len(market) - 2:
        assert not np.array_equal(moved[t + 1:], base[t + 1:])  # the perturbation is felt


@pytest.mark.parametrize("t", [3, 40, 900])
def test_no_look_ahead_with_high_low(market, t):
    rng = np.random.default_rng(t)
    high, low = market.mid * 1.001, market.mid * 0.999
    base = compute_features(market, high=high, low=low)
    h2, l2 = high.copy(), low.copy()
    h2[t + 1:] *= 1.01
    l2[t + 1:] *= 0.99
    moved = compute_features(_perturbed_after(market, t, rng), high=h2, low=l2)
    np.testing.assert_array_equal(moved[: t + 1], base[: t + 1])


def test_split_sizes_order_and_scaling(market):
    s = split_by_time(market, 0.7, 0.1)
    assert (len(s.train), len(s.val), len(s.test)) == (1400, 200, 400)
    assert s.bounds == ((0, 1400), (1400, 1600), (1600, 2000))
    assert s.train.timestamp[-1] < s.val.timestamp[0] and s.val.timestamp[-1] < s.test.timestamp[0]
    assert s.train.scaled and s.test.scaled
    np.testing.assert_array_equal(s.test.mid, market.mid[1600:])
    np.testing.assert_array_equal(s.test.features, s.scaler.transform(market.features[1600:]))
    x = s.train.features[:, :38].astype(np.float64)
    assert np.abs(x.mean(axis=0)).max() < 0.1 and np.abs(x).max() <= 5.0


def test_scaler_sees_only_train(market):
    s = split_by_time(market, 0.7, 0.1)
    later = _perturbed_after(market, 1399, np.random.default_rng(0))
    later = later.replace(features=compute_features(later))
    s2 = split_by_time(later, 0.7, 0.1)
    np.testing.assert_array_equal(s2.scaler.mean, s.scaler.mean)
    np.testing.assert_array_equal(s2.train.features, s.train.features)
    assert not np.array_equal(s2.test.features, s.test.features)


def test_empty_validation_and_bad_fractions(market):
    s = split_by_time(market, 0.8, 0.0)
    assert len(s.val) == 0 and len(s.test) == 400
    with pytest.raises(ValueError):
        split_by_time(market, 0.9, 0.1)
    with pytest.raises(ValueError):
        split_by_time(market, 1.2, 0.1)


def test_synthetic_splits_uses_settings():
    s = synthetic_splits(MarketSettings(bars=2000, train_fraction=0.5, val_fraction=0.2))
    assert (len(s.train), len(s.val), len(s.test)) == (1000, 400, 600)
