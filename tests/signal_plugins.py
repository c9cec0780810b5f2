"""Interval plugins that talk through signals, for the tests of :mod:`foxhunt_core.signals`.

Tests expose them as entry points (``EntryPoint(name, "signal_plugins:ATTR", group)``) or put
them in a :class:`~foxhunt_core.plugins.PluginSet` with their manifests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from plugin_fixtures import Opts

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import PluginManifest
from foxhunt_core.signals import SignalSpec

PULSE = SignalSpec(name="pulse", description="q_var of the interval plus the step / 1000.", initial=-1.0)


def manifest(name: str, position: int, hooks: tuple[str, ...], **kw: Any) -> PluginManifest:
    return PluginManifest(name=name, version="0.0.1", position=position, hooks=hooks, options=Opts,
                          description=f"signal test plugin {name}", **kw)


class Source:
    """Publishes ``pulse`` in ``q_stats``."""

    def __init__(self, m: PluginManifest) -> None:
        self.m = m

    @hookimpl
    def register_plugin(self, register):
        register(self.m)

    @hookimpl
    def q_stats(self, ctx, record):
        ctx.signals.publish(self.m.name, "pulse", record["q_var"] + ctx.step / 1000.0)


class Sink:
    """Reads ``pulse`` in ``tau_update`` and lets it slow the liquid-tau relaxation."""

    def __init__(self, m: PluginManifest) -> None:
        self.m = m

    @hookimpl
    def register_plugin(self, register):
        register(self.m)

    @hookimpl
    def tau_update(self, ctx, mod, tau, dt):
        pulse = ctx.signals.read(self.m.name, "pulse")
        ctx.state_of(self.m.name).setdefault("read", []).append(pulse)
        return 1.0 - (1.0 - mod) * np.exp(-dt / (tau * (1.0 + abs(pulse))))


class Intruder(Sink):
    """Publishes a signal its manifest does not provide."""

    @hookimpl
    def tau_update(self, ctx, mod, tau, dt):
        ctx.signals.publish(self.m.name, "pulse", 0.0)


signal_source = Source(manifest("signal_source", 12, ("q_stats",), provides=(PULSE,)))
signal_sink = Sink(manifest("signal_sink", 13, ("tau_update",), consumes=("pulse",)))
signal_early_sink = Sink(manifest("signal_early_sink", 11, ("tau_update",), consumes=("pulse",)))
signal_twin = Source(manifest("signal_twin", 14, ("q_stats",), provides=(PULSE,)))
signal_reserved = Source(manifest("signal_reserved", 15, ("q_stats",),
                                  provides=(SignalSpec(name="loss", description="clashes with the core"),)))
signal_greedy = Sink(manifest("signal_greedy", 16, ("tau_update",), provides=(PULSE,), consumes=("pulse",)))
signal_intruder = Intruder(manifest("signal_intruder", 17, ("tau_update",)))
