"""kan_gate inside the network and the trainer: float64 finite differences through the whole
network and the whole update objective, training of the gate's parameters, the A/B flag file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from foxhunt_kan_gate.stage import KanGateStage

from foxhunt_core.agent import Agent
from foxhunt_core.checkpoint import load_checkpoint
from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
from foxhunt_core.flags import load_flags
from foxhunt_core.net import BranchingC51
from foxhunt_core.plugins import discover
from foxhunt_core.testing import check_tree_gradients
from foxhunt_core.trainer import CHECKPOINT

ROOT = Path(__file__).resolve().parents[3]
AB_FLAGS = ROOT / "flags" / "examples" / "kan-gate-ab.yaml"
SMALL = dict(shared_h1=12, shared_h2=10, adv_h=8, num_atoms=7, v_min=-2.0, v_max=2.0)


def _off_init(params: dict, rng: np.random.Generator) -> None:
    """Move the gate off its sigmoid start and widen the pre-activations, so that both clamps
    occur inside the network; larger output layers so every path carries a visible gradient."""
    for k in params["core"]:
        if k.endswith("w_out") or k == "value.w":
            params["core"][k] *= 10
        if k.endswith("w_gate"):
            params["core"][k] *= 4
    for k, v in params["kan_gate"].items():
        params["kan_gate"][k] = v + rng.normal(0, 0.2, v.shape)


@pytest.mark.parametrize("seed", [11, 12])
def test_whole_network_gradient(seed):
    rng = np.random.default_rng(seed)
    net = BranchingC51(NetSettings(**SMALL), gate=KanGateStage())
    params = net.init_params(rng, np.float64)
    assert set(params["kan_gate"]) == {f"b{d}.{n}" for d in range(4) for n in ("coeff", "residual")}
    _off_init(params, rng)
    obs = rng.normal(size=(6, 50))
    w = rng.normal(size=(6, net.num_actions, net.num_atoms))

    def loss() -> float:
        o = net.forward(params, obs)
        return float((o.log_probs * w).sum() + (o.probs**2).sum())

    out = net.forward(params, obs, keep_cache=True)
    p = out.probs
    dlogits = (w - p * w.sum(-1, keepdims=True)) + p * (2 * p - (2 * p * p).sum(-1, keepdims=True))
    caches = [out.cache["branches"][d]["gcache"] for d in range(4)]
    assert np.mean([(~c.inside_out).mean() for c in caches]) > 0.1, "output clamp active somewhere"
    assert np.mean([(~c.loc.inside).mean() for c in caches]) > 0.05, "inputs beyond the grid"
    grads = net.backward(params, out, dlogits)
    assert set(grads) == set(params) and set(grads["kan_gate"]) == set(params["kan_gate"])
    assert check_tree_gradients(loss, params, grads, rng, samples_per_tensor=12) == []


def _settings(**train) -> RunSettings:
    return RunSettings(net=NetSettings(**SMALL), train=TrainSettings(**train))


def _batch(rng: np.random.Generator, rows: int = 6) -> dict:
    return {
        "obs": rng.normal(size=(rows, 50)),
        "next_obs": rng.normal(size=(rows, 50)),
        "action": rng.integers(0, 3, size=(rows, 4)),
        "reward": rng.normal(size=rows) * 0.5,
        "terminal": (rng.random(rows) < 0.3).astype(np.float64),
    }


def test_update_objective_gradient_reaches_the_gate():
    """The C51 loss of the whole update (double-DQN target, entropy term) through the gate."""
    rng = np.random.default_rng(21)
    plugins = discover().plugin_set(["kan_gate"])
    agent = Agent(_settings(entropy_coeff=0.05), plugins, np, rng, dtype=np.float64)
    assert agent.stage_owners["gate_activation"] == ["kan_gate"]
    _off_init(agent.online, rng)
    agent.sync_target()
    agent.target["core"]["value.b"] += 0.3
    batch = _batch(rng)

    def loss() -> float:
        _, s, _, _ = agent.loss_and_grads(batch, 0.05)
        return float(s["loss"])

    grads, _, _, _ = agent.loss_and_grads(batch, 0.05)
    net_side = {o: {k: v for k, v in s.items() if not k.startswith("attn.")} for o, s in agent.online.items()}
    assert check_tree_gradients(loss, {"kan_gate": net_side["kan_gate"]}, grads, rng, samples_per_tensor=20,
                                rtol=1e-4) == []
    assert check_tree_gradients(loss, net_side, grads, rng, samples_per_tensor=4, rtol=1e-4) == []
    assert all(np.abs(g).max() > 0 for g in grads["kan_gate"].values())


def test_float32_updates_train_the_gate_and_stay_float32():
    rng = np.random.default_rng(4)
    agent = Agent(_settings(lr=1e-2), discover().plugin_set(["kan_gate"]), np, rng)
    before = {k: v.copy() for k, v in agent.online["kan_gate"].items()}
    for _ in range(3):
        batch = {k: (v.astype(np.float32) if v.dtype == np.float64 else v) for k, v in _batch(rng, 16).items()}
        agent.update(batch, 0.01)
    for k, v in agent.online["kan_gate"].items():
        assert v.dtype == np.float32, k
        assert not np.array_equal(before[k], v), f"{k} was not updated"
        assert np.array_equal(agent.target["kan_gate"][k], before[k]), "the target moves only at sync"


def test_ab_flag_file_validates():
    f = load_flags(AB_FLAGS)
    assert f.enabled == ["q_mean_center", "atom_entropy", "kan_gate"]
    assert f.out_of_order and "quantile_select" in f.out_of_order
    stage2 = load_flags(ROOT / "flags" / "stage-02-atom-entropy.yaml")
    assert f.settings == stage2.settings  # the A/B differs in the plugins only
    exe = shutil.which("foxhunt", path=str(Path(sys.executable).parent))
    res = subprocess.run([exe, "flags", "validate", str(AB_FLAGS)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok (stage 5; plugins: q_mean_center, atom_entropy, kan_gate)" in res.stdout


TINY_RUN = {
    "seed": 1, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
    "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4},
    "train": {"steps": 40, "batch_size": 32, "warmup_steps": 200, "stats_every": 20, "checkpoint_every": 1000},
}


def test_ab_flag_file_trains_with_foxhunt_train(tmp_path):
    """The A/B file's plugins and options, on a tiny run: the gate is trained and checkpointed."""
    doc = yaml.safe_load(AB_FLAGS.read_text())
    doc["run"] = TINY_RUN
    flags = tmp_path / "kan-tiny.yaml"
    flags.write_text(yaml.safe_dump(doc, sort_keys=False))
    exe = shutil.which("foxhunt", path=str(Path(sys.executable).parent))
    out = tmp_path / "run"
    res = subprocess.run([exe, "train", "--flags", str(flags), "--out", str(out), "--quiet"], capture_output=True,
                         text=True, timeout=600, env={"OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    tensors, _ = load_checkpoint(out / CHECKPOINT)
    coeff = tensors["online/kan_gate/b0.coeff"]
    assert coeff.shape == (12, 8) and np.isfinite(coeff).all()
    fit = KanGateStage().init_params((12,), np.random.default_rng(0))["b0.coeff"]
    assert not np.allclose(coeff, fit), "the gate's coefficients were not trained"
