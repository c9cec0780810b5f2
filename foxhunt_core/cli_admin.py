"""``foxhunt flags ...`` and ``foxhunt plugins ...``: operator tools around flag files and plugins.

* ``foxhunt flags validate FILE...`` — validate flag files against the installed plugins;
* ``foxhunt flags schema`` — JSON Schema of flag files (for editors);
* ``foxhunt flags diff A B`` — what enabling, options and run settings change from A to B;
* ``foxhunt flags stage N`` — the stage-N flag file of the installed plugins;
* ``foxhunt plugins list`` — the installed plugins as a table (or ``--json``);
* ``foxhunt plugins new NAME`` — a new plugin distribution from templates (:mod:`.scaffold`).

Every error is printed as one line per problem on stderr (``file:line: path: message`` for flag
files, ``plugin 'name': reason`` for plugins) and exits with code 2; nothing is written then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from .checkpoint import atomic_write_text
from .cli_support import flag_data_lines
from .config import RunSettings
from .flags import FlagError, Flags, diff_flags, json_schema, load_flags, stage_text
from .plugins import PluginError, Registry, discover
from .scaffold import HOOKS, ScaffoldError, new_plugin

flags_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Validate, compare and generate flag files.")
plugins_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="Inspect the installed plugins; start a new one.")


def _errors(lines: str) -> None:
    for line in lines.splitlines():
        typer.echo(line, err=True)


def _registry() -> Registry:
    reg = discover()
    try:
        reg.check()
    except PluginError as exc:
        _errors(str(exc))
        raise typer.Exit(2) from None
    return reg


def _load(path: Path) -> Flags:
    try:
        return load_flags(path)
    except (FlagError, PluginError) as exc:
        _errors(str(exc))
        raise typer.Exit(2) from None


# ----------------------------------------------------------------------------- flags
@flags_app.command("validate")
def validate(files: list[Path] = typer.Argument(..., help="Flag files to validate.")) -> None:
    """Validate flag files; prints one line per file that is valid and per problem otherwise."""
    failed = False
    for path in files:
        try:
            f = load_flags(path)
            data = flag_data_lines(f)  # what train checks before it starts: the market can be split
            if data:
                raise FlagError(data)
        except (FlagError, PluginError) as exc:
            _errors(str(exc))
            failed = True
            continue
        typer.echo(f"{path}: ok (stage {f.stage}; plugins: {', '.join(f.enabled) or 'none'})")
    if failed:
        raise typer.Exit(2)


@flags_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of flag files for the installed plugins."""
    typer.echo(json.dumps(json_schema(_registry()), indent=2))


@flags_app.command("diff")
def diff(
    a: Path = typer.Argument(..., help="The flag file before."),
    b: Path = typer.Argument(..., help="The flag file after."),
) -> None:
    """What changes from flag file A to flag file B: enabled plugins, options and run settings.

    Exits 0 when the files are equivalent, 1 when they differ (as diff(1) does), 2 on bad input.
    """
    fa, fb = _load(a), _load(b)
    lines = diff_flags(fa, fb, fb.registry or _registry())
    typer.echo("\n".join(lines) if lines else "no differences")
    if lines:
        raise typer.Exit(1)


@flags_app.command("stage")
def stage(
    n: int = typer.Argument(..., help="Rollout stage: positions 1..N of the rollout order are enabled."),
    run_from: Path | None = typer.Option(None, "--run-from", help="Copy the run: block of this flag file."),
    out: Path | None = typer.Option(None, "--out", help="Write the file here instead of printing it."),
) -> None:
    """Print (or write) the stage-N flag file of the installed plugins, with default options."""
    run: dict[str, Any] | None = None
    if run_from is not None:
        run = _load(run_from).raw_run
    try:
        text = stage_text(n, _registry(), run)
    except FlagError as exc:
        _errors(str(exc))
        raise typer.Exit(2) from None
    if out is None:
        typer.echo(text, nl=False)
    else:
        atomic_write_text(out, text)


# ----------------------------------------------------------------------------- plugins
def _rows(reg: Registry, settings: RunSettings, enabled: list[str] | None) -> list[dict[str, Any]]:
    rows = []
    for p in reg.ordered():
        m = p.manifest
        rows.append({
            "name": m.name, "version": m.version, "position": m.position, "hooks": list(m.hooks),
            "kernels": m.kernel_names(), "parameters": m.parameter_count(settings),
            "requires": {"plugins": list(m.requires.plugins), "core": m.requires.core},
            "provides": [s.name for s in m.provides], "consumes": list(m.consumes),
            "enabled": None if enabled is None else m.name in enabled,
            "distribution": p.distribution, "description": m.description,
        })
    return rows


@plugins_app.command("list")
def list_plugins(
    flags: Path | None = typer.Option(None, "--flags", help="Show which plugins this flag file enables."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The installed plugins: name, version, order position, hooks, kernels, parameters, requires."""
    enabled: list[str] | None = None
    settings = RunSettings()
    if flags is not None:
        f = _load(flags)
        reg, enabled, settings = f.registry or discover(), f.enabled, f.settings
    else:
        reg = discover()
    rows = _rows(reg, settings, enabled)
    if as_json:
        doc = {"rollout_order": reg.rollout_order(), "plugins": rows, "problems": reg.problems,
               "excluded": reg.excluded}
        typer.echo(json.dumps(doc, indent=2))
    else:
        t = Table(title="installed foxhunt plugins (rollout order)")
        for col in ("position", "name", "version", "hooks", "kernels", "params", "requires", "enabled"):
            t.add_column(col, justify="right" if col in ("position", "params") else "left")
        for r in rows:
            core = r["requires"]["core"]
            req = ", ".join(r["requires"]["plugins"] + ([f"core {core}"] if core else []))
            t.add_row(str(r["position"]), r["name"], r["version"], ", ".join(r["hooks"]),
                      ", ".join(r["kernels"]) or "-", str(r["parameters"]), req or "-",
                      "-" if r["enabled"] is None else ("yes" if r["enabled"] else "no"))
        con = Console()
        (con if con.is_terminal else Console(width=200)).print(t)
        for name, why in sorted(reg.excluded.items()):
            typer.echo(f"plugin {name!r}: not loaded ({why})")
    if reg.problems:
        _errors("\n".join(reg.problem_lines()))
        raise typer.Exit(2)


@plugins_app.command("new")
def new(
    name: str = typer.Argument(..., help="Plugin name (the entry-point name; package foxhunt_NAME)."),
    hook: str = typer.Option("post_attention", "--hook", help=f"The hook it implements: {', '.join(HOOKS)}."),
    directory: Path | None = typer.Option(None, "--dir", help="Directory of the new distribution (absent or "
                                          "empty; default: NAME with dashes, here)."),
) -> None:
    """Write a working plugin distribution: manifest, options, stage and twin, kernel, tests."""
    try:
        path, position = new_plugin(name, hook, directory)
    except ScaffoldError as exc:
        _errors(str(exc))
        raise typer.Exit(2) from None
    typer.echo(f"{path}: plugin {name!r} ({hook}, rollout position {position}); next: "
               f"pip install -e {path} && python -m pytest {path}")
