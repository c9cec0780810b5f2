"""What a plugin declares about itself, and the documented rollout order the core holds.

A plugin's module implements the ``register_plugin`` hook and calls ``register(manifest)`` with a
:class:`PluginManifest`: name, version, rollout position, the hooks it implements, its options
model, its parameter tensors, its kernels, its requirements and the signals it provides and
consumes (:mod:`foxhunt_core.signals`). The core checks every claim
(:func:`foxhunt_core.plugins.discover`); this module holds the models and the pure checks.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .config import RunSettings
from .signals import SignalName, SignalSpec

DOCUMENTED_ORDER: tuple[str, ...] = (
    "q_mean_center",
    "atom_entropy",
    "quantile_select",
    "graph_message",
    "kan_gate",
    "diffusion_refine",
    "tlob_inject",
    "xlstm_context",
    "rk4_tau",
)
"""The rollout order of DESIGN.md: ``DOCUMENTED_ORDER[p - 1]`` owns position ``p``."""

DOCUMENTED_REQUIRES: dict[str, tuple[str, ...]] = {"rk4_tau": ("xlstm_context",)}
"""Requirements the design fixes; a plugin of that name must declare at least these."""

RESERVED_OPTION_NAMES = frozenset({"enabled"})
NAME_PATTERN = r"^[a-z][a-z0-9_]{1,47}$"

_DIMENSIONS = {
    "num_actions": lambda s: int(sum(s.net.branch_sizes)),
    "num_branches": lambda s: len(s.net.branch_sizes),
    "num_atoms": lambda s: s.net.num_atoms,
    "state_dim": lambda s: s.net.state_dim,
    "shared_h1": lambda s: s.net.shared_h1,
    "shared_h2": lambda s: s.net.shared_h2,
    "adv_h": lambda s: s.net.adv_h,
    "attn_dim": lambda s: s.net.attn_dim,
}
# NetSettings.branch_sizes has four entries (direction, magnitude, order, urgency).
_DIMENSIONS.update({f"branch_size_{d}": (lambda s, d=d: int(s.net.branch_sizes[d])) for d in range(4)})
OPTION_DIM = re.compile(r"^options\.([a-z_][a-z0-9_]*)$")
"""A shape entry ``options.NAME`` is the plugin's integer option ``NAME`` (e.g. a hidden width)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamSpec(_Frozen):
    """One parameter tensor a plugin adds to the network (saved in checkpoints under its name)."""

    name: str = Field(description="Tensor name inside the plugin's parameter sub-tree.")
    shape: tuple[int | str, ...] = Field(
        description=f"Shape; a string entry names a run dimension ({', '.join(_DIMENSIONS)}) or, as "
        "'options.NAME', an integer option of the plugin."
    )
    description: str = Field(description="What the tensor is.")

    @field_validator("shape")
    @classmethod
    def _known_dims(cls, shape: tuple[int | str, ...]) -> tuple[int | str, ...]:
        for d in shape:
            if isinstance(d, str) and d not in _DIMENSIONS and not OPTION_DIM.match(d):
                raise ValueError(f"unknown dimension {d!r} (known: {', '.join(_DIMENSIONS)}, options.NAME)")
            if isinstance(d, int) and d < 1:
                raise ValueError(f"dimension {d} must be positive")
        return shape

    def resolve(self, settings: RunSettings, options: Any = None) -> tuple[int, ...]:
        """The shape in numbers for a run's settings and the plugin's options (model or dict)."""
        out = []
        for d in self.shape:
            if isinstance(d, int):
                out.append(d)
                continue
            m = OPTION_DIM.match(d)
            if m is None:
                out.append(_DIMENSIONS[d](settings))
                continue
            opts = options if isinstance(options, dict) else dict(options or {})
            v = opts.get(m.group(1))
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"parameter {self.name!r}: shape entry {d!r} is {v!r}, not a positive integer")
            out.append(v)
        return tuple(out)

    def size(self, settings: RunSettings, options: Any = None) -> int:
        n = 1
        for d in self.resolve(settings, options):
            n *= d
        return n


