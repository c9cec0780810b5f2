"""The rollout controller: run each stage's trials, judge the stage by its gates, promote or roll back.

``start`` validates a plan and every stage's flag file, writes the generated flag files and
records the plan in a new ledger (nothing has run when a plan is refused). ``drive`` then walks
the stages (:func:`foxhunt_ops.state.walk`); for the next stage it

1. runs the trials the ledger does not have as ``done``/``failed`` (a trial left ``running`` by
   a dead controller is rerun from scratch). With ``init_from: good`` the trial for seed ``s``
   starts from the good stage's final checkpoint for seed ``s``
   (``trials/<good>/seed-<s>/checkpoint.safetensors``, :mod:`foxhunt_core.warmstart`); the
   first stage judged has no good stage and starts from scratch;
2. evaluates the stage's gates against the good stage — the last promoted one
   (:mod:`foxhunt_ops.gates`) — and reads the stage's analysis from the verdicts, as Argo
   Rollouts does: Successful, Failed or Inconclusive;
3. records one decision: Successful is ``promote`` (or ``pause`` when the plan asks an operator
   to promote); Failed is ``rollback`` (the good flag set stays the last promoted stage's, and
   the rollout stops) or, at the first judged stage, where there is nothing to roll back to,
   ``abort``; Inconclusive (too few finite seeds, an interval that straddles a bound) is
   ``pause``, with the reason, for an operator to promote, roll back or abort. Stages whose
   plugins are not installed are recorded as ``skip``.

Operators act through the same ledger: ``promote`` accepts a paused stage (or, with a reason,
overrides a failed gate), ``abort`` and ``rollback [--to]`` end the rollout; a running controller
notices an operator's abort or rollback within a second and stops its trials.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foxhunt_core.checkpoint import atomic_write_text
from foxhunt_core.trainer import CHECKPOINT

from . import gates as gates_mod
from .backends import Backend
from .ledger import FINAL, Ledger, LedgerError
from .mandatory import finite_verdict
from .metrics import METRICS, metric_value, num
from .plan import Plan, parse_plan, retries_of
from .stages import ResolvedStage
from .state import RolloutState, controller_lock, walk, write_good_flags
from .trial import TrialOutcome, TrialSpec

Echo = Callable[[str], None]
POLL_S = 0.5
DEVICE_OVERRIDE = "device_override"


def check_new(rollout_dir: Path) -> None:
    """Refuse a directory that already holds a started rollout."""
    rollout_dir = Path(rollout_dir)
    if (rollout_dir / "ledger.sqlite").exists():
        led = Ledger.open(rollout_dir)
        if led.initialised:
            name = led.meta()["plan_name"]
            led.close()
            raise LedgerError(f"{rollout_dir} already holds a rollout of plan {name!r}: resume it with "
                              f"`foxhunt rollout resume {rollout_dir}` or choose another --dir")
        led.close()


def start(plan: Plan, stages: list[ResolvedStage], rollout_dir: Path, device: str | None = None) -> Ledger:
    """Create the rollout directory's ledger for a validated plan and its resolved stages;
    ``device`` (``run --device``) replaces the plan's device for every trial, resumes included."""
    rollout_dir = Path(rollout_dir)
    check_new(rollout_dir)
    rollout_dir.mkdir(parents=True, exist_ok=True)
    with controller_lock(rollout_dir):
        atomic_write_text(rollout_dir / "plan.yaml", plan.text)
        for s in stages:
            if s.flags_text is not None:
                atomic_write_text(rollout_dir / s.flags_file, s.flags_text)
        led = Ledger.open(rollout_dir, create=True)
        led.initialise(plan.path, plan.spec.name, plan.sha256, plan.text, stages,
                       {DEVICE_OVERRIDE: device} if device else None)
    return led


def stored_plan(led: Ledger) -> Plan:
    meta = led.meta()
    return parse_plan(meta["plan_text"], meta["plan_path"])


def stored_device(led: Ledger, plan: Plan) -> str:
    """The device of the rollout's trials: ``run --device``'s, else the plan's."""
    return led.meta().get(DEVICE_OVERRIDE) or plan.spec.device


def _results(led: Ledger, stage_id: str) -> tuple[dict[int, Any], dict[int, str]]:
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    for t in led.trials(stage_id):
        results[t["seed"]] = t["result"] if t["status"] == "done" else None
        if t["status"] == "failed":
            errors[t["seed"]] = t["error"] or "failed"
    return results, errors


