"""Health gates: a stage's trials (and the last good stage's) in, one verdict per gate out.

For a gate (:class:`foxhunt_ops.plan.Gate`) and a stage:

1. per-seed values: the metric of each trial (``compare: absolute``), or the stage's value minus
   (``difference``) or over (``ratio``) the last good stage's value *for the same seed*; seeds
   the two stages do not share are left out. A comparison at the first stage to be judged (no
   good stage yet) is ``skip``: there is nothing to compare with.
2. missing values (failed trial, absent metric) and NaN/Inf values: ``fail`` the gate (the
   default), or leave those seeds out (``ignore``); with no seed left the gate is ``skip``.
3. aggregate over seeds (mean, median, min, max; ``all`` checks every seed) and compare with
   ``min``/``max`` (inclusive).
4. comparisons may run a paired one-sided test across seeds (:mod:`foxhunt_ops.stats`); its
   p-value is always reported, and with ``alpha`` set a crossed bound blocks only when p < alpha.

A verdict is ``pass``, ``fail`` or ``skip``; a ``fail`` *blocks* the stage unless the gate is a
``dry_run``. Verdicts of volatile metrics (timings) are marked so that reproducibility checks
can leave them out.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .metrics import metric_value
from .plan import Gate
from .stats import TESTS

Results = dict[int, dict[str, Any] | None]
"""Trial results of one stage by seed (``None``: the trial failed)."""


@dataclass
class Verdict:
    """One gate's verdict on one stage (stored as JSON in the ledger's decisions)."""

    gate: str
    metric: str
    compare: str
    aggregate: str
    min: float | None
    max: float | None
    dry_run: bool
    verdict: str
    reason: str
    value: float | None = None
    per_seed: dict[str, float | None] = field(default_factory=dict)
    test: str = "none"
    p_value: float | None = None
    volatile: bool = False

    @property
    def blocking(self) -> bool:
        return self.verdict == "fail" and not self.dry_run

    def to_json(self) -> dict[str, Any]:
        from .metrics import num

        d = asdict(self)
        d["value"] = num(self.value)
        d["per_seed"] = {k: num(v) for k, v in self.per_seed.items()}
        return d


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:+.4g}"


def _margin(v: float, gate: Gate) -> float:
    lo = v - gate.min if gate.min is not None else math.inf
    hi = gate.max - v if gate.max is not None else math.inf
    return min(lo, hi)


def _bounds(gate: Gate) -> str:
    if gate.min is not None and gate.max is not None:
        return f"[{gate.min:g}, {gate.max:g}]"
    return f">= {gate.min:g}" if gate.min is not None else f"<= {gate.max:g}"


def _per_seed(gate: Gate, cur: Results, prev: Results | None) -> dict[int, float | None]:
    if gate.compare == "absolute":
        return {s: metric_value(r, gate.metric) for s, r in sorted(cur.items())}
    if prev is None:  # the caller skips comparisons without a good stage
        return {}
    out: dict[int, float | None] = {}
    for s in sorted(set(cur) & set(prev)):
        a, b = metric_value(cur[s], gate.metric), metric_value(prev[s], gate.metric)
        if a is None or b is None:
            out[s] = None
        elif gate.compare == "difference":
            out[s] = a - b
        else:
            out[s] = a / b if b != 0 else math.nan
    return out


def _what(gate: Gate) -> str:
    if gate.compare == "difference":
        return f"{gate.metric} minus the good stage's"
    if gate.compare == "ratio":
        return f"{gate.metric} over the good stage's"
    return gate.metric


def evaluate_gate(gate: Gate, cur: Results, prev: Results | None, detail: dict[int, str] | None = None) -> Verdict:
    """The verdict of ``gate`` for a stage's results ``cur`` against the good stage's ``prev``.

    ``detail`` adds a per-seed note to failure reasons (why a trial failed, which values were
    non-finite).
    """
    v = Verdict(gate=gate.name, metric=gate.metric, compare=gate.compare, aggregate=gate.aggregate,
                min=gate.min, max=gate.max, dry_run=gate.dry_run, verdict="skip", reason="",
                test=gate.test, volatile=gate.volatile)
    if gate.compare != "absolute" and prev is None:
        v.reason = "no good stage to compare with yet (this is the first stage judged)"
        return v
    values = _per_seed(gate, cur, prev)
    v.per_seed = {str(s): x for s, x in values.items()}
    notes = detail or {}
    if not values:
        v.verdict = "fail" if gate.on_no_data == "fail" else "skip"
        v.reason = "no seed in common with the good stage"
        return v
    missing = [s for s, x in values.items() if x is None]
    bad = [s for s, x in values.items() if x is not None and not math.isfinite(x)]
    for seeds, policy, what in ((missing, gate.on_no_data, "no data"), (bad, gate.on_nan, "NaN/Inf")):
        if seeds and policy == "fail":
            v.verdict = "fail"
            v.reason = f"{what} for seed(s) " + ", ".join(
                f"{s}" + (f" ({notes[s]})" if s in notes else "") for s in seeds)
            return v
    kept = {s: x for s, x in values.items() if x is not None and math.isfinite(x)}
    if not kept:
        v.reason = "no data left once seeds without a finite value are ignored"
        return v
    xs = list(kept.values())
    if gate.aggregate == "all":
        seed = min(kept, key=lambda s: _margin(kept[s], gate))
        v.value = kept[seed]
        where = f" (seed {seed})"
    else:
        agg = {"mean": statistics.fmean, "median": statistics.median, "min": min, "max": max}[gate.aggregate]
        v.value = float(agg(xs))
        where = ""
    if gate.test != "none":
        neutral = 0.0 if gate.compare == "difference" else 1.0
        sign = 1.0 if gate.min is not None else -1.0  # oriented so that worse is negative
        v.p_value = TESTS[gate.test]([sign * (x - neutral) for x in xs])
    crossed = _margin(v.value, gate) < 0
    stat = f"{gate.aggregate} of {_what(gate)} = {_fmt(v.value)}{where}, bound {_bounds(gate)}"
    ptxt = f"; {gate.test} test p = {v.p_value:.3g} over {len(xs)} seed(s)" if v.p_value is not None else ""
    if crossed and gate.alpha is not None and v.p_value is not None and v.p_value >= gate.alpha:
        v.verdict = "pass"
        v.reason = f"{stat}: crossed, but not significant (p >= alpha {gate.alpha:g}){ptxt}"
    elif crossed:
        v.verdict = "fail"
        extra = "; ".join(f"seed {s}: {notes[s]}" for s in kept if s in notes)
        v.reason = f"{stat}: outside{ptxt}" + (f" ({extra})" if extra else "")
    else:
        v.verdict = "pass"
        v.reason = f"{stat}: inside{ptxt}"
    return v


def evaluate(gates: list[Gate], cur: Results, prev: Results | None,
             detail: dict[int, str] | None = None) -> list[Verdict]:
    """Every gate's verdict, in the order of ``gates``."""
    return [evaluate_gate(g, cur, prev, detail) for g in gates]


def failure_notes(results: Results, errors: dict[int, str]) -> dict[int, str]:
    """Per-seed notes for reasons: a failed trial's error, or where its non-finite values were."""
    notes = {s: f"trial failed: {e}" for s, e in errors.items()}
    for s, r in results.items():
        if r and r.get("non_finite_fields"):
            groups: dict[str, list[str]] = {}
            for f in r["non_finite_fields"]:
                source, _, name = f.partition(".")
                groups.setdefault(source, []).append(name)
            notes[s] = "non-finite in " + "; ".join(
                f"{src} ({', '.join(names[:4])}" + (f", +{len(names) - 4} more)" if len(names) > 4 else ")")
                for src, names in groups.items())
    return notes
