"""Run directories: one writer at a time, and a new run never mixed into an old one.

* :func:`run_lock` holds an exclusive ``flock`` on ``<run>/.foxhunt.lock`` for as long as a
  command writes into the directory (``train``, ``resume``); a second writer is refused at once
  with the holder's pid. The kernel releases the lock when its holder dies, ``kill -9`` included.
* :func:`check_new_run` refuses, before anything is written, an ``--out`` that is a file, lies
  under a file, or already holds a run (any of :data:`RUN_FILES`) unless ``overwrite`` is given;
  :func:`NewRun` creates the directory, takes the lock, removes an old run's files (with
  ``overwrite``) and, if the run cannot start, removes what it created, so that a refused
  ``train`` leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

LOCK = ".foxhunt.lock"
RUN_FILES = ("run.json", "checkpoint.safetensors", "metrics.json", "log.jsonl", "eval.json", "gemm_tuning.json")


class RunDirError(ValueError):
    """A run directory cannot be used as asked; the message is one line naming it."""


def _why(exc: OSError) -> str:
    return exc.strerror or errno.errorcode.get(exc.errno or 0, type(exc).__name__)


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock (exclusive, non-blocking)."""
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise RunDirError(f"{run_dir}: cannot lock the run directory ({_why(exc)})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunDirError(f"{run_dir}: another foxhunt process (pid {holder}) is writing to this run "
                              "directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` that does not exist yet (None: it exists)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return missing
        missing = p
    return missing


def old_run_files(out: Path) -> list[str]:
    return [n for n in RUN_FILES if (out / n).exists()]


def check_new_run(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` that cannot hold a new run (module docstring); writes nothing."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: exists and is not a directory")
    for parent in out.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise RunDirError(f"{out}: {parent} is not a directory")
            break
    if out.is_dir():
        old = old_run_files(out)
        if old and not overwrite:
            raise RunDirError(f"{out}: already holds a run ({', '.join(old)}): continue it with `foxhunt resume "
                              f"{out}`, or pass --overwrite to replace it")


class NewRun:
    """Create (or reuse) a run directory for a new run, locked; undo on failure (module docstring)."""

    def __init__(self, out: Path, overwrite: bool) -> None:
        self.out = Path(out)
        self.overwrite = overwrite
        self.created: Path | None = None
        self._lock: contextlib.ExitStack | None = None
        self._before: set[str] = set()
        self._had_lock = False

    def __enter__(self) -> NewRun:
        check_new_run(self.out, self.overwrite)
        self.created = _first_missing(self.out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._remove_created()
            raise RunDirError(f"{self.out}: cannot create the run directory ({_why(exc)})") from None
        self._had_lock = (self.out / LOCK).exists()
        self._lock = contextlib.ExitStack()
        try:
            self._lock.enter_context(run_lock(self.out))
            if self.overwrite:
                for name in old_run_files(self.out):
                    (self.out / name).unlink()
                for tmp in self.out.glob(".*.tmp"):
                    tmp.unlink()
            self._before = {p.name for p in self.out.iterdir()} - {LOCK}
        except BaseException:
            self._lock.close()
            self._remove_created()
            raise
        return self

    def abandon(self) -> None:
        """The run could not start: remove what this run created (the directory, if it made it)."""
        if self.created is not None:
            self._remove_created()
            return
        for p in self.out.iterdir():
            if p.name not in self._before and p.name != LOCK:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        if not self._had_lock:
            (self.out / LOCK).unlink(missing_ok=True)

    def _remove_created(self) -> None:
        if self.created is not None and self.created.exists():
            shutil.rmtree(self.created, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.close()
