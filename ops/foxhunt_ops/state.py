"""Where a rollout stands, derived from its ledger alone; the controller's lock; the good flag set.

The state is a walk over the stages in plan order, reading each stage's *effective* decision
(its latest one): ``promote`` and ``skip`` move on; a controller's ``rollback``, ``abort`` or
``pause`` stops the walk there (an operator may ``promote`` over it and resume); a stage without
a decision is the next one to run. An operator's ``abort`` or ``rollback`` as the latest decision
of all ends the rollout for good. The *good* flag set is the one the latest decision names: the
last promoted stage, or the target of an operator's rollback.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt_core.checkpoint import atomic_write_text

from .ledger import LedgerError
from .stages import ResolvedStage

LOCK = "controller.lock"
GOOD_FLAGS = "good-flags.yaml"
STOPS = {"rollback": "rolled_back", "abort": "aborted", "pause": "paused"}


@dataclass
class RolloutState:
    """A rollout's position: ``status`` is pending, paused, rolled_back, aborted or complete."""

    status: str
    at: int | None
    """Index of the stage to run next (pending) or where the walk stopped; ``None`` when complete."""
    good: str | None
    good_sha256: str | None
    final: bool = False
    """Ended by an operator's abort or rollback: nothing resumes it."""
    effective: dict[str, dict[str, Any]] = field(default_factory=dict)
    last: dict[str, Any] | None = None


def walk(stages: list[ResolvedStage], decisions: list[dict[str, Any]]) -> RolloutState:
    """The state of a rollout with these stages and decisions (in sequence order)."""
    eff = {d["stage_id"]: d for d in decisions}
    last = decisions[-1] if decisions else None
    good = last["good_stage_id"] if last else None
    good_sha = last["good_flags_sha256"] if last else None
    index = {s.stage_id: s.index for s in stages}
    if last is not None and last["actor"] == "operator" and last["action"] in ("abort", "rollback"):
        return RolloutState(STOPS[last["action"]], index.get(last["stage_id"]), good, good_sha, True, eff, last)
    for s in stages:
        d = eff.get(s.stage_id)
        if d is None:
            return RolloutState("pending", s.index, good, good_sha, False, eff, last)
        if d["action"] in STOPS:
            return RolloutState(STOPS[d["action"]], s.index, good, good_sha, False, eff, last)
    return RolloutState("complete", None, good, good_sha, False, eff, last)


@contextlib.contextmanager
def controller_lock(rollout_dir: Path) -> Iterator[None]:
    """Hold the rollout's lock: one controller (or manual verb that needs it) at a time.

    The kernel releases it when the holder dies, ``kill -9`` included.
    """
    path = Path(rollout_dir) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text().strip() or "?"
            raise LedgerError(f"{rollout_dir}: a controller is running on this rollout (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)


def locked(rollout_dir: Path) -> bool:
    """Whether a controller holds the rollout's lock now."""
    path = Path(rollout_dir) / LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def write_good_flags(rollout_dir: Path, stages: list[ResolvedStage], good: str | None) -> Path | None:
    """Write the good flag set to ``good-flags.yaml`` (removed when there is none)."""
    path = Path(rollout_dir) / GOOD_FLAGS
    stage = next((s for s in stages if s.stage_id == good), None)
    if stage is None or stage.flags_text is None:
        path.unlink(missing_ok=True)
        return None
    if not path.exists() or path.read_text() != stage.flags_text:
        atomic_write_text(path, stage.flags_text)
    return path
