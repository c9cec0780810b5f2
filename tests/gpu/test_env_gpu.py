"""GpuTradingEnv (kernels/env_step.cu) against the NumPy transition of foxhunt_core.env.

Every run draws a fresh market, state, actions and uniforms. Outputs are poisoned (NaN, or the
wrong boolean) before each launch, so an unwritten element fails. Tolerances: the state, PnL,
costs, rewards and every observation column but one are compared exactly (float64 money
arithmetic with no FMA contraction, see env_step.cu); ``holding_time`` is ``log1p`` in float32,
where CUDA's and NumPy's log1p may differ in the last float32 ulp (relative error <= 1e-6).
"""

import numpy as np
import pytest

from foxhunt_core.config import EnvSettings, MarketSettings
from foxhunt_core.env import TradingEnv, observe, start_bars, transition
from foxhunt_core.gpu.env import STREAM_RESET, GpuTradingEnv, philox4x32_10, philox_uniforms
from foxhunt_core.market.schema import INDEX
from foxhunt_core.market.splits import synthetic_splits

HOLD = INDEX["holding_time"]
N = 1000  # not a multiple of the block size: the last block is partial
EPISODE_LEN = 8
KAT = [  # Random123 tests/kat_vectors, philox4x32 10: counter, key, expected
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


def _split(rng):
    return synthetic_splits(MarketSettings(bars=2000, seed=int(rng.integers(1 << 30)))).train


def _random_state(rng, market, params, n):
    """A consistent mid-episode state: open positions, working orders of both kinds."""
    start = rng.integers(0, params.num_starts, n)
    steps = rng.integers(0, params.episode_len, n)
    levels = np.concatenate([-params.sizes, [0.0], params.sizes])
    position = rng.choice(levels, n)
    target = rng.choice(levels, n)
    active = (rng.random(n) < 0.6) & (target != position)
    cursor = start + steps
    touch = np.where(target > position, market.bid[cursor], market.ask[cursor])
    return {
        "cursor": cursor, "start": start, "steps": steps, "position": position,
        "open_pnl_bps": np.where(position != 0, rng.normal(0, 40, n), 0.0),
        "hold": np.where(position != 0, rng.integers(1, 100, n), 0),
        "order_active": active,
        "order_target": np.where(active, target, 0.0),
        "order_price": np.where(active, touch + rng.integers(-2, 3, n) * market.tick, 0.0),
        "order_kind": np.where(active, rng.integers(1, 3, n), 0),
        "order_ttl": np.where(active, rng.integers(1, 17, n), 0),
    }


def _actions(rng, prev):
    """Random actions; half the episodes repeat their last action (keeps working orders)."""
    a = rng.integers(0, 3, size=prev.shape)
    return np.where(rng.random((prev.shape[0], 1)) < 0.5, prev, a)


def _rel(got, ref):
    den = np.linalg.norm(ref)
    return np.linalg.norm(got - ref) / (den if den > 0 else 1.0)


def _assert_obs(got, ref, what):
    cols = np.arange(ref.shape[1]) != HOLD
    np.testing.assert_array_equal(got[:, cols], ref[:, cols], err_msg=what)
    rel = _rel(got[:, HOLD], ref[:, HOLD])
    assert rel <= 1e-6, f"{what}: holding_time relative error {rel:.2e}"


def _poison(env, expect_truncated):
    for buf in (env.obs, env.final_obs, env.prev_obs, env.reward, *env.info.values()):
        buf.fill(np.nan)
    env.terminated.fill(True)
    env.truncated.set(~expect_truncated)


def _check(env, state, a, u, counts=None, explicit=True):
    """One GPU step against the NumPy transition from the same state with the same draws
    (``explicit``: passed to the kernel; else the kernel's Philox draws must equal ``u``)."""
    import cupy as cp

    m, p = env.market, env.params
    new_state, out = transition(state, a, m, p, u[:, 0], start_bars(u[:, 1], p.num_starts))
    _poison(env, out.truncated)
    obs, reward, term, trunc, final = env.step(cp.asarray(a, dtype=a.dtype),
                                               uniforms=cp.asarray(u) if explicit else None)
    _assert_obs(env.prev_obs.get(), observe(state, m), "prev_obs")
    _assert_obs(final.get(), out.final_obs, "final_obs")
    _assert_obs(obs.get(), out.obs, "obs")
    np.testing.assert_array_equal(reward.get(), out.reward)
    np.testing.assert_array_equal(term.get(), out.terminated)
    np.testing.assert_array_equal(trunc.get(), out.truncated)
    for key in ("pnl_bps", "cost_bps", "turnover", "position"):
        np.testing.assert_array_equal(env.info[key].get(), getattr(out, key), err_msg=key)
    got = env.host_state()
    for key, ref in new_state.items():
        np.testing.assert_array_equal(got[key], ref, err_msg=key)
    if counts is not None:
        _count(counts, state, new_state, out, a, p)
    return new_state


def _count(counts, state, new_state, out, a, p):
    """Tally the events the parity run must cover: resets, limit fills, expired orders."""
    limit = (a[:, 2] != 0) & (np.abs((a[:, 0] - 1) * p.sizes[a[:, 1]] - state["position"]) > 1e-12)
    moved = out.position != state["position"]
    counts["resets"] += int(out.truncated.sum())
    counts["limit_fills"] += int((limit & moved).sum())
    counts["expiries"] += int((limit & ~moved & ~out.truncated & ~new_state["order_active"]).sum())


# ---------------------------------------------------------------------------- CPU: host Philox
def test_host_philox_matches_random123_known_answers():
    for ctr, key, want in KAT:
        got = philox4x32_10(np.array([ctr], dtype=np.uint32), np.array([key], dtype=np.uint32))
        assert got[0].tolist() == want


def test_host_uniforms_are_uniform_and_distinct_per_counter():
    u = philox_uniforms(7, 3, 100_000)
    assert u.shape == (100_000, 2) and (u >= 0).all() and (u < 1).all()
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    assert not np.array_equal(u, philox_uniforms(7, 4, 100_000))
    assert not np.array_equal(u, philox_uniforms(8, 3, 100_000))


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_device_philox_matches_random123_known_answers(cp):
    ctr = cp.asarray(np.array([c for c, _, _ in KAT], dtype=np.uint32))
    key = cp.asarray(np.array([k for _, k, _ in KAT], dtype=np.uint32))
    out = cp.full((len(KAT), 4), 0xDEADBEEF, dtype=cp.uint32)
    GpuTradingEnv._kernel("env_philox_kat")((1,), (32,), (ctr, key, out, np.int32(len(KAT))))
    assert out.get().tolist() == [w for _, _, w in KAT]


@pytest.mark.gpu
@pytest.mark.parametrize("fill_base_rate", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("action_dtype", [np.int64, np.int32])
def test_step_matches_numpy_transition_with_explicit_uniforms(cp, rng, fill_base_rate, action_dtype):
    # fill_base_rate 0: limit orders fill only when the price trades through them
    split = _split(rng)
    env = GpuTradingEnv(split, EnvSettings(fill_base_rate=fill_base_rate), N, seed=1,
                        episode_len=EPISODE_LEN)
    state = _random_state(rng, env.market, env.params, N)
    env.set_state(state)
    counts = {"resets": 0, "limit_fills": 0, "expiries": 0}
    a = rng.integers(0, 3, size=(N, 4)).astype(action_dtype)
    for _ in range(4 * EPISODE_LEN):
        a = _actions(rng, a).astype(action_dtype)
        state = _check(env, state, a, rng.random((N, 2)), counts)
    assert all(v > 0 for v in counts.values()), counts
    env.check()  # no action was flagged


@pytest.mark.gpu
def test_philox_draws_and_reset_match_the_host_twin(rng):
    split = _split(rng)
    seed = int(rng.integers(1 << 62))
    env = GpuTradingEnv(split, EnvSettings(), N, seed=seed, episode_len=EPISODE_LEN)
    env.obs.fill(np.nan)
    obs = env.reset().get()
    u = philox_uniforms(seed, 0, N, STREAM_RESET)[:, 0]
    starts = start_bars(u, env.params.num_starts)
    np.testing.assert_array_equal(env.host_state()["start"], starts)
    ref_state = {k: v.copy() for k, v in env.host_state().items()}
    _assert_obs(obs, observe(ref_state, env.market), "reset obs")
    a = rng.integers(0, 3, size=(N, 4))
    for step in range(1, 3 * EPISODE_LEN):
        assert env.step_counter == step
        a = _actions(rng, a)
        ref_state = _check(env, ref_state, a, philox_uniforms(seed, step, N), explicit=False)
    assert env.step_counter == 3 * EPISODE_LEN


@pytest.mark.gpu
def test_graph_replay_equals_eager_steps(cp, rng):
    split = _split(rng)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # everything on one stream: a non-blocking one does not wait for the default
        eager = GpuTradingEnv(split, EnvSettings(), N, seed=3, episode_len=EPISODE_LEN)
        graphed = GpuTradingEnv(split, EnvSettings(), N, seed=3, episode_len=EPISODE_LEN)
        eager.reset()
        graphed.reset()
        actions = cp.zeros((N, 4), dtype=cp.int64)
        graphed.step(actions)  # compile and warm up outside the capture
        eager.step(actions)
        stream.begin_capture()
        graphed.step(actions)
        graph = stream.end_capture()
        for _ in range(3 * EPISODE_LEN):
            actions.set(rng.integers(0, 3, size=(N, 4)))
            graph.launch(stream)
            eager.step(actions)
            stream.synchronize()
            for key, ref in eager.host_state().items():
                np.testing.assert_array_equal(graphed.host_state()[key], ref, err_msg=key)
            np.testing.assert_array_equal(graphed.obs.get(), eager.obs.get())
            np.testing.assert_array_equal(graphed.final_obs.get(), eager.final_obs.get())
    assert graphed.step_counter == eager.step_counter == 2 + 3 * EPISODE_LEN


@pytest.mark.gpu
def test_state_dict_round_trip_and_cpu_checkpoint(cp, rng):
    split = _split(rng)
    s = EnvSettings()
    env = GpuTradingEnv(split, s, N, seed=5, episode_len=EPISODE_LEN)
    env.reset()
    acts = [cp.asarray(rng.integers(0, 3, size=(N, 4))) for _ in range(30)]
    for a in acts[:11]:
        env.step(a)
    saved = env.state_dict()
    expected = [[x.get() for x in env.step(a)] for a in acts[11:]]
    clone = GpuTradingEnv(split, s, N, seed=999, episode_len=EPISODE_LEN)
    clone.load_state_dict(saved)
    got = [[x.get() for x in clone.step(a)] for a in acts[11:]]
    for e, g in zip(expected, got, strict=True):
        for x, y in zip(e, g, strict=True):
            np.testing.assert_array_equal(x, y)
    # a CPU environment's checkpoint loads: same episodes, same observation
    cpu = TradingEnv(split, s, np.random.default_rng(0), num_envs=N, episode_len=EPISODE_LEN)
    cpu.reset()
    for _ in range(5):
        cpu_obs, *_ = cpu.step(rng.integers(0, 3, size=(N, 4)))
    env.load_state_dict(cpu.state_dict())
    for key, ref in cpu.state_dict().items():
        if isinstance(ref, np.ndarray):
            np.testing.assert_array_equal(env.state_dict()[key], ref, err_msg=key)
    _assert_obs(env.obs.get(), cpu_obs, "obs after loading a CPU state")


@pytest.mark.gpu
def test_out_of_range_actions_are_flagged(cp, rng):
    env = GpuTradingEnv(_split(rng), EnvSettings(), 64, seed=0, episode_len=EPISODE_LEN)
    env.reset()
    env.step(cp.ones((64, 4), dtype=cp.int64))
    env.check()
    env.step(cp.full((64, 4), 3, dtype=cp.int64))
    with pytest.raises(ValueError, match="0..2"):
        env.check()
    with pytest.raises(TypeError, match="int64 or int32"):
        env.step(cp.ones((64, 4), dtype=cp.float32))
    with pytest.raises(ValueError, match="shape"):
        env.step(cp.ones((63, 4), dtype=cp.int64))
