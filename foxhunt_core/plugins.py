"""Plugin discovery, validation and calling.

Discovery (:func:`discover`) reads the entry-point group ``foxhunt.plugins``; the entry-point
name is the plugin's name. Each plugin is registered alone with a pluggy manager,
``pm.check_pending()`` runs (an implementation that matches no hook is an error), and its
``register_plugin`` hook is called with a ``register`` callback that receives its
:class:`~foxhunt_core.manifest.PluginManifest`. The core then checks every claim of the manifest
and owns naming, duplicates and ordering. A plugin that fails to import or to validate is kept
as a *problem* with its name and the reason; :meth:`Registry.check` turns the problems into one
:class:`PluginError` (one line per problem) so that a run stops before it trains.

Which entry points are loaded at all is filtered like pytest's ``-p no:NAME``: the environment
variable ``FOXHUNT_PLUGINS`` (comma-separated; ``NAME`` entries form an allow-list, ``no:NAME``
entries a block-list) and the flag file's ``load:`` list (same syntax).

:class:`PluginSet` holds the enabled plugins of a run: stages returned by several plugins are
ordered by the plugins' positions, never by pluggy's registration order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from . import __version__, hookspecs, signals
from .manifest import (
    DOCUMENTED_ORDER,
    DOCUMENTED_REQUIRES,
    PluginManifest,
    kernel_problems,
    options_model_problems,
    parameter_mismatches,
    parameter_spec_problems,
    position_problems,
    version_satisfies,
)

ENTRY_POINT_GROUP = "foxhunt.plugins"
ENV_VAR = "FOXHUNT_PLUGINS"
RESERVED_NAMES = frozenset({"core", "sigmoid_gate"})


class PluginError(RuntimeError):
    """A plugin could not be loaded or validated; ``str()`` is one line per problem, naming it."""


# ----------------------------------------------------------------------------- the set of a run
@dataclass(frozen=True)
class LoadedPlugin:
    name: str
    position: int
    obj: Any
    manifest: PluginManifest | None = None


class PluginSet:
    """The enabled plugins of a run, registered with pluggy, in rollout order."""

    def __init__(self, plugins: Iterable[LoadedPlugin] = ()) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: list[LoadedPlugin] = sorted(plugins, key=lambda p: (p.position, p.name))
        seen: set[str] = set()
        for p in self.plugins:
            if p.name in RESERVED_NAMES:
                raise PluginError(f"plugin {p.name!r} is reserved by the core")
            if p.name in seen:
                raise PluginError(f"plugin {p.name!r} is registered twice")
            seen.add(p.name)
            try:
                self.pm.register(p.obj, name=p.name)
            except ValueError as exc:
                raise PluginError(f"plugin {p.name!r}: {exc}") from exc
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {exc.plugin_name!r}: {exc}") from exc

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    def ordered(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call ``hook`` on each plugin in rollout order; the non-``None`` results with names."""
        out = []
        for p in self.plugins:
            others = [q.obj for q in self.plugins if q is not p]
            caller = self.pm.subset_hook_caller(hook, remove_plugins=others)
            res = caller(**kwargs)
            if isinstance(res, list):
                res = res[0] if res else None
            if res is not None:
                out.append((p.name, res))
        return out

    def first(self, hook: str, **kwargs: Any) -> Any:
        """The first non-``None`` result in rollout order (for ``firstresult`` hooks)."""
        res = self.ordered(hook, **kwargs)
        return res[0][1] if res else None

    def broadcast(self, hook: str, **kwargs: Any) -> None:
        """Call every implementation of ``hook`` in rollout order."""
        self.ordered(hook, **kwargs)

    def check_parameters(self, tree: Mapping[str, Mapping[str, Any]], settings: Any,
                         options: Mapping[str, Any] | None = None) -> None:
        """Raise :class:`PluginError` (one line per problem, naming the plugin) where the tensors
        the stages of a plugin created (``tree[name]``: post-attention, gate and branch-input
        stages alike) differ from its manifest's ``parameters`` for these settings and options.
        Plugins loaded without a manifest (embedding, tests) are not checked."""
        lines = []
        for p in self.plugins:
            if p.manifest is None:
                continue
            opts = (options or {}).get(p.name)
            if opts is None or isinstance(opts, dict):
                try:
                    opts = p.manifest.options.model_validate(opts or {})
                except ValidationError as exc:
                    lines.append(f"plugin {p.name!r}: options: {exc.errors()[0]['msg']}")
                    continue
            lines += [f"plugin {p.name!r}: {why}"
                      for why in parameter_mismatches(p.manifest, tree.get(p.name, {}), settings, opts)]
        if lines:
            raise PluginError("\n".join(lines))


