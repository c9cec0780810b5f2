"""What a training checkpoint's metadata must hold, and how it must agree with its run.

:func:`foxhunt_core.checkpoint.load_checkpoint` verifies that a file is intact (hashes, finite
tensors). A run continues from a checkpoint only if, beyond that,

* the metadata document has exactly the keys a trainer writes (:class:`CheckpointMeta`: a key
  added to ``Trainer._meta`` needs its field here), of the right types;
* the settings it was made with are valid run settings (:mod:`foxhunt_core.validation`), the
  flag text matches its hash, and the counters agree: ``0 <= step <= train.steps`` and Adam's
  step count equals ``step``;
* it agrees with the run directory's ``run.json`` (:func:`check_run_json`): the same settings
  (the step total aside, which ``resume --steps`` may raise), the same plugins and flag file;
* its tensors are exactly those the run would save, with their shapes and dtypes
  (:func:`check_tensor_layout`);
* the training history it expects is in ``metrics.json`` (:func:`read_history`).

Each refusal is a :class:`~foxhunt_core.checkpoint.CheckpointError` of one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .checkpoint import CheckpointError
from .config import RunSettings

RUN_JSON = "run.json"
METRICS = "metrics.json"


class _Ctx(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entropy_coeff: float = Field(description="The loss's entropy coefficient at the checkpoint.")
    stash: dict[str, Any] = Field(description="Plugins' interval state (RunContext.stash).")
    signals: dict[str, float] = Field(
        default_factory=dict, description="The interval plugins' typed signals by name (RunContext.signals).")


class CheckpointMeta(BaseModel):
    """The JSON document of a training checkpoint (``Trainer._meta`` plus the file's own keys)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: str = Field(description="Always foxhunt-checkpoint.")
    version: int = Field(description="Checkpoint format version.")
    tensors_sha256: dict[str, str] = Field(description="sha256 of every tensor.")
    foxhunt_version: str = Field(description="foxhunt version that wrote the file.")
    settings: dict[str, Any] = Field(description="The run settings the checkpoint was made with.")
    flags_text: str = Field(description="The flag file's text.")
    flags_sha256: str = Field(description="sha256 of flags_text (empty without a flag file).")
    plugins: list[str] = Field(description="Enabled plugins, in rollout order.")
    step: int = Field(ge=0, description="Gradient updates done.")
    adam_t: int = Field(ge=0, description="Adam's step count (equals step).")
    liquid: dict[str, Any] = Field(description="Liquid-tau state.")
    ctx: _Ctx = Field(description="Run-context scalars.")
    first_raw_q_mean: float | None = Field(description="Raw Q-mean of the first Q-statistics record.")
    train_seconds: float = Field(ge=0, description="Training wall time up to the checkpoint.")
    history_records: int = Field(ge=0, description="Q-statistics records in metrics.json at the checkpoint.")
    collector: dict[str, Any] = Field(description="Collector (environment, replay, RNG) state.")
    selection: dict[str, Any] = Field(description="Model selection on the validation split (foxhunt_core.selection).")
    market_fingerprint: dict[str, str] = Field(description="sha256 of each data file of a file market (empty: none).")


def _first_error(exc: ValidationError, prefix: tuple[str, ...] = ()) -> str:
    e = exc.errors()[0]
    where = ".".join(str(p) for p in prefix + tuple(e["loc"])) or "<root>"
    if e["type"] == "extra_forbidden":
        return f"unknown key {where!r}"
    if e["type"] == "missing":
        return f"missing key {where!r}"
    return f"{where}: {e['msg']}"


def check_meta(meta: dict[str, Any], path: Path | str) -> RunSettings:
    """Validate the document of a checkpoint; returns its settings."""
    from . import validation

    try:
        m = CheckpointMeta.model_validate(meta)
    except ValidationError as exc:
        raise CheckpointError(f"{path}: metadata: {_first_error(exc)}") from None
    try:
        settings = RunSettings.model_validate(m.settings)
    except ValidationError as exc:
        raise CheckpointError(f"{path}: metadata: {_first_error(exc, ('settings',))}") from None
    problems = validation.settings_problems(settings)
    if problems:
        loc, msg = problems[0]
        raise CheckpointError(f"{path}: metadata: settings.{'.'.join(map(str, loc))}: {msg}")
    if m.flags_text and hashlib.sha256(m.flags_text.encode("utf-8")).hexdigest() != m.flags_sha256:
        raise CheckpointError(f"{path}: metadata: flags_sha256 is not the hash of flags_text")
    if m.step > settings.train.steps:
        raise CheckpointError(f"{path}: metadata: step {m.step} is beyond the run's train.steps "
                              f"{settings.train.steps}")
    if m.adam_t != m.step:
        raise CheckpointError(f"{path}: metadata: Adam's step count {m.adam_t} differs from step {m.step}")
    return settings


def _comparable(settings: Any) -> Any:
    try:
        out = RunSettings.model_validate(settings).model_dump(mode="json")
    except (ValidationError, TypeError):
        return settings
    out["train"].pop("steps", None)
    return out


def _difference(a: Any, b: Any, loc: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _difference(a.get(k), b.get(k), f"{loc}.{k}" if loc else str(k))
            if d:
                return d
        return None
    return None if a == b else f"{loc}: {b!r} in run.json, {a!r} in the checkpoint"


def check_run_json(meta: dict[str, Any], path: Path | str, run_json: Path, required: bool) -> None:
    """The checkpoint was made by the run of ``run_json`` (absent and not required: nothing to check)."""
    if not run_json.exists():
        if required:
            raise CheckpointError(f"{run_json}: missing (the run directory's manifest, written by foxhunt train)")
        return
    try:
        run = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{run_json}: unreadable ({' '.join(str(exc).split())})") from None
    if not isinstance(run, dict) or not isinstance(run.get("settings"), dict):
        raise CheckpointError(f"{run_json}: not a run manifest (no settings)")
    diff = _difference(_comparable(meta["settings"]), _comparable(run["settings"]), "settings")
    if diff:
        raise CheckpointError(f"{path}: made with other settings than {run_json.name} ({diff}): the checkpoint of "
                              "another run?")
    for key in ("plugins", "flags_sha256"):
        if run.get(key) != meta.get(key):
            raise CheckpointError(f"{path}: {key} differ from {run_json.name} ({run.get(key)!r} there, "
                                  f"{meta.get(key)!r} here): the checkpoint of another run?")


def check_tensor_layout(tensors: dict[str, Any], expected: dict[str, Any], replay_size: int,
                        path: Path | str) -> None:
    """The checkpoint's tensors are the ``expected`` ones (key -> an array of the run's own shape;
    the replay's arrays hold ``replay_size`` rows)."""
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise CheckpointError(f"{path}: unknown tensor {unknown[0]!r} (this run saves no such tensor)")
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]!r} is missing")
    for key in sorted(expected):
        want, got = expected[key], tensors[key]
        shape = tuple(want.shape)
        if key.startswith("replay."):
            shape = (replay_size,) + shape[1:]
        if tuple(got.shape) != shape or got.dtype != want.dtype:
            raise CheckpointError(f"{path}: tensor {key!r} is {got.dtype}{list(got.shape)}, this run's is "
                                  f"{want.dtype}{list(shape)}")


def read_history(run_dir: Path, step: int, records: int, path: Path | str,
                 required: bool = True) -> list[dict[str, Any]]:
    """The Q-statistics records up to ``step`` from ``metrics.json``; the checkpoint expects
    ``records`` (not ``required``: a missing file is an empty history, as for a checkpoint
    evaluated away from its run directory)."""
    mpath = run_dir / METRICS
    if (records == 0 or not required) and not mpath.exists():
        return []
    if not mpath.exists():
        raise CheckpointError(f"{mpath}: missing; the checkpoint at update {step} expects {records} Q-statistics "
                              "record(s) there (the run's training history)")
    try:
        history = json.loads(mpath.read_text(encoding="utf-8"))
        kept = [r for r in history if int(r["step"]) <= step]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{mpath}: unreadable ({' '.join(str(exc).split()) or type(exc).__name__})") from None
    if len(kept) != records:
        raise CheckpointError(f"{mpath}: holds {len(kept)} Q-statistics record(s) up to update {step}; the "
                              f"checkpoint expects {records}")
    return kept
