"""The vectorized trading environment: ``N`` parallel episodes on one market split.

:class:`TradingEnv` walks bars of a :class:`~foxhunt_core.market.data.MarketData` split. At
every step each episode observes bar ``t`` (its 50 scaled features, with the account block
38..41 written by the environment), acts, and is paid for the bar ``t -> t+1``.

Actions
-------
An int array ``[N, 4]``, one row per episode, every entry in ``0..2``:

* ``direction``: 0 short, 1 flat, 2 long;
* ``magnitude``: index into ``settings.position_sizes`` (fractions of max notional);
* ``order``: 0 market, 1 limit at the touch (bid to buy, ask to sell), 2 passive limit one
  tick behind the touch;
* ``urgency``: index into ``settings.urgency_bars``, the bars a limit order may wait.

The target position is ``(direction - 1) * position_sizes[magnitude]`` (flat ignores the
magnitude). If it equals the current position, any working order is cancelled.

Fills and costs (all in fractions of max notional; prices of bar ``t`` unless stated)
------------------------------------------------------------------------------------
* **Market order**: the whole change ``d = target - position`` fills now at the touch, paying
  ``|d| * (half_spread_t / mid_t + taker_fee_bps * 1e-4)``; any working order is cancelled.
* **Limit order**: becomes the working order (replacing any previous one) for ``d`` at price
  ``L`` = touch, or touch minus (buy) / plus (sell) one tick. Repeating the working order's
  action (same target, same order type) keeps it in place with its price and remaining time.
  The order is checked at the close of each following bar ``j``: it fills **surely** if the
  price traded through it (buy: ``bid_j < L``; sell: ``ask_j > L``), otherwise
  with probability ``1 - exp(-lam)``::

      lam = lam0 * sqrt(count_j / mean_count) * sqrt(min(pressure_j / mean_pressure, 4)) * 0.3**k

  where ``lam0 = -log(1 - fill_base_rate)`` (so that at the normal trade rate and queue
  pressure an order at the touch fills with probability ``fill_base_rate``), ``pressure_j``
  is the opposing trade volume over our side's L1 size (sells over ``bid_size`` for a buy),
  the means are over the split, and ``k >= 0`` is how many ticks ``L`` sits behind the touch
  of bar ``j`` (a passive order starts at ``k = 1``). A fill executes at ``L`` and earns
  ``d * (mid_j - L) / mid_j - |d| * maker_fee_bps * 1e-4`` (negative when the price ran
  through it: adverse selection). An unfilled order is cancelled after ``urgency_bars[u]``
  bars.

Reward
------
``pnl_t = position * (mid_{t+1} / mid_t - 1) - costs + limit-fill result`` (fraction of max
notional, the position held at constant notional over the bar, after any market fill at
``t``); ``reward = 1e4 * pnl_t / reward_scale_bps``.

Account features written into each observation
-----------------------------------------------
``position`` (signed fraction of max notional), ``unrealized_pnl`` (net PnL in bps since the
position last changed sign, / 10, clipped to ±5), ``holding_time`` (``log1p(bars held) /
log1p(64)``), ``working_order`` (signed size still to fill, 0 if none).

Episodes
--------
Training mode: each episode starts at a uniformly random bar with ``episode_len`` bars of room
and is *truncated* (never terminated: trading has no terminal state) after ``episode_len``
steps; it is then reset at once to a new start, flat and without orders. ``step`` returns the
new observation; ``info["final_obs"]`` holds the observation each episode reached before any
reset (equal to the returned one for episodes not reset), so it is always the right
``next_obs`` for bootstrapping. :meth:`TradingEnv.sequential` walks the whole split once,
from its first bar to its last (``len(split) - 1`` steps), for evaluation.

All randomness (starts, limit fills) comes from the ``np.random.Generator`` passed in; give the
environment its own generator, since :meth:`load_state_dict` restores its state.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from foxhunt_core.config import EnvSettings
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.schema import INDEX

PASSIVE_DECAY = 0.3  # fill-intensity factor per tick behind the touch
PRESSURE_CAP = 4.0  # cap of the relative queue pressure in the fill intensity
UNREALIZED_SCALE_BPS = 10.0
HOLDING_SCALE_BARS = 64
_STATE_VERSION = 1


class TradingEnv:
    """``num_envs`` parallel trading episodes on one split (see the module docstring)."""

    def __init__(
        self,
        split: MarketData,
        settings: EnvSettings,
        rng: np.random.Generator,
        *,
        num_envs: int | None = None,
        episode_len: int | None = None,
        mode: Literal["random", "sequential"] = "random",
    ) -> None:
        if mode not in ("random", "sequential"):
            raise ValueError(f"mode must be 'random' or 'sequential', got {mode!r}")
        t_len = len(split)
        self.mode = mode
        self.split = split
        self.settings = settings
        self.rng = rng
        if mode == "sequential":
            self.num_envs = 1
            self.episode_len = t_len - 1
        else:
            self.num_envs = settings.num_envs if num_envs is None else int(num_envs)
            self.episode_len = settings.episode_len if episode_len is None else int(episode_len)
        if self.num_envs < 1 or self.episode_len < 1:
            raise ValueError("num_envs and episode_len must be at least 1")
        if t_len < self.episode_len + 1:
            raise ValueError(
                f"split has {t_len} bars; an episode of {self.episode_len} steps needs "
                f"{self.episode_len + 1}"
            )
        self._prepare_market(split)
        self._sizes = np.asarray(settings.position_sizes, dtype=np.float64)
        self._urgency = np.asarray(settings.urgency_bars, dtype=np.int64)
        self._taker = settings.taker_fee_bps * 1e-4
        self._maker = settings.maker_fee_bps * 1e-4
        rate = settings.fill_base_rate
        self._lam0 = np.inf if rate >= 1.0 else -np.log1p(-rate)
        n = self.num_envs
        self.cursor = np.zeros(n, dtype=np.int64)
        self.start = np.zeros(n, dtype=np.int64)
        self.steps = np.zeros(n, dtype=np.int64)
        self.position = np.zeros(n, dtype=np.float64)
        self.open_pnl_bps = np.zeros(n, dtype=np.float64)
        self.hold = np.zeros(n, dtype=np.int64)
        self.order_active = np.zeros(n, dtype=bool)
        self.order_target = np.zeros(n, dtype=np.float64)
        self.order_price = np.zeros(n, dtype=np.float64)
        self.order_kind = np.zeros(n, dtype=np.int64)
        self.order_ttl = np.zeros(n, dtype=np.int64)
        self._ready = False

    @classmethod
    def sequential(
        cls, split: MarketData, settings: EnvSettings, rng: np.random.Generator | None = None
    ) -> TradingEnv:
        """One episode that walks ``split`` from its first bar to its last, once.

        ``rng`` drives the limit-order fills; without one a fixed seed (0) is used.
        """
        return cls(split, settings, np.random.default_rng(0) if rng is None else rng,
                   mode="sequential")

    # ------------------------------------------------------------------ market arrays
    def _prepare_market(self, split: MarketData) -> None:
        self._feat = split.features
        self._mid = split.mid
        self._bid = split.bid
        self._ask = split.ask
        self._tick = split.tick_size
        self._half = (split.ask - split.bid) / (2.0 * split.mid)
        self._ret = split.mid[1:] / split.mid[:-1] - 1.0
        self._count = split.trade_count
        vol, signed = split.trade_volume, split.signed_volume
        self._buy_press = 0.5 * (vol + signed) / np.maximum(split.ask_size, 1e-9)
        self._sell_press = 0.5 * (vol - signed) / np.maximum(split.bid_size, 1e-9)
        mean_count = float(np.mean(split.trade_count))
        self._mean_count = mean_count if mean_count > 0 else 1.0
        press = vol / np.maximum(split.bid_size + split.ask_size, 1e-9)
        mean_press = float(np.mean(press))
        self._mean_press = mean_press if mean_press > 0 else 1.0

    # ------------------------------------------------------------------ episodes
    def _reset_envs(self, idx: np.ndarray) -> None:
        if idx.size == 0:
            return
        if self.mode == "sequential":
            starts = np.zeros(idx.size, dtype=np.int64)
        else:
            starts = self.rng.integers(0, len(self.split) - self.episode_len, size=idx.size)
        self.start[idx] = starts
        self.cursor[idx] = starts
        self.steps[idx] = 0
        self.position[idx] = 0.0
        self.open_pnl_bps[idx] = 0.0
        self.hold[idx] = 0
        self.order_active[idx] = False
        self.order_target[idx] = 0.0
        self.order_price[idx] = 0.0
        self.order_kind[idx] = 0
        self.order_ttl[idx] = 0

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        """Start every episode afresh; returns ``(obs float32[N, 50], info)``."""
        self._reset_envs(np.arange(self.num_envs))
        self._ready = True
        return self._observe(), {}

    def _observe(self) -> np.ndarray:
        obs = self._feat[self.cursor]  # fancy indexing copies
        obs[:, INDEX["position"]] = self.position
        obs[:, INDEX["unrealized_pnl"]] = np.clip(
            self.open_pnl_bps / UNREALIZED_SCALE_BPS, -5.0, 5.0
        )
        obs[:, INDEX["holding_time"]] = np.log1p(self.hold) / np.log1p(HOLDING_SCALE_BARS)
        obs[:, INDEX["working_order"]] = np.where(
            self.order_active, self.order_target - self.position, 0.0
        )
        return obs

    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        a = np.asarray(actions)
        if a.shape != (self.num_envs, 4):
            raise ValueError(f"actions must have shape ({self.num_envs}, 4), got {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"actions must be integers, got dtype {a.dtype}")
        if a.size and (a.min() < 0 or a.max() > 2):
            raise ValueError("every action entry must be in 0..2")
        return a.astype(np.int64, copy=False)

    # ------------------------------------------------------------------ the step
    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Apply one action per episode; returns ``(obs, reward, terminated, truncated, info)``.

        ``info``: ``final_obs`` float32[N, 50] (see the module docstring), and per episode
        ``pnl_bps`` (the step's net PnL in bps of max notional), ``turnover`` (|position
        change| this step), ``cost_bps`` (half spreads and fees paid, rebates negative; a
        limit fill's price relative to the mid is in ``pnl_bps`` only) and
        ``position`` (after the step, before any reset).
        """
        if not self._ready:
            raise RuntimeError("call reset() before step()")
        a = self._check_actions(actions)
        t = self.cursor
        j = t + 1
        p_old = self.position.copy()
        target = (a[:, 0] - 1).astype(np.float64) * self._sizes[a[:, 1]]
        delta = target - p_old
        moving = np.abs(delta) > 1e-12
        market = a[:, 2] == 0

        # market orders: fill now at the touch, cancel any working order
        mkt = market & moving
        mkt_cost = np.where(mkt, np.abs(delta) * (self._half[t] + self._taker), 0.0)
        turnover = np.where(mkt, np.abs(delta), 0.0)
        position = np.where(mkt, target, p_old)
        # limit orders: a new one replaces the working order; the same one keeps its place
        kind = a[:, 2]
        lim = ~market & moving
        keep = lim & self.order_active & (self.order_target == target) & (self.order_kind == kind)
        new = lim & ~keep
        buy = delta > 0
        touch = np.where(buy, self._bid[t], self._ask[t])
        behind = np.where(kind == 2, np.where(buy, -self._tick, self._tick), 0.0)
        self.order_active = lim
        self.order_target = np.where(lim, target, 0.0)
        self.order_kind = np.where(lim, kind, 0)
        self.order_price = np.where(new, touch + behind, np.where(keep, self.order_price, 0.0))
        self.order_ttl = np.where(new, self._urgency[a[:, 3]], np.where(keep, self.order_ttl, 0))

        # mark to market over bar t -> t+1 with the position held after the market fill
        mtm = position * self._ret[t]

        # working orders at the close of bar j
        u = self.rng.random(self.num_envs)
        active = self.order_active
        o_delta = self.order_target - position
        o_buy = o_delta > 0
        price = self.order_price
        bid_j, ask_j = self._bid[j], self._ask[j]
        half_tick = 0.5 * self._tick
        through = np.where(o_buy, bid_j < price - half_tick, ask_j > price + half_tick)
        k = np.maximum(np.rint(np.where(o_buy, bid_j - price, price - ask_j) / self._tick), 0.0)
        press = np.where(o_buy, self._sell_press[j], self._buy_press[j]) / self._mean_press
        rate = np.sqrt(self._count[j] / self._mean_count) * np.sqrt(np.minimum(press, PRESSURE_CAP))
        with np.errstate(invalid="ignore"):  # inf * 0 when fill_base_rate is 1 and no trades
            lam = self._lam0 * rate * PASSIVE_DECAY**k
            prob = np.where(np.isnan(lam), 0.0, -np.expm1(-lam))
        filled = active & (through | (u < prob))
        mid_j = self._mid[j]
        fill_fee = np.where(filled, np.abs(o_delta) * self._maker, 0.0)
        fill_edge = np.where(filled, o_delta * (mid_j - price) / mid_j, 0.0)
        turnover = turnover + np.where(filled, np.abs(o_delta), 0.0)
        position = np.where(filled, self.order_target, position)
        ttl = np.where(active & ~filled, self.order_ttl - 1, 0)
        self.order_active = active & ~filled & (ttl > 0)
        self.order_ttl = np.where(self.order_active, ttl, 0)
        self.order_target = np.where(self.order_active, self.order_target, 0.0)
        self.order_kind = np.where(self.order_active, self.order_kind, 0)
        self.order_price = np.where(self.order_active, self.order_price, 0.0)

        cost = mkt_cost + fill_fee
        pnl = mtm - cost + fill_edge
        pnl_bps = 1e4 * pnl
        # account bookkeeping
        same = (np.sign(position) == np.sign(p_old)) & (position != 0)
        self.open_pnl_bps = np.where(
            position == 0, 0.0, np.where(same, self.open_pnl_bps + pnl_bps, pnl_bps)
        )
        self.hold = np.where(position == 0, 0, np.where(same, self.hold + 1, 1))
        self.position = position
        self.cursor = j
        self.steps = self.steps + 1

        truncated = self.steps >= self.episode_len
        obs = self._observe()
        info: dict[str, Any] = {
            "final_obs": obs,
            "pnl_bps": pnl_bps,
            "turnover": turnover,
            "cost_bps": 1e4 * cost,
            "position": position.copy(),
        }
        if truncated.any():
            obs = obs.copy()
            idx = np.flatnonzero(truncated)
            self._reset_envs(idx)
            obs[idx] = self._observe()[idx]
        reward = (pnl_bps / self.settings.reward_scale_bps).astype(np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: per-episode arrays (NumPy, exact)
        and JSON-able scalars, including the generator's ``bit_generator.state``."""
        return {
            "version": _STATE_VERSION,
            "mode": self.mode,
            "num_envs": self.num_envs,
            "episode_len": self.episode_len,
            "data_len": len(self.split),
            "data_first_ts": int(self.split.timestamp[0]),
            "ready": self._ready,
            "cursor": self.cursor.copy(),
            "start": self.start.copy(),
            "steps": self.steps.copy(),
            "position": self.position.copy(),
            "open_pnl_bps": self.open_pnl_bps.copy(),
            "hold": self.hold.copy(),
            "order_active": self.order_active.astype(np.int8),
            "order_target": self.order_target.copy(),
            "order_price": self.order_price.copy(),
            "order_kind": self.order_kind.copy(),
            "order_ttl": self.order_ttl.copy(),
            "rng_state": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (arrays may come back as lists)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported env state version {state.get('version')!r}")
        expect = {
            "mode": self.mode,
            "num_envs": self.num_envs,
            "episode_len": self.episode_len,
            "data_len": len(self.split),
            "data_first_ts": int(self.split.timestamp[0]),
        }
        for key, value in expect.items():
            if state[key] != value:
                raise ValueError(
                    f"env state was saved with {key}={state[key]!r}, this env has {value!r}"
                )
        n = self.num_envs
        arrays = {
            "cursor": np.int64, "start": np.int64, "steps": np.int64, "position": np.float64,
            "open_pnl_bps": np.float64, "hold": np.int64, "order_active": bool,
            "order_target": np.float64, "order_price": np.float64, "order_kind": np.int64,
            "order_ttl": np.int64,
        }
        for key, dtype in arrays.items():
            arr = np.array(state[key], dtype=dtype)
            if arr.shape != (n,):
                raise ValueError(f"env state {key!r} has shape {arr.shape}, expected ({n},)")
            setattr(self, key, arr)
        self.rng.bit_generator.state = state["rng_state"]
        self._ready = bool(state["ready"])
