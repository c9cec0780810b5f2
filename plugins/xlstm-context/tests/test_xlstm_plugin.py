"""xlstm_context as a plugin: manifest, the hook and its signals, the trainer's save and resume,
the example flag file, and that it only observes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from foxhunt_xlstm_context import plugin
from foxhunt_xlstm_context.learner import INPUT_KEYS
from foxhunt_xlstm_context.options import XlstmContextOptions

from foxhunt_core.config import RunSettings
from foxhunt_core.flags import load_flags
from foxhunt_core.hookspecs import RunContext
from foxhunt_core.plugins import PluginSet, discover
from foxhunt_core.signals import Signals
from foxhunt_core.trainer import CHECKPOINT, Trainer

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "flags" / "examples" / "xlstm-context-ab.yaml"


def test_manifest_is_discovered_host_side_with_its_signals():
    reg = discover(environ={})
    assert "xlstm_context" not in reg.problems
    m = reg.plugins["xlstm_context"].manifest
    assert m.position == 8 and m.hooks == ("q_stats",)
    assert m.kernels == () and m.parameter_count() == 0  # host-side only: no kernels, nothing in the network
    assert "host-side only, no kernels" in m.description
    assert [s.name for s in m.provides] == ["context_norm", "context_divergence"] and m.consumes == ()
    for name, field in XlstmContextOptions.model_fields.items():
        assert field.description, name


def _ctx(options=None) -> RunContext:
    return RunContext(step=0, total_steps=100, iqn_readiness=0.0, base_entropy_coeff=0.001, entropy_coeff=0.001,
                      options={} if options is None else {"xlstm_context": options},
                      signals=Signals.of_plugins([("xlstm_context", plugin.MANIFEST)]))


def _record(rng: np.random.Generator) -> dict[str, float]:
    return {"step": 0, **{k: float(v) for k, v in zip(INPUT_KEYS, rng.normal(size=len(INPUT_KEYS)))}}


def test_the_hook_publishes_both_signals_and_keeps_json_state():
    ctx = _ctx()
    rng = np.random.default_rng(0)
    contexts = []
    for _ in range(6):
        plugin.q_stats(ctx=ctx, record=_record(rng))
        contexts.append(np.array(ctx.stash["xlstm_context"]["context"]))
    sig = ctx.signals.snapshot()
    assert sig["context_norm"] == pytest.approx(float(np.linalg.norm(contexts[-1])), rel=1e-15)
    assert sig["context_divergence"] == pytest.approx(float(np.linalg.norm(contexts[-1] - contexts[-2])), rel=1e-15)
    assert sig["context_norm"] > 0 and sig["context_divergence"] > 0
    st = ctx.stash["xlstm_context"]
    assert st["readings"] == 6 and st["updates"] == 5
    assert json.loads(json.dumps(ctx.stash)) == ctx.stash  # checkpointable
    # a record with a NaN statistic (or without one) is skipped and counted; the context stays
    bad = _record(rng)
    bad["q_var"] = math.nan
    plugin.q_stats(ctx=ctx, record=bad)
    plugin.q_stats(ctx=ctx, record={"step": 1, "q_var": 1.0})
    assert ctx.stash["xlstm_context"]["skipped"] == 2 and ctx.stash["xlstm_context"]["readings"] == 6
    assert ctx.signals.snapshot() == {"context_norm": sig["context_norm"], "context_divergence": 0.0}


def test_options_reach_the_learner():
    ctx = _ctx(XlstmContextOptions(context_dim=4, init_seed=3))
    plugin.q_stats(ctx=ctx, record=_record(np.random.default_rng(1)))
    assert len(ctx.stash["xlstm_context"]["context"]) == 4


def tiny(steps: int) -> RunSettings:
    return RunSettings.model_validate({
        "seed": 3, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 200, "stats_every": 10,
                  "checkpoint_every": 1000, "target_sync_every": 50, "replay_capacity": 5000},
    })


def _plugins(names=("xlstm_context",)) -> PluginSet:
    return discover(environ={}).plugin_set(list(names))


def _params(tr: Trainer) -> dict[str, np.ndarray]:
    return {f"{o}/{k}": np.array(v) for o, s in tr.agent.online.items() for k, v in s.items()}


def test_resume_through_the_trainer_is_bit_identical(tmp_path):
    """200 updates straight == 100, checkpoint, a fresh trainer loads it, 100 more: the learner's
    whole state (weights, Adam, memory, normalizer), the signals, the records and the network."""
    s = tiny(200)
    straight = Trainer(s, _plugins(), tmp_path / "a")
    straight.train()
    first = Trainer(s, _plugins(), tmp_path / "b")
    first.train(until_step=100)
    del first
    resumed = Trainer(s, _plugins(), tmp_path / "b")
    resumed.load(tmp_path / "b" / CHECKPOINT)
    assert resumed.step == 100 and resumed.ctx.stash["xlstm_context"]["readings"] == 10
    resumed.train()
    assert json.dumps(resumed.ctx.stash, sort_keys=True) == json.dumps(straight.ctx.stash, sort_keys=True)
    assert resumed.ctx.signals.snapshot() == straight.ctx.signals.snapshot()
    assert resumed.history == straight.history
    a, b = _params(straight), _params(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    st = straight.ctx.stash["xlstm_context"]
    assert st["readings"] == 20 and st["updates"] == 19
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert all(math.isfinite(m["context_norm"]) and "context_divergence" in m for m in metrics)
    assert metrics[-1]["context_norm"] == straight.ctx.signals.snapshot()["context_norm"]


def test_it_only_observes_the_training_is_that_of_a_run_without_it():
    """Without a consumer of its signals, the run's parameters and statistics are bit-identical to
    the run without the plugin: it draws nothing from the run's generators and changes nothing."""
    off = Trainer(tiny(120), _plugins(()), None)
    off.train()
    on = Trainer(tiny(120), _plugins(), None)
    on.train()
    a, b = _params(off), _params(on)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    for r_off, r_on in zip(off.history, on.history, strict=True):
        extra = {k: r_on.pop(k) for k in ("context_norm", "context_divergence")}
        assert r_on == r_off and all(math.isfinite(v) for v in extra.values())
    assert on.ctx.stash["xlstm_context"]["readings"] == 12


def test_the_example_ab_flag_file_is_valid_and_trains():
    f = load_flags(EXAMPLE)
    assert f.enabled == ["q_mean_center", "atom_entropy", "xlstm_context"]
    assert f.out_of_order and "not installed yet" in f.out_of_order
    stage2 = load_flags(ROOT / "flags" / "stage-02-atom-entropy.yaml")
    assert f.raw_run == stage2.raw_run  # paired A/B runs share the run settings
    for name in ("q_mean_center", "atom_entropy"):
        assert f.options[name] == stage2.options[name]
    assert f.options["xlstm_context"] == XlstmContextOptions().model_dump(mode="json")
    tr = Trainer(tiny(20), f.registry.plugin_set(f.enabled), None, options=f.option_models)
    tr.train()
    assert "context_norm" in tr.history[-1]
