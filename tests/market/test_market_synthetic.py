"""The synthetic market: determinism, speed, book structure, OFI impact and the calibrated edge."""

import time

import numpy as np
import pytest

from foxhunt_core.config import EnvSettings, MarketSettings
from foxhunt_core.evaluate import baseline_policies, evaluate, ofi_sign_policy
from foxhunt_core.market.schema import INDEX
from foxhunt_core.market.splits import split_by_time
from foxhunt_core.market.synthetic import VOLATILE, simulate


@pytest.fixture(scope="module")
def market():
    return simulate(MarketSettings(seed=7))


def test_deterministic_in_the_seed():
    a, b = simulate(MarketSettings(bars=3000, seed=3)), simulate(MarketSettings(bars=3000, seed=3))
    for name in ("mid", "bid_size", "trade_volume", "ofi", "regime", "features"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    c = simulate(MarketSettings(bars=3000, seed=4))
    assert not np.array_equal(a.mid, c.mid)


def test_sixty_thousand_bars_are_fast():
    simulate(MarketSettings(bars=2000))  # warm caches
    t0 = time.perf_counter()
    d = simulate(MarketSettings(bars=60_000))
    assert time.perf_counter() - t0 < 2.0
    assert len(d) == 60_000


def test_book_structure(market):
    tick = market.tick_size
    spread = (market.ask - market.bid) / tick
    np.testing.assert_allclose(spread, np.round(spread), atol=1e-6)
    assert np.round(spread).min() >= 1
    np.testing.assert_allclose(market.bid / tick, np.round(market.bid / tick), atol=1e-6)
    np.testing.assert_allclose(market.mid, 0.5 * (market.bid + market.ask))
    assert (market.bid_size >= 1).all() and (market.ask_size >= 1).all()
    assert np.all(np.diff(market.timestamp) > 0)
    assert set(np.unique(market.regime)) == {0, 1, 2, 3}
    vol = market.regime == VOLATILE
    assert spread[vol].mean() > spread[~vol].mean() + 0.5
    assert market.trade_count[vol].mean() > market.trade_count[~vol].mean()
    assert np.isfinite(market.features).all()


def test_ofi_moves_the_price(market):
    """Contemporaneous CKS relation: the mid change regresses on OFI / depth with slope ~beta."""
    n = market.features[:, INDEX["ofi"]].astype(np.float64)
    dmid = np.diff(market.mid) / market.tick_size
    slope = np.polyfit(n[1:], dmid, 1)[0]
    assert slope == pytest.approx(MarketSettings().ofi_impact, rel=0.15)


def test_features_at_t_predict_the_next_return(market):
    r_next = np.diff(np.log(market.mid))
    for name in ("ofi_ema_fast", "ofi", "l1_depth_imbalance", "signed_volume_8"):
        f = market.features[:-1, INDEX[name]].astype(np.float64)
        assert np.corrcoef(f, r_next)[0, 1] > 0.1, name


def _vector_backtest(data, pos, start):
    """Market-order backtest with the env's costs: half spread + 0.5 bp per unit traded."""
    half = (data.ask - data.bid) / (2 * data.mid)
    r = data.mid[start + 1:] / data.mid[start:-1] - 1
    p = pos[start:-1]
    dp = np.abs(np.diff(np.concatenate([[0.0], p])))
    gross = p * r
    return gross.sum(), (gross - dp * (half[start:-1] + 0.5e-4)).sum()


@pytest.mark.parametrize("seed", [7, 0, 1, 2])
def test_ofi_rule_beats_costs_and_random_loses(seed):
    data = simulate(MarketSettings(seed=seed))
    start = int(0.8 * len(data))  # the default test split
    rule = np.sign(data.features[:, INDEX["ofi_ema_fast"]].astype(np.float64))
    gross, net = _vector_backtest(data, rule, start)
    assert net > 0.04  # of max notional over the 12k test bars
    assert net < 0.6 * gross  # costs take a real share of the edge
    # trading the raw one-bar OFI sign at every bar: an edge before costs, a loss after
    raw = np.sign(data.features[:, INDEX["ofi"]].astype(np.float64))
    gross_raw, net_raw = _vector_backtest(data, raw, start)
    assert gross_raw > 0 > net_raw
    rng = np.random.default_rng(seed)
    rand = rng.choice([-1.0, 0.0, 1.0], size=len(data)) * rng.choice([0.25, 0.5, 1.0], len(data))
    assert _vector_backtest(data, rand, start)[1] < 0


def test_calibration_through_the_environment():
    s = MarketSettings(seed=7, bars=20_000)
    splits = split_by_time(simulate(s), s.train_fraction, s.val_fraction)
    env = EnvSettings()
    rule = evaluate(splits.test, env, ofi_sign_policy(), np.random.default_rng(0))
    rand = evaluate(splits.test, env, baseline_policies(np.random.default_rng(1))["random"],
                    np.random.default_rng(0))
    assert rule["total_return"] > 0.02 and rule["sharpe"] > 5
    assert rand["total_return"] < 0
