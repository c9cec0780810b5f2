"""The ``foxhunt`` command line: train, evaluate and resume runs.

The ``flags`` and ``plugins`` sub-command groups live in :mod:`foxhunt_core.cli_admin`.
Operator errors (an invalid flag file, a broken plugin, a bad checkpoint) are printed one line
per problem on stderr, without a traceback, and exit with code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .backend import BackendError
from .checkpoint import CheckpointError, atomic_write_text, load_checkpoint
from .config import RunSettings
from .explain import ExplainError
from .flags import FlagError, load_flags, parse_flags
from .logs import jsonable
from .plugins import PluginError, discover
from .trainer import CHECKPOINT, EVAL_COLUMNS, Trainer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="foxhunt: C51 trading agents.")
console = Console(stderr=True)
out_console = Console()


class UsageFailure(Exception):
    """An operator error: printed as one line, exit code 2."""


def _fail(msg: str, code: int = 2) -> None:
    """Print ``msg`` (one line per problem, as is: no markup, no wrapping) and exit."""
    for line in str(msg).splitlines() or [""]:
        typer.echo(line, err=True)
    raise typer.Exit(code)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
        TextColumn("updates"), TimeElapsedColumn(), console=console, transient=False,
        disable=not console.is_terminal,
    )


def _run(trainer: Trainer, until: int | None) -> dict[str, Any]:
    with _progress() as prog:
        task = prog.add_task("train", total=until or trainer.settings.train.steps, completed=trainer.step)
        trainer.train(until, progress=lambda s, n: prog.update(task, completed=s))
    return _evaluate_and_report(trainer)


def _evaluate_and_report(trainer: Trainer, split: str = "test") -> dict[str, Any]:
    table = trainer.evaluate(split)
    last = trainer.history[-1] if trainer.history else {}
    report = {
        "split": split,
        "bars": int(next(iter(table.values()))["bars"]),
        "step": trainer.step,
        "seed": trainer.settings.seed,
        "device": trainer.device,
        "plugins": trainer.plugins.names,
        "updates_per_second": trainer.step / trainer.train_seconds if trainer.train_seconds else None,
        "steady_updates_per_second": trainer.steady_updates_per_second,
        "final_stats": {k: last.get(k) for k in ("raw_q_drift", "atom_utilization", "atom_entropy")},
        "policies": table,
    }
    if trainer.out_dir is not None:
        atomic_write_text(trainer.out_dir / "eval.json", json.dumps(jsonable(report), indent=2))
    print_table(report)
    return report


def print_table(report: dict[str, Any]) -> None:
    t = Table(title=f"evaluation on the {report['split']} split ({report['bars']} bars, step {report['step']})")
    t.add_column("policy")
    for c in EVAL_COLUMNS:
        t.add_column(c, justify="right")
    for name, row in report["policies"].items():
        t.add_row(name, *(f"{row[c]:+.4f}" for c in EVAL_COLUMNS))
    out_console.print(t)


def _write_manifest(out: Path, flags_path: str, flags_text: str, sha: str, settings: RunSettings,
                    plugins: list[str], options: dict[str, Any]) -> None:
    doc = {
        "foxhunt_version": __version__,
        "flags_path": flags_path,
        "flags_sha256": sha,
        "flags_text": flags_text,
        "settings": settings.model_dump(mode="json"),
        "plugins": plugins,
        "options": options,
        "argv": sys.argv,
    }
    atomic_write_text(out / "run.json", json.dumps(jsonable(doc), indent=2))


@app.command()
def train(
    flags: Path = typer.Option(..., "--flags", help="Flag file (YAML)."),
    out: Path | None = typer.Option(None, "--out", help="Run directory to create or overwrite (required to train)."),
    steps: int | None = typer.Option(None, help="Gradient updates (overrides the flag file)."),
    seed: int | None = typer.Option(None, help="Run seed (overrides the flag file)."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda (overrides the flag file)."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Batch size (overrides the flag file)."),
    quiet: bool = typer.Option(False, help="No progress output."),
    explain: bool = typer.Option(False, "--explain", help="Print the GPU execution plan of the update (every kernel "
                                 "choice and why) for the flag file and batch size, then exit without training."),
    gpu: str | None = typer.Option(None, "--gpu", help="With --explain: plan for this device, CAPABILITY:SMS (e.g. "
                                   "90:132 for an H200), where this machine has none."),
) -> None:
    """Train an agent with the plugins a flag file enables, then evaluate it on the test split."""
    if out is None and not explain:
        _fail("--out: a run directory is required to train (or give --explain)")
    try:
        f = load_flags(flags)
        over: dict[str, Any] = {}
        if seed is not None:
            over["seed"] = seed
        if device is not None:
            over["device"] = device
        settings = f.settings.model_copy(update=over)
        train_over = {k: v for k, v in (("steps", steps), ("batch_size", batch_size)) if v is not None}
        if train_over:
            settings = settings.model_copy(update={"train": settings.train.model_copy(update=train_over)})
        settings = RunSettings.model_validate(settings.model_dump())
        plugins = (f.registry or discover()).plugin_set(f.enabled)
        if explain:
            from .explain import plan_for
            from .net.fused.record import explain as explain_text

            out_console.print(explain_text(plan_for(settings, plugins, f.option_models, gpu)), highlight=False,
                              markup=False, soft_wrap=True)
            return
        trainer = Trainer(settings, plugins, out, f.text, f.sha256, options=f.option_models, console=not quiet)
    except (FlagError, PluginError, BackendError, ExplainError) as exc:
        _fail(str(exc))
    except ValidationError as exc:
        _fail("\n".join(f"command line: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    except ValueError as exc:
        _fail(f"{flags}: {' '.join(str(exc).split())}")
    _write_manifest(out, str(flags), f.text, f.sha256, settings, plugins.names, f.options)
    console.print(f"run [bold]{out}[/]: device {trainer.device}, seed {settings.seed}, "
                  f"{settings.train.steps} updates, plugins {plugins.names or 'none'}", highlight=False)
    _run(trainer, None)


def _rebuild(meta: dict[str, Any], out: Path | None, source: str) -> Trainer:
    """A trainer for a checkpoint: plugins and their options from the flag text stored in it."""
    settings = RunSettings.model_validate(meta["settings"])
    text = meta.get("flags_text", "")
    if text:
        f = parse_flags(text, f"{source}#flags")
        registry, options = f.registry or discover(), dict(f.option_models)
    else:
        registry, options = discover(), {}
        registry.check()
    plugins = registry.plugin_set(meta.get("plugins", []))
    return Trainer(settings, plugins, out, text, meta.get("flags_sha256", ""), options=options,
                   console=out is not None)


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="Run directory with a checkpoint."),
    steps: int | None = typer.Option(None, help="Train until this many updates instead of the run's own total."),
) -> None:
    """Continue a run from its latest checkpoint, bit-identically, then evaluate it."""
    ckpt = run_dir / CHECKPOINT
    try:
        _, meta = load_checkpoint(ckpt)
        if steps is not None:
            meta["settings"]["train"]["steps"] = int(steps)
        trainer = _rebuild(meta, run_dir, str(ckpt))
        trainer.load(ckpt)
    except (CheckpointError, FlagError, PluginError, BackendError) as exc:
        _fail(str(exc))
    console.print(f"resuming [bold]{run_dir}[/] at update {trainer.step} of {trainer.settings.train.steps}",
                  highlight=False)
    _run(trainer, None)


@app.command("eval")
def eval_cmd(
    checkpoint: Path = typer.Argument(..., help="A checkpoint file or a run directory."),
    split: str = typer.Option("test", help="Split of the run's market: train, val or test."),
    data: Path | None = typer.Option(None, help="Evaluate on an OHLCV bar file (CSV or Parquet) instead."),
) -> None:
    """Evaluate a checkpoint's greedy policy and the baselines; prints the table."""
    ckpt = checkpoint / CHECKPOINT if checkpoint.is_dir() else checkpoint
    if split not in ("train", "val", "test"):
        _fail(f"--split must be train, val or test, not {split!r}")
    try:
        _, meta = load_checkpoint(ckpt)
        trainer = _rebuild(meta, None, str(ckpt))
        trainer.load(ckpt)
        if data is not None:
            from .market import load_bars_for_eval

            trainer.splits = load_bars_for_eval(data, trainer.settings.market)
    except (CheckpointError, FlagError, PluginError, BackendError) as exc:
        _fail(str(exc))
    except ValueError as exc:
        _fail(str(exc))
    _evaluate_and_report(trainer, split)


def _register_admin() -> None:
    from .cli_admin import flags_app, plugins_app

    app.add_typer(flags_app, name="flags")
    app.add_typer(plugins_app, name="plugins")

    from foxhunt_ops.cli import rollout_app  # ops/foxhunt_ops, installed with foxhunt-core

    app.add_typer(rollout_app, name="rollout")


_register_admin()


def main() -> None:  # pragma: no cover - console entry
    np.seterr(all="ignore")
    app()