class Controller:
    """Drives one rollout directory with one backend."""

    def __init__(self, rollout_dir: Path, backend: Backend, echo: Echo | None = None) -> None:
        self.dir = Path(rollout_dir)
        self.backend = backend
        self.echo = echo or (lambda msg: None)
        self.led = Ledger.open(self.dir)
        if not self.led.initialised:
            raise LedgerError(f"{self.dir}: the rollout was never started (run the plan again)")
        self.plan = stored_plan(self.led)
        self.device = stored_device(self.led, self.plan)
        self.stages = self.led.stages()

    def state(self) -> RolloutState:
        return walk(self.stages, self.led.decisions())

    # ------------------------------------------------------------------ the loop
    def drive(self) -> RolloutState:
        """Run the rollout from where the ledger says it stands until it completes or stops."""
        with controller_lock(self.dir):
            self.led.event("session", backend=self.backend.name, pid=os.getpid())
            self._restore_flag_files()
            self.since = self.led.last_seq()
            first = self.state()
            if first.status != "pending":
                ended = " by an operator" if first.final else ""
                self.echo(f"nothing to run: the rollout is {first.status.replace('_', ' ')}{ended}")
            try:
                self._loop()
            except (sqlite3.Error, OSError, ValueError) as exc:
                # every decision is one transaction: the ledger says where the rollout stands
                with contextlib.suppress(sqlite3.Error):
                    self.led.event("controller_error", error=f"{type(exc).__name__}: {' '.join(str(exc).split())}")
                raise
            st = self.state()
            write_good_flags(self.dir, self.stages, st.good)
            self.led.event("session_end", status=st.status)
        return st

    def _loop(self) -> None:
        while True:
            st = self.state()
            if st.status != "pending" or st.at is None:
                return
            stage = self.stages[st.at]
            if stage.skip_reason:
                self._decide(stage, "skip", stage.skip_reason, st)
                continue
            if not self._run_trials(stage, st.good) or self._operator_stopped():
                return
            self._judge(stage, st)

    def _restore_flag_files(self) -> None:
        for s in self.stages:
            path = self.dir / s.flags_file
            if s.flags_text is not None and (not path.exists() or path.read_text() != s.flags_text):
                atomic_write_text(path, s.flags_text)

    def _operator_stopped(self) -> bool:
        return self.led.operator_stop_since(self.since) is not None

    def _spec(self, stage: ResolvedStage, seed: int, good: str | None) -> TrialSpec:
        warm = None
        if stage.init_from == "good" and good is not None:
            warm = str((self.dir / "trials" / good / f"seed-{seed}" / CHECKPOINT).resolve())
        return TrialSpec(stage_id=stage.stage_id, seed=seed, steps=stage.steps,
                         flags_file=str((self.dir / stage.flags_file).resolve()),
                         flags_sha256=stage.flags_sha256 or "",
                         run_dir=str((self.dir / self._run_dir(stage, seed)).resolve()),
                         device=self.backend.device_for(self.device),
                         timeout_s=self.plan.spec.trial_timeout_s, init_from=warm)

    @staticmethod
    def _run_dir(stage: ResolvedStage, seed: int) -> str:
        return f"trials/{stage.stage_id}/seed-{seed}"

    def _run_trials(self, stage: ResolvedStage, good: str | None) -> bool:
        """Run the stage's unfinished trials (warm-started from ``good`` when the stage says so);
        ``False`` when an operator stopped the rollout."""
        rows = {t["seed"]: t for t in self.led.trials(stage.stage_id)}
        queue = []
        for seed in stage.seeds:
            row = rows.get(seed)
            if row is not None and row["status"] in FINAL:
                continue
            if row is not None:
                self.led.event("rerun", stage=stage.stage_id, seed=seed, was=row["status"],
                               why="unfinished when the last controller stopped; rerun from scratch")
                self.echo(f"{stage.stage_id}: seed {seed} was {row['status']} when the last controller stopped; "
                          "rerunning it from scratch")
            queue.append(self._spec(stage, seed, good))
        if queue:
            start = f"warm start from {good}" if queue[0].init_from else "from scratch"
            self.echo(f"{stage.stage_id}: {len(queue)} trial(s) on {self.backend.name} "
                      f"(plugins: {', '.join(stage.plugins) or 'none'}; {stage.steps} updates; {start})")
        try:
            while queue or self.backend.running():
                while queue and self.backend.running() < self.backend.capacity:
                    spec = queue.pop(0)
                    self.led.trial_started(spec, self._run_dir(stage, spec.seed))
                    self.backend.submit(spec)
                for out in self.backend.wait(POLL_S):
                    if out.status == "failed" and self._retry(stage, out):
                        queue.append(self._spec(stage, out.seed, good))  # its ledger row stays running
                        continue
                    self.led.trial_finished(out)
                    what = f"failed: {out.error}" if out.status == "failed" else "done"
                    where = f", GPU {out.gpu}" if out.gpu is not None else ""
                    self.echo(f"{stage.stage_id}: seed {out.seed} {what} ({out.wall_s:.1f} s{where})")
                if self._operator_stopped():
                    self._cancel("an operator stopped the rollout")
                    return False
        except BaseException:
            self._cancel("the controller was interrupted")
            raise
        return True

    def _retry(self, stage: ResolvedStage, out: TrialOutcome) -> bool:
        """Whether a failed trial runs again: it died without a verdict (not a refusal, exit 2)
        and has retries left (the plan's or the stage's ``retries``, counted in the ledger)."""
        allowed = retries_of(self.plan, stage.index)
        done = sum(1 for e in self.led.events() if e["kind"] == "retry"
                   and (e["detail"].get("stage"), e["detail"].get("seed")) == (stage.stage_id, out.seed))
        if out.exit_code == 2 or done >= allowed:
            return False
        self.led.event("retry", stage=stage.stage_id, seed=out.seed, attempt=done + 2, error=out.error)
        self.echo(f"{stage.stage_id}: seed {out.seed} died ({out.error}); retry {done + 1} of {allowed}")
        return True

    def _cancel(self, why: str) -> None:
        specs = self.backend.cancel()
        if specs:
            self.led.trials_cancelled([s.key for s in specs])
            self.led.event("cancelled", why=why, trials=[list(s.key) for s in specs])

    # ------------------------------------------------------------------ judging
    def results(self, stage_id: str) -> dict[int, Any]:
        return _results(self.led, stage_id)[0]

    def _judge(self, stage: ResolvedStage, st: RolloutState) -> None:
        cur, errors = _results(self.led, stage.stage_id)
        cur = {s: cur.get(s) for s in stage.seeds}
        prev = self.results(st.good) if st.good is not None else None
        verdicts = gates_mod.evaluate(stage.gates, cur, prev, gates_mod.failure_notes(cur, errors))
        verdicts.append(finite_verdict(cur))  # the check no plan can disable
        verdict = gates_mod.analysis(verdicts)
        dry = [v.gate for v in verdicts if v.dry_run]
        dry_txt = f"; dry-run gates (reported, never blocking): {', '.join(dry)}" if dry else ""
        if verdict == "Failed":
            fails = "; ".join(f"{v.gate}: {v.reason}" for v in verdicts if v.blocking)
            if st.good is None:
                action = "abort"
                reason = (f"Failed: {stage.stage_id} fails blocking gate(s) with no good stage to roll back to "
                          f"(it is the first stage judged): {fails}")
            else:
                action = "rollback"
                reason = f"Failed: {stage.stage_id} fails blocking gate(s); rolled back to {st.good}: {fails}"
        elif verdict == "Inconclusive":
            action = "pause"
            why = "; ".join(f"{v.gate}: {v.reason}" for v in verdicts if v.pending)
            reason = (f"Inconclusive: {stage.stage_id} cannot be judged: {why}; an operator decides "
                      f"(`foxhunt rollout promote DIR` to accept it, `rollback` or `abort` to refuse it){dry_txt}")
        elif stage.pause:
            action = "pause"
            reason = ("Successful: all blocking gates passed; the plan asks for an operator's promotion "
                      f"(`foxhunt rollout promote DIR`){dry_txt}")
        else:
            action = "promote"
            passed = ", ".join(v.gate for v in verdicts if not v.dry_run and v.verdict == "pass")
            reason = f"Successful: all blocking gates passed ({passed}){dry_txt}"
        metrics = {m: {str(s): num(metric_value(r, m)) for s, r in cur.items()} for m in METRICS}
        self._decide(stage, action, reason, st, gates=[v.to_json() for v in verdicts], metrics=metrics)

    def _decide(self, stage: ResolvedStage, action: str, reason: str, st: RolloutState, **kw: Any) -> None:
        good = (stage.stage_id, stage.flags_sha256) if action == "promote" else (st.good, st.good_sha256)
        self.led.decide(stage.stage_id, action, "controller", reason, flags_sha256=stage.flags_sha256,
                        good=good, **kw)
        write_good_flags(self.dir, self.stages, good[0])
        self.echo(f"{stage.stage_id}: {action.upper()}: {reason}")


