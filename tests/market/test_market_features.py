"""Features: schema order by name, hand-checked microstructure values, robustness, scaler."""

import numpy as np
import pytest

from foxhunt_core.config import MarketSettings
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import FeatureScaler, compute_features
from foxhunt_core.market.schema import ACCOUNT_BLOCK, INDEX, STATE_DIM
from foxhunt_core.market.synthetic import simulate


def _bars(mid, bid_size, ask_size, volume, count, signed, ofi, spread_ticks=1.0, tick=0.01):
    mid = np.asarray(mid, dtype=np.float64)
    n = mid.shape[0]
    half = 0.5 * tick * np.broadcast_to(np.asarray(spread_ticks, dtype=np.float64), (n,))
    f = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)).copy()  # noqa: E731
    return MarketData(
        timestamp=np.arange(n), mid=mid, bid=mid - half, ask=mid + half, bid_size=f(bid_size),
        ask_size=f(ask_size), trade_volume=f(volume), trade_count=f(count),
        signed_volume=f(signed), ofi=f(ofi), regime=np.full(n, -1),
        features=np.zeros((n, STATE_DIM)), tick_size=tick, source="test",
    )


def test_shape_dtype_finite_and_account_block_zero():
    d = simulate(MarketSettings(bars=2000, seed=1))
    f = d.features
    assert f.shape == (2000, STATE_DIM) and f.dtype == np.float32
    assert np.isfinite(f).all()
    a, b = ACCOUNT_BLOCK
    assert not f[:, a:b].any()
    # every market feature varies
    others = [i for i in range(STATE_DIM) if not a <= i < b]
    assert (f[:, others].std(axis=0) > 0).all()


def test_microstructure_block_by_name():
    d = _bars(
        mid=[100.0, 100.01, 100.03, 100.02], bid_size=[30, 10, 40, 20], ask_size=[10, 30, 40, 60],
        volume=[20, 40, 0, 10], count=[2, 4, 0, 1], signed=[5, -5, 0, 10], ofi=[10, -20, 0, 5],
        spread_ticks=[1, 2, 2, 3],
    )
    f = compute_features(d).astype(np.float64)
    np.testing.assert_allclose(f[:, INDEX["bid_ask_spread"]], [1, 2, 2, 3], rtol=1e-6)
    np.testing.assert_allclose(f[:, INDEX["l1_depth_imbalance"]], [0.5, -0.5, 0, -0.5], atol=1e-7)
    depth = np.array([20, 20, 40, 40.0])
    np.testing.assert_allclose(f[:, INDEX["ofi"]], [10 / 20, -1, 0, 5 / 40], rtol=1e-6)
    np.testing.assert_allclose(f[:, INDEX["queue_pressure"]],
                               np.log1p(np.array([20, 40, 0, 10]) / depth), rtol=1e-6)
    np.testing.assert_allclose(f[:, INDEX["spread_velocity"]], [0, 1, 0, 1], atol=1e-6)
    np.testing.assert_allclose(f[:, INDEX["depth_change_rate"]],
                               [0, 0, np.log(41 / 21), 0], atol=1e-6)
    # microprice - mid = imbalance * spread / 2, in ticks
    np.testing.assert_allclose(f[:, INDEX["microprice_dev"]], [0.25, -0.5, 0, -0.75], atol=1e-5)
    assert f[1, INDEX["ret_1"]] > 0 > f[3, INDEX["ret_1"]]
    assert f[0, INDEX["ret_1"]] == 0.0
    assert f[2, INDEX["trade_arrival_rate"]] < 0 < f[1, INDEX["trade_arrival_rate"]]


def test_degenerate_inputs_stay_finite():
    n = 300
    flat = _bars(mid=np.full(n, 50.0), bid_size=0, ask_size=0, volume=0, count=0, signed=0, ofi=0)
    f = compute_features(flat)
    assert np.isfinite(f).all()
    spread = [INDEX["bid_ask_spread"], INDEX["spread_mean_32"]]
    np.testing.assert_array_equal(f[:, spread], 1.0)  # one tick
    f[:, spread] = 0.0
    np.testing.assert_allclose(f, 0.0, atol=1e-9)  # nothing else moves: all others are 0


def test_scaler_fits_and_clips():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(1000, STATE_DIM)).astype(np.float32)
    a, b = ACCOUNT_BLOCK
    x[:, a:b] = 0.0
    x[:, 0] = 7.0  # a constant column
    sc = FeatureScaler.fit(x)
    y = sc.transform(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y[:, 1:a].mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(y[:, 1:a].std(axis=0), 1, atol=1e-4)
    assert not y[:, 0].any()
    big = x[:2].copy()
    big[0, 5], big[1, 5], big[0, a] = 1e6, -1e6, 0.75
    yb = sc.transform(big)
    assert yb[0, 5] == 5.0 and yb[1, 5] == -5.0
    assert yb[0, a] == pytest.approx(0.75)  # the account block passes through
    back = FeatureScaler.from_dict(sc.to_dict())
    np.testing.assert_array_equal(back.transform(x), y)
    with pytest.raises(ValueError):
        FeatureScaler.fit(np.zeros((0, STATE_DIM)))
