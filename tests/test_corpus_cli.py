"""Bad command lines and hostile paths: one line on stderr, exit 2, nothing written.

Covers ``train --out`` on a file, under a file, in ``/proc``, on an existing or locked run;
out-of-range ``--steps``/``--seed``/``--device`` for ``train`` and ``resume``; ``resume`` and
``eval`` on what is not a run; ``rollout report --out`` where it cannot write; click's usage
errors as the ``foxhunt`` entry point prints them; and a full disk while a run writes.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from corpus_helpers import TINY, invoke, refused, tree

from foxhunt_core import checkpoint as checkpoint_mod
from foxhunt_core.cli import app
from foxhunt_core.cli_support import run_app
from foxhunt_core.runlock import run_lock
from foxhunt_core.trainer import CHECKPOINT


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("cli")
    flags = d / "tiny.yaml"
    flags.write_text(TINY)
    res = invoke(["train", "--flags", flags, "--out", d / "run", "--quiet"])
    assert res.exit_code == 0, res.output
    return flags, d / "run"


@pytest.fixture()
def run(trained, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(trained[1], out)
    return out


# ----------------------------------------------------------------------------- train
@pytest.mark.parametrize("opts, fragment", [
    (["--steps", "0"], "command line: --steps: Input should be greater than or equal to 1"),
    (["--steps", "-5"], "command line: --steps: Input should be greater than or equal to 1"),
    (["--steps", "100000000000"], "command line: --steps: must be at most 10_000_000_000"),
    (["--seed", "-1"], "command line: --seed: must be at least 0"),
    (["--seed", str(2**64)], "command line: --seed: must be at most"),
    (["--device", "gpu"], "command line: --device: Input should be 'auto', 'cpu' or 'cuda'"),
])
def test_train_refuses_bad_overrides(trained, tmp_path, opts, fragment):
    out = tmp_path / "run"
    refused(["train", "--flags", trained[0], "--out", out, *opts], fragment, watch=(tmp_path,))
    assert not out.exists()


def test_train_on_cuda_without_a_gpu(trained, tmp_path):
    from foxhunt_core.backend import cuda_available

    if cuda_available():
        pytest.skip("a GPU is present")
    refused(["train", "--flags", trained[0], "--out", tmp_path / "r", "--device", "cuda"], "cuda",
            watch=(tmp_path,))


def _file(tmp: Path) -> Path:
    p = tmp / "a-file"
    p.write_text("x")
    return p


@pytest.mark.parametrize("where, fragment", [
    ("existing-file", "exists and is not a directory"),
    ("under-a-file", "is not a directory"),
    ("in-proc", "cannot create the run directory"),
    ("missing-flags", "cannot read (No such file or directory)"),
])
def test_train_refuses_paths_it_cannot_use(trained, tmp_path, where, fragment):
    flags = trained[0]
    if where == "existing-file":
        out = _file(tmp_path)
    elif where == "under-a-file":
        out = _file(tmp_path) / "sub" / "run"
    elif where == "in-proc":
        out = Path("/proc/foxhunt-corpus/run")
    else:
        out, flags = tmp_path / "run", tmp_path / "nope.yaml"
    refused(["train", "--flags", flags, "--out", out], fragment, prefix=str(out) if where != "missing-flags"
            else str(flags), watch=(tmp_path,))
    assert not Path("/proc/foxhunt-corpus").exists()


def test_train_into_an_existing_run_needs_overwrite(trained, run):
    refused(["train", "--flags", trained[0], "--out", run], "already holds a run (run.json, checkpoint.safetensors",
            prefix=str(run), watch=(run,))


def test_train_into_a_locked_directory(trained, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    with run_lock(out):
        line = refused(["train", "--flags", trained[0], "--out", out], "is writing to this run directory",
                       watch=(out,))
    assert f"(pid {os.getpid()})" in line
    assert sorted(p.name for p in out.iterdir()) == [".foxhunt.lock"]


# ----------------------------------------------------------------------------- resume and eval
@pytest.mark.parametrize("steps, fragment", [
    ("-5", "command line: --steps: must be at least 1, not -5"),
    ("0", "command line: --steps: must be at least 1, not 0"),
    ("10", "command line: --steps: 10 is below the checkpoint's update 30"),
    ("100000000000", "command line: --steps: must be at most 10000000000"),
])
def test_resume_refuses_bad_steps(run, steps, fragment):
    refused(["resume", run, "--steps", steps], fragment, watch=(run,))


@pytest.mark.parametrize("what, fragment", [
    ("missing", "not a run directory"),
    ("a-file", "not a run directory"),
    ("empty", "no such checkpoint file"),
])
def test_resume_refuses_what_is_not_a_run(tmp_path, what, fragment):
    target = {"missing": tmp_path / "nope", "a-file": _file(tmp_path), "empty": tmp_path / "empty"}[what]
    if what == "empty":
        target.mkdir()
    refused(["resume", target], fragment, watch=(tmp_path,))


def test_resume_of_a_locked_run(run):
    with run_lock(run):
        refused(["resume", run], "another foxhunt process", watch=(run,))


@pytest.mark.parametrize("args, fragment", [
    (["--split", "holdout"], "--split must be train, val or test, not 'holdout'"),
])
def test_eval_refuses_bad_options(run, args, fragment):
    refused(["eval", run, *args], fragment, watch=(run,))


def test_eval_of_a_missing_checkpoint(tmp_path):
    refused(["eval", tmp_path / "nope.safetensors"], "no such checkpoint file", watch=(tmp_path,))


# ----------------------------------------------------------------------------- rollout report / status
@pytest.fixture()
def rollout_dir(tmp_path) -> Path:
    from foxhunt_ops.ledger import Ledger
    from foxhunt_ops.stages import ResolvedStage

    d = tmp_path / "rollout"
    led = Ledger.open(d, create=True)
    led.initialise("p.yaml", "p", "sha", "version: 1\n", [ResolvedStage(
        index=0, stage_id="stage-0", number=0, source="stage 0", source_sha256=None, flags_text="version: 1\n",
        flags_sha256="h", plugins=[], seeds=[0], steps=10)])
    led.close()
    return d


@pytest.mark.parametrize("where", ["in-proc", "under-a-file"])
def test_report_out_where_it_cannot_write(rollout_dir, tmp_path, where):
    out = Path("/proc/foxhunt-corpus.html") if where == "in-proc" else _file(tmp_path) / "report.html"
    refused(["rollout", "report", rollout_dir, "--out", out], "cannot write the report", watch=(rollout_dir,))


def test_status_of_what_is_not_a_rollout(tmp_path):
    refused(["rollout", "status", tmp_path], "no rollout ledger (ledger.sqlite) here", watch=(tmp_path,))


def test_status_of_a_ledger_never_started(tmp_path):
    from foxhunt_ops.ledger import Ledger

    Ledger.open(tmp_path, create=True).close()
    refused(["rollout", "status", tmp_path], "the rollout was never started", watch=(tmp_path,))


# ----------------------------------------------------------------------------- usage errors, one line
@pytest.mark.parametrize("args, fragment", [
    (["train", "--flags", "f.yaml", "--out", "r", "--steps", "abc"],
     "Invalid value for '--steps': Input should be a valid integer"),
    (["train", "--out", "r"], "Missing option '--flags'"),
    (["train", "--flags", "f.yaml", "--out", "r", "--bogus"], "No such option: --bogus"),
    (["resume"], "Missing argument 'run_dir'"),
    (["eval", "run", "--split"], "Option '--split' requires an argument"),
    (["warp"], "No such command 'warp'"),
    (["rollout", "run", "p.yaml", "--workers", "many"], "Invalid value for '--workers'"),
])
def test_usage_errors_are_one_line(tmp_path, capsys, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    code = run_app(app, "foxhunt", args)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("foxhunt") and fragment in lines[0], lines
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- a full disk
def _disk_full_after(monkeypatch, writes: int) -> None:
    """Let ``writes`` atomic writes succeed, then fail every one with ENOSPC."""
    real, count = checkpoint_mod.atomic_write_bytes, [0]

    def write(path, data):
        count[0] += 1
        if count[0] > writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(checkpoint_mod, "atomic_write_bytes", write)


def test_disk_full_before_the_run_starts_leaves_nothing(trained, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _disk_full_after(monkeypatch, 0)  # run.json cannot be written
    refused(["train", "--flags", trained[0], "--out", out], "run.json: No space left on device", watch=(tmp_path,))
    assert not out.exists()


def _fails_on_one_line(args: list, fragment: str) -> None:
    """A run that had started: its banner, then exactly one error line, exit 2, no traceback."""
    res = invoke(args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    errors = [ln for ln in res.stderr.splitlines() if "No space" in ln or "Error" in ln]
    assert len(errors) == 1 and fragment in errors[0] and res.stderr.splitlines()[-1] == errors[0], res.stderr


def test_disk_full_at_the_first_checkpoint(trained, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _disk_full_after(monkeypatch, 1)  # run.json, then metrics.json fails
    _fails_on_one_line(["train", "--flags", trained[0], "--out", out], "metrics.json: No space left on device")
    assert not (out / CHECKPOINT).exists()  # nothing half-written; resume says so in one line
    monkeypatch.undo()
    refused(["resume", out], "no such checkpoint file", watch=(out,))


def test_disk_full_while_resuming_keeps_the_last_checkpoint(run, monkeypatch):
    before = tree(run)
    _disk_full_after(monkeypatch, 0)
    _fails_on_one_line(["resume", run, "--steps", "40"], "metrics.json: No space left on device")
    after = tree(run)
    assert after[CHECKPOINT] == before[CHECKPOINT] and after["metrics.json"] == before["metrics.json"]
    monkeypatch.undo()
    res = invoke(["resume", run, "--steps", "40"])
    assert res.exit_code == 0, res.output