# ----------------------------------------------------------------------------- operators
def _find(stages: list[ResolvedStage], ref: str) -> ResolvedStage:
    for s in stages:
        if s.stage_id == ref or (ref.isdigit() and s.number == int(ref)):
            return s
    raise LedgerError(f"no stage {ref!r} in this rollout (stages: {', '.join(s.stage_id for s in stages)})")


def operator_promote(rollout_dir: Path, reason: str | None) -> str:
    """Promote the stage the rollout stopped at (paused, or, with a reason, failed); returns a message."""
    led = Ledger.open(rollout_dir)
    stages = led.stages()
    with controller_lock(rollout_dir):
        st = walk(stages, led.decisions())
        if st.final:
            raise LedgerError(f"the rollout was ended by an operator's {st.last['action'] if st.last else '?'}; "
                              "start a new rollout")
        if st.status == "complete" or st.at is None:
            raise LedgerError("the rollout is complete: nothing to promote")
        stage = stages[st.at]
        if st.status == "pending":
            raise LedgerError(f"{stage.stage_id} has not been judged yet: resume the rollout "
                              f"(foxhunt rollout resume {rollout_dir})")
        if st.status != "paused" and not reason:
            raise LedgerError(f"{stage.stage_id} failed a blocking gate ({st.status}); promoting it anyway "
                              "overrides the gate and needs --reason")
        why = reason or "promoted by an operator after the pause"
        led.decide(stage.stage_id, "promote", "operator", why, flags_sha256=stage.flags_sha256,
                   good=(stage.stage_id, stage.flags_sha256))
        write_good_flags(rollout_dir, stages, stage.stage_id)
    return f"{stage.stage_id} promoted; continue with `foxhunt rollout resume {rollout_dir}`"