# ----------------------------------------------------------------------------- filters
@dataclass(frozen=True)
class PluginFilter:
    """Allow- and block-lists, each tagged with where it came from (env variable, flag file)."""

    rules: tuple[tuple[str, frozenset[str] | None, frozenset[str]], ...] = ()

    @staticmethod
    def parse(items: Iterable[str], source: str) -> PluginFilter:
        """``["a", "no:b"]``: allow only ``a``, block ``b`` (``no:`` entries alone block only)."""
        only, block = set(), set()
        for raw in items:
            item = raw.strip()
            if not item:
                continue
            if item.startswith("no:"):
                block.add(item[3:].strip())
            else:
                only.add(item)
        return PluginFilter(((source, frozenset(only) if only else None, frozenset(block)),))

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> PluginFilter:
        value = (os.environ if environ is None else environ).get(ENV_VAR, "")
        return PluginFilter.parse(value.split(","), ENV_VAR) if value.strip() else PluginFilter()

    def __add__(self, other: PluginFilter) -> PluginFilter:
        return PluginFilter(self.rules + other.rules)

    def excluded(self, name: str) -> str | None:
        """Why ``name`` is not loaded, or ``None`` when it is."""
        for source, only, block in self.rules:
            if name in block:
                return f"blocked by {source}"
            if only is not None and name not in only:
                return f"not in the allow-list of {source}"
        return None


# ----------------------------------------------------------------------------- discovery
@dataclass(frozen=True)
class InstalledPlugin:
    """A plugin that imported and validated."""

    manifest: PluginManifest
    obj: Any
    distribution: str = ""

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def position(self) -> int:
        return self.manifest.position


@dataclass
class Registry:
    """The installed plugins after discovery: the valid ones, the broken ones, the filtered ones."""

    plugins: dict[str, InstalledPlugin] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)

    def ordered(self) -> list[InstalledPlugin]:
        return sorted(self.plugins.values(), key=lambda p: (p.position, p.name))

    def rollout_order(self) -> list[str]:
        """The documented order, then installed extensions by position."""
        ext = [p.name for p in self.ordered() if p.name not in DOCUMENTED_ORDER]
        return list(DOCUMENTED_ORDER) + ext

    def problem_lines(self) -> list[str]:
        return [
            f"plugin {name!r}: {reason}"
            + (f" (skip it with {ENV_VAR}=no:{name})" if i == len(reasons) - 1 else "")
            for name, reasons in sorted(self.problems.items())
            for i, reason in enumerate(reasons)
        ]

    def check(self) -> None:
        """Raise :class:`PluginError` when any loaded plugin failed to import or validate."""
        if self.problems:
            raise PluginError("\n".join(self.problem_lines()))

    def plugin_set(self, names: Iterable[str]) -> PluginSet:
        """The :class:`PluginSet` of the named (valid, installed) plugins."""
        out = []
        for name in names:
            if name not in self.plugins:
                installed = ", ".join(sorted(self.plugins)) or "none"
                raise PluginError(f"plugin {name!r} is not installed (installed: {installed})")
            p = self.plugins[name]
            out.append(LoadedPlugin(name, p.position, p.obj, p.manifest))
        return PluginSet(out)


