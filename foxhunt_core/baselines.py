"""The fitted baselines every evaluation reports beside the policy: ``linear`` and ``momentum``.

The constant ones (``flat``, ``random``, ``buy_and_hold``) are in :mod:`foxhunt_core.evaluate`;
these two are fitted on the run's own splits, never on the split they are judged on:

* ``linear`` — an ordinary least-squares forecast of the next bar's return
  ``mid[t+1] / mid[t] - 1`` from the bar's scaled market features (the account block left
  out) and an intercept, fitted on the training split. It trades only when the forecast beats
  the cost of trading: long at full size with a market order when the forecast exceeds the
  training split's mean half spread plus the taker fee, short when it is below minus that, and
  otherwise it keeps the position it has (no order).
* ``momentum`` — the sign of the last ``k`` bars' return (the ``ret_k`` feature, unscaled),
  long or short at full size with market orders; ``k`` in 1, 2, 4, ..., 64 is the one with the
  highest total return on the validation split (the training split when there is none).

A policy is the :data:`~foxhunt_core.evaluate.Policy` of the evaluation: observations in,
actions out; both read the position from the observation's account block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from foxhunt_core.config import EnvSettings
from foxhunt_core.evaluate import Policy, evaluate
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import FeatureScaler
from foxhunt_core.market.schema import INDEX, MARKET_FEATURES

MOMENTUM_LOOKBACKS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
RIDGE = 1e-6  # relative ridge on the normal equations: keeps a constant feature column harmless
FULL = 2  # the magnitude action of the largest position size


@dataclass(frozen=True)
class LinearForecast:
    """Weights of the next-bar return forecast and the cost it must beat (return units)."""

    weights: np.ndarray
    """``[len(MARKET_FEATURES) + 1]``: one per market feature, then the intercept."""
    cost: float
    r2_train: float

    def forecast(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float64)[:, MARKET_FEATURES]
        return x @ self.weights[:-1] + self.weights[-1]


def _design(features: np.ndarray) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)[:, MARKET_FEATURES]
    return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)


def fit_linear(train: MarketData, env: EnvSettings) -> LinearForecast:
    """Least squares of the next bar's return on the training split's features (module docstring)."""
    if len(train) < 3:
        raise ValueError("the linear baseline needs at least 3 training bars")
    x = _design(train.features[:-1])
    y = train.mid[1:] / train.mid[:-1] - 1.0
    gram = x.T @ x
    gram += RIDGE * np.trace(gram) / gram.shape[0] * np.eye(gram.shape[0])
    w = np.linalg.solve(gram, x.T @ y)
    resid = y - x @ w
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(resid @ resid) / total if total > 0 else 0.0
    half_spread = float(np.mean((train.ask - train.bid) / (2.0 * train.mid)))
    return LinearForecast(weights=w, cost=half_spread + env.taker_fee_bps * 1e-4, r2_train=r2)


def _held_direction(obs: np.ndarray) -> np.ndarray:
    pos = obs[:, INDEX["position"]]
    return np.where(pos > 0, 2, np.where(pos < 0, 0, 1))


def linear_policy(model: LinearForecast) -> Policy:
    """Trade the forecast's sign at full size when it beats the cost, else keep the position."""

    def policy(obs: np.ndarray) -> np.ndarray:
        f = model.forecast(obs)
        direction = np.where(f > model.cost, 2, np.where(f < -model.cost, 0, _held_direction(obs)))
        out = np.zeros((obs.shape[0], 4), dtype=np.int64)
        out[:, 0] = direction
        out[:, 1] = FULL
        return out

    return policy


def momentum_policy(k: int, scaler: FeatureScaler) -> Policy:
    """Long when the last ``k`` bars' return is positive, short when negative, else hold."""
    col = INDEX[f"ret_{k}"]
    mean, std = float(scaler.mean[col]), float(scaler.std[col])

    def policy(obs: np.ndarray) -> np.ndarray:
        raw = obs[:, col].astype(np.float64) * std + mean
        out = np.zeros((obs.shape[0], 4), dtype=np.int64)
        out[:, 0] = np.where(raw > 0, 2, np.where(raw < 0, 0, _held_direction(obs)))
        out[:, 1] = FULL
        return out

    return policy


def choose_momentum(split: MarketData, env: EnvSettings, scaler: FeatureScaler,
                    seed: int) -> tuple[int, dict[int, float]]:
    """The lookback with the highest total return on ``split`` and every lookback's return."""
    returns = {k: evaluate(split, env, momentum_policy(k, scaler), np.random.default_rng(seed),
                            periods_per_year=1.0)["total_return"]
               for k in MOMENTUM_LOOKBACKS}
    best = max(MOMENTUM_LOOKBACKS, key=lambda k: (returns[k], -k))
    return best, returns


@dataclass
class FittedBaselines:
    """The fitted baselines of a run and what was fitted (for the run record)."""

    policies: dict[str, Policy]
    linear: LinearForecast
    momentum_k: int
    momentum_returns: dict[int, float]

    def info(self) -> dict[str, object]:
        return {"linear": {"cost": self.linear.cost, "r2_train": self.linear.r2_train},
                "momentum": {"k": self.momentum_k, "chosen_on_returns": self.momentum_returns}}


def fit_baselines(train: MarketData, val: MarketData, env: EnvSettings, scaler: FeatureScaler,
                  seed: int) -> FittedBaselines:
    """``linear`` fitted on ``train``, ``momentum``'s lookback chosen on ``val`` (``train`` if empty)."""
    model = fit_linear(train, env)
    k, returns = choose_momentum(val if len(val) >= 2 else train, env, scaler, seed)
    return FittedBaselines(policies={"linear": linear_policy(model), "momentum": momentum_policy(k, scaler)},
                           linear=model, momentum_k=k, momentum_returns=returns)
