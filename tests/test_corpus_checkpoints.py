"""Damaged, edited and foreign checkpoints: `eval` and `resume` refuse each with one line, writing nothing.

One tiny run is trained once (in this process); every case copies its run directory, damages
one thing (bytes of the file, its metadata with or without a fresh hash, its tensors, the run's
run.json or metrics.json, the file itself replaced by a FIFO or a device) and runs the commands
the case names. Edits "rehashed" rewrite the file through ``save_checkpoint``, so they pass the
integrity hashes and must be caught by what the metadata and the run directory say.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import TINY, invoke, refused
from safetensors import safe_open
from safetensors.numpy import save

from foxhunt_core.checkpoint import load_checkpoint, save_checkpoint
from foxhunt_core.trainer import CHECKPOINT

W1 = "online/core/trunk.w1"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ckpt")
    flags = d / "tiny.yaml"
    flags.write_text(TINY)
    small = d / "small.yaml"
    small.write_text(TINY.replace("shared_h1: 16", "shared_h1: 8"))
    out = {}
    for name, f in (("run", flags), ("small", small)):
        res = invoke(["train", "--flags", f, "--out", d / name, "--quiet"])
        assert res.exit_code == 0, res.output
        out[name] = d / name
    return out


# ----------------------------------------------------------------------------- edits
def _raw(path: Path) -> tuple[bytes, int]:
    data = path.read_bytes()
    return data, 8 + int.from_bytes(data[:8], "little")


def _poke(offset: int, payload: bytes) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        p = run / CHECKPOINT
        data, start = _raw(p)
        at = start + offset
        p.write_bytes(data[:at] + payload + data[at + len(payload):])
    return edit


def _flip_bit(run: Path) -> None:
    p = run / CHECKPOINT
    data, start = _raw(p)
    b = bytearray(data)
    b[start + 1000] ^= 0x01
    p.write_bytes(bytes(b))


def _parts(run: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with safe_open(str(run / CHECKPOINT), framework="np") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}, dict(fh.metadata())


def _crafted(tensors_edit=None, text_edit=None, header_edit=None) -> Callable[[Path], None]:
    """Rewrite the file with raw metadata (hashes kept as they were unless an edit changes them)."""
    def edit(run: Path) -> None:
        tensors, header = _parts(run)
        if tensors_edit is not None:
            tensors_edit(tensors)
        if text_edit is not None:
            header["foxhunt"] = text_edit(header["foxhunt"])
        if header_edit is not None:
            header_edit(header)
        (run / CHECKPOINT).write_bytes(save(tensors, metadata=header))
    return edit


def _rehashed(meta_edit=None, tensors_edit=None) -> Callable[[Path], None]:
    """Edit the metadata document and/or tensors and write the file with fresh, matching hashes."""
    def edit(run: Path) -> None:
        tensors, meta = load_checkpoint(run / CHECKPOINT)
        meta.pop("tensors_sha256")
        if meta_edit is not None:
            meta_edit(meta)
        if tensors_edit is not None:
            tensors_edit(tensors)
        save_checkpoint(run / CHECKPOINT, tensors, meta)
    return edit


def _doc(edit: Callable[[dict], None]) -> Callable[[str], str]:
    def text(raw: str) -> str:
        doc = json.loads(raw)
        edit(doc)
        return json.dumps(doc)
    return text


def _set(key_path: str, value) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        *head, last = key_path.split(".")
        for k in head:
            d = d[k]
        d[last] = value
    return edit


def _delete(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key)


def _json_file(name: str, edit: Callable[[object], object]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        p = run / name
        p.write_text(json.dumps(edit(json.loads(p.read_text()))))
    return apply


def _text_file(name: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / name).write_text(text)


def _remove(name: str) -> Callable[[Path], None]:
    return lambda run: (run / name).unlink()


def _replace_checkpoint(kind: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        p = run / CHECKPOINT
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "directory":
            p.mkdir()
        elif kind == "dev-zero":
            p.symlink_to("/dev/zero")
    return apply


def _foreign(runs_: dict[str, Path]) -> Callable[[Path], None]:
    return lambda run: shutil.copy(runs_["small"] / CHECKPOINT, run / CHECKPOINT)


def _tensor(key: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict], None]:
    def edit(t: dict) -> None:
        t[key] = fn(t[key])
    return edit


def _nan_at(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flat[3] = np.nan
    return a


def _inf_at(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flat[0] = np.inf
    return a


BOTH, RESUME, EVAL = ("eval", "resume"), ("resume",), ("eval",)

# id -> (edit of the copied run directory, commands, fragment of the one line)
CASES: dict[str, tuple[Callable[[Path], None] | str, tuple[str, ...], str]] = {
    # ---------------------------------------------------------------- bytes of the file
    "bit-flip-in-tensor-data": (_flip_bit, BOTH, "does not match its sha256"),
    "ff-block-in-tensor-data": (_poke(0, b"\xff" * 4096), BOTH, "does not match its sha256"),
    "zeros-in-tensor-data": (_poke(2048, b"\x00" * 512), BOTH, "does not match its sha256"),
    "truncated-file": (lambda run: (run / CHECKPOINT).write_bytes((run / CHECKPOINT).read_bytes()[:5000]), BOTH,
                       "not a readable safetensors file"),
    "empty-file": (lambda run: (run / CHECKPOINT).write_bytes(b""), BOTH, "not a readable safetensors file"),
    "garbage-file": (lambda run: (run / CHECKPOINT).write_bytes(b"\x00\x01garbage" * 50), BOTH,
                     "not a readable safetensors file"),
    # ---------------------------------------------------------------- the metadata, hashes as they were
    "metadata-edited": (_crafted(text_edit=_doc(_set("step", 3))), BOTH, "metadata does not match its sha256"),
    "metadata-hash-missing": (_crafted(header_edit=lambda h: h.pop("foxhunt_sha256")), BOTH,
                              "metadata 'foxhunt_sha256' is missing"),
    "metadata-missing": (_crafted(header_edit=lambda h: h.pop("foxhunt")), BOTH, "metadata 'foxhunt' is missing"),
    "metadata-not-json": (_crafted(text_edit=lambda t: t[:-7]), BOTH, "metadata 'foxhunt' is not JSON"),
    "metadata-a-list": (_crafted(text_edit=lambda t: "[1, 2]"), BOTH, "metadata 'foxhunt' is not a JSON object"),
    "format-foreign": (_crafted(text_edit=_doc(_set("format", "other"))), BOTH, "metadata format is 'other'"),
    "format-version-1": (_crafted(text_edit=_doc(_set("version", 1))), BOTH,
                         "version 1 is not supported (written by an older foxhunt, without integrity hashes)"),
    "format-version-99": (_crafted(text_edit=_doc(_set("version", 99))), BOTH, "version 99 is not supported"),
    "hash-table-missing": (_crafted(text_edit=_doc(_delete("tensors_sha256")),
                                    header_edit=lambda h: h.update(foxhunt_sha256=hashlib.sha256(
                                        h["foxhunt"].encode()).hexdigest())), BOTH,
                           "metadata has no tensor hash table"),
    "tensor-not-listed": (_crafted(tensors_edit=lambda t: t.update({"online/core/extra": np.zeros(3, np.float32)})),
                          BOTH, "tensor 'online/core/extra' is not in the checkpoint's hash table"),
    "listed-tensor-missing": (_crafted(tensors_edit=lambda t: t.pop(W1)), BOTH,
                              f"tensor '{W1}' listed in the metadata is missing"),
    # ---------------------------------------------------------------- tensors, rehashed
    "nan-weight": (_rehashed(tensors_edit=_tensor(W1, _nan_at)), BOTH, f"tensor '{W1}' holds 1 non-finite value"),
    "inf-adam-moment": (_rehashed(tensors_edit=_tensor("adam.v/core/trunk.w1", _inf_at)), BOTH,
                        "tensor 'adam.v/core/trunk.w1' holds 1 non-finite value"),
    "unknown-tensor": (_rehashed(tensors_edit=lambda t: t.update({"online/core/extra": np.zeros(3, np.float32)})),
                       BOTH, "unknown tensor 'online/core/extra'"),
    "missing-tensor": (_rehashed(tensors_edit=lambda t: t.pop("target/core/trunk.w1")), BOTH,
                       "tensor 'target/core/trunk.w1' is missing"),
    "misshapen-tensor": (_rehashed(tensors_edit=_tensor(W1, lambda a: a[:, :8].copy())), BOTH,
                         f"tensor '{W1}' is float32[50, 8], this run's is float32[50, 16]"),
    "retyped-tensor": (_rehashed(tensors_edit=_tensor(W1, lambda a: a.astype(np.float64))), BOTH,
                       f"tensor '{W1}' is float64[50, 16]"),
    "replay-rows-differ": (_rehashed(meta_edit=_set("collector.replay.size", 100)), BOTH,
                           "tensor 'replay.action' is int64[440, 4], this run's is int64[100, 4]"),
    "replay-beyond-capacity": (_rehashed(meta_edit=_set("collector.replay.size", 10**6)), BOTH,
                               "collector.replay.size 1000000 is not a fill level of a replay of 2000"),
    # ---------------------------------------------------------------- the metadata, rehashed
    "step-negative": (_rehashed(_set("step", -5)), BOTH, "metadata: step: Input should be greater than or equal to 0"),
    "step-huge": (_rehashed(_set("step", 10**9)), BOTH, "step 1000000000 is beyond the run's train.steps 30"),
    "adam-step-differs": (_rehashed(_set("adam_t", 7)), BOTH, "Adam's step count 7 differs from step 30"),
    "step-as-text": (_rehashed(_set("step", "30")), BOTH, "metadata: step: Input should be a valid integer"),
    "unknown-key": (_rehashed(_set("extra", 1)), BOTH, "metadata: unknown key 'extra'"),
    "missing-key": (_rehashed(_delete("liquid")), BOTH, "metadata: missing key 'liquid'"),
    "missing-history-count": (_rehashed(_delete("history_records")), BOTH, "missing key 'history_records'"),
    "train-seconds-negative": (_rehashed(_set("train_seconds", -1.0)), BOTH, "train_seconds: Input should be greater"),
    "collector-not-a-mapping": (_rehashed(_set("collector", [1])), BOTH, "collector: Input should be a valid dict"),
    "entropy-coefficient-text": (_rehashed(_set("ctx.entropy_coeff", "high")), BOTH,
                                 "ctx.entropy_coeff: Input should be a valid number"),
    "ctx-unknown-key": (_rehashed(_set("ctx.extra", 1)), BOTH, "metadata: unknown key 'ctx.extra'"),
    "flags-hash-wrong": (_rehashed(_set("flags_sha256", "0" * 64)), BOTH, "flags_sha256 is not the hash of flags_text"),
    "settings-invalid": (_rehashed(_set("settings.net.shared_h1", 2)), BOTH,
                         "metadata: settings.net.shared_h1: Input should be greater than or equal to 4"),
    "settings-rule-broken": (_rehashed(_set("settings.train.tau_min", 5.0)), BOTH,
                             "metadata: settings.train.tau_min: must not exceed tau"),
    "settings-unknown-key": (_rehashed(_set("settings.train.speed", 5)), BOTH, "unknown key 'settings.train.speed'"),
    "seed-changed": (_rehashed(_set("settings.seed", 5)), BOTH,
                     "made with other settings than run.json (settings.seed: 1 in run.json, 5 in the checkpoint)"),
    "network-changed": (_rehashed(_set("settings.net.adv_h", 16)), BOTH, "settings.net.adv_h: 12 in run.json, 16"),
    "plugins-changed": (_rehashed(_set("plugins", ["q_mean_center"])), BOTH, "plugins differ from run.json"),
    "another-runs-checkpoint": ("foreign", BOTH, "settings.net.shared_h1: 16 in run.json, 8 in the checkpoint"),
    # ---------------------------------------------------------------- the run directory
    "metrics-deleted": (_remove("metrics.json"), RESUME,
                        "metrics.json: missing; the checkpoint at update 30 expects 3 Q-statistics record(s)"),
    "metrics-not-json": (_text_file("metrics.json", "[{"), BOTH, "metrics.json: unreadable"),
    "metrics-shortened": (_json_file("metrics.json", lambda r: r[:1]), BOTH,
                          "holds 1 Q-statistics record(s) up to update 30; the checkpoint expects 3"),
    "metrics-without-steps": (_json_file("metrics.json", lambda r: [{"loss": 1.0}] * 3), BOTH,
                              "metrics.json: unreadable"),
    "metrics-not-a-list": (_json_file("metrics.json", lambda r: 5), BOTH, "metrics.json: unreadable"),
    "run-json-deleted": (_remove("run.json"), RESUME, "run.json: missing (the run directory's manifest"),
    "run-json-not-json": (_text_file("run.json", "{"), BOTH, "run.json: unreadable"),
    "run-json-without-settings": (_json_file("run.json", lambda r: {"plugins": []}), BOTH, "not a run manifest"),
    "run-json-other-seed": (_json_file("run.json", lambda r: {**r, "settings": {**r["settings"], "seed": 9}}), BOTH,
                            "settings.seed: 9 in run.json, 1 in the checkpoint"),
    "run-json-other-flags": (_json_file("run.json", lambda r: {**r, "flags_sha256": "f" * 64}), BOTH,
                             "flags_sha256 differ from run.json"),
    "checkpoint-deleted": (_remove(CHECKPOINT), BOTH, "no such checkpoint file"),
    "checkpoint-a-fifo": (_replace_checkpoint("fifo"), BOTH, "not a regular file (a named pipe (FIFO))"),
    "checkpoint-a-directory": (_replace_checkpoint("directory"), BOTH, "not a regular file (a directory)"),
    "checkpoint-to-dev-zero": (_replace_checkpoint("dev-zero"), BOTH, "not a regular file (a character device)"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_damaged_checkpoint_is_refused_in_one_line(name, runs, tmp_path):
    edit, commands, fragment = CASES[name]
    run = tmp_path / "run"
    shutil.copytree(runs["run"], run, symlinks=True)
    (_foreign(runs) if edit == "foreign" else edit)(run)
    for cmd in commands:
        refused([cmd, run], fragment, watch=(run,))


def test_the_untouched_copy_resumes_and_evaluates(runs, tmp_path):
    """The corpus's copies are refused for their damage: an undamaged copy works."""
    run = tmp_path / "run"
    shutil.copytree(runs["run"], run)
    assert invoke(["eval", run]).exit_code == 0
    res = invoke(["resume", run, "--steps", "40"])
    assert res.exit_code == 0, res.output
    assert json.loads((run / "eval.json").read_text())["step"] == 40


def test_eval_of_a_checkpoint_away_from_its_run(runs, tmp_path):
    """eval FILE needs no run directory (no run.json, no metrics.json), resume does."""
    lone = tmp_path / "lone.safetensors"
    shutil.copy(runs["run"] / CHECKPOINT, lone)
    assert invoke(["eval", lone]).exit_code == 0


def test_the_corpus_is_large():
    assert len(CASES) >= 50
