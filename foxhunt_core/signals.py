"""Typed signals between interval plugins: named floats one plugin provides and others consume.

A plugin's manifest declares the signals it ``provides`` (:class:`SignalSpec`: a name, what the
value means, its value before the first publication) and the names it ``consumes``. The core
checks the wiring before a run trains: every consumed signal must be provided by an enabled
plugin earlier in the rollout order (:func:`wiring_problems`; a flag file that breaks it is
refused, one line per problem, naming the consumer and the provider). During a run the plugins
exchange values through :class:`Signals` on the run context (``ctx.signals``), which refuses a
name the calling plugin has not declared, so the manifests say exactly who talks to whom.

Interval hooks run in rollout order and in the order ``q_stats``, ``tau_update``,
``entropy_coefficient`` within an interval, so a value published in ``q_stats`` is read in the
same interval's ``tau_update``; a value keeps its last publication until the next one. The
trainer writes every signal into each Q-statistics record under its own name (so into
``metrics.json``, where rollout gates and reports read it, and where the core's non-finite check
sees it) and saves the values in checkpoints, so a resumed run reads what it would have read.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

if TYPE_CHECKING:
    from .manifest import PluginManifest

SIGNAL_PATTERN = r"^[a-z][a-z0-9_]{1,47}$"
SignalName = Annotated[str, StringConstraints(pattern=SIGNAL_PATTERN)]

CORE_RECORD_KEYS = frozenset({
    "step", "env_steps", "loss", "aux_loss", "entropy", "grad_norm", "q_min", "q_max", "q_mean", "q_var",
    "raw_q_mean", "raw_q_drift", "atom_entropy", "atom_utilization", "avg_max_q", "entropy_coeff",
    "liquid_mod", "iqn_readiness",
})
"""Keys the core writes into a Q-statistics record (``q_gap_<d>`` too): no signal may take one."""


class SignalError(ValueError):
    """A plugin used a signal it has not declared, or the declared wiring is broken (one line)."""


class SignalSpec(BaseModel):
    """One float signal a plugin provides."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: SignalName = Field(description="Signal name; also its key in Q-statistics records and metrics.json.")
    description: str = Field(min_length=1, description="What the value means, with its unit or range.")
    initial: float = Field(0.0, allow_inf_nan=False, description="The value before the first publication.")


def reserved(name: str) -> bool:
    """Whether ``name`` is a key the core itself writes into Q-statistics records."""
    return name in CORE_RECORD_KEYS or (name.startswith("q_gap_") and name[6:].isdigit())


# ----------------------------------------------------------------------------- checks
def manifest_problems(provides: Iterable[SignalSpec], consumes: Iterable[str]) -> list[str]:
    """What is wrong with one manifest's signal declarations (empty list: nothing)."""
    out = []
    names = [s.name for s in provides]
    eaten = list(consumes)
    for n in sorted({n for n in names if names.count(n) > 1}):
        out.append(f"provides signal {n!r} twice")
    for n in sorted({n for n in eaten if eaten.count(n) > 1}):
        out.append(f"consumes signal {n!r} twice")
    for n in names:
        if reserved(n):
            out.append(f"signal name {n!r} is a key the core writes into Q-statistics records")
    for n in sorted(set(names) & set(eaten)):
        out.append(f"consumes signal {n!r}, which it provides itself")
    return out


def provider_clashes(manifests: Mapping[str, PluginManifest]) -> dict[str, list[str]]:
    """Signals provided by more than one installed plugin: ``{plugin: [problem, ...]}``."""
    by_signal: dict[str, list[str]] = {}
    for name, m in manifests.items():
        for s in m.provides:
            by_signal.setdefault(s.name, []).append(name)
    out: dict[str, list[str]] = {}
    for sig, owners in sorted(by_signal.items()):
        if len(owners) > 1:
            for n in owners:
                others = sorted(set(owners) - {n})
                out.setdefault(n, []).append(f"signal {sig!r} is also provided by {others}")
    return out


@dataclass(frozen=True)
class WiringProblem:
    """A consumed signal without an enabled provider earlier in the order."""

    consumer: str
    signal: str
    providers: tuple[str, ...]
    """Installed plugins that provide the signal (none: no installed plugin does)."""
    message: str


