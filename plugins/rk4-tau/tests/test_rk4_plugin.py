"""rk4_tau as a plugin: manifest, the hook and the signal it reads, the refused flag file, runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from foxhunt_rk4_tau import plugin
from foxhunt_rk4_tau.options import Rk4TauOptions
from typer.testing import CliRunner

from foxhunt_core.cli import app
from foxhunt_core.config import RunSettings
from foxhunt_core.explore import liquid_exact_step
from foxhunt_core.flags import FlagError, load_flags, parse_flags
from foxhunt_core.hookspecs import RunContext
from foxhunt_core.plugins import discover
from foxhunt_core.signals import Signals
from foxhunt_core.trainer import CHECKPOINT, Trainer

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "flags" / "examples" / "rk4-tau-ab.yaml"


@pytest.fixture(autouse=True)
def _no_env_filter(monkeypatch):
    monkeypatch.delenv("FOXHUNT_PLUGINS", raising=False)


def test_manifest_requires_xlstm_and_consumes_its_norm():
    reg = discover(environ={})
    assert "rk4_tau" not in reg.problems
    m = reg.plugins["rk4_tau"].manifest
    assert m.position == 9 and m.hooks == ("tau_update",)
    assert m.requires.plugins == ("xlstm_context",) and m.consumes == ("context_norm",)
    assert [s.name for s in m.provides] == ["rk4_substeps"]
    assert m.kernels == () and m.parameter_count() == 0
    for name, field in Rk4TauOptions.model_fields.items():
        assert field.description, name


def _ctx(norm: float, **opts) -> RunContext:
    xlstm = discover(environ={}).plugins["xlstm_context"].manifest
    sig = Signals.of_plugins([("xlstm_context", xlstm), ("rk4_tau", plugin.MANIFEST)])
    sig.publish("xlstm_context", "context_norm", norm)
    return RunContext(step=0, total_steps=10, iqn_readiness=0.0, base_entropy_coeff=0.0, entropy_coeff=0.0,
                      options={"rk4_tau": Rk4TauOptions(**opts)}, signals=sig)


MOD = np.array([1.5, 0.3, 1.9, 1.0])
TAU = np.array([0.01, 0.05, 0.3, 1.0])


def test_above_the_threshold_rk4_within_1e_6_of_the_exact_step():
    ctx = _ctx(0.51)
    new = plugin.tau_update(ctx=ctx, mod=MOD.copy(), tau=TAU, dt=1.0)
    assert np.abs(new - liquid_exact_step(MOD, TAU, 1.0)).max() < 1e-6
    assert ctx.signals.snapshot()["rk4_substeps"] == 1000.0  # tau = 0.01: h / tau = 100 in steps of 0.1
    assert ctx.stash["rk4_tau"] == {"rk4_intervals": 1}


@pytest.mark.parametrize("norm", [0.5, 0.0, math.nan])
def test_at_or_below_the_threshold_the_core_takes_its_exact_step(norm):
    ctx = _ctx(norm)
    assert plugin.tau_update(ctx=ctx, mod=MOD.copy(), tau=TAU, dt=0.05) is None
    assert ctx.stash["rk4_tau"] == {"exact_intervals": 1} and ctx.signals.snapshot()["rk4_substeps"] == 0.0


def test_more_substeps_than_allowed_falls_back_to_the_exact_step():
    ctx = _ctx(2.0, max_substeps=999)
    assert plugin.tau_update(ctx=ctx, mod=MOD.copy(), tau=TAU, dt=1.0) is None
    assert ctx.stash["rk4_tau"] == {"capped_intervals": 1}


def test_threshold_is_an_option():
    assert plugin.tau_update(ctx=_ctx(0.8, threshold=1.0), mod=MOD.copy(), tau=TAU, dt=0.05) is None
    assert plugin.tau_update(ctx=_ctx(0.8, threshold=0.7), mod=MOD.copy(), tau=TAU, dt=0.05) is not None


# ----------------------------------------------------------------------------- flag files
def _doc(plugins: dict, **top) -> str:
    return yaml.safe_dump({"version": 1, **top, "plugins": plugins}, sort_keys=False)


def test_a_flag_file_with_rk4_but_without_xlstm_is_refused_in_one_line(tmp_path):
    text = _doc({"q_mean_center": {"enabled": True}, "atom_entropy": {"enabled": True},
                 "rk4_tau": {"enabled": True}}, out_of_order="rk4 alone")
    with pytest.raises(FlagError) as exc:
        parse_flags(text, "rk4.yaml")
    assert exc.value.problems == ["rk4.yaml:9: plugins.rk4_tau.enabled: rk4_tau requires plugin "
                                  "'xlstm_context', which is not enabled"]
    # disabled explicitly, the same; and the command line exits 2 with that line only
    path = tmp_path / "rk4.yaml"
    path.write_text(_doc({"xlstm_context": {"enabled": False}, "rk4_tau": {"enabled": True}}, out_of_order="x"))
    res = CliRunner().invoke(app, ["flags", "validate", str(path)])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [f"{path}:7: plugins.rk4_tau.enabled: rk4_tau requires plugin "
                                       "'xlstm_context', which is not enabled"]


def test_the_example_ab_flag_file_is_valid_and_pairs_with_the_xlstm_one():
    f = load_flags(EXAMPLE)
    assert f.enabled == ["q_mean_center", "atom_entropy", "xlstm_context", "rk4_tau"]
    a = load_flags(ROOT / "flags" / "examples" / "xlstm-context-ab.yaml")
    assert f.raw_run == a.raw_run and {k: f.options[k] for k in a.options} == a.options
    assert f.options["rk4_tau"] == Rk4TauOptions().model_dump(mode="json")


# ----------------------------------------------------------------------------- in a run
def tiny(steps: int) -> RunSettings:
    return RunSettings.model_validate({
        "seed": 3, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 200, "stats_every": 10,
                  "checkpoint_every": 1000, "target_sync_every": 50, "replay_capacity": 5000,
                  "liquid_dt": 1.0},  # h = 1: h / tau up to 100
    })


def _trainer(steps: int, out=None, with_rk4: bool = True, **opts) -> Trainer:
    names = ["xlstm_context", "rk4_tau"] if with_rk4 else ["xlstm_context"]
    return Trainer(tiny(steps), discover(environ={}).plugin_set(names), out, options={"rk4_tau": Rk4TauOptions(**opts)})


def test_in_a_run_rk4_follows_the_context_norm_and_stays_near_the_exact_step():
    """liquid_dt = 1 (h / tau up to 100). Until the first RK4 interval the run is the xLSTM-only
    run; at that interval liquid_mod is within 1e-6 of the exact step's."""
    with_rk4 = _trainer(100)
    with_rk4.train()
    exact = _trainer(100, with_rk4=False)
    exact.train()
    st = with_rk4.ctx.stash["rk4_tau"]
    norms = [r["context_norm"] for r in with_rk4.history]
    assert st["rk4_intervals"] == sum(n > 0.5 for n in norms) > 0
    assert st.get("exact_intervals", 0) == sum(n <= 0.5 for n in norms) > 0  # the first record: norm 0
    first = next(i for i, n in enumerate(norms) if n > 0.5)
    for i in range(first):
        assert with_rk4.history[i]["liquid_mod"] == exact.history[i]["liquid_mod"]
    a, b = np.array(with_rk4.history[first]["liquid_mod"]), np.array(exact.history[first]["liquid_mod"])
    assert 0 < np.abs(a - b).max() < 1e-6
    assert with_rk4.history[first]["rk4_substeps"] >= 1 and with_rk4.history[0]["rk4_substeps"] == 0.0
    assert all(0.1 <= x <= 2.0 for r in with_rk4.history for x in r["liquid_mod"])


