"""Flag files: which plugins a run enables, with their options, and overrides of run settings.

::

    version: 1
    stage: 0            # informative; the enabled set is what counts
    run:                # optional overrides of foxhunt_core.config.RunSettings
      seed: 0
      train: {steps: 3000}
    plugins:
      q_mean_center: {enabled: true}

Only safe YAML is read. Errors are :class:`FlagError` with one line per problem,
``file: path.to.field: message``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config import RunSettings

MAX_FLAG_BYTES = 256 * 1024


class FlagError(ValueError):
    """A flag file is invalid; ``str()`` is one line per problem."""


class PluginFlags(BaseModel):
    model_config = ConfigDict(extra="allow")
    enabled: bool = Field(False, description="Whether the plugin is part of this run.")


class FlagFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(1, ge=1, le=1, description="Schema version of the flag file.")
    stage: int = Field(0, ge=0, description="Rollout stage this file describes (informative).")
    out_of_order: str | None = Field(None, description="Reason for enabling plugins out of the documented order.")
    run: dict[str, Any] = Field(default_factory=dict, description="Overrides of the run settings.")
    plugins: dict[str, PluginFlags] = Field(default_factory=dict, description="Per-plugin switches and options.")


@dataclass
class Flags:
    """A validated flag file."""

    path: str
    text: str
    sha256: str
    settings: RunSettings
    enabled: list[str]
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage: int = 0


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _fmt(path: str, exc: ValidationError, prefix: tuple[str, ...] = ()) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in prefix + tuple(err["loc"])) or "<root>"
        lines.append(f"{path}: {loc}: {err['msg']}")
    return "\n".join(lines)


def parse_flags(text: str, path: str = "<flags>") -> Flags:
    """Validate flag-file text; raises :class:`FlagError`."""
    if len(text.encode("utf-8", "replace")) > MAX_FLAG_BYTES:
        raise FlagError(f"{path}: <root>: file is larger than {MAX_FLAG_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise FlagError(f"{where}: <root>: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise FlagError(f"{path}: <root>: expected a mapping, got {type(doc).__name__}")
    try:
        ff = FlagFile.model_validate(doc)
    except ValidationError as exc:
        raise FlagError(_fmt(path, exc)) from None
    try:
        settings = RunSettings.model_validate(_merge(RunSettings().model_dump(), ff.run))
    except ValidationError as exc:
        raise FlagError(_fmt(path, exc, ("run",))) from None
    enabled = [n for n, p in ff.plugins.items() if p.enabled]
    options = {n: {k: v for k, v in p.model_dump().items() if k != "enabled"} for n, p in ff.plugins.items()}
    return Flags(
        path=path,
        text=text,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        settings=settings,
        enabled=enabled,
        options=options,
        stage=ff.stage,
    )


def load_flags(path: str | Path) -> Flags:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise FlagError(f"{p}: <root>: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FlagError(f"{p}: <root>: not UTF-8 text (byte {exc.start})") from None
    return parse_flags(text, str(p))
