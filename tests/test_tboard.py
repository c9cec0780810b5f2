"""TensorBoard event files: written into the run directory, readable, with every tag family;
`foxhunt runs compare` prints eval tables side by side."""

import json
import struct
from pathlib import Path

import pytest
from test_cli import foxhunt
from test_trainer import tiny

from foxhunt_core.plugins import PluginSet
from foxhunt_core.tboard import Board
from foxhunt_core.trainer import Trainer


def read_events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run's event files: tag -> [(step, value)] (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        raw = path.read_bytes()
        i = 0
        while i < len(raw):
            (n,) = struct.unpack("<Q", raw[i:i + 8])
            ev = event_pb2.Event.FromString(raw[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((ev.step, v.simple_value))
    return out


def test_the_event_file_is_opened_at_the_first_record(tmp_path):
    """A command refused before it records anything must leave the run directory as it was."""
    board = Board(tmp_path, True)
    assert list(tmp_path.iterdir()) == []
    board.evaluation("val", {"policy": {"total_return": 0.5}}, 10)
    board.close()
    board.evaluation("val", {"policy": {"total_return": 0.7}}, 20)  # after close: nothing
    assert read_events(tmp_path) == {"val/policy/total_return": [(10, 0.5)]}


def test_a_run_writes_losses_stats_signals_evaluations_and_throughput(tmp_path):
    s = tiny(steps=60)
    s = s.model_copy(update={"select": s.select.model_copy(update={"every": 20})})
    tr = Trainer(s, PluginSet(), tmp_path / "r")
    tr.train()
    table = tr.evaluate("test")
    tr.board.close()
    ev = read_events(tmp_path / "r")
    assert [st for st, _ in ev["stats/loss"]] == [20, 40, 60]
    assert {"stats/q_var", "stats/atom_utilization", "stats/raw_q_drift", "stats/entropy_coeff",
            "stats/liquid_mod/0"} <= set(ev)
    assert [st for st, _ in ev["throughput/updates_per_second"]] == [40, 60]
    assert [st for st, _ in ev["val/policy/total_return"]] == [20, 40, 60]
    assert ev["test/linear/sharpe"] == [(60, pytest.approx(table["linear"]["sharpe"], rel=1e-6))]
    loss = {r["step"]: r["loss"] for r in tr.history}
    assert [v for _, v in ev["stats/loss"]] == pytest.approx([loss[20], loss[40], loss[60]], rel=1e-6)


def test_tensorboard_can_be_switched_off(tmp_path):
    s = tiny(steps=20)
    s = s.model_copy(update={"train": s.train.model_copy(update={"tensorboard": False})})
    tr = Trainer(s, PluginSet(), tmp_path / "r")
    tr.train()
    assert not list((tmp_path / "r").glob("events.out.tfevents.*"))


def _report(policy_return, label):
    pol = {"total_return": policy_return, "sharpe": 1.0, "volatility": 0.1, "max_drawdown": 0.0, "turnover": 2.0}
    return {"split": "test", "bars": 100, "step": 5, "interval": {"label": label, "bars_per_year": 252.0},
            "selection": {"verdict": "no edge found on validation: x"}, "policies": {"policy": pol, "flat": pol}}


def test_runs_compare_prints_tables_side_by_side(tmp_path):
    for name, ret, label in (("a", 0.125, "1d"), ("b", -0.25, "1h")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval.json").write_text(json.dumps(_report(ret, label)))
    res = foxhunt("runs", "compare", tmp_path / "a", tmp_path / "b")
    row = next(line for line in res.stdout.splitlines() if "policy total_return" in line)
    assert "+0.1250" in row and "-0.2500" in row and row.index("+0.1250") < row.index("-0.2500")
    assert any("1d" in line and "1h" in line for line in res.stdout.splitlines())
    res = foxhunt("runs", "compare", tmp_path / "a", tmp_path / "none", check=False)
    assert res.returncode == 2 and "none" in res.stderr and len(res.stderr.strip().splitlines()) == 1
