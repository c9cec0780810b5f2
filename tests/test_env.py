"""TradingEnv: hand-checked fills, costs and rewards; episodes; bit-identical state round trip."""

import json

import numpy as np
import pytest

from foxhunt_core.config import EnvSettings, MarketSettings
from foxhunt_core.env import TradingEnv
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.schema import INDEX, STATE_DIM
from foxhunt_core.market.source import bar_volatility_bps
from foxhunt_core.market.splits import synthetic_splits

TICK = 0.01


def _market(mid, spread_ticks=1.0, count=5.0, volume=50.0, signed=0.0, size=100.0):
    mid = np.asarray(mid, dtype=np.float64)
    n = mid.shape[0]
    full = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)).copy()  # noqa: E731
    half = 0.5 * TICK * full(spread_ticks)
    return MarketData(
        timestamp=np.arange(n), mid=mid, bid=mid - half, ask=mid + half, bid_size=full(size),
        ask_size=full(size), trade_volume=full(volume), trade_count=full(count),
        signed_volume=full(signed), ofi=np.zeros(n), regime=np.full(n, -1),
        features=np.zeros((n, STATE_DIM)), tick_size=TICK, source="hand",
    )


def _seq(data, **over):
    env = TradingEnv.sequential(data, EnvSettings(**over), np.random.default_rng(0))
    obs, info = env.reset()
    return env, obs


def _act(direction, magnitude=2, order=0, urgency=0):
    return np.array([[direction, magnitude, order, urgency]])


def test_market_order_cost_and_mark_to_market():
    env, obs = _seq(_market([100.0, 100.02, 100.01, 100.01]), reward_scale_bps=2.0)
    assert obs.shape == (1, STATE_DIM) and obs.dtype == np.float32
    obs, reward, term, trunc, info = env.step(_act(2))
    # +2 bp move on full size, minus half spread (0.5 bp) and taker fee (0.5 bp)
    assert info["pnl_bps"][0] == pytest.approx(1e4 * (100.02 / 100 - 1) - 1.0)
    assert info["cost_bps"][0] == pytest.approx(1.0)
    assert reward.dtype == np.float32 and reward[0] == pytest.approx(info["pnl_bps"][0] / 2)
    assert info["turnover"][0] == 1.0 and not term[0] and not trunc[0]
    assert obs[0, INDEX["position"]] == 1.0 and obs[0, INDEX["holding_time"]] > 0
    obs, reward, *_ , info = env.step(_act(0, magnitude=1))  # long 1 -> short 0.5: trade 1.5
    assert info["turnover"][0] == 1.5
    cost = 1.5 * (0.005 / 100.02 + 0.5e-4)
    assert info["pnl_bps"][0] == pytest.approx(1e4 * (-0.5 * (100.01 / 100.02 - 1) - cost))
    assert obs[0, INDEX["position"]] == -0.5


def test_flat_direction_ignores_magnitude_and_costs_nothing():
    env, _ = _seq(_market([100.0, 100.5, 99.0]))
    for _ in range(2):
        _, reward, _, _, info = env.step(_act(1, magnitude=2))
        assert reward[0] == 0.0 and info["turnover"][0] == 0.0


def test_limit_order_filled_when_price_trades_through():
    # buy at the touch (bid 99.995); the next bar's bid 99.975 is below it: a sure fill
    env, _ = _seq(_market([100.0, 99.98, 99.98], count=0.0))
    obs, reward, *_, info = env.step(_act(2, order=1))
    edge = (99.98 - 99.995) / 99.98  # bought above the new mid: adverse selection
    rebate = 0.1e-4
    assert info["pnl_bps"][0] == pytest.approx(1e4 * (edge + rebate))
    assert obs[0, INDEX["position"]] == 1.0 and obs[0, INDEX["working_order"]] == 0.0


def test_passive_order_waits_then_is_cancelled():
    # no trades and an unchanged price: nothing fills; urgency 1 -> 4 bars of patience
    env, obs = _seq(_market(np.full(10, 100.0), count=0.0, volume=0.0))
    for i in range(4):
        obs, reward, *_, info = env.step(_act(0, magnitude=1, order=2, urgency=1))
        assert reward[0] == 0.0 and obs[0, INDEX["position"]] == 0.0
        assert env.order_price[0] == (pytest.approx(100.015) if i < 3 else 0.0)
        assert obs[0, INDEX["working_order"]] == (-0.5 if i < 3 else 0.0)
    obs, *_ = env.step(_act(0, magnitude=1, order=2, urgency=1))  # a fresh order
    assert env.order_ttl[0] == 3 and obs[0, INDEX["working_order"]] == -0.5
    obs, *_ = env.step(_act(1, order=2))  # flat = the current position: cancels the order
    assert obs[0, INDEX["working_order"]] == 0.0 and not env.order_active[0]


