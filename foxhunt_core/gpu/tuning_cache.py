"""The machine's GEMM tuning cache: cuBLASLt algorithms chosen by earlier runs, kept across runs.

With ``train.gemm_autotune`` a run on the GPU times cuBLASLt's candidate algorithms for every GEMM
shape it meets (:mod:`.cublaslt`) and keeps the fastest. The choice depends on timing, so two
fresh runs may choose differently and round differently, and the timing costs the first
update a few seconds. The cache keeps the choices per GPU model and cuBLASLt version in
``<cache dir>/gemm_tuning/<tag hash>.json``; a fresh run starts from it, so its GEMMs run the
algorithms an earlier run on the machine chose, untimed, and only shapes new to the machine are
timed (and then added). The cache directory is ``$FOXHUNT_CACHE_DIR``, else
``$XDG_CACHE_HOME/foxhunt``, else ``~/.cache/foxhunt``; ``FOXHUNT_GEMM_CACHE=0`` turns the cache
off. A run directory's own record (a resumed run) comes first.

The cache is disposable: a file that cannot be read or has the wrong form is set aside with a
log event (the run tunes as if there were none) and replaced at the next write. Writes merge
the run's choices into what the file holds at that moment and replace it atomically, so
concurrent runs on one machine never leave a torn file (at worst one's additions wait for its
next write).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..checkpoint import atomic_write_text


def cache_dir(env: dict[str, str] | None = None) -> Path | None:
    """The cache directory, or None when ``FOXHUNT_GEMM_CACHE=0``."""
    env = dict(os.environ) if env is None else env
    if env.get("FOXHUNT_GEMM_CACHE", "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    if env.get("FOXHUNT_CACHE_DIR"):
        return Path(env["FOXHUNT_CACHE_DIR"]).expanduser()
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "foxhunt"


def cache_file(root: Path, device: str) -> Path:
    """The file of one GPU model and cuBLASLt version (``device``: :func:`.cublaslt.device_tag`)."""
    return root / "gemm_tuning" / f"{hashlib.sha256(device.encode()).hexdigest()[:16]}.json"


def read(path: Path) -> dict[str, Any]:
    """The record in ``path``; ValueError naming the file when it cannot be read or has the wrong form."""
    from .cublaslt import check_tuning_record

    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable GEMM tuning cache ({exc})") from None
    check_tuning_record(record, str(path))
    return record


def merged(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new``'s plans over ``old``'s (when ``old`` is for the same device), sorted by plan."""
    plans = dict(old["plans"]) if old is not None and old.get("device") == new["device"] else {}
    plans.update(new["plans"])
    return {**new, "plans": dict(sorted(plans.items()))}


def add(path: Path, record: dict[str, Any]) -> int:
    """Merge ``record`` into the cache file ``path`` (created with its directory when missing; an
    unreadable one is replaced); returns how many plans the file holds now."""
    try:
        old = read(path) if path.is_file() else None
    except ValueError:
        old = None
    out = merged(old, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(out, indent=1))
    return len(out["plans"])
