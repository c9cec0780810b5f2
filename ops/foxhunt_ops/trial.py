"""One trial: one ``foxhunt train`` process for (stage flag file, seed, steps) in its own run directory.

A trial runs as a child process of whoever launches it (the controller, or a Ray worker), so a
trial that crashes is a failed trial, not a dead controller. The child

* starts from an empty run directory (a leftover one, from a trial that was running when the
  controller died, is removed first: a rerun starts from scratch);
* writes its stdout and stderr to ``trial.log`` there;
* runs in its own session (a Ctrl-C at the controller's terminal reaches the controller only)
  and, on Linux, is killed by the kernel when its parent dies (:mod:`foxhunt_ops.child`): a
  controller killed with ``kill -9`` leaves no trial behind to write into a directory that a
  resumed controller reuses;
* gets ``OPENBLAS_NUM_THREADS=1`` unless the environment sets it (one BLAS thread per trial is
  both fastest for the small GEMMs and what makes CPU trials reproducible across machines).

:func:`outcome` reads what the finished process left (:func:`foxhunt_ops.metrics.read_result`)
and checks that the run used the flag file the ledger expects.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .child import PARENT_ENV
from .metrics import read_result

LOG = "trial.log"


@dataclass(frozen=True)
class TrialSpec:
    """Everything a worker needs to run one trial (plain data: it travels to Ray workers)."""

    stage_id: str
    seed: int
    steps: int | None
    flags_file: str
    """Absolute path of the generated flag file."""
    flags_sha256: str
    run_dir: str
    """Absolute path of the trial's run directory."""
    device: str
    timeout_s: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.stage_id, self.seed)

    def command(self, python: str | None = None) -> list[str]:
        cmd = [python or sys.executable, "-m", "foxhunt_ops.child", "train", "--flags", self.flags_file,
               "--out", self.run_dir, "--seed", str(self.seed), "--device", self.device, "--quiet"]
        if self.steps is not None:
            cmd += ["--steps", str(self.steps)]
        return cmd


@dataclass
class TrialOutcome:
    """How a trial ended: ``done`` (with a result) or ``failed`` (with an error)."""

    stage_id: str
    seed: int
    status: str
    exit_code: int | None
    wall_s: float
    result: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trial_env() -> dict[str, str]:
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launch(spec: TrialSpec) -> subprocess.Popen[bytes]:
    """Start the trial's process in a fresh run directory."""
    run_dir = Path(spec.run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    with open(run_dir / LOG, "wb") as log:
        return subprocess.Popen(spec.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=trial_env(), start_new_session=True)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])


def outcome(spec: TrialSpec, exit_code: int | None, wall_s: float, timed_out: bool = False) -> TrialOutcome:
    """What a finished trial process left in its run directory."""
    run_dir = Path(spec.run_dir)
    base = dict(stage_id=spec.stage_id, seed=spec.seed, exit_code=exit_code, wall_s=round(wall_s, 3))
    if timed_out:
        return TrialOutcome(status="failed", error=f"timed out after {spec.timeout_s:g} s", **base)
    if exit_code != 0:
        why = f"killed by signal {-exit_code}" if exit_code is not None and exit_code < 0 else f"exit {exit_code}"
        tail = _tail(run_dir / LOG)
        return TrialOutcome(status="failed", error=f"{why}" + (f": {tail}" if tail else ""), **base)
    try:
        result = read_result(run_dir)
    except (ValueError, KeyError) as exc:
        return TrialOutcome(status="failed", error=str(exc), **base)
    if result.get("flags_sha256") != spec.flags_sha256:
        return TrialOutcome(status="failed", error=f"the run used flags {result.get('flags_sha256')}, "
                            f"not the stage's {spec.flags_sha256}", **base)
    return TrialOutcome(status="done", result=result, **base)


def run_blocking(spec: TrialSpec) -> TrialOutcome:
    """Launch, wait (with the spec's timeout) and read the outcome: what a Ray task runs."""
    t0 = time.perf_counter()
    proc = launch(spec)
    try:
        code = proc.wait(timeout=spec.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill(proc)
        code, timed_out = proc.returncode, True
    return outcome(spec, code, time.perf_counter() - t0, timed_out)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill a trial's process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
