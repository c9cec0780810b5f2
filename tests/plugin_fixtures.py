"""Plugin objects for discovery tests: well-formed stand-ins and one broken plugin per defect.

Tests expose them as entry points (``EntryPoint(name, "plugin_fixtures:ATTR", group)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import KernelSpec, ParamSpec, PluginManifest, Requires

KERNEL = Path(__file__).parent / "flags" / "fixture_kernel.cu"


class Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    depth: int = Field(2, ge=1, description="How deep.")


class LooseOpts(BaseModel):  # no extra="forbid"
    depth: int = Field(2, description="How deep.")


class UndescribedOpts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    depth: int = 2


class EnabledOpts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Clashes with the flag file's switch.")


def manifest(name: str, position: int, hooks: tuple[str, ...], **kw: Any) -> PluginManifest:
    return PluginManifest(name=name, version="0.0.1", position=position, hooks=hooks,
                          options=kw.pop("options", Opts), description=f"test stand-in for {name}", **kw)


class Stub:
    """A plugin implementing ``q_stats`` (or more, through ``extra``)."""

    def __init__(self, m: Any, calls: int = 1) -> None:
        self.m, self.calls = m, calls

    @hookimpl
    def register_plugin(self, register):
        for _ in range(self.calls):
            register(self.m)

    @hookimpl
    def q_stats(self, ctx, record):
        ctx.state_of("stub")["seen"] = record.get("step")


class TauStub(Stub):
    @hookimpl
    def tau_update(self, ctx, mod, tau, dt):
        return None


class NoRegister:
    @hookimpl
    def q_stats(self, ctx, record):
        return None


class Misspelled(Stub):
    @hookimpl
    def q_stat(self, ctx, record):  # matches no hook: check_pending refuses it
        return None


class RaisesInRegister:
    @hookimpl
    def register_plugin(self, register):
        raise RuntimeError("no manifest today")


xlstm_context = Stub(manifest("xlstm_context", 8, ("q_stats",),
                              parameters=(ParamSpec(name="w", shape=("num_branches", 16), description="cell"),)))
rk4_tau = TauStub(manifest("rk4_tau", 9, ("q_stats", "tau_update"), requires=Requires(plugins=("xlstm_context",))))
extension = Stub(manifest("my_extension", 12, ("q_stats",), requires=Requires(core=">=0.1")))
extension_twin = Stub(manifest("other_extension", 12, ("q_stats",)))

no_register = NoRegister()
misspelled = Misspelled(manifest("misspelled", 20, ("q_stats",)))
raises = RaisesInRegister()
registers_twice = Stub(manifest("registers_twice", 21, ("q_stats",)), calls=2)
wrong_name = Stub(manifest("not_my_name", 22, ("q_stats",)))
wrong_position = Stub(manifest("kan_gate", 3, ("q_stats",)))
squatter = Stub(manifest("squatter", 4, ("q_stats",)))
undeclared_hook = TauStub(manifest("undeclared_hook", 23, ("q_stats",)))
missing_hook = Stub(manifest("missing_hook", 24, ("q_stats", "tau_update")))
unknown_hook = Stub(manifest("unknown_hook", 25, ("q_stats", "warp_drive")))
loose_options = Stub(manifest("loose_options", 26, ("q_stats",), options=LooseOpts))
undescribed = Stub(manifest("undescribed", 27, ("q_stats",), options=UndescribedOpts))
enabled_option = Stub(manifest("enabled_option", 28, ("q_stats",), options=EnabledOpts))
missing_kernel = Stub(manifest("missing_kernel", 29, ("q_stats",),
                               kernels=(KernelSpec(path=KERNEL.with_name("nope.cu"), functions=("k",)),)))
wrong_kernel = Stub(manifest("wrong_kernel", 30, ("q_stats",),
                             kernels=(KernelSpec(path=KERNEL, functions=("fixture_kernel", "absent_kernel")),)))
future_core = Stub(manifest("future_core", 31, ("q_stats",), requires=Requires(core=">=9.0")))
rk4_without_requirement = TauStub(manifest("rk4_tau", 9, ("q_stats", "tau_update")))
dict_manifest = Stub({"name": "dict_manifest", "version": "1.0", "position": 32, "hooks": ["q_stats"],
                      "options": Opts, "colour": "red"})


def install_stand_ins(monkeypatch: Any, *names: str) -> None:
    """Make discovery see the installed plugins plus the named stand-ins of this module (a stand-in
    takes the place of an installed plugin of the same name)."""
    from importlib.metadata import EntryPoint

    import foxhunt_core.plugins as plugins_mod

    real = plugins_mod.entry_points
    extra = [EntryPoint(n, f"plugin_fixtures:{n}", plugins_mod.ENTRY_POINT_GROUP) for n in names]
    monkeypatch.setattr(plugins_mod, "entry_points",
                        lambda group: [e for e in real(group=group) if e.name not in names] + extra)
    monkeypatch.delenv("FOXHUNT_PLUGINS", raising=False)
