"""Rollouts that meet trouble: a trial that dies, NaN with every gate disabled, a tampered ledger,
a ledger write that fails. Real controllers on tiny budgets (one stage, one or two seeds)."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from rollout_helpers import TINY_RUN, invoke

from foxhunt_ops import backends
from foxhunt_ops.ledger import Ledger

pytestmark = pytest.mark.slow

QUIET_GATES = ("gates:\n  - {name: raw_q_drift, dry_run: true}\n  - {name: atom_utilization, dry_run: true}\n"
               "  - {name: throughput, dry_run: true}\n")


def _plan(tmp_path: Path, extra: str = "", seeds: str = "[0]", gates: str = QUIET_GATES,
          stages: str = "stages:\n  - stage: 0\n") -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"version: 1\nname: safety\ndevice: cpu\nseeds: {seeds}\nsteps: 20\n{extra}" + TINY_RUN
                    + gates + stages)
    return plan


def _dying_first(monkeypatch, code_or_signal: int) -> list:
    """The first launch of every trial is a process that dies (a signal) or exits with a code."""
    real, seen = backends.launch, []

    def launch(spec, env=None):
        if spec.key in seen:
            return real(spec, env)
        seen.append(spec.key)
        run_dir = Path(spec.run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        body = (f"import os; os.kill(os.getpid(), {code_or_signal})" if code_or_signal > 0
                else f"raise SystemExit({-code_or_signal})")
        return subprocess.Popen([sys.executable, "-c", body], env=env)

    monkeypatch.setattr(backends, "launch", launch)
    return seen


def _ledger(out: Path) -> tuple[list, list, list]:
    led = Ledger.open(out)
    try:
        return led.decisions(), led.trials(), led.events()
    finally:
        led.close()


def test_a_trial_that_dies_once_is_retried_and_the_stage_promoted(tmp_path, monkeypatch):
    """A killed trial used to abort its stage with no way to retry it."""
    seen = _dying_first(monkeypatch, int(signal.SIGKILL))
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", _plan(tmp_path), "--dir", out)
    assert res.exit_code == 0, res.output
    decisions, trials, events = _ledger(out)
    assert seen == [("stage-0", 0)]
    assert [(d["stage_id"], d["action"]) for d in decisions] == [("stage-0", "promote")]
    assert [t["status"] for t in trials] == ["done"]
    retries = [e["detail"] for e in events if e["kind"] == "retry"]
    assert len(retries) == 1 and retries[0]["seed"] == 0 and "killed by signal 9" in retries[0]["error"]
    assert "finite_mandatory" in [g["gate"] for g in decisions[0]["gates"]]


def test_without_retries_a_dead_trial_fails_its_stage(tmp_path, monkeypatch):
    _dying_first(monkeypatch, int(signal.SIGKILL))
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", _plan(tmp_path, "retries: 0\n"), "--dir", out)
    assert res.exit_code == 1, res.output
    decisions, trials, events = _ledger(out)
    assert [t["status"] for t in trials] == ["failed"] and not [e for e in events if e["kind"] == "retry"]
    assert decisions[0]["action"] == "abort"
    assert "killed by signal 9" in decisions[0]["reason"] and "finite_mandatory: no trial of the stage finished" \
        in decisions[0]["reason"]


def test_a_trial_that_refused_its_input_is_not_retried(tmp_path, monkeypatch):
    _dying_first(monkeypatch, -2)  # exit 2: foxhunt train refused its flags; a rerun would too
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", _plan(tmp_path), "--dir", out)
    assert res.exit_code == 1, res.output
    decisions, trials, events = _ledger(out)
    assert [(t["status"], t["exit_code"]) for t in trials] == [("failed", 2)]
    assert not [e for e in events if e["kind"] == "retry"]


def test_a_nan_stage_is_not_promoted_with_every_gate_disabled(with_nan_plugin, tmp_path):
    """The plan's gates can all be switched off; the non-finite check cannot."""
    (tmp_path / "nan.yaml").write_text(
        "version: 1\nstage: 3\nout_of_order: fault injection for the rollout tests\n"
        "plugins:\n  q_mean_center: {enabled: true}\n  nan_probe: {enabled: true}\n")
    off = "gates:\n" + "".join(f"  - {{name: {g}, enabled: false}}\n" for g in
                               ("value_bias", "raw_q_drift", "atom_utilization", "finite", "eval_return", "throughput"))
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", _plan(tmp_path, gates=off, stages="stages:\n  - flags: nan.yaml\n"), "--dir", out)
    assert res.exit_code == 1, res.output
    decisions, trials, _ = _ledger(out)
    assert [t["status"] for t in trials] == ["done"]
    (d,) = decisions
    assert d["action"] == "abort" and d["good_stage_id"] is None
    assert [g["gate"] for g in d["gates"]] == ["finite_mandatory"]
    assert "finite_mandatory: NaN/Inf in the results (mandatory, no plan can disable it): seed 0:" in d["reason"]
    assert not (out / "good-flags.yaml").exists()


def test_a_stage_id_edited_in_the_ledger_is_refused(tmp_path):
    """An id edited to ../../../x used to make resume write outside the rollout directory."""
    from foxhunt_ops.controller import start
    from foxhunt_ops.plan import load_plan
    from foxhunt_ops.stages import resolve_stages

    out = tmp_path / "a" / "b" / "rollout"
    plan = load_plan(_plan(tmp_path))
    start(plan, resolve_stages(plan), out).close()
    db = sqlite3.connect(out / "ledger.sqlite")
    (spec,) = db.execute("SELECT spec FROM stages").fetchone()
    doc = json.loads(spec)
    doc["stage_id"] = "../../../x"
    db.execute("PRAGMA foreign_keys=OFF")
    db.execute("UPDATE stages SET stage_id = ?, spec = ?", ("../../../x", json.dumps(doc)))
    db.commit()
    db.close()
    def files() -> list[Path]:  # SQLite's WAL side files and the lock come and go with every open
        return sorted(p for p in tmp_path.rglob("*") if not p.name.endswith(("-shm", "-wal", ".lock")))

    before = files()
    for verb in ("resume", "status"):
        res = invoke("rollout", verb, out)
        assert res.exit_code == 2, res.output
        (line,) = res.stderr.splitlines()
        assert "stages row '../../../x': stage id '../../../x' is not a valid id" in line
    assert files() == before and not (tmp_path / "x").exists()


def test_a_failed_ledger_write_leaves_a_state_status_reports(tmp_path, monkeypatch):
    """A crash while recording a decision used to leave `status` saying complete."""
    out = tmp_path / "rollout"

    def broken(self, *a, **k):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Ledger, "decide", broken)
    res = invoke("rollout", "run", _plan(tmp_path), "--dir", out)
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()[-1:]
    assert "the controller stopped on an error (OperationalError: disk I/O error)" in line
    monkeypatch.undo()
    res = invoke("rollout", "status", out)
    assert res.exit_code == 0
    assert "pending (no controller is running" in res.output
    assert "the last controller stopped on an error: OperationalError: disk I/O error" in res.output
    _, trials, _ = _ledger(out)
    done = trials[0]["finished_at"]
    res = invoke("rollout", "resume", out)
    assert res.exit_code == 0, res.output
    decisions, trials, _ = _ledger(out)
    assert [d["action"] for d in decisions] == ["promote"] and trials[0]["finished_at"] == done  # not rerun
