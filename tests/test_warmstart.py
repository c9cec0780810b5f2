"""Warm start: a stage's run begins from the good stage's checkpoint; a component that starts as the
identity leaves the coordinated Q unchanged at step 0."""

import json

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict
from typer.testing import CliRunner

from foxhunt_core.checkpoint import CheckpointError, flatten, load_checkpoint, unflatten
from foxhunt_core.cli import app
from foxhunt_core.config import RunSettings
from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import ParamSpec, PluginManifest
from foxhunt_core.plugins import LoadedPlugin, PluginSet
from foxhunt_core.trainer import CHECKPOINT, Trainer
from foxhunt_core.warmstart import RECORD, branch_rows, transfer, warm_start
from hook_plugins import AffinePostPlugin, CenterPlugin, OfiColumnPlugin, TanhGatePlugin, ZeroRows


class TwoColumnsPlugin:
    POSITION = 8

    @hookimpl
    def branch_inputs(self, ctx):
        return ZeroRows((2,), name="two_columns")  # two observation columns for the order branch


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


def settings(**net):
    return RunSettings.model_validate({
        "seed": 4, "device": "cpu", "market": {"bars": 2000}, "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4, **net},
        "train": {"steps": 80, "batch_size": 32, "warmup_steps": 200, "stats_every": 20, "checkpoint_every": 1000},
    })


PLUGINS = {"center": CenterPlugin, "affine_post": AffinePostPlugin, "ofi_column": OfiColumnPlugin,
           "tanh_gate": TanhGatePlugin, "two_columns": TwoColumnsPlugin}
IDENTITY = {"center": False, "affine_post": True, "ofi_column": True, "tanh_gate": False, "two_columns": True}
PARAMS = {  # what each stand-in's stage creates, as its manifest must declare it
    "center": (),
    "affine_post": tuple(ParamSpec(name=k, shape=("num_actions",), description=k) for k in "abc"),
    "ofi_column": (ParamSpec(name="w", shape=(1,), description="w"),),
    "two_columns": (),
    "tanh_gate": tuple(ParamSpec(name=f"b{d}.slope", shape=("adv_h",), description="slope") for d in range(4)),
}


