"""Training runs end to end: resume identity, hook points, checkpoints of plugin parameters."""

import json

import numpy as np
import pytest

from foxhunt_core.checkpoint import CheckpointError, load_checkpoint
from foxhunt_core.config import RunSettings
from foxhunt_core.plugins import LoadedPlugin, PluginSet
from foxhunt_core.trainer import CHECKPOINT, Trainer
from hook_plugins import RawSelectStage, all_plugins


def tiny(steps=200, **train):
    return RunSettings.model_validate({
        "seed": 3,
        "device": "cpu",
        "market": {"bars": 4000},
        "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 200, "stats_every": 20,
                  "checkpoint_every": 1000, "target_sync_every": 50, "replay_capacity": 5000, **train},
    })


def plugin_set(names=None):
    plugs = all_plugins()
    names = list(plugs) if names is None else names
    return PluginSet([LoadedPlugin(n, plugs[n].POSITION, plugs[n]) for n in names])


def _params(trainer):
    return {f"{o}/{k}": np.array(v) for o, s in trainer.agent.online.items() for k, v in s.items()}


@pytest.mark.parametrize(
    "with_plugins, steps", [(False, 2000), (True, 240)], ids=["core-2k", "all-hooks"]
)
def test_resume_is_bit_identical(tmp_path, with_plugins, steps):
    """``steps`` updates in one go == ``steps/2`` + resume from the checkpoint + ``steps/2``."""
    s = tiny(steps=steps)
    ps = plugin_set if with_plugins else (lambda: PluginSet())
    straight = Trainer(s, ps(), tmp_path / "a")
    straight.train()

    first = Trainer(s, ps(), tmp_path / "b")
    first.train(until_step=steps // 2)  # writes a checkpoint there
    del first
    resumed = Trainer(s, ps(), tmp_path / "b")
    resumed.load(tmp_path / "b" / CHECKPOINT)
    assert resumed.step == steps // 2
    resumed.train()

    a, b = _params(straight), _params(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert straight.history == resumed.history
    if with_plugins:
        assert straight.ctx.stash == resumed.ctx.stash


def test_every_hook_point_is_used(tmp_path):
    RawSelectStage.calls = 0
    tr = Trainer(tiny(steps=100), plugin_set(), tmp_path / "run")
    owners = tr.agent.stage_owners
    assert owners["pre_attention"] == ["center"]
    assert owners["post_attention"] == ["affine_post"]
    assert owners["gate_activation"] == ["tanh_gate"]
    assert owners["action_select"] == ["raw_select"]
    assert owners["branch_inputs"] == ["ofi_column"]
    assert tr.agent.net.in_width[2] == tr.agent.net.in_width[0] + 1  # widened by the OFI column
    before = {o: {k: np.array(v) for k, v in s.items()} for o, s in tr.agent.online.items()}
    tr.train()
    # differentiable stages' own parameters are trained ...
    for owner in ("affine_post", "tanh_gate", "ofi_column"):
        assert any(not np.array_equal(before[owner][k], v) for k, v in tr.agent.online[owner].items()), owner
    # ... and saved under the plugin's name
    tensors, meta = load_checkpoint(tmp_path / "run" / CHECKPOINT)
    for owner in ("affine_post", "tanh_gate", "ofi_column"):
        for k, v in tr.agent.online[owner].items():
            assert np.array_equal(tensors[f"online/{owner}/{k}"], v)
    # interval hooks ran once per stats interval, in order
    st = tr.ctx.stash["interval"]
    assert st["steps"] == list(range(20, 101, 20))
    assert st["tau_calls"] == 5
    assert tr.ctx.entropy_coeff == pytest.approx(0.123)
    assert all(r["entropy_coeff"] == pytest.approx(0.123) for r in tr.history)
    assert RawSelectStage.calls > 0  # collection chose actions through action_select
    calls = RawSelectStage.calls
    tr.evaluate("val")
    assert RawSelectStage.calls > calls  # and so did evaluation


def test_pre_attention_does_not_hide_raw_drift(tmp_path):
    """The raw Q statistics are read before pre-attention stages (centering)."""
    tr = Trainer(tiny(steps=60), plugin_set(["center"]), None)
    tr.train()
    rec = tr.history[-1]
    assert abs(rec["raw_q_mean"]) > 1e-3
    assert abs(rec["q_mean"]) < 0.05 * abs(rec["raw_q_mean"])  # centred (attention mixes a little)


def test_checkpoint_of_other_settings_is_refused(tmp_path):
    tr = Trainer(tiny(steps=20), PluginSet(), tmp_path / "r")
    tr.train()
    other = Trainer(tiny(steps=20, gamma=0.5), PluginSet(), None)
    with pytest.raises(CheckpointError, match="settings in the checkpoint differ"):
        other.load(tmp_path / "r" / CHECKPOINT)
    with pytest.raises(CheckpointError, match="plugins"):
        Trainer(tiny(steps=20), plugin_set(["center"]), None).load(tmp_path / "r" / CHECKPOINT)


def test_checkpoint_from_before_a_new_setting_loads(tmp_path):
    """A setting added since a checkpoint was written compares at its default."""
    from foxhunt_core.checkpoint import load_checkpoint, save_checkpoint

    tr = Trainer(tiny(steps=20), PluginSet(), tmp_path / "r")
    tr.train()
    path = tmp_path / "r" / CHECKPOINT
    tensors, meta = load_checkpoint(path)
    del meta["settings"]["train"]["gemm_autotune"]
    save_checkpoint(path, tensors, meta)
    again = Trainer(tiny(steps=20), PluginSet(), None)
    again.load(path)
    assert again.step == tr.step


def test_run_directory_contents(tmp_path):
    tr = Trainer(tiny(steps=40), PluginSet(), tmp_path / "r")
    tr.train()
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert [m["step"] for m in metrics] == [20, 40]
    for key in ("raw_q_drift", "atom_utilization", "atom_entropy", "avg_max_q", "q_gap_3", "loss"):
        assert all(np.isfinite(m[key]) for m in metrics), key
    log = [json.loads(x) for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert {"train_start", "q_stats", "checkpoint", "train_end"} <= {e["event"] for e in log}


@pytest.mark.parametrize("record,problem", [
    ([], "not a GEMM tuning record"),
    ({"format": 1, "device": "H200", "plans": []}, "needs a 'device' string and a 'plans' table"),
    ({"format": 1, "device": "H200", "plans": {"c77 NN m256": "abc"}}, "is not a 64-byte algorithm in hex"),
])
def test_a_malformed_gemm_tuning_record_is_refused_by_name(record, problem):
    from foxhunt_core.gpu import cublaslt

    with pytest.raises(ValueError, match=f"run/gemm_tuning.json: .*{problem}"):
        cublaslt.load_tuning_record(record, "run/gemm_tuning.json")


def test_steady_rate_leaves_out_the_first_update(tmp_path, monkeypatch):
    """The first update's one-off work (on the GPU: graph capture, compilation, GEMM tuning) counts
    in ``updates_per_second`` but not in ``steady_updates_per_second``."""
    import time

    tr = Trainer(tiny(steps=40), PluginSet(), None)
    update, ends = tr._update, []

    def slow_first():
        if not ends:
            time.sleep(1.0)
        out = update()
        ends.append(time.perf_counter())
        return out

    monkeypatch.setattr(tr, "_update", slow_first)
    tr.train()
    assert tr.step == 40 and len(ends) == 40 and tr.train_seconds > 1.0
    # the rate over a window that leaves out the first second (the sleep) ...
    assert tr.steady_updates_per_second > 39 / (tr.train_seconds - 1.0)
    # ... and holds the 39 later updates: at most their own rate, between the first update's end and the last's
    own = 39 / (ends[-1] - ends[0])
    assert 0.5 * own < tr.steady_updates_per_second <= own


def test_steady_rate_needs_a_second_update():
    tr = Trainer(tiny(steps=1), PluginSet(), None)
    tr.train()
    assert tr.step == 1 and tr.steady_updates_per_second is None
