"""The report's figures (matplotlib, Agg, no pyplot state), returned as base64 PNG for embedding."""

from __future__ import annotations

import base64
import io
import math
from typing import Any

from matplotlib.figure import Figure

from .metrics import metric_value

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _floats(xs: list[Any]) -> list[float]:
    return [math.nan if x is None else float(x) for x in xs]


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=6, loc="best")


def _bounds(ax: Any, gate: dict[str, Any] | None) -> None:
    if not gate:
        return
    lo, hi = gate.get("min"), gate.get("max")
    style = dict(color="#b22222", lw=1, ls="--")
    if lo is not None:
        ax.axhline(lo, **style)
    if hi is not None:
        ax.axhline(hi, **style)
    if lo is not None and hi is not None:
        ax.axhspan(lo, hi, color="#2ca02c", alpha=0.07)


def stage_figure(stage_id: str, results: dict[int, Any], prev: dict[int, Any] | None, prev_id: str | None,
                 gates: dict[str, dict[str, Any]]) -> str:
    """Five panels: raw Q-mean drift and atom utilization over training (one line per seed), test
    return, value bias and throughput per seed (this stage beside the good stage it was judged
    against); dashed red lines are the gates' bounds."""
    fig = Figure(figsize=(16, 2.9))
    axes = fig.subplots(1, 5)
    seeds = sorted(results)
    for k, (metric, title) in enumerate((("raw_q_drift", "raw Q-mean drift"),
                                         ("atom_utilization", "atom utilization"))):
        ax = axes[k]
        for i, s in enumerate(seeds):
            r = results[s]
            if r:
                ax.plot(r["series"]["step"], _floats(r["series"][metric]), color=COLORS[i % len(COLORS)],
                        lw=1.2, label=f"seed {s}")
        gate = next((g for g in gates.values() if g["metric"] == metric and g["compare"] == "absolute"), None)
        _bounds(ax, gate)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("update", fontsize=8)
        ax.tick_params(labelsize=7)
        _legend(ax)
    for k, (metric, title) in ((2, ("eval_return", "test return per seed")),
                               (3, ("value_bias", "value bias per seed (mean Q - return) / std")),
                               (4, ("steady_updates_per_second", "throughput after the first update (updates/s)"))):
        ax = axes[k]
        width = 0.38
        xs = list(range(len(seeds)))
        cur = _floats([metric_value(results[s], metric) for s in seeds])
        ax.bar([x + (width / 2 if prev else 0) for x in xs], cur, width=width, color="#1f77b4", label=stage_id)
        if prev:
            old = _floats([metric_value(prev.get(s), metric) for s in seeds])
            ax.bar([x - width / 2 for x in xs], old, width=width, color="#bbbbbb", label=f"{prev_id} (good)")
        if metric == "eval_return":
            hold = _floats([(results[s] or {}).get("baselines", {}).get("buy_and_hold") for s in seeds])
            ax.plot(xs, hold, "k_", ms=14, label="buy & hold")
            ax.axhline(0, color="#555555", lw=0.6)
        if metric == "value_bias":
            _bounds(ax, next((g for g in gates.values() if g["metric"] == metric and g["compare"] == "absolute"), None))
            ax.axhline(0, color="#555555", lw=0.6)
        ax.set_xticks(xs, [f"seed {s}" for s in seeds], fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        _legend(ax)
    fig.suptitle(stage_id, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return png(fig)


def overview_figure(stage_ids: list[str], by_stage: dict[str, dict[int, Any]]) -> str:
    """Test return, value bias and throughput of every judged stage, one line per seed across stages."""
    fig = Figure(figsize=(14, 2.8))
    axes = fig.subplots(1, 3)
    seeds = sorted({s for res in by_stage.values() for s in res})
    panels = (("eval_return", "test return by stage (lines join a seed)"),
              ("value_bias", "value bias by stage"),
              ("steady_updates_per_second", "throughput by stage (updates/s after the first)"))
    for ax, (metric, title) in zip(axes, panels):
        for i, seed in enumerate(seeds):
            ys = _floats([metric_value(by_stage.get(sid, {}).get(seed), metric) for sid in stage_ids])
            ax.plot(range(len(stage_ids)), ys, "o-",
                    color=COLORS[i % len(COLORS)], lw=1, ms=4, label=f"seed {seed}")
        ax.set_xticks(range(len(stage_ids)), stage_ids, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        _legend(ax)
    fig.tight_layout()
    return png(fig)
