"""Value bias: the discounted returns, the truncation horizon, the statistic, and the walk it is
measured on (the same walk as the policy's evaluation)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from foxhunt_core import value_bias as vb
from foxhunt_core.cli import app
from foxhunt_core.config import RunSettings
from foxhunt_core.plugins import LoadedPlugin, PluginSet
from foxhunt_core.qpipe import branch_argmax, expected_q
from foxhunt_core.trainer import Trainer
from hook_plugins import AffinePostPlugin, CenterPlugin


def tiny(steps=60, device="cpu", **train):
    return RunSettings.model_validate({
        "seed": 2, "device": device, "market": {"bars": 2000},
        "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 200, "stats_every": 20,
                  "checkpoint_every": 1000, **train},
    })


def test_discounted_returns_are_the_explicit_sums():
    rng = np.random.default_rng(0)
    r = rng.normal(size=40)
    g = vb.discounted_returns(r, 0.9)
    for t in (0, 7, 39):
        assert g[t] == pytest.approx(sum(0.9**k * r[t + k] for k in range(40 - t)), rel=1e-12)


@pytest.mark.parametrize("gamma, bars, h", [(0.9, 12000, 44), (0.99, 12000, 459), (0.99, 400, 200), (0.0, 100, 1),
                                            (0.5, 100, 7)])
def test_the_horizon_keeps_the_cut_off_return_under_one_percent(gamma, bars, h):
    assert vb.horizon(gamma, bars) == h
    if h < bars // 2:
        assert gamma**h <= vb.TRUNCATION < gamma ** (h - 1)


def test_the_statistic_is_the_mean_error_over_the_returns_std():
    rng = np.random.default_rng(1)
    r = rng.normal(size=500) * 3.0
    g = vb.discounted_returns(r, 0.9)
    exact = vb.summarize(g, g, r, 0.9)  # Q that predicts every return exactly
    assert exact["bias"] == pytest.approx(0.0, abs=1e-12) and exact["value_bias"] == pytest.approx(0.0, abs=1e-12)
    used = exact["states"]
    assert used == 500 - vb.horizon(0.9, 500)
    over = vb.summarize(g + 2.5, g - 1.0, r, 0.9)
    assert over["bias"] == pytest.approx(2.5) and over["coordinated_bias"] == pytest.approx(-1.0)
    assert over["value_bias"] == pytest.approx(2.5 / np.std(g[:used]))
    assert over["return_std"] == pytest.approx(np.std(g[:used]))
    flat = vb.summarize(np.full(100, 0.4), np.full(100, 0.4), np.zeros(100), 0.9)  # returns that never vary
    assert flat["return_std"] == 0.0 and flat["value_bias"] == pytest.approx(0.4 / vb.RETURN_STD_FLOOR)


def _plugins(*plugs):
    return PluginSet([LoadedPlugin(type(p).__name__.lower(), p.POSITION, p) for p in plugs])


@pytest.fixture(scope="module")
def trained():
    tr = Trainer(tiny(), _plugins(CenterPlugin(), AffinePostPlugin()))
    tr.train()
    return tr


def test_the_walk_is_the_policys_evaluation_walk(trained):
    rec = vb.measure(trained)
    table = trained.evaluate("test")
    assert rec["total_return"] == pytest.approx(table["policy"]["total_return"], rel=1e-12, abs=1e-15)
    assert rec["bars"] == int(table["policy"]["bars"]) and rec["split"] == "test"
    assert all(np.isfinite(rec[k]) for k in ("value_bias", "coordinated_value_bias", "q_mean", "return_mean"))


def test_the_predicted_value_is_the_raw_expected_q_of_the_taken_actions(trained):
    agent = trained.agent
    obs = np.random.default_rng(3).normal(size=(5, 50)).astype(np.float32)
    actions, raw, coord = vb.taken_values(agent, obs)
    assert np.array_equal(actions, trained._act(obs))  # the greedy actions evaluation takes
    out = agent.net.forward(agent.online, obs)
    q, _ = expected_q(out.probs, agent.z)
    idx = actions + agent.step.branch_base
    assert raw == pytest.approx(np.take_along_axis(q, idx, axis=1).mean(axis=1), rel=1e-5)
    qc = agent.qpipe.forward(agent.online, out.probs, agent.z).q_coord
    assert coord == pytest.approx(np.take_along_axis(qc, idx, axis=1).mean(axis=1), rel=1e-5)
    assert np.array_equal(branch_argmax(qc, agent.offsets), actions)
    assert not np.allclose(raw, coord)  # the centring stage moves coordinated Q, not the raw estimate


def test_train_writes_the_value_bias_into_eval_json(tmp_path):
    flags = tmp_path / "f.yaml"
    flags.write_text("version: 1\nstage: 0\nrun:\n  device: cpu\n  market: {bars: 2000}\n"
                     "  env: {num_envs: 8, episode_len: 64}\n  net: {shared_h1: 16, shared_h2: 16, adv_h: 12}\n"
                     "  train: {steps: 30, batch_size: 32, warmup_steps: 200, stats_every: 10}\nplugins: {}\n")
    res = CliRunner().invoke(app, ["train", "--flags", str(flags), "--out", str(tmp_path / "run"), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "run" / "eval.json").read_text())["value_bias"]
    assert doc["gamma"] == 0.9 and doc["horizon"] == 44 and doc["states"] == doc["bars"] - 44
    assert {"value_bias", "bias", "q_mean", "return_mean", "return_std", "truncation_weight",
            "coordinated_value_bias"} <= set(doc)


@pytest.mark.gpu
def test_the_walk_on_the_gpu_is_the_policys_evaluation_walk():
    tr = Trainer(tiny(device="cuda"), _plugins(CenterPlugin(), AffinePostPlugin()))
    tr.train()
    rec = vb.measure(tr)
    assert rec["total_return"] == pytest.approx(tr.evaluate("test")["policy"]["total_return"], rel=1e-9, abs=1e-12)
    assert np.isfinite(rec["value_bias"])
