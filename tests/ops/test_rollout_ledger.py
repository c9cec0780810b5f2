"""The ledger's write rules and the rollout state derived from it (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from foxhunt_ops.controller import operator_abort, operator_promote, operator_rollback
from foxhunt_ops.ledger import Ledger, LedgerError
from foxhunt_ops.stages import ResolvedStage
from foxhunt_ops.state import controller_lock, locked, walk
from foxhunt_ops.trial import TrialOutcome, TrialSpec, outcome


def _stage(i: int, skip: str | None = None) -> ResolvedStage:
    text = None if skip else f"version: 1\nstage: {i}\n"
    return ResolvedStage(index=i, stage_id=f"stage-{i}", number=i, source=f"stage {i}", source_sha256=None,
                         flags_text=text, flags_sha256=None if skip else f"h{i}", plugins=[], seeds=[0, 1], steps=10,
                         skip_reason=skip)


@pytest.fixture()
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger.open(tmp_path, create=True)
    led.initialise("p.yaml", "p", "sha", "text", [_stage(0), _stage(1), _stage(2), _stage(3, "not installed")])
    yield led
    led.close()


def _spec(stage: str, seed: int) -> TrialSpec:
    return TrialSpec(stage_id=stage, seed=seed, steps=10, flags_file="f", flags_sha256="h0", run_dir="d", device="cpu")


def test_a_finished_trial_row_is_never_rewritten(ledger: Ledger):
    ledger.trial_started(_spec("stage-0", 0), "trials/stage-0/seed-0")
    ledger.trial_finished(TrialOutcome("stage-0", 0, "done", 0, 1.0, result={"final": {}}))
    ledger.trial_started(_spec("stage-0", 0), "elsewhere")
    ledger.trial_finished(TrialOutcome("stage-0", 0, "failed", 1, 1.0, error="late"))
    (row,) = ledger.trials("stage-0")
    assert (row["status"], row["run_dir"], row["error"]) == ("done", "trials/stage-0/seed-0", None)


def test_a_running_row_is_restarted_in_place(ledger: Ledger):
    ledger.trial_started(_spec("stage-0", 1), "trials/stage-0/seed-1")
    ledger.trials_cancelled([("stage-0", 1)])
    assert ledger.trials()[0]["status"] == "cancelled"
    ledger.trial_started(_spec("stage-0", 1), "trials/stage-0/seed-1")
    assert [t["status"] for t in ledger.trials()] == ["running"]


def test_one_controller_decision_per_stage(ledger: Ledger):
    ledger.decide("stage-0", "promote", "controller", "ok", good=("stage-0", "h0"))
    with pytest.raises(LedgerError, match="already has a controller decision"):
        ledger.decide("stage-0", "rollback", "controller", "again")
    ledger.decide("stage-0", "promote", "operator", "operators may add decisions", good=("stage-0", "h0"))
    assert len(ledger.decisions()) == 2


def test_the_walk_and_the_operator_verbs(ledger: Ledger, tmp_path: Path):
    stages = ledger.stages()
    assert walk(stages, ledger.decisions()).status == "pending"
    ledger.decide("stage-0", "promote", "controller", "ok", good=("stage-0", "h0"))
    ledger.decide("stage-1", "pause", "controller", "wait", good=("stage-0", "h0"))
    st = walk(stages, ledger.decisions())
    assert (st.status, st.at, st.good) == ("paused", 1, "stage-0")
    assert "stage-1 promoted" in operator_promote(tmp_path, None)
    ledger.decide("stage-2", "rollback", "controller", "gate", good=("stage-1", "h1"))
    st = walk(stages, ledger.decisions())
    assert (st.status, st.at, st.good, st.final) == ("rolled_back", 2, "stage-1", False)
    with pytest.raises(LedgerError, match="needs --reason"):
        operator_promote(tmp_path, None)
    operator_promote(tmp_path, "known flaky gate")
    ledger.decide("stage-3", "skip", "controller", "not installed", good=("stage-2", "h2"))
    st = walk(stages, ledger.decisions())
    assert (st.status, st.good) == ("complete", "stage-2")
    with pytest.raises(LedgerError, match="stage-3 is not a promoted stage before the good one"):
        operator_rollback(tmp_path, "3", None)
    operator_rollback(tmp_path, None, None)  # to the promoted stage before stage-2
    st = walk(stages, ledger.decisions())
    assert (st.status, st.good, st.final) == ("rolled_back", "stage-1", True)
    assert (tmp_path / "good-flags.yaml").read_text() == stages[1].flags_text
    with pytest.raises(LedgerError, match="ended by an operator"):
        operator_promote(tmp_path, "no")


def test_abort_from_a_pause(ledger: Ledger, tmp_path: Path):
    ledger.decide("stage-0", "pause", "controller", "wait")
    assert "aborted at stage-0; good flag set: none" in operator_abort(tmp_path, "not today")
    st = walk(ledger.stages(), ledger.decisions())
    assert (st.status, st.final, st.good) == ("aborted", True, None)


def test_the_lock_admits_one_controller(tmp_path: Path):
    with controller_lock(tmp_path):
        assert locked(tmp_path)
        with pytest.raises(LedgerError, match="a controller is running"), controller_lock(tmp_path):
            pass
    assert not locked(tmp_path)


def test_a_trial_that_exits_non_zero_is_failed_with_the_end_of_its_log(tmp_path: Path):
    (tmp_path / "trial.log").write_text("step 1\n\nValueError: boom\n")
    spec = TrialSpec(stage_id="s", seed=0, steps=1, flags_file="f", flags_sha256="h", run_dir=str(tmp_path),
                     device="cpu")
    out = outcome(spec, 2, 0.5)
    assert (out.status, out.error) == ("failed", "exit 2: step 1 | ValueError: boom")
    assert outcome(spec, -9, 0.5).error.startswith("killed by signal 9")
    assert outcome(spec, 0, 0.5).error.startswith(f"{tmp_path}: incomplete run directory")
