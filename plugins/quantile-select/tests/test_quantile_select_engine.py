"""quantile_select inside the engine (CPU): what collection and evaluation choose by, and a training run."""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_quantile_select.quantile import quantile_select_xp

from foxhunt_core.agent import Agent
from foxhunt_core.collector import HostCollector
from foxhunt_core.config import RunSettings
from foxhunt_core.explore import boltzmann_select
from foxhunt_core.plugins import discover
from foxhunt_core.qpipe import branch_argmax
from foxhunt_core.trainer import Trainer

STAGE_3 = ["q_mean_center", "atom_entropy", "quantile_select"]


def tiny(steps: int = 60) -> RunSettings:
    return RunSettings.model_validate({
        "seed": 4, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4,
                "v_min": -3.0, "v_max": 5.0},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 200, "stats_every": 20,
                  "checkpoint_every": 1000, "target_sync_every": 50, "replay_capacity": 5000},
    })


def _agent(options: dict | None = None, dtype=np.float64) -> Agent:
    rng = np.random.default_rng(9)
    agent = Agent(tiny(), discover().plugin_set(STAGE_3), np, rng, options=options, dtype=dtype)
    for k in agent.online["core"]:  # sharper, more varied distributions than the near-uniform init
        if k.endswith("w_out") or k == "value.w":
            agent.online["core"][k] *= 20
    return agent


def _obs(n: int = 16) -> np.ndarray:
    return np.random.default_rng(2).normal(size=(n, 50))


def _expected(agent: Agent, obs: np.ndarray, readiness: float) -> tuple[np.ndarray, np.ndarray]:
    """(Q_select from the forward's atom probabilities, coordinated Q) for ``obs``."""
    out = agent.net.forward(agent.online, obs)
    q = agent.qpipe.forward(agent.online, out.probs, agent.z)
    return quantile_select_xp(np, out.probs, agent.z, readiness, 0.1, 0.9), q.q_coord


@pytest.mark.parametrize("readiness", [0.0, 0.4, 1.0])
def test_collection_chooses_by_q_select_and_evaluation_by_coordinated_q(readiness):
    agent = _agent()
    obs = _obs()
    assert agent.stage_owners["action_select"] == ["quantile_select"]
    q_select, q_coord = _expected(agent, obs, readiness)
    np.testing.assert_allclose(agent.act_values(obs, readiness), q_select, rtol=0, atol=1e-12)
    np.testing.assert_allclose(agent.act_values(obs, readiness, evaluation=True), q_coord, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(agent.greedy(obs), branch_argmax(q_coord, agent.offsets))
    assert not np.allclose(q_select, q_coord, atol=1e-3)  # the two really differ here


def test_evaluation_option_q_select_uses_it_at_the_evaluation_readiness():
    agent = _agent(options={"quantile_select": {"evaluation": "q_select"}})
    obs = _obs()
    q_select, _ = _expected(agent, obs, 1.0)
    np.testing.assert_allclose(agent.act_values(obs, 1.0, evaluation=True), q_select, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(agent.greedy(obs), branch_argmax(q_select, agent.offsets))


def test_host_collector_draws_boltzmann_on_q_select():
    settings = tiny()
    agent = _agent(dtype=np.float32)
    rngs = {k: np.random.default_rng(i) for i, k in enumerate(("env", "replay", "explore"))}
    col = HostCollector(agent, Trainer(settings, None, None).splits.train, settings, rngs)
    temps = np.array([0.5, 1.0, 2.0, 0.25])
    col.set_exploration(temps, 0.3)
    obs = col.obs.astype(np.float32)
    state = rngs["explore"].bit_generator.state
    got = col._policy_actions(obs)
    rngs["explore"].bit_generator.state = state
    u = rngs["explore"].random((obs.shape[0], 4)).astype(np.float32)
    values = agent.act_values(obs, 0.3)
    np.testing.assert_allclose(values, _expected(agent, obs.astype(np.float64), 0.3)[0], atol=1e-4)
    np.testing.assert_array_equal(got, boltzmann_select(values, agent.offsets, temps.astype(np.float32), u))


def test_trainer_evaluates_on_coordinated_q_and_trains_with_the_stage():
    tr = Trainer(tiny(60), discover().plugin_set(STAGE_3), None, options={})
    tr.train()
    assert tr.agent.stage_owners["action_select"] == ["quantile_select"] and len(tr.history) == 3
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["raw_q_mean"]) for r in tr.history)
    obs = _obs(32).astype(np.float32)
    out = tr.agent.net.forward(tr.agent.online, obs)
    q = tr.agent.qpipe.forward(tr.agent.online, out.probs, tr.agent.z)
    np.testing.assert_array_equal(tr.policy()(obs), branch_argmax(q.q_coord, tr.agent.offsets))
    assert tr.evaluate("val")["policy"]["bars"] > 0
