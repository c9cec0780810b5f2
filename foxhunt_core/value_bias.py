"""Value bias: how far the agent's Q-values run from the returns they predict.

On the evaluation episode (the greedy policy's walk over a held-out split, the same walk and the
same fills as :meth:`foxhunt_core.trainer.Trainer.evaluate` for the policy), at every bar ``t``:

* ``Q_t`` — the predicted value of the actions taken: the mean over the branches of the raw
  expected Q (atoms -> E[Q], before any pre-attention stage) of the action the branch took. The
  branches of the branching C51 network all estimate the same return (each branch's target is
  ``r + gamma z`` of that branch's bootstrap action), so their mean is the network's estimate;
* ``G_t = sum_k gamma^k r_{t+k}`` — the realized discounted return from that state on, with the
  training reward (PnL in bps of max notional over ``env.reward_scale_bps``) and ``train.gamma``.

The bias is ``mean_t (Q_t - G_t)``, the overestimation measure of van Hasselt et al. (2016,
"Deep Reinforcement Learning with Double Q-learning") and Fujimoto et al. (2018, TD3): a
bootstrapped estimate that runs away from the returns it predicts shows up as a large positive
bias, one that lags far behind them as a large negative one, and a healthy agent's stays near 0
whatever the level of its Q-values (a profitable policy *should* have a positive mean Q). The
gated statistic is the bias over the standard deviation of ``G_t`` across the walk's states
(``value_bias``), so one band fits any reward scale. The standard deviation is taken as at least
:data:`RETURN_STD_FLOOR` (one reward unit): a policy that stays flat has returns that do not
vary at all, and its bias is then measured in reward units instead of divided by zero.

The walk is finite: ``G_t`` is truncated at the split's end. Only the states from which at
least ``H`` bars remain are used, ``H`` the smallest horizon with ``gamma^H <= 0.01`` (at most
half the walk), so the part of the return cut off weighs at most 1 % (``truncation_weight``,
``gamma^H``, says how much it could weigh).

The same figures for coordinated Q (after attention and post-attention stages) are reported
beside (``coordinated_*``), never gated: a pre-attention stage such as Q-mean centering shifts
coordinated Q by design.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import backend
from .config import EnvSettings
from .env import TradingEnv
from .market.data import MarketData
from .qpipe import branch_argmax

TRUNCATION = 0.01
"""Largest weight ``gamma^H`` of the return cut off at the walk's end for the states used."""
RETURN_STD_FLOOR = 1.0
"""Smallest return standard deviation the bias is divided by (reward units: ``env.reward_scale_bps``
basis points of max notional)."""


def horizon(gamma: float, bars: int, truncation: float = TRUNCATION) -> int:
    """Bars of return kept after a used state: the smallest ``H`` with ``gamma^H <= truncation``,
    at most ``bars // 2`` (at least 1)."""
    if gamma <= 0.0:
        h = 1
    else:
        h = math.ceil(math.log(truncation) / math.log(gamma))
    return max(1, min(h, bars // 2))


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma G_{t+1}`` with ``G_T = 0`` (float64)."""
    r = np.asarray(rewards, dtype=np.float64)
    g = np.empty_like(r)
    acc = 0.0
    for t in range(r.shape[0] - 1, -1, -1):
        acc = r[t] + gamma * acc
        g[t] = acc
    return g


def bias_figures(q_taken: np.ndarray, returns: np.ndarray, prefix: str = "") -> dict[str, float]:
    """Mean predicted Q, mean realized return, their difference and that over the return's std."""
    q = np.asarray(q_taken, dtype=np.float64)
    g = np.asarray(returns, dtype=np.float64)
    bias = float(np.mean(q - g))
    scale = max(float(np.std(g)), RETURN_STD_FLOOR)
    return {f"{prefix}q_mean": float(np.mean(q)), f"{prefix}return_mean": float(np.mean(g)),
            f"{prefix}bias": bias, f"{prefix}value_bias": bias / scale}


def summarize(q_raw: np.ndarray, q_coord: np.ndarray, rewards: np.ndarray, gamma: float,
              truncation: float = TRUNCATION) -> dict[str, Any]:
    """The value-bias record of a walk: per-bar Q of the taken actions (raw and coordinated) and
    per-bar rewards, all of length ``T``."""
    bars = int(np.asarray(rewards).shape[0])
    h = horizon(gamma, bars, truncation)
    g = discounted_returns(rewards, gamma)
    used = max(1, bars - h)
    out: dict[str, Any] = {"gamma": float(gamma), "bars": bars, "states": used, "horizon": h,
                           "truncation_weight": float(gamma**h), "return_std": float(np.std(g[:used]))}
    out.update(bias_figures(q_raw[:used], g[:used]))
    out.update(bias_figures(q_coord[:used], g[:used], prefix="coordinated_"))
    return out


def taken_values(agent: Any, obs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy actions [B, D] (as :meth:`Trainer._act` chooses them) and the mean over branches of
    the raw and of the coordinated expected Q of those actions [B]."""
    xp = agent.xp
    x = xp.asarray(obs, dtype=xp.float32)
    out, q = agent.step.acting(x, evaluation=True)
    actions = branch_argmax(agent.qpipe.selection_values(out.probs, agent.z, q, 1.0, evaluation=True), agent.offsets)
    idx = actions + agent.step.branch_base
    raw = xp.take_along_axis(q.q_raw, idx, axis=1).mean(axis=1)
    coord = xp.take_along_axis(q.q_coord, idx, axis=1).mean(axis=1)
    return backend.to_numpy(actions), backend.to_numpy(raw), backend.to_numpy(coord)


def walk(agent: Any, split: MarketData, settings: EnvSettings, rng: np.random.Generator
         ) -> dict[str, np.ndarray]:
    """The greedy policy's walk over ``split``: per bar the Q of the taken actions (raw and
    coordinated), the reward and the net PnL (fractions of max notional, as evaluation sums)."""
    env = TradingEnv.sequential(split, settings, rng)
    obs, _ = env.reset()
    bars = env.episode_len
    rec = {k: np.empty(bars) for k in ("q_raw", "q_coord", "reward", "pnl")}
    for i in range(bars):
        actions, raw, coord = taken_values(agent, obs)
        obs, reward, _, _, info = env.step(actions)
        rec["q_raw"][i], rec["q_coord"][i] = raw[0], coord[0]
        rec["reward"][i] = reward[0]
        rec["pnl"][i] = info["pnl_bps"][0] * 1e-4
    return rec


def measure(trainer: Any, split: str = "test") -> dict[str, Any]:
    """The value-bias record of a trainer's greedy policy on one of its splits (module docstring);
    the walk's fills use the generator :meth:`Trainer.evaluate` gives the policy."""
    s = trainer.settings
    rec = walk(trainer.agent, getattr(trainer.splits, split), s.env, np.random.default_rng(s.seed + 2))
    out = summarize(rec["q_raw"], rec["q_coord"], rec["reward"], s.train.gamma)
    out["split"] = split
    out["total_return"] = float(rec["pnl"].sum())
    return out
