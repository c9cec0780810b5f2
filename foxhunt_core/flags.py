"""Flag files: which plugins a run enables, with their options, and overrides of run settings.

::

    version: 1              # schema version of the flag file (required)
    stage: 2                # informative; the enabled set is what counts
    out_of_order: null      # a reason, when enabling plugins out of the documented order
    load: []                # entry points to load: NAME (allow-list) or no:NAME (block-list)
    run:                    # overrides of foxhunt_core.config.RunSettings
      seed: 0
      train: {steps: 3000}
    plugins:
      q_mean_center: {enabled: true}
      atom_entropy: {enabled: true, utilization_threshold: 0.5}

The schema is a pydantic model built from the run settings and each installed plugin's options
model (:func:`flag_model`). Beyond the schema: an unknown plugin is an error that lists the
installed ones; a plugin enabled before its predecessors in the rollout order is an error unless
``out_of_order`` gives a reason; an enabled plugin whose required plugins are not enabled is an
error, and so is one that consumes a signal no enabled plugin before it provides
(:mod:`foxhunt_core.signals`). Every problem is reported on one line, ``file:line: path.to.field: message``
(:class:`FlagError`); YAML is read safely and under limits (:mod:`foxhunt_core.flagyaml`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from . import validation
from .config import RunSettings
from .flagyaml import MAX_BYTES, YamlDoc, YamlProblem, read_yaml
from .plugins import PluginFilter, Registry, discover
from .safeio import FileProblem, read_regular
from .signals import wiring_problems

SCHEMA_VERSION = 1
MAX_FLAG_BYTES = MAX_BYTES


class FlagError(ValueError):
    """A flag file is invalid; ``problems`` (and ``str()``) are one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _problem(path: str, line: int, loc: tuple[Any, ...], msg: str) -> str:
    where = ".".join(str(p) for p in loc) or "<root>"
    return f"{path}:{line}: {where}: {' '.join(str(msg).split())}"


