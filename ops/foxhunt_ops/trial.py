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
    init_from: str | None = None
    """Absolute path of the checkpoint a warm-started trial begins from (``foxhunt train --init-from``)."""
    gpu_memory_fraction: float | None = None
    """Share of its GPU's memory a CUDA trial's CuPy memory pools may hold (``CUPY_GPU_MEMORY_LIMIT``)."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.stage_id, self.seed)

    def command(self, python: str | None = None) -> list[str]:
        cmd = [python or sys.executable, "-m", "foxhunt_ops.child", "train", "--flags", self.flags_file,
               "--out", self.run_dir, "--seed", str(self.seed), "--device", self.device, "--quiet"]
        if self.steps is not None:
            cmd += ["--steps", str(self.steps)]
        if self.init_from is not None:
            cmd += ["--init-from", self.init_from]
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
    gpu: str | None = None
    """The GPU the trial process saw (its ``CUDA_VISIBLE_DEVICES``); ``None`` for a CPU trial."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trial_env(spec: TrialSpec | None = None, gpu: str | None = None) -> dict[str, str]:
    """The trial process's environment: this one's, with one BLAS thread, the parent's pid and, for a
    CUDA trial, its GPU (``gpu`` becomes ``CUDA_VISIBLE_DEVICES``; ``None`` keeps the inherited
    value, which Ray sets for its tasks) and its memory-pool limit."""
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    if spec is not None and spec.device == "cuda":
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if spec.gpu_memory_fraction is not None:
            env["CUPY_GPU_MEMORY_LIMIT"] = f"{100 * spec.gpu_memory_fraction:.4g}%"
    return env


def trial_gpu(spec: TrialSpec, env: dict[str, str]) -> str | None:
    """The GPU a trial launched with ``env`` runs on, as the ledger records it."""
    return env.get("CUDA_VISIBLE_DEVICES", "all visible") if spec.device == "cuda" else None


def launch(spec: TrialSpec, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start the trial's process in a fresh run directory (``env``: :func:`trial_env` by default)."""
    run_dir = Path(spec.run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    with open(run_dir / LOG, "wb") as log:
        return subprocess.Popen(spec.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=trial_env(spec) if env is None else env, start_new_session=True)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])


def _death(exit_code: int | None, log: Path) -> str:
    """Why a trial process ended badly, in one line: the signal or exit code, what it means when it
    is recognisable (the kernel's OOM killer, CuPy's out-of-memory error), and its log's last lines."""
    if exit_code is not None and exit_code < 0:
        why = f"killed by signal {-exit_code}"
        if -exit_code == signal.SIGKILL:
            why += " (SIGKILL: the kernel's out-of-memory killer, or an operator)"
    else:
        why = f"exit {exit_code}"
    tail = _tail(log)
    if "OutOfMemoryError" in tail or "out of memory" in tail.lower():
        why += " (out of GPU memory: see gpu_memory_fraction and workers_per_gpu)"
    return why + (f": {tail}" if tail else "")


def outcome(spec: TrialSpec, exit_code: int | None, wall_s: float, timed_out: bool = False,
            gpu: str | None = None) -> TrialOutcome:
    """What a finished trial process left in its run directory."""
    run_dir = Path(spec.run_dir)
    base = dict(stage_id=spec.stage_id, seed=spec.seed, exit_code=exit_code, wall_s=round(wall_s, 3), gpu=gpu)
    if timed_out:
        return TrialOutcome(status="failed", error=f"timed out after {spec.timeout_s:g} s", **base)
    if exit_code != 0:
        return TrialOutcome(status="failed", error=_death(exit_code, run_dir / LOG), **base)
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
    env = trial_env(spec)
    proc = launch(spec, env)
    try:
        code = proc.wait(timeout=spec.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill(proc)
        code, timed_out = proc.returncode, True
    return outcome(spec, code, time.perf_counter() - t0, timed_out, trial_gpu(spec, env))


def kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill a trial's process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
