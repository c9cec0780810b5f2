"""What the controller reads back from a ledger is checked like what it read from the plan.

A ledger is a file in the rollout directory, so it can be edited or damaged. Stage ids become
paths (``flags/<id>.yaml`` is written, ``trials/<id>/seed-<s>/`` is removed and recreated), so a
stage row is refused unless its id matches the plan's id pattern, its seeds are non-negative
integers and its other fields have the types a resolved stage has.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .errors import LedgerError

MAX_SEED = 2**63 - 1


def check_stage_row(row_id: Any, spec: dict[str, Any], path: Path) -> None:
    """Refuse a ``stages`` row whose id or fields could not have come from a valid plan."""
    from .plan import NAME

    where = f"{path}: stages row {row_id!r}"
    if not isinstance(spec, dict):
        raise LedgerError(f"{where}: not a stage record")
    sid = spec.get("stage_id")
    if not isinstance(sid, str) or not re.fullmatch(NAME, sid):
        raise LedgerError(f"{where}: stage id {sid!r} is not a valid id (pattern {NAME})")
    if sid != row_id:
        raise LedgerError(f"{where}: the record names stage {sid!r}")
    seeds = spec.get("seeds")
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED for s in seeds)):
        raise LedgerError(f"{where}: seeds {seeds!r} are not non-negative integers")
    steps = spec.get("steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise LedgerError(f"{where}: steps {steps!r} is not a positive integer")
    for key in ("index",):
        if not isinstance(spec.get(key), int):
            raise LedgerError(f"{where}: {key} {spec.get(key)!r} is not an integer")
    for key in ("flags_text", "flags_sha256", "skip_reason"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise LedgerError(f"{where}: {key} is not text")
