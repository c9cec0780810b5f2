"""Plugin discovery and calling: a pluggy manager whose plugins carry a rollout position.

Plugins come from the entry-point group ``foxhunt.plugins`` or are passed in directly (tests,
embedding). The core owns naming, duplicates and ordering: stages returned by several plugins
are ordered by the plugins' positions, never by pluggy's registration order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pluggy

from . import hookspecs

ENTRY_POINT_GROUP = "foxhunt.plugins"
RESERVED_NAMES = frozenset({"core", "sigmoid_gate"})


class PluginError(RuntimeError):
    """A plugin could not be loaded or validated; the message names it."""


@dataclass(frozen=True)
class LoadedPlugin:
    name: str
    position: int
    obj: Any


class PluginSet:
    """The enabled plugins of a run, registered with pluggy, in rollout order."""

    def __init__(self, plugins: Iterable[LoadedPlugin] = ()) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: list[LoadedPlugin] = sorted(plugins, key=lambda p: (p.position, p.name))
        seen: set[str] = set()
        for p in self.plugins:
            if p.name in RESERVED_NAMES:
                raise PluginError(f"plugin name {p.name!r} is reserved by the core")
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


def load_entry_point_plugins(enabled: Iterable[str]) -> list[LoadedPlugin]:
    """Load the named plugins from the ``foxhunt.plugins`` entry-point group.

    A plugin module exposes ``POSITION`` (its place in the rollout order) and hook
    implementations. Raises :class:`PluginError` naming the plugin for a missing or broken one.
    """
    wanted = list(enabled)
    eps = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    out = []
    for name in wanted:
        if name not in eps:
            installed = ", ".join(sorted(eps)) or "none"
            raise PluginError(f"plugin {name!r} is not installed (installed: {installed})")
        try:
            obj = eps[name].load()
        except Exception as exc:  # noqa: BLE001 - any import failure is reported by name
            raise PluginError(f"plugin {name!r} failed to import: {type(exc).__name__}: {exc}") from exc
        out.append(LoadedPlugin(name, int(getattr(obj, "POSITION", 1_000)), obj))
    return out