def test_touch_order_fills_surely_at_full_rate_when_trades_arrive():
    env, _ = _seq(_market(np.full(4, 100.0), count=5.0, volume=50.0), fill_base_rate=1.0)
    obs, reward, *_, info = env.step(_act(0, order=1))  # sell at the ask 100.005
    assert obs[0, INDEX["position"]] == -1.0
    assert info["pnl_bps"][0] == pytest.approx(1e4 * (0.005 / 100 + 0.1e-4))
    env, _ = _seq(_market(np.full(4, 100.0), count=0.0, volume=0.0), fill_base_rate=1.0)
    obs, *_ = env.step(_act(0, order=1))  # no trades: no fill, even at rate 1
    assert obs[0, INDEX["position"]] == 0.0


def test_fill_rate_matches_base_rate_at_normal_conditions():
    data = _market(np.full(4001, 100.0))
    env = TradingEnv(data, EnvSettings(), np.random.default_rng(1), num_envs=4000, episode_len=8)
    env.reset()
    actions = np.tile([2, 2, 1, 0], (4000, 1))
    *_, info = env.step(actions)
    assert info["position"].mean() == pytest.approx(EnvSettings().fill_base_rate, abs=0.03)
    env.reset()
    *_, info = env.step(np.tile([2, 2, 2, 0], (4000, 1)))  # one tick behind: much rarer
    assert info["position"].mean() < 0.5 * EnvSettings().fill_base_rate


def test_sequential_walks_the_whole_split_once():
    data = _market(100 + np.arange(6) * 0.01)
    env, _ = _seq(data)
    seen = []
    for _ in range(5):
        *_, trunc, info = env.step(_act(2))
        seen.append(bool(trunc[0]))
    assert seen == [False] * 4 + [True]
    assert env.cursor[0] == 0  # auto-reset to the first bar


@pytest.fixture(scope="module")
def train_split():
    return synthetic_splits(MarketSettings(bars=3000, seed=2)).train


def test_random_episodes_reset_and_report_final_obs(train_split):
    s = EnvSettings(num_envs=8, episode_len=16)
    env = TradingEnv(train_split, s, np.random.default_rng(3))
    obs, _ = env.reset()
    assert obs.shape == (8, STATE_DIM)
    assert (env.start <= len(train_split) - 1 - 16).all()
    rng = np.random.default_rng(4)
    for step in range(1, 40):
        actions = rng.integers(0, 3, size=(8, 4))
        before = env.cursor.copy()
        obs, reward, term, trunc, info = env.step(actions)
        assert reward.shape == (8,) and not term.any()
        assert trunc.all() == (step % 16 == 0) and trunc.any() == (step % 16 == 0)
        fin = info["final_obs"]
        np.testing.assert_array_equal(
            fin[:, :38], train_split.features[before + 1, :38]
        )
        if trunc.any():
            assert (obs[:, INDEX["position"]] == 0).all()
            np.testing.assert_array_equal(obs[:, :38], train_split.features[env.start, :38])
            np.testing.assert_array_equal(fin[:, INDEX["position"]], info["position"])
        else:
            np.testing.assert_array_equal(fin, obs)


def test_invalid_actions_are_rejected(train_split):
    env = TradingEnv(train_split, EnvSettings(num_envs=2), np.random.default_rng(0))
    with pytest.raises(RuntimeError):
        env.step(np.ones((2, 4), dtype=int))
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.step(np.ones((3, 4), dtype=int))
    with pytest.raises(ValueError, match="0..2"):
        env.step(np.full((2, 4), 3))
    with pytest.raises(ValueError, match="integers"):
        env.step(np.ones((2, 4)))
    with pytest.raises(ValueError, match="bars"):
        TradingEnv(train_split.slice(0, 10), EnvSettings(), np.random.default_rng(0))


def _run(env, actions):
    out = []
    for a in actions:
        obs, reward, term, trunc, info = env.step(a)
        out.append((obs, reward, trunc, info["final_obs"], info["pnl_bps"]))
    return out


def test_state_round_trip_is_bit_identical(train_split):
    s = EnvSettings(num_envs=6, episode_len=12)
    rng = np.random.default_rng(9)
    actions = rng.integers(0, 3, size=(60, 6, 4))
    env = TradingEnv(train_split, s, np.random.default_rng(5))
    env.reset()
    _run(env, actions[:25])
    state = env.state_dict()
    arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
    meta = json.loads(json.dumps({k: v for k, v in state.items() if k not in arrays}))
    assert env.order_active.any() and (env.position != 0).any()  # a cut with live state
    expected = _run(env, actions[25:])
    clone = TradingEnv(train_split, s, np.random.default_rng(12345))  # a different generator
    clone.load_state_dict({**meta, **{k: v.tolist() for k, v in arrays.items()}})
    got = _run(clone, actions[25:])
    for e, g in zip(expected, got, strict=True):
        for a, b in zip(e, g, strict=True):
            np.testing.assert_array_equal(a, b)


