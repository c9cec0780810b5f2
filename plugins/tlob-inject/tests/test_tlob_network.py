"""tlob_inject inside the network and the trainer: the widened rows (count, zero start, identity at
step 0 against stage 6), float64 finite differences through the whole network, training, the
checkpoint round trip, a warm start from a stage-6 checkpoint, the stage files 7..9."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from foxhunt_tlob_inject.options import TlobInjectOptions
from foxhunt_tlob_inject.stage import stages_for

from foxhunt_core.agent import Agent
from foxhunt_core.checkpoint import CheckpointError
from foxhunt_core.config import NetSettings, RunSettings
from foxhunt_core.flags import load_flags
from foxhunt_core.market import schema
from foxhunt_core.net import BranchingC51
from foxhunt_core.testing import check_tree_gradients
from foxhunt_core.testing.gradcheck import numeric_gradient
from foxhunt_core.trainer import CHECKPOINT, Trainer
from foxhunt_core.warmstart import warm_start

ROOT = Path(__file__).resolve().parents[3]
FLAGS = ROOT / "flags"
STAGE6, STAGE7 = FLAGS / "stage-06-diffusion-refine.yaml", FLAGS / "stage-07-tlob-inject.yaml"
SMALL = dict(shared_h1=12, shared_h2=10, adv_h=8, num_atoms=7, v_min=-2.0, v_max=2.0)
TINY_RUN = {
    "seed": 2, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
    "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4},
    "train": {"steps": 40, "batch_size": 32, "warmup_steps": 200, "stats_every": 20, "checkpoint_every": 1000,
              "target_sync_every": 50, "replay_capacity": 5000},
}
# the GLU rows that read the columns: tensors of the core's, one row per column
WIDENED = [f"branch{d}.{w}_in" for d in (2, 3) for w in ("w_gate", "w_val")]


def _stages(**opts):
    o = TlobInjectOptions(**opts)
    return stages_for(o.order_features, o.urgency_features)


def test_widened_rows_are_3072_at_adv_h_256_and_start_at_zero():
    s = NetSettings()  # the default network: trunk 256/256, adv_h 256
    assert s.adv_h == 256
    plain = BranchingC51(s).init_params(np.random.default_rng(0), np.float64)
    net = BranchingC51(s, branch_inputs=_stages())
    wide = net.init_params(np.random.default_rng(0), np.float64)
    assert set(wide) == {"core"} and set(wide["core"]) == set(plain["core"]) | set(WIDENED)
    assert sum(wide["core"][k].size for k in WIDENED) == 3 * 2 * 256 * 2 == 3072
    for k in WIDENED:
        assert wide["core"][k].shape == (3, 256) and not wide["core"][k].any(), k
    for k, v in plain["core"].items():  # every other tensor drawn as without the plugin
        assert np.array_equal(wide["core"][k], v), k


def _agent(path: Path, seed: int) -> Agent:
    f = load_flags(path)
    settings = f.settings.model_validate({**f.settings.model_dump(), "net": TINY_RUN["net"]})
    return Agent(settings, f.registry.plugin_set(f.enabled), np, np.random.default_rng(seed), options=f.option_models)


@pytest.mark.parametrize("seed", [0, 7])
def test_step_0_q_values_equal_stage_6s(seed):
    a6, a7 = _agent(STAGE6, seed), _agent(STAGE7, seed)
    assert a7.stage_owners["branch_inputs"] == ["tlob_inject"] and a6.stage_owners["branch_inputs"] == []
    obs = np.random.default_rng(seed + 1).normal(size=(33, 50)).astype(np.float32)
    for evaluation in (False, True):
        q6 = a6.act_values(obs, 0.4, evaluation=evaluation)
        q7 = a7.act_values(obs, 0.4, evaluation=evaluation)
        assert np.array_equal(q6, q7)
    o6, o7 = a6.net.forward(a6.online, obs), a7.net.forward(a7.online, obs)
    assert np.array_equal(o6.probs, o7.probs)
    # ... and the columns do reach the branches once their rows move off zero
    a7.online["core"]["branch2.w_val_in"][...] = 0.5
    assert not np.array_equal(a7.net.forward(a7.online, obs).probs, o6.probs)


def _big_outputs(params: dict) -> None:
    for k in params["core"]:
        if k.endswith("w_out") or k == "value.w":
            params["core"][k] *= 10


@pytest.mark.parametrize("seed", [3, 4])
def test_whole_network_gradient_reaches_the_widened_rows(seed):
    rng = np.random.default_rng(seed)
    # Non-default lists, one of them not a run of consecutive schema indices.
    stages = _stages(order_features=["ofi", "bid_ask_spread"],
                     urgency_features=["queue_pressure", "trade_arrival_rate", "ret_1"])
    net = BranchingC51(NetSettings(**SMALL), branch_inputs=stages)
    params = net.init_params(rng, np.float64)
    _big_outputs(params)
    obs = rng.normal(size=(6, 50))
    w = rng.normal(size=(6, net.num_actions, net.num_atoms))

    def loss() -> float:
        o = net.forward(params, obs)
        return float((o.log_probs * w).sum() + (o.probs**2).sum())

    def grads():
        out = net.forward(params, obs, keep_cache=True)
        p = out.probs
        dlogits = (w - p * w.sum(-1, keepdims=True)) + p * (2 * p - (2 * p * p).sum(-1, keepdims=True))
        return net.backward(params, out, dlogits)

    g0 = grads()  # at the zero start: the rows get a gradient, so they learn from the first update
    for k in WIDENED:
        assert np.abs(g0["core"][k]).min() > 0, k
    for k in WIDENED:  # off zero, so the columns also carry gradient into the rest of the network
        params["core"][k][...] = rng.normal(0, 0.5, params["core"][k].shape)
    g = grads()
    assert set(g) == {"core"}
    assert check_tree_gradients(loss, params, g, rng, samples_per_tensor=8) == []
    for k in WIDENED:  # every widened row, not only samples
        for r in range(params["core"][k].shape[0]):
            for c in range(params["core"][k].shape[1]):
                num = numeric_gradient(loss, params["core"][k], (r, c), 1e-6)
                assert abs(num - g["core"][k][r, c]) <= 1e-8 + 1e-5 * abs(num), (k, r, c)


def _tiny(path: Path, **train):
    f = load_flags(path)
    run = {**TINY_RUN, "train": {**TINY_RUN["train"], **train}}
    return f, f.settings.model_validate({**f.settings.model_dump(), **run})


def test_training_moves_the_rows_and_the_checkpoint_round_trips(tmp_path):
    f, settings = _tiny(STAGE7)
    tr = Trainer(settings, f.registry.plugin_set(f.enabled), tmp_path / "a", options=f.option_models)
    tr.train()
    for k in WIDENED:
        rows = tr.agent.online["core"][k]
        assert np.isfinite(rows).all() and np.abs(rows).max() > 0, f"{k}: widened rows not trained"
    ckpt = tmp_path / "a" / CHECKPOINT
    assert ckpt.exists()
    back = Trainer(settings, f.registry.plugin_set(f.enabled), None, options=f.option_models)
    back.load(ckpt, history=False)
    assert back.step == tr.step
    for owner, sub in tr.agent.online.items():
        for k, v in sub.items():
            assert np.array_equal(back.agent.online[owner][k], v), (owner, k)
    obs = np.random.default_rng(5).normal(size=(17, 50)).astype(np.float32)
    q_back, q = (t.agent.act_values(obs, 1.0, evaluation=True) for t in (back, tr))
    assert np.array_equal(q_back, q)
    f6, s6 = _tiny(STAGE6)
    wrong = Trainer(s6, f6.registry.plugin_set(f6.enabled), None, options=f6.option_models)
    with pytest.raises(CheckpointError, match="differ from"):  # stage 6 has no tlob_inject
        wrong.load(ckpt, history=False)


def test_warm_start_from_a_stage_6_checkpoint_keeps_its_q_at_step_0(tmp_path):
    f6, s6 = _tiny(STAGE6)
    good = Trainer(s6, f6.registry.plugin_set(f6.enabled), tmp_path / "six", options=f6.option_models)
    good.train()
    f7, s7 = _tiny(STAGE7)
    tr = Trainer(s7, f7.registry.plugin_set(f7.enabled), tmp_path / "seven", options=f7.option_models)
    rec = warm_start(tr, tmp_path / "six" / CHECKPOINT)
    assert rec["new_plugins"] == ["tlob_inject"] and rec["function_preserved"] is True
    assert sorted(rec["widened"]) == sorted(f"core/{k}" for k in WIDENED)
    obs = np.random.default_rng(9).normal(size=(40, 50)).astype(np.float32)
    q6, q7 = good.agent.act_values(obs, 1.0, evaluation=True), tr.agent.act_values(obs, 1.0, evaluation=True)
    assert np.abs(q7 - q6).max() <= 1e-6 * max(1.0, np.abs(q6).max())


def test_columns_are_looked_up_in_the_schema_by_name(monkeypatch):
    """A schema whose microstructure block moved: the stage follows the names, not 42..47."""
    moved = dict(schema.INDEX)
    moved["bid_ask_spread"], moved["ret_1"] = moved["ret_1"], moved["bid_ask_spread"]
    monkeypatch.setattr(schema, "INDEX", moved)
    order, _ = _stages()
    assert order.indices[0] == 0
    obs = np.arange(100, dtype=np.float64).reshape(2, 50)
    assert list(order.forward(np, {}, obs)[0][0]) == [0.0, 43.0, 44.0]


def test_stage_files_7_to_9_validate():
    exe = Path(sys.executable).parent / "foxhunt"
    files = [FLAGS / name for name in ("stage-07-tlob-inject.yaml", "stage-08-xlstm-context.yaml",
                                       "stage-09-rk4-tau.yaml")]
    res = subprocess.run([str(exe), "flags", "validate", *map(str, files)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for n, line in zip((7, 8, 9), res.stdout.strip().splitlines()):
        assert f"ok (stage {n}; " in line and "tlob_inject" in line
    assert load_flags(files[2]).enabled[-3:] == ["tlob_inject", "xlstm_context", "rk4_tau"]


def test_the_stage_7_agent_checks_the_manifest():
    f = load_flags(STAGE7)
    settings = RunSettings(net=NetSettings(**SMALL))
    agent = Agent(settings, f.registry.plugin_set(f.enabled), np, np.random.default_rng(0), options=f.option_models)
    assert "tlob_inject" not in agent.online  # no tensors of its own, as its manifest declares
    assert agent.net.in_width[2:] == [SMALL["shared_h2"] + 3] * 2
    assert [agent.online["core"][k].shape for k in WIDENED] == [(3, SMALL["adv_h"])] * 4


def test_the_plan_takes_the_wide_wgrad_gemm_for_z_with_the_columns():
    """At the default network on a Hopper GPU under TF32, z with the six columns is 268 wide: past
    wgrad_gemm's tail of 8 (264), within its wide variant's 272. The plan keeps the GLU blocks'
    weight gradient on the kernel (cuBLAS before the wide variant) and the heads' on theirs; the
    same network on Ampere has no wgmma, and neither."""
    from foxhunt_core.net.fused import layout
    from foxhunt_core.net.fused.plan import Device, ExecutionPlan

    net = BranchingC51(NetSettings(), branch_inputs=_stages())
    assert layout.z_width(net) == 268
    plan = ExecutionPlan.build(net, Device("90", 132), True, 4096)
    assert plan.wgrad_gemm, plan.wgrad_gemm.why
    assert "268 columns within wgrad_gemm's 257..272" in plan.wgrad_gemm.why
    assert plan.wgrad_heads and "257..264" in plan.wgrad_heads.why
    assert plan.glu_gemm and plan.glu_backward_gemm
    assert not ExecutionPlan.build(net, Device("80", 108), True, 4096).wgrad_gemm
