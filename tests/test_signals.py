"""Typed signals between interval plugins: declarations, the load-time wiring check, the channel,
records, metrics.json and checkpoints."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from signal_plugins import signal_intruder, signal_sink, signal_source
from typer.testing import CliRunner

import foxhunt_core.plugins as plugins_mod
from foxhunt_core.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from foxhunt_core.cli import app
from foxhunt_core.config import RunSettings
from foxhunt_core.flags import FlagError, parse_flags
from foxhunt_core.plugins import ENTRY_POINT_GROUP, LoadedPlugin, PluginSet, discover
from foxhunt_core.signals import SignalError, Signals, SignalSpec
from foxhunt_core.trainer import CHECKPOINT, Trainer


def ep(name: str) -> EntryPoint:
    return EntryPoint(name, f"signal_plugins:{name}", ENTRY_POINT_GROUP)


def with_entry_points(monkeypatch, *names: str) -> None:
    real = plugins_mod.entry_points
    monkeypatch.setattr(plugins_mod, "entry_points", lambda group: list(real(group=group)) + [ep(n) for n in names])
    monkeypatch.delenv("FOXHUNT_PLUGINS", raising=False)


def _doc(plugins: dict) -> str:
    return yaml.safe_dump({"version": 1, "out_of_order": "signal study", "plugins": plugins}, sort_keys=False)


# ----------------------------------------------------------------------------- declarations
def test_signal_names_and_values_are_validated_by_the_manifest_model():
    with pytest.raises(ValidationError, match="should match pattern"):
        SignalSpec(name="Context-Norm", description="x")
    with pytest.raises(ValidationError, match="finite number"):
        SignalSpec(name="pulse", description="x", initial=float("nan"))
    with pytest.raises(ValidationError, match="at least 1 character"):
        SignalSpec(name="pulse", description="")


@pytest.mark.parametrize("name, reason", [
    ("signal_reserved", "signal name 'loss' is a key the core writes into Q-statistics records"),
    ("signal_greedy", "consumes signal 'pulse', which it provides itself"),
])
def test_discovery_refuses_bad_declarations(name, reason):
    reg = discover(eps=[ep(name)], environ={})
    assert name not in reg.plugins
    assert reason in reg.problems[name]


def test_one_provider_per_signal():
    reg = discover(eps=[ep("signal_source"), ep("signal_twin")], environ={})
    assert reg.plugins == {}
    assert reg.problems["signal_source"] == ["signal 'pulse' is also provided by ['signal_twin']"]
    assert reg.problems["signal_twin"] == ["signal 'pulse' is also provided by ['signal_source']"]


# ----------------------------------------------------------------------------- the wiring check
def test_a_wired_flag_file_is_accepted(monkeypatch):
    with_entry_points(monkeypatch, "signal_source", "signal_sink")
    f = parse_flags(_doc({"signal_source": {"enabled": True}, "signal_sink": {"enabled": True}}), "w.yaml")
    assert f.enabled == ["signal_source", "signal_sink"]


@pytest.mark.parametrize("plugins, installed, line, message", [
    ({"signal_sink": {"enabled": True}}, ("signal_source", "signal_sink"), 5,
     "signal_sink consumes signal 'pulse' provided by signal_source, which is not enabled"),
    ({"signal_sink": {"enabled": True}}, ("signal_sink",), 5,
     "signal_sink consumes signal 'pulse', which no installed plugin provides"),
    ({"signal_early_sink": {"enabled": True}, "signal_source": {"enabled": True}},
     ("signal_source", "signal_early_sink"), 5,
     "signal_early_sink consumes signal 'pulse' provided by signal_source, which comes after it in the rollout "
     "order (a provider must run first)"),
])
def test_a_consumer_without_an_earlier_provider_is_refused_in_one_line(monkeypatch, plugins, installed, line,
                                                                       message):
    with_entry_points(monkeypatch, *installed)
    consumer = next(iter(plugins))
    with pytest.raises(FlagError) as exc:
        parse_flags(_doc(plugins), "w.yaml")
    assert exc.value.problems == [f"w.yaml:{line}: plugins.{consumer}.enabled: {message}"]


def test_the_cli_refuses_the_file_with_exit_2(monkeypatch, tmp_path):
    with_entry_points(monkeypatch, "signal_source", "signal_sink")
    path = tmp_path / "sink.yaml"
    path.write_text(_doc({"signal_sink": {"enabled": True}}))
    res = CliRunner().invoke(app, ["flags", "validate", str(path)])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [f"{path}:5: plugins.signal_sink.enabled: signal_sink consumes signal "
                                       "'pulse' provided by signal_source, which is not enabled"]


def test_a_plugin_set_without_the_provider_is_refused():
    with pytest.raises(SignalError, match="signal_sink consumes signal 'pulse'"):
        Signals.of_plugins([("signal_sink", signal_sink.m)])
    with pytest.raises(SignalError, match="comes after it"):
        Signals.of_plugins([("signal_sink", signal_sink.m), ("signal_source", signal_source.m)])


# ----------------------------------------------------------------------------- the channel
def test_the_channel_holds_floats_for_declared_names_only():
    sig = Signals.of_plugins([("signal_source", signal_source.m), ("signal_sink", signal_sink.m),
                              ("signal_intruder", signal_intruder.m)])
    assert sig.read("signal_sink", "pulse") == -1.0  # the declared initial value
    sig.publish("signal_source", "pulse", np.float32(0.25))
    assert sig.read("signal_sink", "pulse") == 0.25 and type(sig.snapshot()["pulse"]) is float
    with pytest.raises(SignalError, match="'signal_intruder' published signal 'pulse', which its manifest does "
                                          "not provide \\(it is provided by signal_source\\)"):
        sig.publish("signal_intruder", "pulse", 1.0)
    with pytest.raises(SignalError, match="does not consume"):
        sig.read("signal_intruder", "pulse")
    with pytest.raises(SignalError, match="as str, not a real number"):
        sig.publish("signal_source", "pulse", "0.3")
    with pytest.raises(SignalError, match="as bool"):
        sig.publish("signal_source", "pulse", True)
    with pytest.raises(SignalError, match="clashes"):
        sig.write_into({"pulse": 1.0})
    with pytest.raises(SignalError, match="'other' is provided by none"):
        sig.load({"other": 1.0})


# ----------------------------------------------------------------------------- in a run
def tiny(steps: int) -> RunSettings:
    return RunSettings.model_validate({
        "seed": 5, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 200, "stats_every": 20,
                  "checkpoint_every": 1000, "target_sync_every": 50, "replay_capacity": 5000},
    })


def wired() -> PluginSet:
    return PluginSet([LoadedPlugin(p.m.name, p.m.position, p, p.m) for p in (signal_source, signal_sink)])


def test_signals_reach_the_consumer_every_record_and_metrics_json(tmp_path):
    tr = Trainer(tiny(80), wired(), tmp_path / "r")
    tr.train()
    want = [r["q_var"] + r["step"] / 1000.0 for r in tr.history]
    assert [r["pulse"] for r in tr.history] == want  # written into every record
    assert tr.ctx.stash["signal_sink"]["read"] == want  # read in the same interval's tau_update
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert [m["pulse"] for m in metrics] == want
    _, meta = load_checkpoint(tmp_path / "r" / CHECKPOINT)
    assert meta["ctx"]["signals"] == {"pulse": want[-1]}
    # the consumer really used it: liquid_mod differs from the core's exact step without it
    plain = Trainer(tiny(20), PluginSet([LoadedPlugin("signal_source", 12, signal_source, signal_source.m)]), None)
    plain.train()
    assert tr.history[0]["liquid_mod"] != plain.history[0]["liquid_mod"]


def test_resume_restores_the_signal_values(tmp_path):
    """Two halves with a resume between them end exactly where one straight run does, and the
    first interval after the resume reads the saved value (not the initial one)."""
    s = tiny(80)
    straight = Trainer(s, wired(), tmp_path / "a")
    straight.train()
    first = Trainer(s, wired(), tmp_path / "b")
    first.train(until_step=40)
    del first
    resumed = Trainer(s, wired(), tmp_path / "b")
    resumed.load(tmp_path / "b" / CHECKPOINT)
    assert resumed.ctx.signals.snapshot() == {"pulse": straight.history[1]["pulse"]}
    resumed.train()
    assert resumed.history == straight.history
    assert resumed.ctx.signals.snapshot() == straight.ctx.signals.snapshot()
    for o, sub in straight.agent.online.items():
        for k, v in sub.items():
            assert np.array_equal(v, resumed.agent.online[o][k]), (o, k)


def test_a_checkpoint_with_a_foreign_signal_is_refused(tmp_path):
    tr = Trainer(tiny(20), wired(), tmp_path / "r")
    tr.train()
    path = tmp_path / "r" / CHECKPOINT
    tensors, meta = load_checkpoint(path)
    meta["ctx"]["signals"]["other"] = 1.0
    save_checkpoint(path, tensors, meta)
    with pytest.raises(CheckpointError, match="signal 'other' is provided by none of this run's plugins"):
        Trainer(tiny(20), wired(), None).load(path)


def test_an_undeclared_publication_stops_the_run():
    ps = PluginSet([LoadedPlugin("signal_intruder", 17, signal_intruder, signal_intruder.m)])
    with pytest.raises(SignalError, match="which its manifest does not provide"):
        Trainer(tiny(20), ps, None).train()