def test_a_threshold_never_reached_leaves_the_run_as_without_the_plugin():
    a = _trainer(60, threshold=1e9)
    a.train()
    b = _trainer(60, with_rk4=False)
    b.train()
    assert [r["liquid_mod"] for r in a.history] == [r["liquid_mod"] for r in b.history]
    for o, sub in a.agent.online.items():
        for k, v in sub.items():
            assert np.array_equal(v, b.agent.online[o][k])


def test_resume_through_the_trainer_is_bit_identical(tmp_path):
    straight = _trainer(120, tmp_path / "a")
    straight.train()
    first = _trainer(120, tmp_path / "b")
    first.train(until_step=60)
    del first
    resumed = _trainer(120, tmp_path / "b")
    resumed.load(tmp_path / "b" / CHECKPOINT)
    resumed.train()
    assert resumed.history == straight.history
    assert json.dumps(resumed.ctx.stash, sort_keys=True) == json.dumps(straight.ctx.stash, sort_keys=True)
    assert resumed.ctx.signals.snapshot() == straight.ctx.signals.snapshot()
    assert straight.ctx.stash["rk4_tau"]["rk4_intervals"] > 0


def test_plugins_list_shows_the_signal_wiring():
    res = CliRunner().invoke(app, ["plugins", "list", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["plugins"]}
    assert rows["rk4_tau"]["consumes"] == ["context_norm"] and rows["rk4_tau"]["provides"] == ["rk4_substeps"]
    assert rows["xlstm_context"]["provides"] == ["context_norm", "context_divergence"]
