"""Real rollouts on tiny budgets: the smoke plan (local and Ray, warm-started stages), a NaN stage
rolled back, a controller killed with SIGKILL during a warm-started stage and resumed, an
inconclusive stage paused and promoted, a trial killed from outside, the value-bias gate both ways,
and the operator's verbs."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rollout_helpers import FLAGS, SMOKE, TINY_RUN, invoke

from foxhunt_ops.ledger import Ledger

pytestmark = pytest.mark.slow


def _snapshot(rollout: Path) -> dict:
    led = Ledger.open(rollout)
    try:
        return led.snapshot()
    finally:
        led.close()


def test_the_smoke_plan_promotes_stages_0_to_2_and_writes_the_ledger_and_the_report(smoke_local):
    out, res = smoke_local
    assert res.exit_code == 0, res.output
    led = Ledger.open(out)
    decisions, trials, stages = led.decisions(), led.trials(), led.stages()
    led.close()
    assert [(d["stage_id"], d["action"], d["actor"]) for d in decisions] == [
        (f"stage-{i}", "promote", "controller") for i in range(3)]
    assert len(trials) == 9 and {t["status"] for t in trials} == {"done"}
    for s in stages:  # the hash the ledger keeps is the hash of the file the trials ran
        text = (out / s.flags_file).read_text()
        assert hashlib.sha256(text.encode()).hexdigest() == s.flags_sha256
        assert all(t["result"]["flags_sha256"] == s.flags_sha256 for t in trials if t["stage_id"] == s.stage_id)
    assert all(d["reason"].startswith("Successful: all blocking gates passed (value_bias, finite")
               for d in decisions)
    first = decisions[0]["gates"]
    assert {g["gate"]: g["verdict"] for g in first}["eval_return"] == "skip"  # nothing to compare stage 0 with
    second = {g["gate"]: g for g in decisions[1]["gates"]}
    assert second["eval_return"]["p_value"] is not None and second["eval_return"]["test"] == "sign"
    lo, hi = second["eval_return"]["interval"]  # decided by the interval of the paired difference
    assert second["eval_return"]["decide_by"] == "interval" and -0.02 <= lo <= hi
    assert second["value_bias"]["verdict"] == "pass" and second["raw_q_drift"]["dry_run"]
    by_stage = {}
    for t in trials:
        by_stage.setdefault(t["stage_id"], []).append(t["result"]["warm_start"])
    assert by_stage["stage-0"] == [None] * 3  # the first stage judged starts from scratch
    for sid, before in (("stage-1", []), ("stage-2", ["q_mean_center"])):  # warm from the last promoted stage
        assert [(w["from_plugins"], w["from_step"], w["dropped"]) for w in by_stage[sid]] == [(before, 100, [])] * 3
    assert [w["function_preserved"] for w in by_stage["stage-1"]] == [False] * 3  # centring changes Q
    assert [w["function_preserved"] for w in by_stage["stage-2"]] == [True] * 3  # atom_entropy: the loss only
    assert (out / "good-flags.yaml").read_text() == stages[2].flags_text
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4  # overview + one figure per stage
    assert "http://" not in html and "https://" not in html and "<script" not in html
    for word in ("The story", "Decisions", "stage-2", "eval_return", "raw_q_drift", "value_bias", "Final flag set",
                 "atom_entropy", "Successful", "Warm start (3 of 3 trials)", "interval"):
        assert word in html


def test_the_ray_backend_gives_the_same_ledger(smoke_local, ray_session, tmp_path: Path):
    out = tmp_path / "ray"
    res = invoke("rollout", "run", SMOKE, "--dir", out, "--backend", "ray")
    assert res.exit_code == 0, res.output
    assert _snapshot(out) == _snapshot(smoke_local[0])
    led = Ledger.open(out)
    assert [e["detail"]["backend"] for e in led.events() if e["kind"] == "session"] == ["ray"]
    led.close()


def _count(db: Path, sql: str) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return int(con.execute(sql).fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _trial_processes(rollout: Path) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and str(rollout) in (p / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; trials die with their parent on Linux")
def test_a_controller_killed_mid_stage_resumes_to_the_same_ledger(smoke_local, tmp_path: Path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-c", "from foxhunt_core.cli import app; app(prog_name='foxhunt')",
           "rollout", "run", str(SMOKE), "--dir", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = out / "ledger.sqlite"
    deadline = time.monotonic() + 120
    try:  # kill it once stage 1 has a finished trial and another one running
        while time.monotonic() < deadline and proc.poll() is None:
            if (_count(db, "SELECT COUNT(*) FROM trials WHERE status = 'done'") >= 4
                    and _count(db, "SELECT COUNT(*) FROM trials WHERE status = 'running'") >= 1):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the controller finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    for _ in range(100):  # its trial processes die with it
        if not _trial_processes(out):
            break
        time.sleep(0.05)
    assert _trial_processes(out) == []
    led = Ledger.open(out)
    before = {(t["stage_id"], t["seed"]): t for t in led.trials()}
    unfinished = [k for k, t in before.items() if t["status"] == "running"]
    assert unfinished and len(led.decisions()) < 3
    led.close()

    res = invoke("rollout", "resume", out, "--workers", "2")
    assert res.exit_code == 0, res.output
    assert _snapshot(out) == _snapshot(smoke_local[0])
    led = Ledger.open(out)
    after = {(t["stage_id"], t["seed"]): t for t in led.trials()}
    reruns = [(e["detail"]["stage"], e["detail"]["seed"]) for e in led.events() if e["kind"] == "rerun"]
    led.close()
    assert sorted(reruns) == sorted(unfinished)
    assert {k[0] for k in unfinished} == {"stage-1"}  # killed during the warm-started stage
    assert all(after[k]["result"]["warm_start"]["from_plugins"] == [] for k in unfinished)
    for key, t in before.items():  # finished trials were not run again
        if t["status"] == "done":
            assert after[key]["started_at"] == t["started_at"] and after[key]["finished_at"] == t["finished_at"]


def _nan_plan(tmp_path: Path) -> Path:
    (tmp_path / "nan.yaml").write_text(
        "version: 1\nstage: 3\nout_of_order: fault injection for the rollout tests\n"
        "plugins:\n  q_mean_center: {enabled: true}\n  nan_probe: {enabled: true}\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\nname: nan\ndevice: cpu\nseeds: [0, 1]\nsteps: 50\n" + TINY_RUN
                    + "gates:\n  - {name: raw_q_drift, dry_run: true}\n  - {name: atom_utilization, dry_run: true}\n"
                    + "  - {name: throughput, dry_run: true}\n"
                    + f"stages:\n  - flags: {FLAGS / 'stage-01-q-mean-center.yaml'}\n    pause: true\n"
                    + "  - flags: nan.yaml\n    id: nan-stage\n")
    return plan


def test_a_stage_that_produces_nan_is_rolled_back_to_the_last_good_flag_set(with_nan_plugin, tmp_path: Path):
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", _nan_plan(tmp_path), "--dir", out, "--workers", "2")
    assert res.exit_code == 3, res.output  # paused after stage 1 for an operator
    assert "paused" in invoke("rollout", "status", out).output
    res = invoke("rollout", "promote", out)
    assert res.exit_code == 0 and "stage-1 promoted" in res.output
    res = invoke("rollout", "resume", out)
    assert res.exit_code == 1, res.output
    led = Ledger.open(out)
    d = led.decisions()[-1]
    stages = led.stages()
    led.close()
    assert (d["stage_id"], d["action"], d["actor"], d["good_stage_id"]) == ("nan-stage", "rollback", "controller",
                                                                            "stage-1")
    assert d["reason"].startswith("Failed: nan-stage fails blocking gate(s); rolled back to stage-1: ")
    assert "finite: max of non_finite" in d["reason"]
    assert "non-finite in metrics (" in d["reason"] and "; params (core/attn." in d["reason"]
    finite = next(g for g in d["gates"] if g["gate"] == "finite")
    assert finite["verdict"] == "fail" and finite["value"] > 0
    assert (out / "good-flags.yaml").read_text() == stages[0].flags_text
    status = invoke("rollout", "status", out, "--json").output
    assert '"status": "rolled_back"' in status and '"good_stage": "stage-1"' in status
    assert "nan-stage" in (out / "report.html").read_text()
    # an operator may override the verdict only with a reason
    res = invoke("rollout", "promote", out)
    assert res.exit_code == 2 and "needs --reason" in res.output


def test_operator_rollback_and_abort_end_the_rollout(smoke_local, tmp_path: Path):
    out = tmp_path / "copy"
    shutil.copytree(smoke_local[0], out)
    res = invoke("rollout", "rollback", out, "--to", "0", "--reason", "stage 1 misbehaves in production")
    assert res.exit_code == 0, res.output
    led = Ledger.open(out)
    d = led.decisions()[-1]
    stages = led.stages()
    led.close()
    assert (d["action"], d["actor"], d["good_stage_id"]) == ("rollback", "operator", "stage-0")
    assert (out / "good-flags.yaml").read_text() == stages[0].flags_text
    assert invoke("rollout", "resume", out).exit_code == 1  # ended: nothing runs
    res = invoke("rollout", "rollback", out)
    assert res.exit_code == 2 and "no promoted stage before the good one (stage-0)" in res.output
    res = invoke("rollout", "abort", out)
    assert res.exit_code == 2 and "already rolled back" in res.output


def test_a_failing_baseline_aborts_and_an_operator_can_accept_it(tmp_path: Path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\nname: baseline\ndevice: cpu\nseeds: [0, 1]\nsteps: 50\n" + TINY_RUN
                    + "gates:\n  - {name: raw_q_drift, min: -0.001, max: 0.001, dry_run: false}\n"
                    + "  - {name: atom_utilization, dry_run: true}\n  - {name: throughput, dry_run: true}\n"
                    + "stages:\n  - stage: 0\n  - stage: 1\n    gates: [{name: raw_q_drift, dry_run: true}]\n")
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", plan, "--dir", out)
    assert res.exit_code == 1, res.output
    led = Ledger.open(out)
    (d,) = led.decisions()
    led.close()
    assert (d["stage_id"], d["action"], d["good_stage_id"]) == ("stage-0", "abort", None)
    assert "no good stage to roll back to (it is the first stage judged): raw_q_drift: all of" in d["reason"]
    assert not (out / "good-flags.yaml").exists()
    assert invoke("rollout", "promote", out, "--reason", "the baseline's drift is the known problem").exit_code == 0
    res = invoke("rollout", "resume", out)
    assert res.exit_code == 0, res.output
    led = Ledger.open(out)
    assert [(d["stage_id"], d["action"], d["actor"]) for d in led.decisions()] == [
        ("stage-0", "abort", "controller"), ("stage-0", "promote", "operator"), ("stage-1", "promote", "controller")]
    led.close()


def test_an_inconclusive_stage_pauses_and_promote_continues_it(tmp_path: Path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\nname: inconclusive\ndevice: cpu\nseeds: [0, 1]\nsteps: 50\ninit_from: good\n"
                    + TINY_RUN + "gates:\n  - {name: atom_utilization, dry_run: true}\n"
                    + "  - {name: throughput, dry_run: true}\n"
                    + "stages:\n  - stage: 0\n  - stage: 1\n    gates: [{name: value_bias, min_seeds: 3}]\n"
                    + "  - stage: 2\n")
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", plan, "--dir", out, "--workers", "2")
    assert res.exit_code == 3, res.output  # paused for an operator
    led = Ledger.open(out)
    d = led.decisions()[-1]
    led.close()
    assert (d["stage_id"], d["action"], d["actor"], d["good_stage_id"]) == ("stage-1", "pause", "controller", "stage-0")
    assert d["reason"].startswith("Inconclusive: stage-1 cannot be judged: value_bias: too few finite seeds: 2 of 2 "
                                  "(the gate needs 3)")
    assert {g["gate"]: g["verdict"] for g in d["gates"]}["value_bias"] == "inconclusive"
    assert "Inconclusive" in (out / "report.html").read_text()
    assert invoke("rollout", "resume", out).exit_code == 3  # still waiting: nothing runs
    res = invoke("rollout", "promote", out)
    assert res.exit_code == 0 and "stage-1 promoted" in res.output
    res = invoke("rollout", "resume", out)
    assert res.exit_code == 0, res.output
    led = Ledger.open(out)
    rows = [(d["stage_id"], d["action"], d["actor"]) for d in led.decisions()]
    warm = [t["result"]["warm_start"]["from_plugins"] for t in led.trials("stage-2")]
    led.close()
    assert rows == [("stage-0", "promote", "controller"), ("stage-1", "pause", "controller"),
                    ("stage-1", "promote", "operator"), ("stage-2", "promote", "controller")]
    assert warm == [["q_mean_center"]] * 2  # stage 2 began from the stage the operator promoted


def _kill_plan(tmp_path: Path, policy: str) -> Path:
    (tmp_path / "kill.yaml").write_text(
        "version: 1\nstage: 1\nout_of_order: fault injection for the rollout tests\n"
        "plugins:\n  q_mean_center: {enabled: true}\n  kill_probe: {enabled: true, seed: 1}\n")
    plan = tmp_path / f"plan-{policy}.yaml"
    plan.write_text(f"version: 1\nname: kill\ndevice: cpu\nseeds: [0, 1, 2]\nsteps: 50\non_no_data: {policy}\n"
                    + TINY_RUN + "gates:\n  - {name: atom_utilization, dry_run: true}\n"
                    + "  - {name: throughput, dry_run: true}\n"
                    + f"stages:\n  - flags: {FLAGS / 'stage-00-baseline.yaml'}\n  - flags: kill.yaml\n    id: killed\n")
    return plan


@pytest.mark.parametrize("policy", ["fail", "ignore"])
def test_a_trial_killed_from_outside_is_failed_and_judged_by_the_no_data_policy(with_nan_plugin, tmp_path: Path,
                                                                               policy: str):
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", _kill_plan(tmp_path, policy), "--dir", out, "--workers", "2")
    led = Ledger.open(out)
    trials = {(t["stage_id"], t["seed"]): t for t in led.trials()}
    d = led.decisions()[-1]
    led.close()
    dead = trials[("killed", 1)]
    assert (dead["status"], dead["exit_code"]) == ("failed", -9)
    assert dead["error"].startswith("killed by signal 9 (SIGKILL: the kernel's out-of-memory killer, or an operator)")
    assert all(trials[("killed", s)]["status"] == "done" for s in (0, 2))  # nothing else is lost
    vb = next(g for g in d["gates"] if g["gate"] == "value_bias")
    if policy == "fail":
        assert res.exit_code == 1 and (d["stage_id"], d["action"]) == ("killed", "rollback")
        assert vb["verdict"] == "fail" and "1 (no data: trial failed: killed by signal 9" in vb["reason"]
    else:
        assert res.exit_code == 0 and (d["stage_id"], d["action"]) == ("killed", "promote")
        assert vb["verdict"] == "pass" and "left out: 1 (no data: trial failed: killed by signal 9" in vb["reason"]
        assert sorted(vb["per_seed"]) == ["0", "1", "2"] and vb["per_seed"]["1"] is None
    assert "killed by signal 9" in (out / "report.html").read_text()


UNSTABLE = """\
version: 1
stage: 0
run:
  net: {v_min: -100.0, v_max: 100.0}
  train: {gamma: 0.99, lr: 0.01, target_sync_every: 1}
