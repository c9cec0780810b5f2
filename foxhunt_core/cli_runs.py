"""``foxhunt runs compare DIR...``: the evaluation tables of several runs side by side.

Each run directory's ``eval.json`` gives one column; the rows are every (policy, metric) pair
that any of the runs reports, then what each table was evaluated on (split, bars, interval,
step) and its selection verdict. A directory without a readable ``eval.json`` is an error that
names it (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from .evaluate import METRICS

runs_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Look at finished runs.")
out_console = Console()


def read_eval(run_dir: Path) -> dict[str, Any]:
    """A run directory's evaluation report; ``ValueError`` naming the file when unreadable."""
    path = run_dir / "eval.json" if run_dir.is_dir() else run_dir
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: no readable evaluation ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("policies"), dict):
        raise ValueError(f"{path}: not an evaluation report (no policies table)")
    return doc


def compare_rows(reports: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The rows of the side-by-side table: (label, one cell per run)."""
    policies: list[str] = []
    for rep in reports:
        policies += [p for p in rep["policies"] if p not in policies]
    rows = []
    for p in policies:
        for m in METRICS:
            cells = []
            for rep in reports:
                v = rep["policies"].get(p, {}).get(m)
                cells.append("-" if v is None else f"{float(v):+.4f}")
            rows.append((f"{p} {m}", cells))
    for key in ("split", "bars", "step"):
        rows.append((key, [str(rep.get(key, "-")) for rep in reports]))
    rows.append(("bar", [rep.get("interval", {}).get("label", "-") for rep in reports]))
    rows.append(("bars a year", [f"{rep['interval']['bars_per_year']:,.0f}" if rep.get("interval") else "-"
                                 for rep in reports]))
    rows.append(("selection", [rep.get("selection", {}).get("verdict", "-") for rep in reports]))
    return rows


@runs_app.command("compare")
def compare(run_dirs: list[Path] = typer.Argument(..., help="Run directories (or eval.json files).")) -> None:
    """Print the evaluation tables of several runs side by side (one column per run)."""
    try:
        reports = [read_eval(d) for d in run_dirs]
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    t = Table(title="evaluation tables side by side (sharpe, volatility, turnover annualized)")
    t.add_column("")
    for d in run_dirs:
        t.add_column(str(d), justify="right", overflow="fold")
    for label, cells in compare_rows(reports):
        t.add_row(label, *cells)
    out_console.print(t)
