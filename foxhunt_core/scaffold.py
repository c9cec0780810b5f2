"""``foxhunt plugins new NAME``: a working plugin distribution, generated from templates.

The templates live beside this module (``templates/plugin``, package data): ``common/`` holds
what every plugin has (pyproject with its entry point, ``__init__``, README, the test that
discovers and validates the plugin), ``<hook>/`` what a plugin of that hook adds or replaces
(manifest, options model, stage, NumPy twin, kernel and its launch wrapper, tests). A file
``x.tmpl`` becomes ``x``; the directory ``package`` becomes the plugin's package and ``NAME`` in
a file name the plugin's name; ``README.section.md.part`` is the hook's part of the README.
Placeholders are :class:`string.Template` fields (``$name``, ``${name}_forward``).

Nothing is written until every file has been rendered, and then into a temporary directory
beside the target that is renamed into place: a refused name, hook or directory leaves nothing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import string
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from pydantic import BaseModel

from . import __version__
from .checkpoint import umask
from .manifest import DOCUMENTED_ORDER, DOCUMENTED_REQUIRES, NAME_PATTERN
from .plugins import ENTRY_POINT_GROUP, RESERVED_NAMES, discover
from .signals import SIGNAL_PATTERN
from .signals import reserved as reserved_signal

TEMPLATES = Path(__file__).parent / "templates" / "plugin"
PART_SUFFIX = ".part"


@dataclass(frozen=True)
class HookTemplate:
    """What ``foxhunt plugins new --hook HOOK`` generates."""

    hook: str
    summary: str
    kernels: bool


HOOKS: dict[str, HookTemplate] = {t.hook: t for t in (
    HookTemplate("post_attention", "a trained per-action affine map of coordinated Q and Var[Q] after the "
                 "attention", True),
    HookTemplate("pre_attention", "a partial per-row centring of expected Q before the attention", True),
    HookTemplate("action_select", "selection values penalised by each action's atom spread", True),
    HookTemplate("gate_activation", "a sigmoid gate with a trained slope per GLU unit", True),
    HookTemplate("q_stats", "an exponential moving average of a Q-statistic, published as a signal", False),
)}


class ScaffoldError(ValueError):
    """A refused name, hook or directory; ``str()`` is one line."""


# ----------------------------------------------------------------------------- checks
def installed_names() -> set[str]:
    """Names of every entry point of the ``foxhunt.plugins`` group (broken and filtered ones too)."""
    return {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}


def name_problem(name: str, installed: Iterable[str]) -> str | None:
    """Why ``name`` cannot name a new plugin, or ``None``."""
    if not re.match(NAME_PATTERN, name):
        return (f"plugin name {name!r} does not match {NAME_PATTERN} (a lower-case letter, then 1 to 47 "
                "lower-case letters, digits or underscores)")
    if name in RESERVED_NAMES:
        return f"plugin name {name!r} is reserved by the core"
    if name.startswith("model_") or hasattr(BaseModel, name):  # as discovery refuses it
        return f"plugin name {name!r} clashes with the flag-file schema (a pydantic attribute)"
    if name in set(installed):
        return f"plugin name {name!r} is taken by an installed plugin"
    if DOCUMENTED_REQUIRES.get(name):
        need = ", ".join(DOCUMENTED_REQUIRES[name])
        return f"plugin {name!r} requires {need} in the documented rollout order; this template has no requirements"
    if importlib.util.find_spec(f"foxhunt_{name}") is not None:
        return f"a module foxhunt_{name} is already importable; choose another name"
    return None


def signal_name(name: str) -> str:
    """The signal a ``q_stats`` plugin of this name provides."""
    return f"{name}_ema"


def hook_problem(name: str, hook: str) -> str | None:
    if hook not in HOOKS:
        return f"hook {hook!r} has no template (choose one of: {', '.join(HOOKS)})"
    if hook == "q_stats":
        sig = signal_name(name)
        if not re.match(SIGNAL_PATTERN, sig) or reserved_signal(sig):
            return f"plugin name {name!r} gives the signal name {sig!r}, which is too long (48 characters at most)"
    return None


def next_position(taken: Iterable[int]) -> int:
    """The first position after the documented order that no installed plugin claims."""
    used = set(taken)
    pos = len(DOCUMENTED_ORDER) + 1
    while pos in used:
        pos += 1
    return pos


def position_for(name: str, taken: Iterable[int]) -> int:
    """A documented component keeps its documented position; an extension takes the next free one."""
    if name in DOCUMENTED_ORDER:
        return DOCUMENTED_ORDER.index(name) + 1
    return next_position(taken)


def core_spec(version: str = __version__) -> str:
    """``'>=0.1,<0.2'`` for core 0.1.x: the minor release line a generated plugin was written for."""
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


# ----------------------------------------------------------------------------- rendering
def placeholders(name: str, hook: str, position: int) -> dict[str, str]:
    return {
        "name": name,
        "package": f"foxhunt_{name}",
        "dist": "foxhunt-" + name.replace("_", "-"),
        "Class": "".join(p.capitalize() for p in name.split("_") if p),
        "PREFIX": name.upper(),
        "hook": hook,
        "position": str(position),
        "summary": HOOKS[hook].summary,
        "core_spec": core_spec(),
        "signal": signal_name(name),
    }


def _sources(hook: str) -> dict[Path, Path]:
    """Relative template path -> template file: ``common/``, then ``<hook>/`` over it."""
    out: dict[Path, Path] = {}
    for root in (TEMPLATES / "common", TEMPLATES / hook):
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.suffix in (".tmpl", PART_SUFFIX):
                out[f.relative_to(root)] = f
    return out


def _fill(text: str, values: Mapping[str, str], where: Path) -> str:
    try:
        return string.Template(text).substitute(values)
    except (KeyError, ValueError) as exc:  # a template's own defect, not the user's input
        raise RuntimeError(f"template {where}: {type(exc).__name__}: {exc}") from None


def render(name: str, hook: str, position: int) -> dict[str, str]:
    """Relative output path -> file text of the distribution (nothing written)."""
    values = placeholders(name, hook, position)
    sources = _sources(hook)
    parts = {rel: src for rel, src in sources.items() if rel.suffix == PART_SUFFIX}
    for rel, src in parts.items():  # README.section.md.part -> $hook_section
        values[f"hook_{rel.name.split('.')[1]}"] = _fill(src.read_text(), values, src).rstrip("\n")
    out = {}
    for rel, src in sources.items():
        if rel in parts:
            continue
        dest = Path(*(values["package"] if p == "package" else p.replace("NAME", name) for p in rel.parts))
        out[str(dest.with_suffix(""))] = _fill(src.read_text(), values, src)
    return out


# ----------------------------------------------------------------------------- writing
def _check_target(target: Path) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ScaffoldError(f"{target}: exists and is not a directory")
    if target.is_dir() and any(target.iterdir()):
        raise ScaffoldError(f"{target}: directory exists and is not empty")
    if not target.parent.is_dir():
        raise ScaffoldError(f"{target}: parent directory {target.parent} does not exist")


def write_tree(files: Mapping[str, str], target: Path) -> None:
    """Write ``files`` (relative path -> text) as the new directory ``target`` (absent or empty),
    all at once: into a temporary directory beside it, then renamed into place."""
    _check_target(target)
    mask = umask()
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:
        raise ScaffoldError(f"{target}: cannot write in {target.parent} ({exc.strerror})") from None
    try:
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o666 & ~mask)
        for d in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
            d.chmod(0o777 & ~mask)
        os.rename(tmp, target)  # replaces an empty directory too
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ScaffoldError(f"{target}: cannot write the plugin ({exc.strerror or exc})") from None


def new_plugin(name: str, hook: str, target: Path | None = None) -> tuple[Path, int]:
    """Generate the distribution of plugin ``name`` for ``hook`` into ``target`` (default: the
    name with dashes, in the current directory); returns ``(target, rollout position)``."""
    problem = name_problem(name, installed_names()) or hook_problem(name, hook)
    if problem:
        raise ScaffoldError(problem)
    target = Path(target) if target is not None else Path(name.replace("_", "-"))
    _check_target(target)
    reg = discover(environ={})
    position = position_for(name, (p.position for p in reg.plugins.values()))
    write_tree(render(name, hook, position), target)
    return target, position