class KernelSpec(_Frozen):
    """A CUDA source file of the plugin and the kernels (``extern "C" __global__``) it defines."""

    path: Path = Field(description="Absolute path of the .cu file (the plugin computes it from its package).")
    functions: tuple[str, ...] = Field(min_length=1, description="Kernel function names defined in the file.")


class Requires(_Frozen):
    """What must be present for the plugin to run."""

    plugins: tuple[str, ...] = Field((), description="Plugins that must be enabled in the same flag file.")
    core: str = Field("", description="Version range of foxhunt-core, e.g. '>=0.1,<0.2' (empty: any).")

    @field_validator("core")
    @classmethod
    def _parse(cls, spec: str) -> str:
        parse_spec(spec)
        return spec


class PluginManifest(BaseModel):
    """Everything a plugin declares; the core verifies each claim at discovery."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=NAME_PATTERN, description="Plugin name; equals its entry-point name.")
    version: str = Field(pattern=r"^\d+(\.\d+)*([.+-]?[0-9A-Za-z.]+)?$", description="Version of the plugin.")
    position: int = Field(ge=1, description="Position in the rollout order (1..9 are the documented ones).")
    hooks: tuple[str, ...] = Field(min_length=1, description="Names of the foxhunt hooks the plugin implements.")
    options: type[BaseModel] = Field(description="pydantic model of the plugin's flag-file options.")
    parameters: tuple[ParamSpec, ...] = Field((), description="Parameter tensors the plugin adds.")
    kernels: tuple[KernelSpec, ...] = Field((), description="CUDA kernels the plugin ships.")
    requires: Requires = Field(default_factory=Requires, description="Other plugins and core version needed.")
    provides: tuple[SignalSpec, ...] = Field(
        (), description="Float signals the plugin publishes to later interval plugins (foxhunt_core.signals).")
    consumes: tuple[SignalName, ...] = Field(
        (), description="Signals the plugin reads; each must be provided by an enabled plugin earlier in the order.")
    description: str = Field("", description="One line on what the plugin does.")
    starts_as_identity: bool = Field(
        False, description="At its init the plugin leaves the network's function unchanged (a post-attention "
        "stage that starts as the identity, branch-input columns, a change of the loss or the exploration only): "
        "a run warm-started from a checkpoint without it has the checkpoint's coordinated Q at step 0 "
        "(foxhunt_core.warmstart).")

    def parameter_count(self, settings: RunSettings | None = None, options: Any = None) -> int:
        """Parameters the plugin adds for ``settings`` and ``options`` (defaults: the defaults)."""
        s = settings or RunSettings()
        opts = self.options() if options is None else options
        return sum(p.size(s, opts) for p in self.parameters)

    def kernel_names(self) -> list[str]:
        return [f for k in self.kernels for f in k.functions]


# ----------------------------------------------------------------------------- checks
def options_model_problems(model: Any) -> list[str]:
    """Why ``model`` is not a usable options model (empty list: it is)."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return [f"options must be a pydantic model class, got {model!r}"]
    out = []
    if model.model_config.get("extra") != "forbid":
        out.append(f"options model {model.__name__} must set extra='forbid'")
    for fname, info in model.model_fields.items():
        if fname in RESERVED_OPTION_NAMES:
            out.append(f"option name {fname!r} is reserved by the flag file")
        if not (info.description or "").strip():
            out.append(f"option {fname!r} of {model.__name__} has no description")
    if not out:
        try:
            model()
        except Exception as exc:  # noqa: BLE001 - any failure of the defaults is the plugin's problem
            out.append(f"options model {model.__name__} has no valid defaults: {exc}".splitlines()[0])
    return out


