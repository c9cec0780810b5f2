"""Held-out evaluation of a trading policy, its metrics, and the baseline policies.

:func:`evaluate` walks a split once with :meth:`TradingEnv.sequential` and reduces the per-bar
net PnL (fractions of max notional, after all costs) to the metrics the health gates compare:

* ``total_return`` — the sum of per-bar PnL;
* ``sharpe`` — ``mean / std * sqrt(periods_per_year)`` of per-bar PnL (population std;
  0 when the std is 0);
* ``volatility`` — ``std * sqrt(periods_per_year)``, the annualized volatility of per-bar PnL;
* ``max_drawdown`` — the largest fall of the cumulative PnL curve (starting at 0) from its
  running peak, a positive fraction of max notional;
* ``turnover`` — the mean ``|position change|`` per bar times ``periods_per_year``: notional
  traded in a year, in units of max notional;
* ``bars`` — the number of bars stepped (``len(split) - 1``).

``periods_per_year`` is the market's bars per year (:mod:`foxhunt_core.market.interval`):
detected from a file's timestamps, stated by the synthetic market.

A policy is any callable ``obs float32[N, 50] -> actions int[N, 4]`` (see
:mod:`foxhunt_core.env` for the action layout).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from foxhunt_core.config import EnvSettings
from foxhunt_core.env import TradingEnv
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.schema import INDEX

Policy = Callable[[np.ndarray], np.ndarray]
METRICS = ("total_return", "sharpe", "volatility", "max_drawdown", "turnover")


def pnl_metrics(pnl: np.ndarray, turnover: np.ndarray, *, periods_per_year: float) -> dict[str, float]:
    """The metrics of a per-bar PnL series and per-bar |position change| (module docstring)."""
    pnl = np.asarray(pnl, dtype=np.float64)
    turnover = np.asarray(turnover, dtype=np.float64)
    bars = int(pnl.shape[0])
    if bars == 0:
        return {**dict.fromkeys(METRICS, 0.0), "bars": 0}
    std = float(pnl.std())
    sharpe = float(pnl.mean() / std * np.sqrt(periods_per_year)) if std > 0 else 0.0
    curve = np.concatenate([[0.0], np.cumsum(pnl)])
    drawdown = float(np.max(np.maximum.accumulate(curve) - curve))
    return {
        "total_return": float(pnl.sum()),
        "sharpe": sharpe,
        "volatility": std * float(np.sqrt(periods_per_year)),
        "max_drawdown": drawdown,
        "turnover": float(turnover.mean()) * float(periods_per_year),
        "bars": bars,
    }


def evaluate(
    split: MarketData,
    settings: EnvSettings,
    policy: Policy,
    rng: np.random.Generator,
    *,
    periods_per_year: float,
) -> dict[str, float]:
    """Run ``policy`` once over ``split`` (first bar to last) and return its metrics.

    ``rng`` drives limit-order fills only; the same generator state gives the same result.
    """
    pnl, turnover = walk(split, settings, policy, rng)
    return pnl_metrics(pnl, turnover, periods_per_year=periods_per_year)


def walk(split: MarketData, settings: EnvSettings, policy: Policy,
         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The per-bar net PnL (fraction of max notional) and |position change| of ``policy`` over
    ``split``, first bar to last (what :func:`evaluate` reduces to metrics)."""
    env = TradingEnv.sequential(split, settings, rng)
    obs, _ = env.reset()
    bars = env.episode_len
    pnl = np.empty(bars)
    turnover = np.empty(bars)
    for i in range(bars):
        obs, _, _, _, info = env.step(np.asarray(policy(obs)))
        pnl[i] = info["pnl_bps"][0] * 1e-4
        turnover[i] = info["turnover"][0]
    return pnl, turnover


def _constant(action: tuple[int, int, int, int]) -> Policy:
    row = np.asarray(action, dtype=np.int64)

    def policy(obs: np.ndarray) -> np.ndarray:
        return np.tile(row, (obs.shape[0], 1))

    return policy


def baseline_policies(rng: np.random.Generator) -> dict[str, Policy]:
    """``flat`` (never trades), ``random`` (uniform actions from ``rng``) and
    ``buy_and_hold`` (long at full size with a market order, then holds)."""

    def random_policy(obs: np.ndarray) -> np.ndarray:
        return rng.integers(0, 3, size=(obs.shape[0], 4))

    return {
        "flat": _constant((1, 0, 0, 0)),
        "random": random_policy,
        "buy_and_hold": _constant((2, 2, 0, 0)),
    }


def ofi_sign_policy(magnitude: int = 2) -> Policy:
    """The reference rule the synthetic market is calibrated on: hold ``sign(ofi_ema_fast)``
    (long when positive, short otherwise) with market orders; it trades only on sign flips."""
    col = INDEX["ofi_ema_fast"]

    def policy(obs: np.ndarray) -> np.ndarray:
        n = obs.shape[0]
        out = np.zeros((n, 4), dtype=np.int64)
        out[:, 0] = np.where(obs[:, col] > 0, 2, 0)
        out[:, 1] = magnitude
        return out

    return policy