def _dist_label(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else ep.value


def _collect_manifest(pm: pluggy.PluginManager, name: str) -> tuple[PluginManifest | None, list[str]]:
    declared: list[Any] = []
    if not pm.hook.register_plugin.get_hookimpls():
        return None, ["does not implement the register_plugin hook"]
    try:
        pm.hook.register_plugin(register=declared.append)
    except Exception as exc:  # noqa: BLE001 - the plugin's own failure, reported by name
        return None, [f"register_plugin raised {type(exc).__name__}: {exc}".splitlines()[0]]
    if len(declared) != 1:
        return None, [f"register_plugin must call register() once, called it {len(declared)} times"]
    m = declared[0]
    if isinstance(m, PluginManifest):
        return m, []
    try:
        return PluginManifest.model_validate(m), []
    except ValidationError as exc:
        return None, [f"manifest.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]


def validate_plugin(name: str, obj: Any) -> tuple[PluginManifest | None, list[str]]:
    """Register ``obj`` alone, run ``check_pending`` and verify its manifest; ``(manifest, problems)``."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        pm.register(obj, name=name)
        pm.check_pending()
    except (ValueError, pluggy.PluginValidationError) as exc:
        return None, [str(exc).splitlines()[0]]
    m, problems = _collect_manifest(pm, name)
    if m is None:
        return None, problems
    if m.name != name:
        problems.append(f"manifest name {m.name!r} differs from its entry-point name")
    problems += position_problems(name, m.position)
    implemented = {hc.name for hc in (pm.get_hookcallers(obj) or [])} - {hookspecs.REGISTRATION_HOOK}
    unknown = sorted(set(m.hooks) - set(hookspecs.ALL_HOOKS))
    if unknown:
        problems.append(f"declares unknown hooks {unknown}")
    missing = sorted(set(m.hooks) - implemented - set(unknown))
    if missing:
        problems.append(f"declares hooks it does not implement: {missing}")
    undeclared = sorted(implemented - set(m.hooks))
    if undeclared:
        problems.append(f"implements hooks its manifest does not declare: {undeclared}")
    problems += options_model_problems(m.options)
    problems += parameter_spec_problems(m)
    for k in m.kernels:
        problems += kernel_problems(k)
    if m.requires.core and not version_satisfies(__version__, m.requires.core):
        problems.append(f"requires foxhunt-core {m.requires.core}, this is {__version__}")
    need = set(DOCUMENTED_REQUIRES.get(name, ())) - set(m.requires.plugins)
    if need:
        problems.append(f"must declare the documented requirement on {sorted(need)}")
    if name in m.requires.plugins:
        problems.append("requires itself")
    problems += signals.manifest_problems(m.provides, m.consumes)
    return m, problems


def discover(
    plugin_filter: PluginFilter | None = None,
    eps: Iterable[EntryPoint] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Registry:
    """Load and validate every installed plugin the filters allow (``FOXHUNT_PLUGINS`` included).

    ``eps`` replaces the installed entry points (tests, embedding). Never raises for a broken
    plugin: see :attr:`Registry.problems` and :meth:`Registry.check`.
    """
    flt = PluginFilter.from_env(environ) + (plugin_filter or PluginFilter())
    found = list(entry_points(group=ENTRY_POINT_GROUP)) if eps is None else list(eps)
    by_name: dict[str, list[EntryPoint]] = {}
    for ep in found:
        by_name.setdefault(ep.name, []).append(ep)
    reg = Registry()
    for name, group in sorted(by_name.items()):
        why = flt.excluded(name)
        if why is not None:
            reg.excluded[name] = why
            continue
        if len(group) > 1:
            reg.problems[name] = [f"installed twice ({', '.join(_dist_label(e) for e in group)})"]
            continue
        if name in RESERVED_NAMES:
            reg.problems[name] = ["the name is reserved by the core"]
            continue
        if name.startswith("model_") or hasattr(BaseModel, name):
            reg.problems[name] = ["the name clashes with the flag-file schema (a pydantic attribute)"]
            continue
        ep = group[0]
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is reported by name
            reg.problems[name] = [f"failed to import {ep.value}: {type(exc).__name__}: {exc}".splitlines()[0]]
            continue
        manifest, problems = validate_plugin(name, obj)
        if problems or manifest is None:
            reg.problems[name] = problems
            continue
        reg.plugins[name] = InstalledPlugin(manifest, obj, _dist_label(ep))
    by_pos: dict[int, list[str]] = {}
    for p in reg.plugins.values():
        by_pos.setdefault(p.position, []).append(p.name)
    for pos, names in by_pos.items():
        if len(names) > 1:
            for n in names:
                others = sorted(set(names) - {n})
                reg.problems.setdefault(n, []).append(f"position {pos} is also claimed by {others}")
                reg.plugins.pop(n, None)
    for n, clash in signals.provider_clashes({k: p.manifest for k, p in reg.plugins.items()}).items():
        reg.problems.setdefault(n, []).extend(clash)
        reg.plugins.pop(n, None)
    return reg


def load_entry_point_plugins(enabled: Iterable[str], registry: Registry | None = None) -> list[LoadedPlugin]:
    """The named plugins from the ``foxhunt.plugins`` group, after full validation.

    Raises :class:`PluginError` for any broken installed plugin or a name that is not installed.
    """
    reg = registry or discover()
    reg.check()
    return reg.plugin_set(enabled).plugins

