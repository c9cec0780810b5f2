"""Checkpoints: one safetensors file holding everything a run needs to continue bit-identically.

Tensors are stored under slash-separated keys (``online/core/trunk.w1``, ``adam.m/...``,
``replay.obs``, ``env/...``); everything else — settings, flag file text, step counters, RNG
states, liquid-tau state, plugin state — goes into the JSON document in the file's metadata
under ``foxhunt``. Writes are atomic: a temporary file in the same directory, fsync, rename.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save

FORMAT = "foxhunt-checkpoint"
FORMAT_VERSION = 1


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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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


def save_checkpoint(path: Path, tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    doc = {"format": FORMAT, "version": FORMAT_VERSION, **meta}
    data = save({k: to_host(v) for k, v in tensors.items()}, metadata={"foxhunt": json.dumps(doc)})
    atomic_write_bytes(Path(path), data)


def load_checkpoint(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(tensors, meta)``; raises :class:`CheckpointError` with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with safe_open(str(path), framework="np") as fh:
            raw = (fh.metadata() or {}).get("foxhunt")
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for bad files
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable safetensors file ({first})") from exc
    if raw is None:
        raise CheckpointError(f"{path}: metadata 'foxhunt' is missing (not a foxhunt checkpoint)")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: metadata 'foxhunt' is not JSON ({exc.msg} at {exc.pos})") from exc
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: metadata format is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {meta.get('version')!r} is not supported "
            f"(this foxhunt reads {FORMAT_VERSION})"
        )
    return tensors, meta
