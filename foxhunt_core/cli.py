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
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__, validation, value_bias
from .backend import BackendError
from .checkpoint import CheckpointError, atomic_write_text
from .cli_support import OperatorError, checked_checkpoint, flag_data_lines, os_error_line, resume_steps, with_overrides
from .config import RunSettings
from .explain import ExplainError
from .flags import FlagError, load_flags, parse_flags
from .logs import jsonable
from .market.loaders import DataError
from .plugins import PluginError, discover
from .runlock import NewRun, RunDirError, run_lock
from .trainer import CHECKPOINT, EVAL_COLUMNS, Trainer
from .validation import split_problem

app = typer.Typer(add_completion=False, no_args_is_help=True, help="foxhunt: C51 trading agents.")
console = Console(stderr=True)
FORMAT_HELP = "--data's format: ohlcv (bars) or l1 (quotes; --trades the trades)."
out_console = Console()


class UsageFailure(Exception):
    """An operator error: printed as one line, exit code 2."""


OPERATOR_ERRORS = (FlagError, PluginError, BackendError, CheckpointError, OperatorError, RunDirError, DataError,
                   UsageFailure, ExplainError)


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
        "value_bias": value_bias.measure(trainer, split),
        **trainer.evaluation_notes(),
        "policies": table,
    }
    if trainer.out_dir is not None:
        atomic_write_text(trainer.out_dir / "eval.json", json.dumps(jsonable(report), indent=2))
    print_table(report)
    return report