plugins: {}
"""


def test_the_value_bias_gate_passes_the_baseline_and_fails_a_bootstrap_that_runs_away(tmp_path: Path):
    """Stage 0 as shipped, then the same network with no target network (synced every update), gamma
    0.99, lr 0.01 and a support of +-100 that lets Q run: its estimates leave the returns behind."""
    (tmp_path / "unstable.yaml").write_text(UNSTABLE)
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\nname: bias\ndevice: cpu\nseeds: [1, 2]\nsteps: 600\n"
                    + TINY_RUN.replace("bars: 2000", "bars: 6000").replace("replay_capacity: 2000",
                                                                           "replay_capacity: 4000")
                    + "gates:\n  - {name: throughput, dry_run: true}\n"
                    + f"stages:\n  - flags: {FLAGS / 'stage-00-baseline.yaml'}\n  - flags: unstable.yaml\n"
                    + "    id: unstable\n")
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", plan, "--dir", out, "--workers", "2")
    assert res.exit_code == 1, res.output
    led = Ledger.open(out)
    base, bad = led.decisions()
    led.close()
    gates = {g["gate"]: g for g in base["gates"]}
    assert base["action"] == "promote" and gates["value_bias"]["verdict"] == "pass"
    assert all(abs(v) < 0.5 for v in gates["value_bias"]["per_seed"].values())
    # raw drift is reported in dry run only: a healthy baseline's raw Q moves as it learns (here by about the
    # gate's whole +-0.1 band in 600 updates), so it is not a health signal on its own
    drift = gates["raw_q_drift"]
    assert drift["dry_run"] and set(drift["per_seed"]) == {"1", "2"}
    assert all(0.02 < abs(v) < 1.0 for v in drift["per_seed"].values()), drift
    gates = {g["gate"]: g for g in bad["gates"]}
    assert (bad["stage_id"], bad["action"], bad["good_stage_id"]) == ("unstable", "rollback", "stage-0")
    assert gates["value_bias"]["verdict"] == "fail" and "value_bias: all of value_bias" in bad["reason"]
    assert all(v > 0.5 for v in gates["value_bias"]["per_seed"].values())  # every seed: Q above the realized returns
    assert max(gates["value_bias"]["per_seed"].values()) > 2.0  # and in one of them far above