def test_state_from_another_env_is_refused(train_split):
    a = TradingEnv(train_split, EnvSettings(num_envs=2), np.random.default_rng(0))
    a.reset()
    b = TradingEnv(train_split, EnvSettings(num_envs=3), np.random.default_rng(0))
    with pytest.raises(ValueError, match="num_envs"):
        b.load_state_dict(a.state_dict())


def test_reward_scale_of_a_full_position(train_split):
    env = TradingEnv.sequential(train_split, EnvSettings(), np.random.default_rng(0))
    env.reset()
    rewards = [env.step(_act(2))[1][0] for _ in range(len(train_split) - 1)]
    r = np.diff(train_split.mid) / train_split.mid[:-1]
    # after the entry, the reward is the bar return in bp: its std is the per-bar volatility
    assert np.std(rewards[1:]) == pytest.approx(1e4 * np.std(r[1:]), rel=1e-4)
    # a run scales rewards by its training split's bar volatility: a full position's rewards
    # are then in units of a bar's move on any market
    scale = bar_volatility_bps(train_split)
    env = TradingEnv.sequential(train_split, EnvSettings(reward_scale_bps=scale), np.random.default_rng(0))
    env.reset()
    scaled = [env.step(_act(2))[1][0] for _ in range(len(train_split) - 1)]
    assert np.std(scaled[1:]) == pytest.approx(1.0, rel=0.01)


# ---------------------------------------------------------------------- no look-ahead in the fills
_FILL_INPUTS = ("trade_volume", "trade_count", "signed_volume", "bid_size", "ask_size")


def _future_changed(split, t, rng):
    """A copy of ``split`` whose trade and book inputs after bar ``t`` are randomly rescaled."""
    changes = {}
    for name in _FILL_INPUTS:
        arr = getattr(split, name).copy()
        arr[t + 1:] *= rng.uniform(0.2, 5.0, size=arr.shape[0] - t - 1)
        changes[name] = arr
    changes["signed_volume"] = np.clip(changes["signed_volume"], -changes["trade_volume"], changes["trade_volume"])
    return split.replace(**changes)


@pytest.mark.parametrize("t", [0, 1, 9, 100, 1000])
def test_fill_normalization_uses_no_data_after_t(train_split, t):
    """The fill intensity of an order placed at bar t and checked at t+1 reads the trade count
    and queue pressure of t+1 over their means up to t: rescaling everything after t+1 changes
    nothing at or before t+1 (bit for bit), like the features' look-ahead test."""
    from foxhunt_core.env import MarketArrays

    base = MarketArrays.from_split(train_split)
    moved = MarketArrays.from_split(_future_changed(train_split, t + 1, np.random.default_rng(t)))
    for col in ("count_rel", "buy_pressure", "sell_pressure"):
        np.testing.assert_array_equal(getattr(moved, col)[: t + 2], getattr(base, col)[: t + 2])
        assert not np.array_equal(getattr(moved, col)[t + 2:], getattr(base, col)[t + 2:])
    # the normalizer of bar j is the mean of bars before j, by hand
    j = t + 1
    count = train_split.trade_count
    assert base.count_rel[j] == pytest.approx(count[j] / count[:j].mean())
    press = train_split.trade_volume / (train_split.bid_size + train_split.ask_size)
    sells = 0.5 * (train_split.trade_volume[j] - train_split.signed_volume[j]) / train_split.bid_size[j]
    assert base.sell_pressure[j] == pytest.approx(sells / press[:j].mean())


def test_limit_fills_of_a_walk_do_not_depend_on_later_bars(train_split):
    """Walk a split with limit orders; change the bars after t: every step up to t is identical."""
    t = 600
    changed = _future_changed(train_split, t + 1, np.random.default_rng(1))

    def walk(split):
        env = TradingEnv.sequential(split, EnvSettings(), np.random.default_rng(3))
        env.reset()
        rng = np.random.default_rng(4)
        out = []
        for _ in range(t + 1):
            a = np.array([[rng.integers(0, 3), rng.integers(0, 3), rng.integers(1, 3), rng.integers(0, 3)]])
            _, reward, _, _, info = env.step(a)
            out.append((float(reward[0]), float(info["position"][0])))
        return out

    assert walk(train_split) == walk(changed)
