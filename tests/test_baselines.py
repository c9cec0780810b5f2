"""The fitted baselines: linear recovers a planted forecast and trades only past the cost;
momentum trades the sign of the chosen lookback, chosen on validation."""

import numpy as np
import pytest

from foxhunt_core.baselines import MOMENTUM_LOOKBACKS, fit_baselines, fit_linear, linear_policy, momentum_policy
from foxhunt_core.config import EnvSettings, MarketSettings
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import FeatureScaler
from foxhunt_core.market.schema import INDEX, MARKET_FEATURES, STATE_DIM
from foxhunt_core.market.splits import synthetic_splits


def _planted(n=4000, seed=0, half_spread=1e-4):
    """Bars whose next return is 2e-4 * feature ofi + noise (the other features noise)."""
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, STATE_DIM)).astype(np.float32)
    feats[:, 38:42] = 0.0
    r = 2e-4 * feats[:-1, INDEX["ofi"]] + 1e-4 * rng.standard_normal(n - 1)
    mid = 100.0 * np.exp(np.concatenate([[0.0], np.cumsum(r)]))
    z = np.zeros(n)
    return MarketData(timestamp=np.arange(n), mid=mid, bid=mid * (1 - half_spread), ask=mid * (1 + half_spread),
                      bid_size=z + 10, ask_size=z + 10, trade_volume=z + 1, trade_count=z + 1, signed_volume=z,
                      ofi=z, regime=np.full(n, -1), features=feats, tick_size=1e-6, source="planted")


def test_linear_recovers_the_planted_forecast():
    data = _planted()
    model = fit_linear(data, EnvSettings(taker_fee_bps=0.5))
    w = dict(zip(MARKET_FEATURES, model.weights[:-1]))
    assert w[INDEX["ofi"]] == pytest.approx(2e-4, rel=0.05)
    others = [abs(v) for k, v in w.items() if k != INDEX["ofi"]]
    assert max(others) < 1e-5 and abs(model.weights[-1]) < 1e-5
    assert model.cost == pytest.approx(1e-4 + 0.5e-4)
    assert 0.7 < model.r2_train < 0.9


def test_linear_trades_only_past_the_cost_and_holds_otherwise():
    model = fit_linear(_planted(), EnvSettings(taker_fee_bps=0.5))
    pol = linear_policy(model)
    obs = np.zeros((5, STATE_DIM), dtype=np.float32)
    # forecast = 2e-4 * ofi; cost 1.5e-4: ofi 1 -> long, -1 -> short, 0.5 -> hold what is held
    obs[:, INDEX["ofi"]] = [1.0, -1.0, 0.5, 0.5, 0.5]
    obs[:, INDEX["position"]] = [0.0, 0.0, 1.0, -0.5, 0.0]
    a = pol(obs)
    assert a[:, 0].tolist() == [2, 0, 2, 0, 1]
    assert (a[:, 1] == 2).all() and (a[:, 2] == 0).all()  # full size, market orders


def test_momentum_follows_the_sign_of_the_unscaled_return():
    mean, std = np.zeros(STATE_DIM), np.ones(STATE_DIM)
    mean[INDEX["ret_8"]], std[INDEX["ret_8"]] = 0.5, 2.0  # raw = 2 * scaled + 0.5
    pol = momentum_policy(8, FeatureScaler(mean=mean, std=std))
    obs = np.zeros((3, STATE_DIM), dtype=np.float32)
    obs[:, INDEX["ret_8"]] = [-0.1, -0.3, 0.0]  # raw +0.3, -0.1, +0.5
    assert pol(obs)[:, 0].tolist() == [2, 0, 2]


def test_fit_baselines_chooses_momentum_on_validation():
    s = synthetic_splits(MarketSettings(bars=4000, seed=3))
    env = EnvSettings()
    fb = fit_baselines(s.train, s.val, env, s.scaler, seed=0)
    assert set(fb.policies) == {"linear", "momentum"}
    assert set(fb.momentum_returns) == set(MOMENTUM_LOOKBACKS)
    assert fb.momentum_returns[fb.momentum_k] == max(fb.momentum_returns.values())
    info = fb.info()
    assert info["momentum"]["k"] == fb.momentum_k and info["linear"]["cost"] > 0