def print_table(report: dict[str, Any]) -> None:
    interval = report.get("interval", {})
    bar = f", {interval['label']} bars, {interval['bars_per_year']:,.0f} a year" if interval else ""
    t = Table(title=f"evaluation on the {report['split']} split ({report['bars']} bars{bar}, step {report['step']})",
              caption="sharpe, volatility and turnover annualized", caption_justify="left")
    t.add_column("policy")
    for c in EVAL_COLUMNS:
        t.add_column(c, justify="right")
    for name, row in report["policies"].items():
        t.add_row(name, *(f"{row.get(c, float('nan')):+.4f}" for c in EVAL_COLUMNS))
    out_console.print(t)
    for key in ("market", "costs"):
        if report.get(key):
            out_console.print(f"{key}: {report[key]}", highlight=False)
    if report.get("selection"):
        out_console.print(f"selection: {report['selection']['verdict']}", highlight=False)


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
    out: Path | None = typer.Option(None, "--out", help="Run directory to create (required to train; an existing "
                                    "run in it needs --overwrite)."),
    steps: int | None = typer.Option(None, help="Gradient updates (overrides the flag file)."),
    seed: int | None = typer.Option(None, help="Run seed (overrides the flag file)."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda (overrides the flag file)."),
    data: Path | None = typer.Option(None, help="Train on this data file (CSV/Parquet), not the flag file's market."),
    data_format: str = typer.Option("ohlcv", "--format", help=FORMAT_HELP),
    trades: Path | None = typer.Option(None, help="With --format l1: the trades file."),
    quiet: bool = typer.Option(False, help="No progress output."),
    init_from: Path | None = typer.Option(None, "--init-from", help="Warm start: begin from this checkpoint's "
                                          "parameters; newly enabled plugins' at their init."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in --out."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Batch size (overrides the flag file)."),
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
        settings = with_overrides(f.settings, steps=steps, seed=seed, device=device)
        if batch_size is not None:
            settings = RunSettings.model_validate(
                {**settings.model_dump(), "train": {**settings.train.model_dump(), "batch_size": batch_size}})
        if data is not None:
            market = _data_market(settings, data, data_format, trades)
            settings = RunSettings.model_validate({**settings.model_dump(), "market": market.model_dump()})
        # the data's problems: against the flag file's lines, or as they are for --data's file
        problems = flag_data_lines(f, settings) if data is None else [
            msg for _, msg in validation.data_problems(settings)]
        if problems:
            raise OperatorError(problems)
        plugins = (f.registry or discover()).plugin_set(f.enabled)
        if explain:
            from .explain import plan_for
            from .net.fused.record import explain as explain_text

            out_console.print(explain_text(plan_for(settings, plugins, f.option_models, gpu)), highlight=False,
                              markup=False, soft_wrap=True)
            return
        with NewRun(out, overwrite) as run:  # nothing is left in --out unless the run starts
            try:
                trainer = Trainer(settings, plugins, out, f.text, f.sha256, options=f.option_models,
                                  console=not quiet)
                if init_from is not None:
                    from .warmstart import warm_start

                    warm_start(trainer, init_from)
                _write_manifest(out, str(flags), f.text, f.sha256, settings, plugins.names, f.options)
            except BaseException as exc:
                run.abandon()
                if isinstance(exc, ValueError) and not isinstance(exc, OPERATOR_ERRORS):
                    raise OperatorError([f"{flags}: {' '.join(str(exc).split())}"]) from None
                raise
            console.print(f"run [bold]{out}[/]: device {trainer.device}, seed {settings.seed}, "
                          f"{settings.train.steps} updates, plugins {plugins.names or 'none'}", highlight=False)
            _run(trainer, None)
    except OPERATOR_ERRORS as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(os_error_line(exc))


def _data_market(settings: RunSettings, data: Path, fmt: str, trades: Path | None) -> Any:
    """The market settings of ``--data`` (the flag file's own market fields kept where they apply)."""
    from .market.source import file_market

    if fmt not in ("ohlcv", "l1"):
        raise UsageFailure(f"--format must be ohlcv or l1, not {fmt!r}")
    if (fmt == "l1") != (trades is not None):
        raise UsageFailure("--trades goes with --format l1 (and l1 needs it)")
    keep = settings.market.model_dump(exclude={"source", "path", "trades_path", "format"})
    return type(settings.market).model_validate({**keep, **file_market(data, fmt, trades)})


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
        if not run_dir.is_dir():
            raise RunDirError(f"{run_dir}: not a run directory")
        with run_lock(run_dir):
            _, meta = checked_checkpoint(ckpt, run_json_required=True)
            if steps is not None:
                resume_steps(steps, meta)
                meta["settings"]["train"]["steps"] = int(steps)
            trainer = _rebuild(meta, run_dir, str(ckpt))
            trainer.load(ckpt)
            console.print(f"resuming [bold]{run_dir}[/] at update {trainer.step} of {trainer.settings.train.steps}",
                          highlight=False)
            _run(trainer, None)
    except OPERATOR_ERRORS as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(os_error_line(exc))


@app.command("eval")
def eval_cmd(
    checkpoint: Path = typer.Argument(..., help="A checkpoint file or a run directory."),
    split: str = typer.Option("test", help="Split of the run's market: train, val or test."),
    data: Path | None = typer.Option(None, help="Evaluate on this data file (CSV/Parquet), split like the run."),
    data_format: str = typer.Option("ohlcv", "--format", help=FORMAT_HELP),
    trades: Path | None = typer.Option(None, help="With --format l1: the trades file."),
) -> None:
    """Evaluate a checkpoint's deployed policy (the one selected on validation) and the baselines."""
    ckpt = checkpoint / CHECKPOINT if checkpoint.is_dir() else checkpoint
    if split not in ("train", "val", "test"):
        _fail(f"--split must be train, val or test, not {split!r}")
    try:
        _, meta = checked_checkpoint(ckpt, run_json_required=False)
        trainer = _rebuild(meta, None, str(ckpt))
        trainer.load(ckpt, history=False)
        if data is not None:
            from .market.source import load_market

            settings = trainer.settings
            market = _data_market(settings, data, data_format, trades)
            trainer.source = load_market(settings.model_copy(update={"market": market}), for_training=False)
            trainer.market, trainer.splits = trainer.source.data, trainer.source.splits
            why = split_problem(len(trainer.market), market.train_fraction, market.val_fraction, None, split)
            if why is not None:
                raise DataError(f"{data}: {why}")
    except OPERATOR_ERRORS as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(os_error_line(exc))
    except ValueError as exc:
        _fail(str(exc))
    _evaluate_and_report(trainer, split)


def _register_admin() -> None:
    from .cli_admin import flags_app, plugins_app
    from .cli_runs import runs_app

    app.add_typer(flags_app, name="flags")
    app.add_typer(plugins_app, name="plugins")
    app.add_typer(runs_app, name="runs")

    from foxhunt_ops.cli import rollout_app  # ops/foxhunt_ops, installed with foxhunt-core

    app.add_typer(rollout_app, name="rollout")


_register_admin()


def main(prog_name: str | None = None) -> None:
    """The ``foxhunt`` console entry: NumPy's floating-point warnings off (non-finite values are
    checked and reported where they matter), click's usage errors on one line."""
    from .cli_support import run_app

    np.seterr(all="ignore")
    sys.exit(run_app(app, prog_name))
