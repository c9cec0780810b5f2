"""``foxhunt rollout ...``: run a rollout plan, watch it, promote, abort, roll back, resume, report.

* ``run PLAN [--dir D] [--backend local|ray] [--address A] [--workers N] [--dry-run]``
* ``status DIR [--json]`` · ``resume DIR [...]`` · ``report DIR [--out FILE]``
* ``promote DIR [--reason R]`` · ``abort DIR [--reason R]`` · ``rollback DIR [--to STAGE] [--reason R]``

Exit codes of ``run`` and ``resume``: 0 the rollout completed; 1 it stopped on a gate (rolled
back or aborted) or was ended by an operator; 3 it is paused for an operator's promotion;
2 an operator error (invalid plan, unknown directory, ...), printed one line per problem;
130 interrupted (resume it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from .errors import LedgerError, PlanError

if TYPE_CHECKING:  # the modules themselves are imported by the commands that use them
    from .backends import Backend
    from .plan import Gate, Plan
    from .stages import ResolvedStage
    from .state import RolloutState

rollout_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="Staged rollout of plugins under health gates (plans in ops/plans).")

BACKEND = typer.Option("local", "--backend", help="Where trials run: local (a pool of processes here) or ray.")
ADDRESS = typer.Option(None, "--address", help="Ray cluster address (default: join or start a local one).")
WORKERS = typer.Option(None, "--workers", help="Trials at once (local) / CPUs of a new local Ray instance.")


def _fail(msg: str, code: int = 2) -> NoReturn:
    for line in str(msg).splitlines() or [""]:
        typer.echo(line, err=True)
    raise typer.Exit(code)


def _echo(msg: str) -> None:
    typer.echo(msg, err=True)


def _gate_lines(gates: list[Gate], indent: str) -> list[str]:
    lines = []
    for g in gates:
        bound = " ".join(x for x in (f"min {g.min:g}" if g.min is not None else "",
                                      f"max {g.max:g}" if g.max is not None else "") if x)
        extra = ((f", {g.test} test" if g.test != "none" else "") + (f", alpha {g.alpha:g}" if g.alpha else "")
                 + (", decided by its interval" if g.decide_by == "interval" else "")
                 + (f", failure_limit {g.failure_limit}" if g.failure_limit else ""))
        lines.append(f"{indent}{g.name:<17} {g.metric} ({g.compare}, {g.aggregate}) {bound}{extra}"
                     + ("  [dry run]" if g.dry_run else ""))
    return lines


def _describe(plan_path: str, plan: Plan, stages: list[ResolvedStage], device: str, backend: str) -> str:
    """What ``run --dry-run`` prints: every stage, what it runs or why it is skipped, and the gates."""
    runs = [s for s in stages if not s.skip_reason]
    n = sum(len(s.seeds) for s in runs)
    gpu = f", {plan.spec.workers_per_gpu} trial(s) per GPU" if device != "cpu" else ""
    lines = [f"plan {plan_path}: {plan.spec.name}: {len(stages)} stage(s), {n} trial(s), device {device}{gpu}, "
             f"backend {backend}"]
    same = all(s.gates == runs[0].gates for s in runs) if runs else True
    for s in stages:
        if s.skip_reason:
            lines.append(f"  {s.stage_id:<10} SKIP: {s.skip_reason}")
            continue
        lines.append(f"  {s.stage_id:<10} {s.source}  flags sha256 {(s.flags_sha256 or '-')[:12]}  "
                     f"plugins: {', '.join(s.plugins) or 'none'}  seeds {','.join(map(str, s.seeds))}  "
                     f"{s.steps} updates"
                     + ("  warm start from the good stage" if s.init_from == "good" and s is not runs[0] else "")
                     + ("  (pause for promotion)" if s.pause else ""))
        if not same:
            lines += _gate_lines(s.gates, "      gate ")
    if same and runs:
        lines.append("gates of every stage (comparisons are skipped at the first stage judged):")
        lines += _gate_lines(runs[0].gates, "  ")
    return "\n".join(lines)


def _backend(name: str, workers: int | None, address: str | None, plan: Plan, device: str) -> Backend:
    from .backends import make_backend

    s = plan.spec
    try:
        return make_backend(name, workers=workers or s.workers, address=address, device=device,
                            workers_per_gpu=s.workers_per_gpu, gpu_memory_fraction=s.gpu_memory_fraction)
    except ValueError as exc:
        _fail(str(exc))


def _drive(rollout_dir: Path, be: Backend) -> RolloutState:
    """Drive the rollout with ``be`` (closed at the end), write the report, say how it ended."""
    import sqlite3

    from .controller import Controller
    from .report import write_report

    try:
        st = Controller(rollout_dir, be, _echo).drive()
    except LedgerError as exc:
        _fail(str(exc))
    except (sqlite3.Error, OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        _fail(f"{rollout_dir}: the controller stopped on an error ({why}); the ledger holds what was decided "
              f"before it: `foxhunt rollout status {rollout_dir}`")
    except KeyboardInterrupt:
        _echo(f"interrupted; continue with `foxhunt rollout resume {rollout_dir}`")
        raise typer.Exit(130) from None
    finally:
        be.close()
    report = write_report(rollout_dir)
    _echo(f"rollout {st.status.replace('_', ' ')}; good flag set: {st.good or 'none'}; report {report}")
    return st


def _exit_for(st: RolloutState) -> None:
    code = {"complete": 0, "paused": 3}.get(st.status, 1)
    if code:
        raise typer.Exit(code)


@rollout_app.command("run")
def run(
    plan: Path = typer.Argument(..., help="Rollout plan (YAML), e.g. ops/plans/smoke.yaml."),
    out: Path | None = typer.Option(None, "--dir", help="Rollout directory (default runs/rollout-<plan name>)."),
    backend: str = BACKEND,
    address: str | None = ADDRESS,
    workers: int | None = WORKERS,
    device: str | None = typer.Option(None, "--device", help="auto, cpu or cuda for every trial, in place of the "
                                      "plan's device (kept for resumes)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the plan and print what would run; run nothing."),
) -> None:
    """Validate a plan (refused before anything runs if anything is wrong), then run it stage by stage."""
    from .controller import check_new, start
    from .plan import load_plan
    from .stages import resolve_stages

    if backend not in ("local", "ray"):
        _fail(f"--backend must be local or ray, not {backend!r}")
    if device not in (None, "auto", "cpu", "cuda"):
        _fail(f"--device must be auto, cpu or cuda, not {device!r}")
    try:
        p = load_plan(plan)
        stages = resolve_stages(p)
    except PlanError as exc:
        _fail(str(exc))
    if dry_run:
        typer.echo(_describe(str(plan), p, stages, device or p.spec.device, backend))
        return
    rollout_dir = out or Path("runs") / f"rollout-{p.spec.name}"
    try:
        check_new(rollout_dir)
    except LedgerError as exc:
        _fail(str(exc))
    be = _backend(backend, workers, address, p, device or p.spec.device)
    try:
        start(p, stages, rollout_dir, device).close()
    except LedgerError as exc:
        be.close()
        _fail(str(exc))
    _echo(f"rollout {rollout_dir}: plan {p.spec.name} ({len(stages)} stages), backend {backend}")
    _exit_for(_drive(rollout_dir, be))


@rollout_app.command("resume")
def resume(
    rollout_dir: Path = typer.Argument(..., help="Rollout directory."),
    backend: str = BACKEND,
    address: str | None = ADDRESS,
    workers: int | None = WORKERS,
) -> None:
    """Continue a rollout (after a crash, an interruption or a promotion): finished trials are not rerun."""
    from .controller import stored_device, stored_plan
    from .ledger import Ledger

    try:
        led = Ledger.open(rollout_dir)
        try:
            if not led.initialised:
                raise LedgerError(f"{rollout_dir}: the rollout was never started (run the plan again)")
            plan = stored_plan(led)
            device = stored_device(led, plan)
        finally:
            led.close()
    except (LedgerError, PlanError) as exc:
        _fail(str(exc))
    _exit_for(_drive(rollout_dir, _backend(backend, workers, address, plan, device)))


def _status_doc(rollout_dir: Path) -> dict[str, Any]:
    from .ledger import Ledger
    from .state import locked, walk

    led = Ledger.open(rollout_dir)
    try:
        if not led.initialised:
            raise LedgerError(f"{rollout_dir}: the rollout was never started (its ledger holds no plan)")
        stages, decisions = led.stages(), led.decisions()
        st = walk(stages, decisions)
        rows = []
        for s in stages:
            trials = led.trials(s.stage_id)
            count = {k: sum(1 for t in trials if t["status"] == k) for k in ("done", "failed", "running", "cancelled")}
            d = st.effective.get(s.stage_id)
            rows.append({"stage": s.stage_id, "plugins": s.plugins, "seeds": s.seeds, "trials": count,
                         "decision": None if d is None else {k: d[k] for k in ("action", "actor", "reason")},
                         "skip_reason": s.skip_reason})
        errors = [e for e in led.events() if e["kind"] == "controller_error"]
        return {"dir": str(rollout_dir), "plan": led.meta().get("plan_name"), "status": st.status,
                "controller_running": locked(rollout_dir), "good_stage": st.good, "good_flags_sha256": st.good_sha256,
                "ended_by_operator": st.final, "stages": rows,
                "last_error": errors[-1]["detail"].get("error") if errors else None}
    finally:
        led.close()


@rollout_app.command("status")
def status(
    rollout_dir: Path = typer.Argument(..., help="Rollout directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Where a rollout stands: each stage's trials and decision, and the good flag set."""
    try:
        doc = _status_doc(rollout_dir)
    except LedgerError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    running = " (a controller is running)" if doc["controller_running"] else ""
    if doc["status"] == "pending" and not doc["controller_running"]:
        running = f" (no controller is running: continue with `foxhunt rollout resume {rollout_dir}`)"
    typer.echo(f"rollout {doc['dir']} (plan {doc['plan']}): {doc['status'].replace('_', ' ')}{running}")
    if doc["last_error"] and doc["status"] == "pending":
        typer.echo(f"the last controller stopped on an error: {doc['last_error']}")
    typer.echo(f"good flag set: {doc['good_stage'] or 'none'}"
               + (f" ({rollout_dir}/good-flags.yaml)" if doc["good_stage"] else ""))
    for r in doc["stages"]:
        t = r["trials"]
        counts = ", ".join(f"{v} {k}" for k, v in t.items() if v) or "no trials"
        d = r["decision"]
        what = f"{d['action'].upper()} ({d['actor']}): {d['reason']}" if d else "-"
        typer.echo(f"  {r['stage']:<12} {counts:<24} {what}")