def wiring_problems(
    enabled: Iterable[tuple[str, PluginManifest | None]],
    installed: Mapping[str, PluginManifest] | None = None,
) -> list[WiringProblem]:
    """Consumed signals without an enabled provider earlier in ``enabled`` (given in rollout order).

    ``installed`` (all installed plugins' manifests) only sharpens the message: it names a
    provider that is installed but not enabled.
    """
    seq = [(n, m) for n, m in enabled]
    order = {n: i for i, (n, _) in enumerate(seq)}
    provider: dict[str, str] = {}
    for n, m in seq:
        for s in (m.provides if m is not None else ()):
            provider.setdefault(s.name, n)
    known = dict(installed or {})
    known.update({n: m for n, m in seq if m is not None})
    out = []
    for n, m in seq:
        for sig in (m.consumes if m is not None else ()):
            p = provider.get(sig)
            if p is not None and order[p] < order[n]:
                continue
            if p is not None:
                out.append(WiringProblem(n, sig, (p,), f"{n} consumes signal {sig!r} provided by {p}, which comes "
                                                      "after it in the rollout order (a provider must run first)"))
                continue
            owners = tuple(sorted(k for k, km in known.items() if any(s.name == sig for s in km.provides)))
            if owners:
                msg = f"{n} consumes signal {sig!r} provided by {', '.join(owners)}, which is not enabled"
            else:
                msg = f"{n} consumes signal {sig!r}, which no installed plugin provides"
            out.append(WiringProblem(n, sig, owners, msg))
    return out


# ----------------------------------------------------------------------------- the channel
@dataclass
class Signals:
    """The signal values of a run and who may publish or read each one."""

    specs: dict[str, SignalSpec] = field(default_factory=dict)
    provider: dict[str, str] = field(default_factory=dict)
    """Signal name -> the plugin that provides it."""
    consumes: dict[str, frozenset[str]] = field(default_factory=dict)
    """Plugin name -> the signals it consumes."""
    values: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of_plugins(cls, plugins: Iterable[tuple[str, PluginManifest | None]]) -> Signals:
        """The channel of the enabled plugins, given in rollout order; raises :class:`SignalError`
        when a consumed signal has no provider earlier in that order."""
        seq = list(plugins)
        problems = wiring_problems(seq)
        if problems:
            raise SignalError(problems[0].message)
        out = cls()
        for name, m in seq:
            if m is None:
                continue
            for s in m.provides:
                out.specs[s.name], out.provider[s.name], out.values[s.name] = s, name, float(s.initial)
            out.consumes[name] = frozenset(m.consumes)
        return out

    def publish(self, plugin: str, name: str, value: float) -> None:
        """Set signal ``name``, which ``plugin`` must provide, to the real number ``value``."""
        if self.provider.get(name) != plugin:
            owner = self.provider.get(name)
            who = f"it is provided by {owner}" if owner else "no enabled plugin provides it"
            raise SignalError(f"plugin {plugin!r} published signal {name!r}, which its manifest does not "
                              f"provide ({who})")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise SignalError(f"plugin {plugin!r} published signal {name!r} as {type(value).__name__}, "
                              "not a real number")
        self.values[name] = float(value)

    def read(self, plugin: str, name: str) -> float:
        """The current value of ``name``, which ``plugin`` must consume (or provide)."""
        if name not in self.consumes.get(plugin, frozenset()) and self.provider.get(name) != plugin:
            raise SignalError(f"plugin {plugin!r} read signal {name!r}, which its manifest does not consume")
        return self.values[name]

    def snapshot(self) -> dict[str, float]:
        """The current values, by signal name (what records and checkpoints hold)."""
        return dict(self.values)

    def write_into(self, record: dict[str, object]) -> None:
        """Copy the values into a Q-statistics record; a name the record already holds is an error."""
        clash = sorted(set(record) & set(self.values))
        if clash:
            raise SignalError(f"signal {clash[0]!r} clashes with a key of the Q-statistics record")
        record.update(self.values)

    def load(self, values: Mapping[str, float], source: str = "checkpoint") -> None:
        """Restore values saved by :meth:`snapshot` (a signal not in them keeps its initial value)."""
        unknown = sorted(set(values) - set(self.values))
        if unknown:
            raise SignalError(f"{source}: signal {unknown[0]!r} is provided by none of this run's plugins")
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise SignalError(f"{source}: signal {k!r} holds {v!r}, not a number")
            self.values[k] = float(v)
