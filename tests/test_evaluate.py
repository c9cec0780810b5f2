"""Evaluation metrics (hand-computed), the baselines' exact results, and determinism."""

import numpy as np
import pytest

from foxhunt_core.config import EnvSettings, MarketSettings
from foxhunt_core.evaluate import (
    baseline_policies,
    evaluate,
    ofi_sign_policy,
    pnl_metrics,
)
from foxhunt_core.market.splits import synthetic_splits
from foxhunt_core.market.synthetic import BAR

P = 1.0  # periods per year where a test does not look at annualized figures


@pytest.fixture(scope="module")
def test_split():
    return synthetic_splits(MarketSettings(bars=4000, seed=7)).test


def test_metrics_by_hand():
    pnl = np.array([0.01, -0.02, 0.005, 0.01])
    m = pnl_metrics(pnl, np.array([1.0, 0.0, 0.5, 0.5]), periods_per_year=4)
    mean = 0.005 / 4
    std = np.sqrt(((pnl - mean) ** 2).mean())
    assert m["total_return"] == pytest.approx(0.005)
    assert m["sharpe"] == pytest.approx(mean / std * 2.0)
    assert m["volatility"] == pytest.approx(std * 2.0)
    # curve 0, .01, -.01, -.005, .005: from the peak .01 down to -.01
    assert m["max_drawdown"] == pytest.approx(0.02)
    assert m["turnover"] == pytest.approx(0.5 * 4)  # a year of 4 bars
    assert m["bars"] == 4


def test_metrics_edge_cases():
    flat = pnl_metrics(np.zeros(5), np.zeros(5), periods_per_year=252)
    assert flat == {"total_return": 0.0, "sharpe": 0.0, "volatility": 0.0, "max_drawdown": 0.0,
                    "turnover": 0.0, "bars": 5}
    up = pnl_metrics(np.array([0.01, 0.02]), np.zeros(2), periods_per_year=252)
    assert up["max_drawdown"] == 0.0 and up["sharpe"] > 0
    loss = pnl_metrics(np.array([-0.01]), np.zeros(1), periods_per_year=252)
    assert loss["max_drawdown"] == pytest.approx(0.01)  # the curve starts at 0


def test_annualization_scales_with_the_bars_in_a_year():
    pnl = np.random.default_rng(0).normal(1e-4, 1e-3, 500)
    turn = np.full(500, 0.1)
    day, hour = (pnl_metrics(pnl, turn, periods_per_year=p) for p in (252, 252 * 24))
    assert hour["sharpe"] == pytest.approx(day["sharpe"] * np.sqrt(24))
    assert hour["volatility"] == pytest.approx(day["volatility"] * np.sqrt(24))
    assert hour["turnover"] == pytest.approx(day["turnover"] * 24)
    assert hour["total_return"] == day["total_return"]
    # the synthetic market states its bar: one hour of a 7-hour session, 5 days a week
    assert BAR.seconds == 3600 and BAR.bars_per_year == pytest.approx(35 * 365.25 / 7)


def test_flat_is_exactly_zero(test_split):
    m = evaluate(test_split, EnvSettings(), baseline_policies(np.random.default_rng(0))["flat"],
                 np.random.default_rng(0), periods_per_year=P)
    assert m["total_return"] == 0.0 and m["turnover"] == 0.0
    assert m["sharpe"] == 0.0 and m["max_drawdown"] == 0.0
    assert m["bars"] == len(test_split) - 1


def test_buy_and_hold_is_the_mid_return_minus_one_entry(test_split):
    s = EnvSettings()
    m = evaluate(test_split, s, baseline_policies(np.random.default_rng(0))["buy_and_hold"],
                 np.random.default_rng(0), periods_per_year=P)
    mid = test_split.mid
    mid_return = np.sum(mid[1:] / mid[:-1] - 1.0)  # constant notional: the sum of bar returns
    entry = (test_split.ask[0] - test_split.bid[0]) / (2 * mid[0]) + s.taker_fee_bps * 1e-4
    assert m["total_return"] == pytest.approx(mid_return - entry, abs=1e-12)
    assert m["turnover"] == pytest.approx(1.0 / m["bars"])


def test_random_is_reproducible_and_loses(test_split):
    def run():
        pol = baseline_policies(np.random.default_rng(3))["random"]
        return evaluate(test_split, EnvSettings(), pol, np.random.default_rng(4), periods_per_year=P)

    a, b = run(), run()
    assert a == b
    assert a["total_return"] < 0 and a["turnover"] > 0.2


def test_ofi_rule_policy_earns(test_split):
    m = evaluate(test_split, EnvSettings(), ofi_sign_policy(), np.random.default_rng(0), periods_per_year=P)
    assert m["total_return"] > 0