def _verb(fn: Callable[..., str], *args: Any) -> None:
    try:
        typer.echo(fn(*args))
    except LedgerError as exc:
        _fail(str(exc))


@rollout_app.command("promote")
def promote(
    rollout_dir: Path = typer.Argument(..., help="Rollout directory."),
    reason: str | None = typer.Option(None, "--reason", help="Why (required to override a failed gate)."),
) -> None:
    """Promote the stage the rollout stopped at: a paused stage, or (with --reason) one that failed a gate."""
    from .controller import operator_promote

    _verb(operator_promote, rollout_dir, reason)


@rollout_app.command("abort")
def abort(
    rollout_dir: Path = typer.Argument(..., help="Rollout directory."),
    reason: str | None = typer.Option(None, "--reason", help="Why."),
) -> None:
    """End the rollout where it stands; a running controller stops its trials. The good flag set stays."""
    from .controller import operator_abort

    _verb(operator_abort, rollout_dir, reason)


@rollout_app.command("rollback")
def rollback(
    rollout_dir: Path = typer.Argument(..., help="Rollout directory."),
    to: str | None = typer.Option(None, "--to", help="Stage id or number (default: the promoted stage before "
                                                     "the good one)."),
    reason: str | None = typer.Option(None, "--reason", help="Why."),
) -> None:
    """Make an earlier promoted stage the good flag set and end the rollout."""
    from .controller import operator_rollback

    _verb(operator_rollback, rollout_dir, to, reason)


@rollout_app.command("report")
def report(
    rollout_dir: Path = typer.Argument(..., help="Rollout directory."),
    out: Path | None = typer.Option(None, "--out", help="HTML file (default <dir>/report.html)."),
) -> None:
    """Write the rollout's self-contained HTML report."""
    from .report import write_report

    try:
        path = write_report(rollout_dir, out)
    except LedgerError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{exc.filename or out}: cannot write the report ({exc.strerror or exc})")
    typer.echo(str(path))