def position_problems(name: str, position: int) -> list[str]:
    """Whether ``position`` agrees with the documented rollout order."""
    if name in DOCUMENTED_ORDER:
        want = DOCUMENTED_ORDER.index(name) + 1
        if position != want:
            return [f"declares position {position}, but the documented rollout order puts it at {want}"]
        return []
    if position <= len(DOCUMENTED_ORDER):
        owner = DOCUMENTED_ORDER[position - 1]
        return [f"position {position} belongs to {owner!r} in the documented rollout order "
                f"(extensions take positions after {len(DOCUMENTED_ORDER)})"]
    return []


def parameter_spec_problems(m: PluginManifest) -> list[str]:
    """Declared parameters that name an option the options model lacks, or repeat a name."""
    out, seen = [], set()
    fields = getattr(m.options, "model_fields", {})
    for p in m.parameters:
        if p.name in seen:
            out.append(f"parameter {p.name!r} is declared twice")
        seen.add(p.name)
        for d in p.shape:
            g = OPTION_DIM.match(d) if isinstance(d, str) else None
            if g is not None and g.group(1) not in fields:
                out.append(f"parameter {p.name!r}: shape entry {d!r} names no option of the options model")
    return out


def parameter_mismatches(m: PluginManifest, actual: Any, settings: RunSettings, options: Any = None) -> list[str]:
    """How the tensors a plugin's stage created (``actual``: name -> array) differ from what its
    manifest declares for these settings and options: names, shapes, count. Empty: they agree."""
    opts = m.options() if options is None else options
    try:
        declared = {p.name: p.resolve(settings, opts) for p in m.parameters}
    except ValueError as exc:
        return [str(exc)]
    got = {k: tuple(int(n) for n in getattr(v, "shape", ())) for k, v in (actual or {}).items()}
    out = []
    missing, extra = sorted(set(declared) - set(got)), sorted(set(got) - set(declared))
    if missing:
        out.append(f"declares parameters its stage does not create: {missing}")
    if extra:
        out.append(f"its stage creates parameters the manifest does not declare: {extra}")
    for k in sorted(set(declared) & set(got)):
        if declared[k] != got[k]:
            out.append(f"parameter {k!r} has shape {got[k]}, the manifest declares {declared[k]}")
    n_decl, n_got = sum(math.prod(s) for s in declared.values()), sum(math.prod(s) for s in got.values())
    if n_decl != n_got:  # (names and shapes agree only when the counts do)
        out.append(f"{n_got} parameters created, {n_decl} declared")
    return out


_BOUNDS = r"__launch_bounds__\s*\([^)]*\)\s*"


def kernel_problems(spec: KernelSpec) -> list[str]:
    """A missing .cu file, or a declared kernel the file does not define."""
    try:
        src = spec.path.read_text()
    except OSError as exc:
        return [f"kernel source {spec.path} cannot be read ({exc.strerror})"]
    out = []
    for fn in spec.functions:
        if not re.search(rf'extern\s+"C"\s+__global__\s+(?:{_BOUNDS})?void\s+(?:{_BOUNDS})?{re.escape(fn)}\s*\(', src):
            out.append(f"kernel {fn!r} is not defined in {spec.path.name}")
    return out


# ----------------------------------------------------------------------------- versions
_OPS = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    "<": lambda a, b: a < b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _release(v: str) -> tuple[int, ...]:
    m = re.match(r"^\s*(\d+(?:\.\d+)*)", v)
    if m is None:
        raise ValueError(f"not a version: {v!r}")
    parts = [int(x) for x in m.group(1).split(".")]
    return tuple(parts + [0] * (4 - len(parts)))


def parse_spec(spec: str) -> list[tuple[str, tuple[int, ...]]]:
    """``'>=0.1,<0.2'`` -> ``[('>=', (0, 1, 0, 0)), ('<', (0, 2, 0, 0))]`` (release numbers only)."""
    out = []
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.match(r"^(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)$", clause)
        if m is None:
            raise ValueError(f"bad version clause {clause!r} (use >=, <=, >, <, == or != and numbers)")
        out.append((m.group(1), _release(m.group(2))))
    return out


def version_satisfies(version: str, spec: str) -> bool:
    v = _release(version)
    return all(_OPS[op](v, bound) for op, bound in parse_spec(spec))
