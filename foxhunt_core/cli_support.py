"""What the commands check before they touch a run directory, and how operator errors read.

* :func:`with_overrides` applies ``--steps``/``--seed``/``--device`` to a flag file's settings
  and validates the result with the same rules as the file (a bad value is named by its option);
* :func:`flag_data_lines` runs the data checks of :mod:`foxhunt_core.validation` for a flag
  file, with the file's lines;
* :func:`checked_checkpoint` loads a checkpoint with every check of
  :mod:`foxhunt_core.checkpoint_meta`, its run's ``run.json`` included;
* :func:`resume_steps` checks ``resume --steps`` against the checkpoint;
* :func:`os_error_line` is the one line an ``OSError`` (disk full, permission denied, a path in
  ``/proc``) becomes;
* :func:`run_app` runs the command line as the ``foxhunt`` entry point does, with click's usage
  errors (a bad option value, a missing argument) on one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import validation
from .checkpoint import load_checkpoint
from .checkpoint_meta import RUN_JSON, check_meta, check_run_json
from .config import RunSettings
from .flags import Flags


class OperatorError(ValueError):
    """Bad input from the command line or a file; ``str()`` is one line per problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


OPTION_OF = {("seed",): "--seed", ("device",): "--device", ("train", "steps"): "--steps"}


def with_overrides(settings: RunSettings, *, steps: int | None = None, seed: int | None = None,
                   device: str | None = None) -> RunSettings:
    """``settings`` with the command line's overrides, validated like a flag file."""
    data = settings.model_dump(mode="json")
    given = {("seed",): seed, ("device",): device, ("train", "steps"): steps}
    for loc, value in given.items():
        if value is not None:
            d = data
            for part in loc[:-1]:
                d = d[part]
            d[loc[-1]] = value
    try:
        new = RunSettings.model_validate(data)
    except ValidationError as exc:
        raise OperatorError([f"command line: {OPTION_OF.get(tuple(e['loc']), '.'.join(map(str, e['loc'])))}: "
                             f"{e['msg']}" for e in exc.errors()]) from None
    problems = [(loc, msg) for loc, msg in validation.settings_problems(new) if loc in given and given[loc] is not None]
    if problems:
        raise OperatorError([f"command line: {OPTION_OF[loc]}: {msg}" for loc, msg in problems])
    return new


def flag_data_lines(f: Flags, settings: RunSettings | None = None) -> list[str]:
    """The data problems of a flag file's run (or of ``settings``), as the file's problem lines."""
    line_of = f.doc.line_of if f.doc is not None else (lambda loc: 1)
    return validation.lines(validation.data_problems(settings or f.settings), f.path, line_of, ("run",))


def checked_checkpoint(ckpt: Path, run_json_required: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's ``(tensors, meta)`` with every check (its run's ``run.json``, when there is one)."""
    tensors, meta = load_checkpoint(ckpt)
    check_meta(meta, ckpt)
    check_run_json(meta, ckpt, ckpt.parent / RUN_JSON, run_json_required)
    return tensors, meta


def resume_steps(steps: int, meta: dict[str, Any]) -> None:
    """``resume --steps N``: at least the checkpoint's update, and a valid step total."""
    done = int(meta["step"])
    if steps < 1:
        raise OperatorError([f"command line: --steps: must be at least 1, not {steps}"])
    if steps < done:
        raise OperatorError([f"command line: --steps: {steps} is below the checkpoint's update {done}"])
    hi = validation.BOUNDS[("train", "steps")][1]
    if hi is not None and steps > hi:
        raise OperatorError([f"command line: --steps: must be at most {hi:.0f}"])


def os_error_line(exc: OSError) -> str:
    """``path: problem`` for an OSError raised while writing or reading a run's files."""
    where = exc.filename if exc.filename is not None else "foxhunt"
    why = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    return f"{where}: {why}"


def run_app(app: Any, prog_name: str | None = None, args: list[str] | None = None) -> int:
    """Run the typer ``app``; returns the exit code (usage errors: one line on stderr, exit 2)."""
    import typer

    try:  # typer >= 0.25 ships its own copy of click; older ones use click itself
        from typer._click import exceptions as errors
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click import exceptions as errors  # type: ignore[no-redef]
    no_args = getattr(errors, "NoArgsIsHelpError", ())
    try:
        rv = app(args=args, prog_name=prog_name or "foxhunt", standalone_mode=False)
    except no_args as exc:
        typer.echo(exc.format_message(), err=True)
        return 2
    except errors.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        name = ctx.command_path if ctx is not None else (prog_name or "foxhunt")
        typer.echo(f"{name}: {' '.join(exc.format_message().split())}", err=True)
        return int(exc.exit_code)
    except errors.Abort:
        typer.echo("aborted", err=True)
        return 130
    return rv if isinstance(rv, int) else 0