def operator_abort(rollout_dir: Path, reason: str | None) -> str:
    """End the rollout; the good flag set stays what it is (a running controller stops)."""
    led = Ledger.open(rollout_dir)
    stages = led.stages()
    st = walk(stages, led.decisions())
    if st.final or st.status == "complete":
        raise LedgerError(f"the rollout is already {st.status.replace('_', ' ')}: nothing to abort")
    stage = stages[st.at if st.at is not None else -1]
    led.decide(stage.stage_id, "abort", "operator", reason or "aborted by an operator",
               flags_sha256=stage.flags_sha256, good=(st.good, st.good_sha256))
    write_good_flags(rollout_dir, stages, st.good)
    return f"rollout aborted at {stage.stage_id}; good flag set: {st.good or 'none'}"


def operator_rollback(rollout_dir: Path, to: str | None, reason: str | None) -> str:
    """Make an earlier promoted stage the good one and end the rollout (a running controller stops)."""
    led = Ledger.open(rollout_dir)
    stages = led.stages()
    decisions = led.decisions()
    st = walk(stages, decisions)
    promoted = {d["stage_id"] for d in decisions if d["action"] == "promote"}
    good_idx = next((s.index for s in stages if s.stage_id == st.good), len(stages))
    earlier = [s for s in stages if s.stage_id in promoted and s.index < good_idx]
    if to is None:
        if not earlier:
            raise LedgerError(f"no promoted stage before the good one ({st.good or 'none'}) to roll back to")
        target = earlier[-1]
    else:
        target = _find(stages, to)
        if target not in earlier:
            choices = ", ".join(s.stage_id for s in earlier) or "none"
            raise LedgerError(f"{target.stage_id} is not a promoted stage before the good one "
                              f"({st.good or 'none'}): choose one of {choices}")
    at = stages[st.at].stage_id if st.at is not None else (st.good or target.stage_id)
    led.decide(at, "rollback", "operator", reason or f"rolled back by an operator to {target.stage_id}",
               flags_sha256=target.flags_sha256, good=(target.stage_id, target.flags_sha256))
    write_good_flags(rollout_dir, stages, target.stage_id)
    return f"rolled back to {target.stage_id}; good flag set: {rollout_dir}/good-flags.yaml"
