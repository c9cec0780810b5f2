"""Checkpoints: one safetensors file holding everything a run needs to continue bit-identically.

Tensors are stored under slash-separated keys (``online/core/trunk.w1``, ``adam.m/...``,
``replay.obs``, ``env/...``); everything else — settings, flag file text, step counters, RNG
states, liquid-tau state, plugin state — goes into the JSON document in the file's metadata
under ``foxhunt``. Writes are atomic: a temporary file in the same directory, fsync, rename,
with the permissions the user's umask gives a new file.

Integrity: the JSON document lists the sha256 of every tensor (dtype, shape and bytes) under
``tensors_sha256``, and the metadata entry ``foxhunt_sha256`` is the sha256 of the document's
text. :func:`load_checkpoint` verifies both, that the file's tensors are exactly those listed,
and that no floating-point tensor holds NaN or Inf, and refuses the file otherwise (one line:
the file and the first problem). What the document must hold for a run to continue from it is
checked by :mod:`foxhunt_core.checkpoint_meta`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save

FORMAT = "foxhunt-checkpoint"
FORMAT_VERSION = 2


class CheckpointError(ValueError):
    """A checkpoint cannot be read; the message names the file and the problem."""


def to_host(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a.get() if hasattr(a, "get") else np.asarray(a))


def flatten(prefix: str, tree: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    return {f"{prefix}/{o}/{k}": to_host(v) for o, sub in tree.items() for k, v in sub.items()}


def unflatten(prefix: str, tensors: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    head = prefix + "/"
    for key, v in tensors.items():
        if key.startswith(head):
            owner, name = key[len(head) :].split("/", 1)
            out.setdefault(owner, {})[name] = v
    return out


def umask() -> int:
    """The process's file-mode creation mask (read without changing it where Linux allows)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600; a new file gets what the umask gives
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def tensor_sha256(a: np.ndarray) -> str:
    """sha256 of a tensor's dtype, shape and bytes (C order)."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(memoryview(a).cast("B") if a.size else b"")
    return h.hexdigest()


def save_checkpoint(path: Path, tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    host = {k: to_host(v) for k, v in tensors.items()}
    doc = {"format": FORMAT, "version": FORMAT_VERSION, **meta,
           "tensors_sha256": {k: tensor_sha256(v) for k, v in sorted(host.items())}}
    text = json.dumps(doc)
    data = save(host, metadata={"foxhunt": text, "foxhunt_sha256": hashlib.sha256(text.encode()).hexdigest()})
    atomic_write_bytes(Path(path), data)


def _verify_tensors(path: Path, tensors: dict[str, np.ndarray], listed: Any) -> None:
    if not isinstance(listed, dict):
        raise CheckpointError(f"{path}: metadata has no tensor hash table (tensors_sha256)")
    unknown = sorted(set(tensors) - set(listed))
    if unknown:
        raise CheckpointError(f"{path}: tensor {unknown[0]!r} is not in the checkpoint's hash table "
                              f"({len(unknown)} unlisted)")
    missing = sorted(set(listed) - set(tensors))
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]!r} listed in the metadata is missing "
                              f"({len(missing)} missing)")
    for key in sorted(tensors):
        if tensor_sha256(tensors[key]) != listed[key]:
            raise CheckpointError(f"{path}: tensor {key!r} does not match its sha256 (the file is corrupted "
                                  "or was edited)")
    for key in sorted(tensors):
        a = tensors[key]
        if np.issubdtype(a.dtype, np.floating):
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            if bad:
                raise CheckpointError(f"{path}: tensor {key!r} holds {bad} non-finite value(s) (NaN/Inf): "
                                      "the run diverged before this checkpoint, or the file is damaged")


def load_checkpoint(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(tensors, meta)``, verified (module docstring); raises :class:`CheckpointError` with a
    one-line reason."""
    from .safeio import FileProblem, check_regular

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        check_regular(path)
    except FileProblem as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    try:
        with safe_open(str(path), framework="np") as fh:
            header = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for bad files
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable safetensors file ({first})") from exc
    raw = header.get("foxhunt")
    if raw is None:
        raise CheckpointError(f"{path}: metadata 'foxhunt' is missing (not a foxhunt checkpoint)")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: metadata 'foxhunt' is not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: metadata 'foxhunt' is not a JSON object")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: metadata format is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") != FORMAT_VERSION:
        old = " (written by an older foxhunt, without integrity hashes)" if meta.get("version") == 1 else ""
        raise CheckpointError(
            f"{path}: checkpoint format version {meta.get('version')!r} is not supported{old} "
            f"(this foxhunt reads {FORMAT_VERSION})"
        )
    digest = header.get("foxhunt_sha256")
    if digest is None:
        raise CheckpointError(f"{path}: metadata 'foxhunt_sha256' is missing (the metadata cannot be verified)")
    if hashlib.sha256(raw.encode()).hexdigest() != digest:
        raise CheckpointError(f"{path}: metadata does not match its sha256 (the file is corrupted or was edited)")
    _verify_tensors(path, tensors, meta.get("tensors_sha256"))
    return tensors, meta