def plugin_set(names):
    out = []
    for n in names:
        cls = PLUGINS[n]
        m = PluginManifest(name=n, version="0.0.1", position=cls.POSITION + 10, hooks=("q_stats",), options=NoOptions,
                           starts_as_identity=IDENTITY[n], parameters=PARAMS[n])
        out.append(LoadedPlugin(n, cls.POSITION, cls(), m))
    return PluginSet(out)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A trained 'good stage' run with the centring plugin: its checkpoint is where warm starts begin."""
    out = tmp_path_factory.mktemp("good") / "run"
    tr = Trainer(settings(), plugin_set(["center"]), out)
    tr.train()
    return tr, out / CHECKPOINT


def obs_batch():
    return np.random.default_rng(11).normal(size=(64, 50)).astype(np.float32)


def coordinated(tr):
    agent = tr.agent
    out = agent.net.forward(agent.online, obs_batch())
    return agent.qpipe.forward(agent.online, out.probs, agent.z).q_coord


@pytest.mark.parametrize("new", [["affine_post"], ["ofi_column"], ["affine_post", "ofi_column"]])
def test_a_component_that_starts_as_the_identity_keeps_the_good_stages_q_at_step_0(good, new, tmp_path):
    before, ckpt = good
    tr = Trainer(settings(), plugin_set(["center", *new]), tmp_path / "warm")
    cold = coordinated(tr)
    rec = warm_start(tr, ckpt)
    assert rec["new_plugins"] == new and rec["function_preserved"] is True
    assert rec["starts_as_identity"] == {n: True for n in new}
    q_good, q_warm = coordinated(before), coordinated(tr)
    assert np.abs(q_warm - q_good).max() <= 1e-5 * max(1.0, np.abs(q_good).max())
    assert np.abs(cold - q_good).max() > 1e-2  # a fresh init is a different function
    assert np.array_equal(tr.agent.greedy(obs_batch()), before.agent.greedy(obs_batch()))
    if "ofi_column" in new:  # its columns read by rows of zeros in the branches it widens
        assert sorted(rec["widened"]) == sorted(f"core/branch{d}.{w}_in" for d in (2, 3) for w in ("w_gate", "w_val"))
        assert not any(tr.agent.online["core"][k[len("core/"):]].any() for k in rec["widened"])
        assert rec["at_init"] == ["ofi_column/w"] + (
            [f"affine_post/{k}" for k in "abc"] if "affine_post" in new else [])
    for owner, sub in tr.agent.target.items():  # the target starts as the online network
        for k, v in sub.items():
            assert np.array_equal(v, tr.agent.online[owner][k]), (owner, k)
    doc = json.loads((tmp_path / "warm" / RECORD).read_text())
    assert doc["source"] == str(ckpt) and doc["from_plugins"] == ["center"] and doc["from_step"] == 80


def test_every_tensor_of_the_good_stage_is_transferred_and_training_goes_on(good, tmp_path):
    _, ckpt = good
    tr = Trainer(settings(), plugin_set(["center", "affine_post"]), tmp_path / "warm")
    rec = warm_start(tr, ckpt)
    saved = unflatten("online", load_checkpoint(ckpt)[0])
    assert rec["transferred"] == sum(len(s) for s in saved.values()) and rec["dropped"] == []
    for owner, sub in saved.items():
        for k, v in sub.items():
            assert np.array_equal(tr.agent.online[owner][k], v), (owner, k)
    assert tr.step == 0 and tr.agent.opt.t == 0  # a new run: fresh optimizer and counters
    tr.train()
    assert tr.step == 80 and np.isfinite(tr.history[-1]["loss"])


def test_a_component_that_does_not_start_as_the_identity_changes_the_function(good, tmp_path):
    before, ckpt = good
    tr = Trainer(settings(), plugin_set(["center", "tanh_gate"]), tmp_path / "warm")
    rec = warm_start(tr, ckpt)
    assert rec["function_preserved"] is False and rec["starts_as_identity"] == {"tanh_gate": False}
    assert np.abs(coordinated(tr) - coordinated(before)).max() > 1e-4


def test_removing_a_plugin_is_recorded_as_not_preserving_the_function(good, tmp_path):
    _, ckpt = good
    rec = warm_start(Trainer(settings(), plugin_set([]), tmp_path / "w"), ckpt)
    assert rec["removed_plugins"] == ["center"] and rec["function_preserved"] is False


def test_a_network_of_other_sizes_cannot_be_warm_started(good, tmp_path):
    _, ckpt = good
    tr = Trainer(settings(adv_h=8), plugin_set(["center"]), tmp_path / "w")
    with pytest.raises(CheckpointError, match=r"tensor online/core/branch0\.w_gate has shape \(16, 12\), this "
                                              r"network's is \(16, 8\) \(warm start needs the same network sizes\)"):
        warm_start(tr, ckpt)


def test_branch_rows_follow_the_input_layout():
    tr = Trainer(settings(), plugin_set(["ofi_column"]))
    net = tr.agent.net
    # rows of branch<d>.w_gate_in / w_val_in (one per extra column) the older network also had
    assert list(branch_rows(net, 2, set())) == []
    assert list(branch_rows(net, 2, {"ofi_column"})) == [0]
    assert list(branch_rows(net, 1, {"ofi_column"})) == []  # the OFI column widens branches 2 and 3


def test_a_second_branch_input_plugin_widens_the_rows_of_the_first(tmp_path):
    # a checkpoint with one branch-input plugin, warm-started with a second on the same branch:
    # the first's rows are copied, the second's start at zero
    old = Trainer(settings(), plugin_set(["ofi_column"]))
    new = Trainer(settings(), plugin_set(["ofi_column", "two_columns"]), tmp_path / "w")
    saved = {o: {k: np.asarray(v) for k, v in sub.items()} for o, sub in old.agent.online.items()}
    saved["core"]["branch2.w_gate_in"] = np.full_like(saved["core"]["branch2.w_gate_in"], 0.25)
    rec = transfer(new.agent, unflatten("online", flatten("online", saved)), ["ofi_column"])
    w = new.agent.online["core"]["branch2.w_gate_in"]
    assert "core/branch2.w_gate_in" in rec["widened"] and w.shape[0] == 1 + 2
    assert np.all(w[0] == 0.25) and not w[1:].any()


def test_train_init_from_a_missing_checkpoint_is_one_line_exit_2(tmp_path):
    flags = tmp_path / "f.yaml"
    flags.write_text("version: 1\nstage: 0\nrun: {device: cpu, market: {bars: 2000}}\nplugins: {}\n")
    res = CliRunner().invoke(app, ["train", "--flags", str(flags), "--out", str(tmp_path / "run"), "--quiet",
                                   "--init-from", str(tmp_path / "none.safetensors")])
    assert res.exit_code == 2
    assert res.output.strip() == f"{tmp_path / 'none.safetensors'}: no such checkpoint file"


@pytest.mark.gpu
def test_a_warm_start_on_the_gpu_keeps_the_good_stages_q(good, tmp_path):
    """The CPU-trained good stage's checkpoint into a CUDA agent (fused path, flat parameter buffer):
    coordinated Q within TF32 error of the good stage's at step 0."""
    before, ckpt = good
    s = settings().model_copy(update={"device": "cuda"})
    tr = Trainer(s, plugin_set(["center", "affine_post", "ofi_column"]), tmp_path / "warm")
    rec = warm_start(tr, ckpt)
    assert rec["function_preserved"] and tr.device == "cuda"
    q_good = coordinated(before)
    agent = tr.agent
    out = agent.net.forward(agent.online, agent.xp.asarray(obs_batch()))
    q_warm = agent.qpipe.forward(agent.online, out.probs, agent.z, q_raw=out.q, q_var=out.var).q_coord.get()
    rel = np.linalg.norm(q_warm - q_good) / np.linalg.norm(q_good)
    assert rel < 2e-3, rel