# ----------------------------------------------------------------------------- the schema
class FlagFileBase(BaseModel):
    """The plugin-independent part of a flag file."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(description=f"Schema version of the flag file; this foxhunt reads {SCHEMA_VERSION}.")
    stage: int = Field(0, ge=0, description="Rollout stage this file describes (informative; the enabled set counts).")
    out_of_order: str | None = Field(
        None, min_length=1,
        description="Why plugins are enabled out of the documented rollout order (required to do so).",
    )
    load: list[str] = Field(
        default_factory=list,
        description="Which installed plugins are loaded at all: NAME entries form an allow-list, no:NAME a block-list.",
    )
    run: RunSettings = Field(default_factory=RunSettings, description="Overrides of the run settings.")

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"unsupported flag-file version {v} (this foxhunt reads version {SCHEMA_VERSION})")
        return v

    @field_validator("out_of_order")
    @classmethod
    def _reason(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("out_of_order needs a reason")
        return v


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def flag_model(registry: Registry) -> type[FlagFileBase]:
    """The flag-file model for the plugins of ``registry`` (their option models plus ``enabled``)."""
    fields: dict[str, Any] = {}
    for p in registry.ordered():
        m = p.manifest
        entry = create_model(
            f"{_camel(m.name)}Flags",
            __base__=m.options,
            __doc__=f"{m.name} {m.version} (position {m.position}): {m.description}",
            enabled=(bool, Field(False, description=f"Enable {m.name} in this run.")),
        )
        fields[m.name] = (entry | None, Field(None, description=m.description or m.name))
    for name, why in sorted(registry.excluded.items()):
        fields[name] = (dict[str, Any] | None, Field(None, description=f"Not loaded ({why})."))
    plugins = create_model("Plugins", __config__=ConfigDict(extra="forbid"), __doc__="Per-plugin switches and options.",
                           **fields)
    return create_model(
        "FlagFile", __base__=FlagFileBase, __doc__="A foxhunt flag file.",
        plugins=(plugins, Field(default_factory=plugins, description="Per-plugin switches and options.")),
    )


def json_schema(registry: Registry) -> dict[str, Any]:
    """JSON Schema of flag files for the installed plugins (for editors)."""
    schema = flag_model(registry).model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


# ----------------------------------------------------------------------------- the result
@dataclass
class Flags:
    """A validated flag file."""

    path: str
    text: str
    sha256: str
    settings: RunSettings
    enabled: list[str]
    """Enabled plugins, in rollout order."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """JSON-able options of each enabled plugin (defaults filled in)."""
    stage: int = 0
    option_models: dict[str, BaseModel] = field(default_factory=dict)
    """The validated options model of each enabled plugin (what hooks read)."""
    out_of_order: str | None = None
    raw_run: dict[str, Any] = field(default_factory=dict)
    """The ``run:`` block as written."""
    registry: Registry | None = field(default=None, repr=False, compare=False)
    """The plugins the file was validated against."""
    doc: YamlDoc | None = field(default=None, repr=False, compare=False)
    """The parsed YAML (the line of every key, for problems found later)."""


def _fields_of(model: Any, loc: tuple[Any, ...]) -> list[str] | None:
    """Field names of the model at ``loc`` inside ``model`` (for "unknown key" messages)."""
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        subs = [a for a in get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = subs[0] if subs else ann
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return None


def _message(err: dict[str, Any], model: type[BaseModel], registry: Registry) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        if len(loc) == 2 and loc[0] == "plugins":
            installed = ", ".join(sorted(registry.plugins)) or "none"
            return f"unknown plugin {loc[1]!r} (installed: {installed})"
        known = _fields_of(model, loc[:-1])
        if known is not None:
            return f"unknown key (expected one of: {', '.join(known)})"
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")


def _semantic_problems(ff: Any, doc: YamlDoc, path: str, registry: Registry) -> list[str]:
    out = []
    entries = {n: e for n, e in ff.plugins if e is not None}
    on = [n for n, e in entries.items() if (e.get("enabled") if isinstance(e, dict) else e.enabled)]
    flt = PluginFilter.parse(ff.load, "this file's load: list")

    def where(name: str) -> tuple[int, tuple[Any, ...]]:
        loc = ("plugins", name, "enabled")
        return doc.line_of(loc), loc

    order = registry.rollout_order()
    for name in on:
        line, loc = where(name)
        why = registry.excluded.get(name) or flt.excluded(name)
        if why is not None:
            out.append(_problem(path, line, loc, f"plugin {name!r} is enabled but not loaded ({why})"))
            continue
        missing = [p for p in order[: order.index(name)] if p not in on]
        if missing and ff.out_of_order is None:
            out.append(_problem(path, line, loc,
                                f"{name} is enabled before {', '.join(missing)} in the documented rollout order; "
                                'enable those first or give out_of_order: "<reason>"'))
        for req in registry.plugins[name].manifest.requires.plugins:
            if req not in on:
                state = "not enabled" if req in registry.plugins else "not installed"
                out.append(_problem(path, line, loc, f"{name} requires plugin {req!r}, which is {state}"))
    loaded = [(n, registry.plugins[n].manifest) for n in order if n in on and n in registry.plugins]
    for w in wiring_problems(loaded, {n: p.manifest for n, p in registry.plugins.items()}):
        missing_req = {r for r in registry.plugins[w.consumer].manifest.requires.plugins if r not in on}
        if not missing_req & set(w.providers):  # else the missing requirement's line already says it
            line, loc = where(w.consumer)
            out.append(_problem(path, line, loc, w.message))
    return out


def parse_flags(text: str, path: str = "<flags>", registry: Registry | None = None,
                base: Path | None = None) -> Flags:
    """Validate flag-file text against the installed plugins; raises :class:`FlagError`.

    Without ``registry`` the plugins are discovered (honouring ``FOXHUNT_PLUGINS`` and the
    file's ``load:`` list); a broken plugin raises :class:`~foxhunt_core.plugins.PluginError`.
    With ``base``, relative data paths of ``run.market`` are taken relative to it (the flag
    file's directory) and come back absolute in ``settings``.
    """
    try:
        doc = read_yaml(text)
    except YamlProblem as exc:
        raise FlagError([_problem(path, exc.line, exc.path, exc.message)]) from None
    if doc.data is None:
        raise FlagError([_problem(path, 1, (), f"empty flag file (it needs at least 'version: {SCHEMA_VERSION}')")])
    if not isinstance(doc.data, dict):
        raise FlagError([_problem(path, doc.line_of(()), (), f"expected a mapping, got {type(doc.data).__name__}")])
    if registry is None:
        load = doc.data.get("load")
        flt = PluginFilter.parse(load, "the flag file's load: list") if isinstance(load, list) and all(
            isinstance(x, str) for x in load) else PluginFilter()
        registry = discover(flt)
        registry.check()
    model = flag_model(registry)
    data = doc.data
    if base is not None and isinstance(data.get("run"), dict):
        from .market.source import resolve_paths

        data = {**data, "run": resolve_paths(data["run"], base)}
    written = validation.scalar_problems(model, data) + validation.non_finite_problems(data)
    try:
        ff = model.model_validate(data)
    except ValidationError as exc:
        said = dict(written)  # where a written value is of the wrong type, that is the better message
        errors = [e for e in exc.errors()  # a model's own check that failed on a value refused here
                  if not (e["type"] == "value_error" and any(loc[:len(e["loc"])] == tuple(e["loc"]) for loc in said))]
        problems = [_problem(path, doc.line_of(tuple(e["loc"])), tuple(e["loc"]),
                             said.pop(tuple(e["loc"]), None) or _message(e, model, registry)) for e in errors]
        raise FlagError(list(dict.fromkeys(problems + validation.lines(list(said.items()), path, doc.line_of)))) \
            from None
    problems = validation.lines(written, path, doc.line_of) + _semantic_problems(ff, doc, path, registry)
    if not written:
        problems += validation.lines(validation.settings_problems(ff.run), path, doc.line_of, ("run",))
    if problems:
        raise FlagError(problems)
    on = {n for n, e in ff.plugins if isinstance(e, BaseModel) and e.enabled}
    enabled = [n for n in registry.rollout_order() if n in on]
    models: dict[str, BaseModel] = {}
    for n in enabled:
        opts = registry.plugins[n].manifest.options
        models[n] = opts.model_validate(getattr(ff.plugins, n).model_dump(exclude={"enabled"}))
    raw_run = doc.data.get("run") if isinstance(doc.data.get("run"), dict) else {}
    return Flags(
        path=path, text=text, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(), settings=ff.run,
        enabled=enabled, options={n: m.model_dump(mode="json") for n, m in models.items()}, stage=ff.stage,
        option_models=models, out_of_order=ff.out_of_order, raw_run=raw_run, registry=registry, doc=doc,
    )


def load_flags(path: str | Path, registry: Registry | None = None) -> Flags:
    """Read and validate a flag file (see :func:`parse_flags`)."""
    p = Path(path)
    try:
        raw = read_regular(p, MAX_FLAG_BYTES)
    except FileProblem as exc:
        raise FlagError([_problem(str(p), 1, (), str(exc))]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise FlagError([_problem(str(p), line, (), f"not UTF-8 text (byte {exc.start}: {exc.reason})")]) from None
    return parse_flags(text, str(p), registry, base=p.resolve().parent)


# ----------------------------------------------------------------------------- tools
def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


def _changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [f"~ {k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def diff_flags(a: Flags, b: Flags, registry: Registry) -> list[str]:
    """What changes from ``a`` to ``b``: enabled plugins, plugin options, run settings."""
    out = []
    for name in registry.rollout_order():
        if (name in a.enabled) != (name in b.enabled):
            out.append(f"{'+' if name in b.enabled else '-'} plugins.{name}: "
                       f"{'enabled' if name in b.enabled else 'disabled'}")
    for name in registry.rollout_order():
        if name not in a.enabled and name not in b.enabled:
            continue
        default = registry.plugins[name].manifest.options().model_dump(mode="json")
        fa = _flatten(f"plugins.{name}", a.options.get(name, default), {})
        fb = _flatten(f"plugins.{name}", b.options.get(name, default), {})
        out += _changes(fa, fb)
    out += _changes(_flatten("run", a.settings.model_dump(mode="json"), {}),
                    _flatten("run", b.settings.model_dump(mode="json"), {}))
    if a.out_of_order != b.out_of_order:
        out.append(f"~ out_of_order: {a.out_of_order!r} -> {b.out_of_order!r}")
    return out


def stage_text(stage: int, registry: Registry, run: dict[str, Any] | None = None) -> str:
    """The flag file of rollout stage ``stage``: positions 1..stage enabled with default options."""
    order = registry.rollout_order()
    if not 0 <= stage <= len(order):
        raise FlagError([f"<stage>:1: stage: must be between 0 and {len(order)}"])
    missing = [n for n in order[:stage] if n not in registry.plugins]
    if missing:
        installed = ", ".join(p.name for p in registry.ordered()) or "none"
        raise FlagError([f"<stage>:1: stage: stage {stage} needs {', '.join(missing)}, not installed "
                         f"(installed: {installed})"])
    plugins = {n: {"enabled": True, **registry.plugins[n].manifest.options().model_dump(mode="json")}
               for n in order[:stage]}
    doc = {"version": SCHEMA_VERSION, "stage": stage, "run": run if run is not None else {"seed": 0},
           "plugins": plugins}
    what = (f"the core engine with {', '.join(order[:stage])} (positions 1..{stage} of the documented\n"
            f"# rollout order), default options" if stage else "the core engine alone (no plugins)")
    head = f"# Stage {stage}: {what}. Generated by `foxhunt flags stage {stage}`.\n"
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
