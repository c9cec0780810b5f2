"""Helpers of the malformed-input corpus (tests/test_corpus_*.py, tests/ops/test_corpus_plans.py).

Every case runs a ``foxhunt`` command in this process (click's CliRunner) and checks the three
things an operator relies on: exit code 2, exactly one line on stderr (no traceback) that names
the input and the problem, and nothing written: the watched paths are the same before and after
(files, sizes and modification times), and a run directory that did not exist still does not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from foxhunt_core.cli import app
from foxhunt_core.runlock import LOCK

TINY = """\
version: 1
stage: 0
run:
  seed: 1
  device: cpu
  market: {bars: 2000}
  env: {num_envs: 8, episode_len: 64}
  net: {shared_h1: 16, shared_h2: 16, adv_h: 12, num_atoms: 11, attn_dim: 4}
  train: {steps: 30, batch_size: 32, warmup_steps: 200, stats_every: 10, replay_capacity: 2000, checkpoint_every: 1000}
plugins: {}
"""


def tree(path: Path) -> dict[str, tuple[int, int]] | None:
    """Every file under ``path`` with its size and mtime (None: ``path`` does not exist). The run
    directory's lock file is left out: taking the lock records the holder's pid in it."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir() or path.is_symlink():
        st = os.lstat(path)
        return {".": (st.st_size, st.st_mtime_ns)}
    out = {}
    for p in sorted(path.rglob("*")):
        if p.name == LOCK:
            continue
        st = os.lstat(p)
        out[str(p.relative_to(path))] = (st.st_size if not p.is_dir() else 0, st.st_mtime_ns if not p.is_dir() else 0)
    return out


def invoke(args: list[Any], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def refused(args: list[Any], fragment: str, *, prefix: str | None = None, watch: tuple[Path, ...] = (),
            code: int = 2, env: dict[str, str] | None = None) -> str:
    """Run ``foxhunt ARGS``; check exit ``code``, one stderr line with ``fragment`` (and ``prefix``),
    and that the ``watch`` paths are unchanged. Returns the line."""
    before = {p: tree(p) for p in watch}
    res = invoke(args, env)
    assert res.exit_code == code, f"exit {res.exit_code}: {res.output!r} {res.exception!r}"
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in res.output
    assert fragment in lines[0], lines[0]
    if prefix is not None:
        assert lines[0].startswith(prefix), lines[0]
    for p, b in before.items():
        assert tree(p) == b, f"{p} changed"
    return lines[0]
