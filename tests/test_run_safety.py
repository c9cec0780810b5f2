"""Run directories and checkpoints in use: the lock, --overwrite, the umask, the checkpoint cadence by
time, the training time a checkpoint carries, the order of its writes, and the entry point."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import TINY, invoke, refused

from foxhunt_core import trainer as trainer_mod
from foxhunt_core.checkpoint import load_checkpoint
from foxhunt_core.config import RunSettings
from foxhunt_core.flags import parse_flags
from foxhunt_core.trainer import CHECKPOINT, Trainer


def _settings(**train) -> RunSettings:
    base = parse_flags(TINY).settings.model_dump()
    base["train"].update(train)
    return RunSettings.model_validate(base)


def _events(run: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if e["event"] == kind]


def _params(t: Trainer) -> dict[str, np.ndarray]:
    return {f"{o}/{k}": np.array(v) for o, s in t.agent.online.items() for k, v in s.items()}


class Crash(Exception):
    pass


# ----------------------------------------------------------------------------- checkpoints by time
def test_checkpoints_by_time_besides_by_updates(tmp_path):
    run = tmp_path / "run"
    Trainer(_settings(steps=120, checkpoint_every=1000, checkpoint_minutes=0.0002), None, run).train()
    by_time = [e["step"] for e in _events(run, "checkpoint")]
    assert len(by_time) >= 3 and by_time[-1] == 120 and all(0 < s < 120 for s in by_time[:-1]), by_time
    run2 = tmp_path / "run2"
    Trainer(_settings(steps=120, checkpoint_every=1000, checkpoint_minutes=0), None, run2).train()
    assert [e["step"] for e in _events(run2, "checkpoint")] == [120]  # 0: by updates only


@pytest.mark.parametrize("at", [3, 33, 47])
def test_a_resume_between_two_stats_intervals_explores_as_the_straight_run(tmp_path, at):
    """A checkpoint taken by time may fall between two Q-statistics intervals; the resumed run must
    read the exploration schedules where the uninterrupted run last read them."""
    s = _settings(steps=80, checkpoint_every=1000, checkpoint_minutes=0)
    assert at % s.train.stats_every and 0 < at < s.train.steps
    straight = Trainer(s, None, tmp_path / "a")
    straight.train()
    first = Trainer(s, None, tmp_path / "b")
    first.train(until_step=at)
    first.save()
    resumed = Trainer(s, None, tmp_path / "b")
    resumed.load(tmp_path / "b" / CHECKPOINT)
    resumed.train()
    a, b = _params(straight), _params(resumed)
    assert [k for k in a if not np.array_equal(a[k], b[k])] == []
    assert straight.history == resumed.history


def test_a_crash_after_a_time_checkpoint_loses_only_the_updates_since(tmp_path, monkeypatch):
    """Resuming from a checkpoint taken by time ends with the parameters of an uninterrupted run."""
    s = _settings(steps=80, checkpoint_every=1000, checkpoint_minutes=0.0002)
    straight = Trainer(_settings(steps=80, checkpoint_every=1000, checkpoint_minutes=0), None, tmp_path / "a")
    straight.train()
    save = Trainer.save

    def save_then_crash(self):
        path = save(self)
        if self.step < self.settings.train.steps:
            raise Crash(self.step)
        return path

    monkeypatch.setattr(Trainer, "save", save_then_crash)
    with pytest.raises(Crash) as crashed:
        Trainer(s, None, tmp_path / "b").train()
    monkeypatch.undo()
    at = crashed.value.args[0]
    assert 0 < at < 80
    resumed = Trainer(s, None, tmp_path / "b")
    resumed.load(tmp_path / "b" / CHECKPOINT)
    assert resumed.step == at
    resumed.train()
    a, b = _params(straight), _params(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert straight.history == resumed.history


# ----------------------------------------------------------------------------- training time
def test_a_checkpoint_carries_the_training_time_of_the_running_call(tmp_path, monkeypatch):
    """Checkpoints stored train_seconds without the current call's time, so updates_per_second after
    a resume was inflated (26.9 and 37.9 against 11.1 uninterrupted)."""
    seen = []
    real = trainer_mod.save_checkpoint

    def record(path, tensors, meta):
        seen.append((time.perf_counter(), meta["step"], meta["train_seconds"]))
        real(path, tensors, meta)

    monkeypatch.setattr(trainer_mod, "save_checkpoint", record)
    t = Trainer(_settings(steps=40, checkpoint_every=20, checkpoint_minutes=0), None, tmp_path / "r")
    t0 = time.perf_counter()
    t.train()
    (when, step, secs), (_, last_step, last_secs) = seen
    assert step == 20 and last_step == 40
    assert 0 < secs <= when - t0 + 1e-6 and secs > 0.5 * (when - t0)
    assert last_secs == pytest.approx(t.train_seconds)


def test_updates_per_second_after_a_resume_counts_the_time_before_it(tmp_path, monkeypatch):
    flags = tmp_path / "tiny.yaml"
    flags.write_text(TINY.replace("checkpoint_every: 1000", "checkpoint_every: 10"))
    run = tmp_path / "run"
    save = Trainer.save

    def crash_at_20(self):
        path = save(self)
        if self.step == 20:
            raise Crash()
        return path

    monkeypatch.setattr(Trainer, "save", crash_at_20)
    assert isinstance(invoke(["train", "--flags", flags, "--out", run, "--quiet"]).exception, Crash)
    monkeypatch.undo()
    _, meta = load_checkpoint(run / CHECKPOINT)
    assert meta["step"] == 20 and meta["train_seconds"] > 0  # it was 0: the first call's time was left out
    t0 = time.perf_counter()
    assert invoke(["resume", run]).exit_code == 0
    resume_call = time.perf_counter() - t0
    report = json.loads((run / "eval.json").read_text())
    total = report["step"] / report["updates_per_second"]
    assert report["step"] == 30 and total > meta["train_seconds"]
    assert total - meta["train_seconds"] <= resume_call  # plus the resumed call's own training time


# ----------------------------------------------------------------------------- the order of writes
def test_a_crash_between_the_history_and_the_checkpoint_resumes(tmp_path, monkeypatch):
    """metrics.json is written before the checkpoint: a crash between the two leaves records the
    checkpoint does not count yet, which load drops."""
    run = tmp_path / "r"
    t = Trainer(_settings(steps=40, checkpoint_every=20, checkpoint_minutes=0), None, run)
    real, calls = trainer_mod.save_checkpoint, []

    def second_fails(path, tensors, meta):
        calls.append(meta["step"])
        if len(calls) == 2:
            raise Crash()
        real(path, tensors, meta)

    monkeypatch.setattr(trainer_mod, "save_checkpoint", second_fails)
    with pytest.raises(Crash):
        t.train()
    monkeypatch.undo()
    assert [r["step"] for r in json.loads((run / "metrics.json").read_text())] == [10, 20, 30, 40]
    again = Trainer(_settings(steps=40, checkpoint_every=20, checkpoint_minutes=0), None, run)
    again.load(run / CHECKPOINT)
    assert again.step == 20 and [r["step"] for r in again.history] == [10, 20]


# ----------------------------------------------------------------------------- run directories
def test_overwrite_replaces_the_old_run(tmp_path):
    flags = tmp_path / "tiny.yaml"
    flags.write_text(TINY)
    run = tmp_path / "run"
    assert invoke(["train", "--flags", flags, "--out", run, "--quiet"]).exit_code == 0
    res = invoke(["train", "--flags", flags, "--out", run, "--quiet", "--overwrite", "--seed", "4", "--steps", "20"])
    assert res.exit_code == 0, res.output
    _, meta = load_checkpoint(run / CHECKPOINT)
    assert meta["settings"]["seed"] == 4 and meta["step"] == 20
    assert json.loads((run / "run.json").read_text())["settings"]["seed"] == 4
    assert len(_events(run, "train_start")) == 1  # the old run's log went with it


def test_a_new_run_killed_early_does_not_resume_the_old_one(tmp_path, monkeypatch):
    """A new train into an old run directory, killed before its first checkpoint, used to make
    resume continue the old run."""
    flags = tmp_path / "tiny.yaml"
    flags.write_text(TINY)
    run = tmp_path / "run"
    assert invoke(["train", "--flags", flags, "--out", run, "--quiet"]).exit_code == 0

    def killed(self, *a, **k):
        raise Crash()

    monkeypatch.setattr(Trainer, "train", killed)
    res = invoke(["train", "--flags", flags, "--out", run, "--quiet", "--overwrite", "--seed", "4"])
    assert isinstance(res.exception, Crash)
    monkeypatch.undo()
    assert not (run / CHECKPOINT).exists()
    refused(["resume", run], "no such checkpoint file", watch=(run,))


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_files_are_written_with_the_umask(tmp_path, mask, mode):
    """Every file used to be 0600 whatever the umask (mkstemp's mode)."""
    flags = tmp_path / "tiny.yaml"
    flags.write_text(TINY.replace("steps: 30", "steps: 10"))
    old = os.umask(mask)
    try:
        assert invoke(["train", "--flags", flags, "--out", tmp_path / "run", "--quiet"]).exit_code == 0
    finally:
        os.umask(old)
    for name in ("run.json", CHECKPOINT, "metrics.json", "eval.json", "log.jsonl"):
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == mode, name


def test_two_trains_into_one_directory_in_real_processes(tmp_path):
    """The second `foxhunt train` into a directory another one is writing is refused at once."""
    exe = Path(sys.executable).with_name("foxhunt")
    flags = tmp_path / "long.yaml"
    flags.write_text(TINY.replace("steps: 30", "steps: 100000"))
    run = tmp_path / "run"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    first = subprocess.Popen([str(exe), "train", "--flags", str(flags), "--out", str(run), "--quiet"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (run / "run.json").exists():
            time.sleep(0.1)
        assert (run / "run.json").exists(), "the first train did not start"
        second = subprocess.run([str(exe), "train", "--flags", str(flags), "--out", str(run), "--overwrite"],
                                capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert second.stderr.strip() == (f"{run}: another foxhunt process (pid {first.pid}) is writing to this run "
                                         "directory")
    finally:
        first.kill()
        first.wait()


# ----------------------------------------------------------------------------- the entry point
def test_the_entry_point_silences_numpy_warnings_and_is_main(tmp_path, monkeypatch, capsys):
    from importlib.metadata import entry_points

    from foxhunt_core.cli import main

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "foxhunt"]
    assert ep.value == "foxhunt_core.cli:main"
    flags = tmp_path / "tiny.yaml"
    flags.write_text(TINY)
    old = np.geterr()
    try:
        np.seterr(all="warn")
        monkeypatch.setattr(sys, "argv", ["foxhunt", "flags", "validate", str(flags)])
        with pytest.raises(SystemExit) as done:
            main()
        assert done.value.code == 0
        assert set(np.geterr().values()) == {"ignore"}
        with np.errstate():  # what a run's NaN arithmetic now does: no RuntimeWarning on stderr
            np.log(np.array([-1.0]))
        assert "RuntimeWarning" not in capsys.readouterr().err
    finally:
        np.seterr(**old)
