"""What a trial measured: the metrics gates can name, read from a finished run directory.

A trial is one ``foxhunt train`` run. Its run directory holds ``run.json``, ``metrics.json``
(a Q-statistics record every ``stats_every`` updates), ``eval.json`` (the test-split table,
the value-bias record of :mod:`foxhunt_core.value_bias` and ``updates_per_second``),
``checkpoint.safetensors`` and, for a warm-started trial, ``warm_start.json``
(:mod:`foxhunt_core.warmstart`). :func:`read_result` turns them into one JSON-able *result*: the
final value of every metric of :data:`METRICS`, the series the report plots, the baselines'
returns, the value-bias record and the warm-start record. Non-finite numbers are stored as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` so that the ledger holds strict JSON; :func:`metric_value`
turns them back into floats.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Metric:
    """A per-trial scalar a gate can read."""

    description: str
    volatile: bool = False
    """Varies from run to run of the same trial (timings): never part of a reproducibility check."""


METRICS: dict[str, Metric] = {
    "raw_q_drift": Metric(
        "raw Q-mean drift at the end of training: mean expected Q read before any pre_attention stage, "
        "minus its value in the first Q-statistics record (metrics.json, last record)"),
    "raw_q_drift_peak": Metric("largest |raw Q-mean drift| over all Q-statistics records"),
    "value_bias": Metric(
        "value bias on the test split's evaluation walk (eval.json, foxhunt_core.value_bias): mean over the walk's "
        "states of the raw expected Q of the actions taken minus the realized discounted return from the state, "
        "over the standard deviation of that return (0: Q predicts the returns on average; > 0 overestimates)"),
    "coordinated_value_bias": Metric("value bias of coordinated Q (after attention and post-attention stages)"),
    "atom_utilization": Metric(
        "atom utilization of the last Q-statistics record: mean over samples and actions of the fraction "
        "of atoms whose probability is at least train.atom_mass_threshold / num_atoms (1 = every atom "
        "carries mass; a distribution collapsed onto one atom scores 1/num_atoms)"),
    "loss": Metric("C51 loss of the last Q-statistics record"),
    "non_finite": Metric(
        "count of NaN/Inf values in the loss and Q-statistics records, the policy's evaluation row and "
        "the online network's parameters in the checkpoint"),
    "eval_return": Metric("total return of the greedy policy on the held-out test split (eval.json)"),
    "eval_sharpe": Metric("Sharpe ratio of the greedy policy on the test split"),
    "eval_max_drawdown": Metric("maximum drawdown of the greedy policy on the test split"),
    "updates_per_second": Metric("training throughput: gradient updates per second of training time (eval.json)",
                                 volatile=True),
    "steady_updates_per_second": Metric(
        "training throughput after the first update (eval.json): without the replay's warm-up collection and "
        "the first update's one-off work (on the GPU: graph capture, kernel compilation, GEMM tuning)",
        volatile=True),
}
VOLATILE_METRICS = frozenset(k for k, m in METRICS.items() if m.volatile)
SERIES = ("raw_q_drift", "atom_utilization", "loss")


def num(x: Any) -> float | str | None:
    """A JSON-safe number: finite floats as they are, NaN/Inf as strings, ``None`` stays."""
    if x is None:
        return None
    v = float(x)
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def metric_value(result: dict[str, Any] | None, metric: str) -> float | None:
    """A metric's final value from a result (``None``: no data; NaN/Inf come back as floats)."""
    if not result:
        return None
    v = result.get("final", {}).get(metric)
    return None if v is None else float(v)


def _non_finite_fields(records: list[dict[str, Any]]) -> tuple[int, list[str]]:
    count, fields = 0, []
    for rec in records:
        for k, v in rec.items():
            vals = v if isinstance(v, list) else [v]
            bad = sum(1 for x in vals if isinstance(x, (int, float)) and not math.isfinite(float(x)))
            if bad:
                count += bad
                if f"metrics.{k}" not in fields:
                    fields.append(f"metrics.{k}")
    return count, fields


def _non_finite_params(ckpt: Path) -> tuple[int, list[str]]:
    if not ckpt.is_file():
        return 0, []
    from safetensors.numpy import load_file

    count, names = 0, []
    for key, arr in load_file(str(ckpt)).items():
        if key.startswith("online/") and np.issubdtype(arr.dtype, np.floating):
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            if bad:
                count += bad
                names.append(f"params.{key[len('online/'):]}")
    return count, names


def _warm_start(run_dir: Path) -> dict[str, Any] | None:
    """The run's warm-start record (foxhunt_core.warmstart), without the checkpoint's path."""
    path = run_dir / "warm_start.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable warm-start record ({exc})") from None
    return {k: v for k, v in doc.items() if k != "source"}


def read_result(run_dir: Path) -> dict[str, Any]:
    """The result of a finished run directory; raises ``ValueError`` when a file is missing or bad."""
    run_dir = Path(run_dir)
    try:
        run = json.loads((run_dir / "run.json").read_text())
        ev = json.loads((run_dir / "eval.json").read_text())
        records = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{run_dir}: incomplete run directory ({exc})") from None
    last = records[-1] if records else {}
    policy = ev["policies"]["policy"]
    n_metrics, f_metrics = _non_finite_fields(records)
    n_eval = sum(1 for v in policy.values() if not math.isfinite(float(v)))
    n_params, f_params = _non_finite_params(run_dir / "checkpoint.safetensors")
    bias = ev.get("value_bias") or {}
    drifts = [abs(float(r["raw_q_drift"])) for r in records if "raw_q_drift" in r]
    final = {
        "raw_q_drift": last.get("raw_q_drift"),
        "raw_q_drift_peak": (float("nan") if any(math.isnan(d) for d in drifts) else max(drifts)) if drifts else None,
        "value_bias": bias.get("value_bias"),
        "coordinated_value_bias": bias.get("coordinated_value_bias"),
        "atom_utilization": last.get("atom_utilization"),
        "loss": last.get("loss"),
        "non_finite": n_metrics + n_eval + n_params,
        "eval_return": policy.get("total_return"),
        "eval_sharpe": policy.get("sharpe"),
        "eval_max_drawdown": policy.get("max_drawdown"),
        "updates_per_second": ev.get("updates_per_second"),
        "steady_updates_per_second": ev.get("steady_updates_per_second"),
    }
    return {
        "final": {k: num(v) for k, v in final.items()},
        "non_finite_fields": f_metrics + (["eval.policy"] if n_eval else []) + f_params,
        "series": {"step": [int(r["step"]) for r in records],
                   **{k: [num(r.get(k)) for r in records] for k in SERIES}},
        "baselines": {k: num(v.get("total_return")) for k, v in ev["policies"].items() if k != "policy"},
        "value_bias": {k: num(v) if isinstance(v, float) else v for k, v in bias.items()},
        "warm_start": _warm_start(run_dir),
        "plugins": list(run.get("plugins", [])),
        "device": ev.get("device"),
        "flags_sha256": run.get("flags_sha256"),
        "steps": ev.get("step"),
    }
