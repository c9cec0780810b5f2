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

      lam = lam0 * sqrt(count_j / mean_count_j) * sqrt(min(pressure_j / mean_pressure_j, 4)) * 0.3**k

  where ``lam0 = -log(1 - fill_base_rate)`` (so that at the normal trade rate and queue
  pressure an order at the touch fills with probability ``fill_base_rate``), ``pressure_j``
  is the opposing trade volume over our side's L1 size (sells over ``bid_size`` for a buy),
  ``mean_count_j`` and ``mean_pressure_j`` are the means of the trade count and of the total
  queue pressure ``volume / (bid_size + ask_size)`` over the split's bars before ``j``, i.e. up
  to the bar ``t = j - 1`` the order was placed at (the first bar's own value at ``j = 0``):
  nothing after ``t`` normalizes the fill (``tests/test_env.py`` perturbs the future and checks
  the past), and ``k >= 0`` is how many ticks ``L`` sits behind the touch
  of bar ``j`` (a passive order starts at ``k = 1``). A fill executes at ``L`` and earns
  ``d * (mid_j - L) / mid_j - |d| * maker_fee_bps * 1e-4`` (negative when the price ran
  through it: adverse selection). An unfilled order is cancelled after ``urgency_bars[u]``
  bars.

Reward
------
``pnl_t = position * (mid_{t+1} / mid_t - 1) - costs + limit-fill result`` (fraction of max
notional, the position held at constant notional over the bar, after any market fill at
``t``); ``reward = 1e4 * pnl_t / reward_scale_bps`` (``reward_scale_bps`` unset: 1 here; a run
sets it to its training split's per-bar volatility, :func:`foxhunt_core.market.source.load_market`).

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

The transition as a pure function
---------------------------------
:func:`transition` is the whole step as an array function of (state arrays, actions, market
arrays, one uniform per episode for its limit fill, the start bar each episode resets to if it
is truncated); :func:`reset_episodes` and :func:`start_bars` are the reset. :class:`TradingEnv`
only draws the randomness (``rng.random(N)`` for fills, then ``rng.integers`` for the starts of
the episodes that end) and keeps the state. The CUDA environment
(:mod:`foxhunt_core.gpu.env`) implements the same function and is tested against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from foxhunt_core.config import EnvSettings
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.schema import INDEX

PASSIVE_DECAY = 0.3  # fill-intensity factor per tick behind the touch
PRESSURE_CAP = 4.0  # cap of the relative queue pressure in the fill intensity
UNREALIZED_SCALE_BPS = 10.0
UNREALIZED_CLIP = 5.0
HOLDING_SCALE_BARS = 64
STATE_VERSION = 1

#: Per-episode state arrays and their NumPy dtypes (the checkpoint format).
STATE_FIELDS: dict[str, Any] = {
    "cursor": np.int64, "start": np.int64, "steps": np.int64, "position": np.float64,
    "open_pnl_bps": np.float64, "hold": np.int64, "order_active": np.bool_,
    "order_target": np.float64, "order_price": np.float64, "order_kind": np.int64,
    "order_ttl": np.int64,
}
State = dict[str, np.ndarray]

#: The float64 per-bar columns the transition reads (besides the feature matrix), in the
#: column order of :meth:`MarketArrays.columns`.
MARKET_COLUMNS: tuple[str, ...] = (
    "mid", "bid", "ask", "half_spread", "ret", "count_rel", "buy_pressure", "sell_pressure",
)


def mean_before(x: np.ndarray) -> np.ndarray:
    """``out[j]`` = the mean of ``x[0..j-1]`` (``x[0]`` at ``j = 0``): a causal normal level."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    if x.size:
        out[0] = x[0]
        out[1:] = np.cumsum(x)[:-1] / np.arange(1, x.size)
    return out


def _level(x: np.ndarray) -> np.ndarray:
    """A causal mean as a denominator: non-positive levels (no trades yet) count as 1."""
    m = mean_before(x)
    return np.where(m > 0, m, 1.0)


@dataclass(frozen=True)
class MarketArrays:
    """What the transition reads of a split: float64 ``[T]`` columns plus split constants.

    ``half_spread = (ask - bid) / (2 mid)``; ``ret[t] = mid[t+1] / mid[t] - 1`` (0 at the last
    bar, which is never stepped from); ``count_rel`` is the trade count over its mean before the
    bar; ``buy_pressure`` / ``sell_pressure`` are the buyer- / seller-initiated volume over the ask
    / bid L1 size (the queue a sell / buy order waits in), over the mean total queue pressure
    before the bar (the module docstring's fill intensity).
    """

    features: np.ndarray
    mid: np.ndarray
    bid: np.ndarray
    ask: np.ndarray
    half_spread: np.ndarray
    ret: np.ndarray
    count_rel: np.ndarray
    buy_pressure: np.ndarray
    sell_pressure: np.ndarray
    tick: float

    @classmethod
    def from_split(cls, split: MarketData) -> MarketArrays:
        vol, signed = split.trade_volume, split.signed_volume
        ret = np.zeros(len(split))
        ret[:-1] = split.mid[1:] / split.mid[:-1] - 1.0
        press = _level(vol / np.maximum(split.bid_size + split.ask_size, 1e-9))
        return cls(
            features=split.features, mid=split.mid, bid=split.bid, ask=split.ask,
            half_spread=(split.ask - split.bid) / (2.0 * split.mid), ret=ret,
            count_rel=split.trade_count / _level(split.trade_count),
            buy_pressure=0.5 * (vol + signed) / np.maximum(split.ask_size, 1e-9) / press,
            sell_pressure=0.5 * (vol - signed) / np.maximum(split.bid_size, 1e-9) / press,
            tick=split.tick_size,
        )

    def columns(self) -> np.ndarray:
        """float64 ``[T, len(MARKET_COLUMNS)]``: one row per bar (the device layout)."""
        return np.ascontiguousarray(np.stack([getattr(self, c) for c in MARKET_COLUMNS], axis=1))


@dataclass(frozen=True)
class EnvParams:
    """Constants of the transition derived from :class:`EnvSettings` and the episode mode.

    ``num_starts``: an episode (re)starts at a bar in ``0 .. num_starts - 1`` (1 in sequential
    mode: always the first bar).
    """

    sizes: np.ndarray
    urgency: np.ndarray
    taker: float
    maker: float
    lam0: float
    reward_scale_bps: float
    episode_len: int
    num_starts: int

    @classmethod
    def from_settings(cls, settings: EnvSettings, episode_len: int, data_len: int,
                      sequential: bool = False) -> EnvParams:
        rate = settings.fill_base_rate
        return cls(
            sizes=np.asarray(settings.position_sizes, dtype=np.float64),
            urgency=np.asarray(settings.urgency_bars, dtype=np.int64),
            taker=settings.taker_fee_bps * 1e-4,
            maker=settings.maker_fee_bps * 1e-4,
            lam0=float(np.inf if rate >= 1.0 else -np.log1p(-rate)),
            reward_scale_bps=1.0 if settings.reward_scale_bps is None else float(settings.reward_scale_bps),
            episode_len=int(episode_len),
            num_starts=1 if sequential else int(data_len - episode_len),
        )


class StepOutput(NamedTuple):
    """Everything one transition returns besides the new state (see :meth:`TradingEnv.step`)."""

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    pnl_bps: np.ndarray
    turnover: np.ndarray
    cost_bps: np.ndarray
    position: np.ndarray


# ---------------------------------------------------------------------- pure functions
def empty_state(num_envs: int) -> State:
    """All-zero state of ``num_envs`` episodes (flat, no orders, at bar 0)."""
    return {k: np.zeros(num_envs, dtype=d) for k, d in STATE_FIELDS.items()}


def start_bars(u: np.ndarray, num_starts: int) -> np.ndarray:
    """Map uniforms in [0, 1) to start bars ``floor(u * num_starts)`` in ``0..num_starts-1``."""
    bars = (np.asarray(u, dtype=np.float64) * num_starts).astype(np.int64)
    return np.minimum(bars, num_starts - 1)


def reset_episodes(state: State, mask: np.ndarray, starts: np.ndarray) -> State:
    """A new state where the episodes in ``mask`` start afresh at ``starts`` (others kept)."""
    out = {k: np.where(mask, 0, v).astype(v.dtype, copy=False) for k, v in state.items()}
    out["start"] = np.where(mask, starts, state["start"])
    out["cursor"] = np.where(mask, starts, state["cursor"])
    return out


def observe(state: State, market: MarketArrays) -> np.ndarray:
    """float32 ``[N, 50]``: the features of each episode's bar with its account block written."""
    obs = market.features[state["cursor"]]  # fancy indexing copies
    obs[:, INDEX["position"]] = state["position"]
    obs[:, INDEX["unrealized_pnl"]] = np.clip(
        state["open_pnl_bps"] / UNREALIZED_SCALE_BPS, -UNREALIZED_CLIP, UNREALIZED_CLIP
    )
    obs[:, INDEX["holding_time"]] = np.log1p(state["hold"]) / np.log1p(HOLDING_SCALE_BARS)
    obs[:, INDEX["working_order"]] = np.where(
        state["order_active"], state["order_target"] - state["position"], 0.0
    )
    return obs


def transition(
    state: State, actions: np.ndarray, market: MarketArrays, params: EnvParams,
    fill_u: np.ndarray, reset_starts: np.ndarray,
) -> tuple[State, StepOutput]:
    """One step of every episode (the module docstring's rules); ``state`` is not modified.

    Args:
        state: per-episode arrays (:data:`STATE_FIELDS`).
        actions: int64 ``[N, 4]`` (validated by the caller).
        fill_u: uniforms in [0, 1), one per episode: the working order fills if ``u < prob``.
        reset_starts: the start bar of each episode that is truncated by this step (read only
            for those).

    Returns:
        The new state (after any auto-reset) and the :class:`StepOutput`.
    """
    a = actions
    t = state["cursor"]
    j = t + 1
    tick = market.tick
    p_old = state["position"]
    target = (a[:, 0] - 1).astype(np.float64) * params.sizes[a[:, 1]]
    delta = target - p_old
    moving = np.abs(delta) > 1e-12
    market_order = a[:, 2] == 0

    # market orders: fill now at the touch, cancel any working order
    mkt = market_order & moving
    mkt_cost = np.where(mkt, np.abs(delta) * (market.half_spread[t] + params.taker), 0.0)
    turnover = np.where(mkt, np.abs(delta), 0.0)
    position = np.where(mkt, target, p_old)
    # limit orders: a new one replaces the working order; the same one keeps its place
    kind = a[:, 2]
    lim = ~market_order & moving
    keep = lim & state["order_active"] & (state["order_target"] == target) & (state["order_kind"] == kind)
    new = lim & ~keep
    buy = delta > 0
    touch = np.where(buy, market.bid[t], market.ask[t])
    behind = np.where(kind == 2, np.where(buy, -tick, tick), 0.0)
    order_target = np.where(lim, target, 0.0)
    order_kind = np.where(lim, kind, 0)
    order_price = np.where(new, touch + behind, np.where(keep, state["order_price"], 0.0))
    order_ttl = np.where(new, params.urgency[a[:, 3]], np.where(keep, state["order_ttl"], 0))

    # mark to market over bar t -> t+1 with the position held after the market fill
    mtm = position * market.ret[t]

    # working orders at the close of bar j
    active = lim
    o_delta = order_target - position
    o_buy = o_delta > 0
    price = order_price
    bid_j, ask_j = market.bid[j], market.ask[j]
    half_tick = 0.5 * tick
    through = np.where(o_buy, bid_j < price - half_tick, ask_j > price + half_tick)
    k = np.maximum(np.rint(np.where(o_buy, bid_j - price, price - ask_j) / tick), 0.0)
    press = np.where(o_buy, market.sell_pressure[j], market.buy_pressure[j])
    rate = np.sqrt(market.count_rel[j]) * np.sqrt(np.minimum(press, PRESSURE_CAP))
    with np.errstate(invalid="ignore"):  # inf * 0 when fill_base_rate is 1 and no trades
        lam = params.lam0 * rate * PASSIVE_DECAY**k
        prob = np.where(np.isnan(lam), 0.0, -np.expm1(-lam))
    filled = active & (through | (fill_u < prob))
    mid_j = market.mid[j]
    fill_fee = np.where(filled, np.abs(o_delta) * params.maker, 0.0)
    fill_edge = np.where(filled, o_delta * (mid_j - price) / mid_j, 0.0)
    turnover = turnover + np.where(filled, np.abs(o_delta), 0.0)
    position = np.where(filled, order_target, position)
    ttl = np.where(active & ~filled, order_ttl - 1, 0)
    still = active & ~filled & (ttl > 0)

    cost = mkt_cost + fill_fee
    pnl_bps = 1e4 * (mtm - cost + fill_edge)
    # account bookkeeping
    same = (np.sign(position) == np.sign(p_old)) & (position != 0)
    steps = state["steps"] + 1
    after: State = {
        "cursor": j,
        "start": state["start"],
        "steps": steps,
        "position": position,
        "open_pnl_bps": np.where(
            position == 0, 0.0, np.where(same, state["open_pnl_bps"] + pnl_bps, pnl_bps)
        ),
        "hold": np.where(position == 0, 0, np.where(same, state["hold"] + 1, 1)),
        "order_active": still,
        "order_target": np.where(still, order_target, 0.0),
        "order_price": np.where(still, order_price, 0.0),
        "order_kind": np.where(still, order_kind, 0),
        "order_ttl": np.where(still, ttl, 0),
    }
    truncated = steps >= params.episode_len
    final_obs = observe(after, market)
    if truncated.any():  # auto-reset: the returned obs is the new episode's first
        new_state = reset_episodes(after, truncated, reset_starts)
        idx = np.flatnonzero(truncated)
        obs = final_obs.copy()
        obs[idx] = observe({k: v[idx] for k, v in new_state.items()}, market)
    else:
        new_state, obs = after, final_obs
    reward = (pnl_bps / params.reward_scale_bps).astype(np.float32)
    terminated = np.zeros(truncated.shape[0], dtype=bool)
    out = StepOutput(obs, reward, terminated, truncated, final_obs, pnl_bps, turnover, 1e4 * cost,
                     position.copy())
    return new_state, out


# ---------------------------------------------------------------------- the environment
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
        self.market = MarketArrays.from_split(split)
        self.params = EnvParams.from_settings(settings, self.episode_len, t_len, mode == "sequential")
        self._set_state(empty_state(self.num_envs))
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

    # ------------------------------------------------------------------ state and draws
    def _state(self) -> State:
        return {k: getattr(self, k) for k in STATE_FIELDS}

    def _set_state(self, state: State) -> None:
        for k in STATE_FIELDS:
            setattr(self, k, state[k])

    def _draw_starts(self, count: int) -> np.ndarray:
        if self.mode == "sequential":
            return np.zeros(count, dtype=np.int64)
        return self.rng.integers(0, self.params.num_starts, size=count)

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        """Start every episode afresh; returns ``(obs float32[N, 50], info)``."""
        every = np.ones(self.num_envs, dtype=bool)
        self._set_state(reset_episodes(self._state(), every, self._draw_starts(self.num_envs)))
        self._ready = True
        return observe(self._state(), self.market), {}

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
        fill_u = self.rng.random(self.num_envs)
        ending = np.flatnonzero(self.steps + 1 >= self.episode_len)
        starts = np.zeros(self.num_envs, dtype=np.int64)
        if ending.size:
            starts[ending] = self._draw_starts(ending.size)
        state, out = transition(self._state(), a, self.market, self.params, fill_u, starts)
        self._set_state(state)
        info: dict[str, Any] = {
            "final_obs": out.final_obs,
            "pnl_bps": out.pnl_bps,
            "turnover": out.turnover,
            "cost_bps": out.cost_bps,
            "position": out.position,
        }
        return out.obs, out.reward, out.terminated, out.truncated, info

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: per-episode arrays (NumPy, exact)
        and JSON-able scalars, including the generator's ``bit_generator.state``."""
        state: dict[str, Any] = {"version": STATE_VERSION, **identity(self.mode, self.num_envs,
                                                                        self.episode_len, self.split)}
        state["ready"] = self._ready
        for k in STATE_FIELDS:
            v = getattr(self, k)
            state[k] = v.astype(np.int8) if v.dtype == np.bool_ else v.copy()
        state["rng_state"] = self.rng.bit_generator.state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (arrays may come back as lists)."""
        self._set_state(check_state(state, identity(self.mode, self.num_envs, self.episode_len,
                                                    self.split)))
        self.rng.bit_generator.state = state["rng_state"]
        self._ready = bool(state["ready"])


# ---------------------------------------------------------------------- checkpoint helpers
def identity(mode: str, num_envs: int, episode_len: int, split: MarketData) -> dict[str, Any]:
    """The values a saved state must agree on with the environment that loads it."""
    return {"mode": mode, "num_envs": num_envs, "episode_len": episode_len,
            "data_len": len(split), "data_first_ts": int(split.timestamp[0])}


def check_state(state: dict[str, Any], expect: dict[str, Any]) -> State:
    """Validate a saved state against ``expect`` (see :func:`identity`); return its arrays."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"unsupported env state version {state.get('version')!r}")
    for key, value in expect.items():
        if state[key] != value:
            raise ValueError(f"env state was saved with {key}={state[key]!r}, this env has {value!r}")
    n = expect["num_envs"]
    out: State = {}
    for key, dtype in STATE_FIELDS.items():
        arr = np.array(state[key], dtype=dtype)
        if arr.shape != (n,):
            raise ValueError(f"env state {key!r} has shape {arr.shape}, expected ({n},)")
        out[key] = arr
    return out
