"""Checkpoint files: round trip, atomic replacement, and one-line errors for bad files."""

import json
import os

import numpy as np
import pytest

from foxhunt_core.checkpoint import (
    CheckpointError,
    atomic_write_text,
    flatten,
    load_checkpoint,
    save_checkpoint,
    unflatten,
)


def test_round_trip(tmp_path):
    tree = {"core": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "plug": {"a": np.ones(2)}}
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, flatten("online", tree), {"step": 7, "rng": {"state": 2**100}})
    tensors, meta = load_checkpoint(path)
    back = unflatten("online", tensors)
    assert meta["step"] == 7 and meta["rng"]["state"] == 2**100
    np.testing.assert_array_equal(back["core"]["w"], tree["core"]["w"])
    np.testing.assert_array_equal(back["plug"]["a"], tree["plug"]["a"])


def test_atomic_write_leaves_no_temporary_and_keeps_old_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    atomic_write_text(path, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "not a readable safetensors file"),
        (b"\x00\x01garbage" * 10, "not a readable safetensors file"),
    ],
)
def test_malformed_files_give_one_line_errors(tmp_path, content, needle):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(path)
    msg = str(exc.value)
    assert str(path) in msg and needle in msg and "\n" not in msg


def test_foreign_and_future_checkpoints_are_refused(tmp_path):
    from safetensors.numpy import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"x": np.zeros(2)}, str(foreign))
    with pytest.raises(CheckpointError, match="metadata 'foxhunt' is missing"):
        load_checkpoint(foreign)
    future = tmp_path / "future.safetensors"
    save_file({"x": np.zeros(2)}, str(future),
              metadata={"foxhunt": json.dumps({"format": "foxhunt-checkpoint", "version": 99})})
    with pytest.raises(CheckpointError, match="version 99 is not supported"):
        load_checkpoint(future)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.safetensors")
