"""Health gates: a stage's trials (and the last good stage's) in, one verdict per gate out.

For a gate (:class:`foxhunt_ops.plan.Gate`) and a stage:

1. per-seed values: the metric of each trial (``compare: absolute``), or the stage's value minus
   (``difference``) or over (``ratio``) the last good stage's value *for the same seed*; seeds
   the two stages do not share are left out. A comparison at the first stage to be judged (no
   good stage yet) is ``skip``: there is nothing to compare with.
2. seeds that fail: a missing value (failed or killed trial, absent metric) or a NaN/Inf value
   under the policy ``fail`` (``on_no_data`` / ``on_nan``; ``ignore`` leaves the seed out), and,
   for ``aggregate: all``, a value outside the bounds. More failing seeds than
   ``failure_limit`` (default 0) fail the gate.
3. fewer than ``min_seeds`` seeds with a finite value (two for ``decide_by: interval``): the
   gate is ``inconclusive``.
4. aggregate the finite values (mean, median, min, max; ``all`` has been checked seed by seed)
   and decide: ``decide_by: value`` compares the aggregate with ``min``/``max`` (inclusive; a
   paired test's ``alpha``, when set, lets a crossed bound block only when p < alpha);
   ``decide_by: interval`` takes the bootstrap interval of the aggregate (:mod:`.stats`): wholly
   inside the bounds passes, wholly outside fails, straddling a bound is ``inconclusive``.
5. every gate reports its interval (mean and median aggregates, two seeds or more) and, for a
   paired test, its p-value, whichever way it decides.

A verdict is ``pass``, ``fail``, ``inconclusive`` or ``skip``. A stage's *analysis*
(:func:`analysis`), as in Argo Rollouts: **Failed** when a gate that is not a dry run fails,
else **Inconclusive** when one is inconclusive, else **Successful**. Verdicts of volatile
metrics (timings) are marked so that reproducibility checks can leave them out.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .metrics import metric_value
from .plan import Gate
from .stats import TESTS, bootstrap_interval

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
    decide_by: str = "value"
    interval: list[float] | None = None
    """Bootstrap interval ``[low, high]`` of the aggregate at ``confidence``."""
    confidence: float | None = None
    failed_seeds: dict[str, str] = field(default_factory=dict)
    """Seeds that failed the gate, and why (at most ``failure_limit`` of them when it passes)."""
    failure_limit: int = 0

    @property
    def blocking(self) -> bool:
        return self.verdict == "fail" and not self.dry_run

    @property
    def pending(self) -> bool:
        """Inconclusive and not a dry run: the stage waits for an operator."""
        return self.verdict == "inconclusive" and not self.dry_run

    def to_json(self) -> dict[str, Any]:
        from .metrics import num

        d = asdict(self)
        d["value"] = num(self.value)
        d["per_seed"] = {k: num(v) for k, v in self.per_seed.items()}
        return d


def analysis(verdicts: list[Verdict] | list[dict[str, Any]]) -> str:
    """``Failed``, ``Inconclusive`` or ``Successful`` (see the module docstring)."""
    rows = [v.to_json() if isinstance(v, Verdict) else v for v in verdicts]
    live = [v for v in rows if not v.get("dry_run")]
    if any(v["verdict"] == "fail" for v in live):
        return "Failed"
    if any(v["verdict"] == "inconclusive" for v in live):
        return "Inconclusive"
    return "Successful"


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


def _seed_list(failed: dict[int, str]) -> str:
    return ", ".join(f"{s} ({why})" for s, why in failed.items())


def evaluate_gate(gate: Gate, cur: Results, prev: Results | None, detail: dict[int, str] | None = None) -> Verdict:
    """The verdict of ``gate`` for a stage's results ``cur`` against the good stage's ``prev``.

    ``detail`` adds a per-seed note to failure reasons (why a trial failed, which values were
    non-finite).
    """
    v = Verdict(gate=gate.name, metric=gate.metric, compare=gate.compare, aggregate=gate.aggregate,
                min=gate.min, max=gate.max, dry_run=gate.dry_run, verdict="skip", reason="",
                test=gate.test, volatile=gate.volatile, decide_by=gate.decide_by, confidence=gate.confidence,
                failure_limit=gate.failure_limit)
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
    failed: dict[int, str] = {}
    for s, x in values.items():
        if x is None and gate.on_no_data == "fail":
            failed[s] = "no data" + (f": {notes[s]}" if s in notes else "")
        elif x is not None and not math.isfinite(x) and gate.on_nan == "fail":
            failed[s] = "NaN/Inf" + (f": {notes[s]}" if s in notes else "")
    kept = {s: x for s, x in values.items() if x is not None and math.isfinite(x)}
    if gate.aggregate == "all":
        for s, x in kept.items():
            if _margin(x, gate) < 0:
                failed[s] = f"{_fmt(x)} outside {_bounds(gate)}" + (f"; {notes[s]}" if s in notes else "")
    failed = dict(sorted(failed.items()))
    v.failed_seeds = {str(s): why for s, why in failed.items()}
    limit = f"failure_limit {gate.failure_limit}"
    if len(failed) > gate.failure_limit:
        v.verdict = "fail"
        head = ""
        worst = min(kept, key=lambda s: _margin(kept[s], gate)) if gate.aggregate == "all" and kept else None
        if worst is not None and _margin(kept[worst], gate) < 0:
            v.value = kept[worst]
            head = f"all of {_what(gate)} = {_fmt(v.value)} (seed {worst}), bound {_bounds(gate)}: outside; "
        v.reason = f"{head}{len(failed)} of {len(values)} seed(s) fail ({limit}): {_seed_list(failed)}"
        return v
    ignored = {s: ("no data" if x is None else "NaN/Inf") + (f": {notes[s]}" if s in notes else "")
               for s, x in values.items() if s not in kept and s not in failed}
    need = max(gate.min_seeds, 2 if gate.decide_by == "interval" else 1)
    if len(kept) < need:
        v.verdict = "inconclusive"
        out = {**ignored, **{s: why for s, why in failed.items() if s not in kept}}
        v.reason = (f"too few finite seeds: {len(kept)} of {len(values)} (the gate needs {need})"
                    + (f"; left out: {_seed_list(dict(sorted(out.items())))}" if out else ""))
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
        if gate.aggregate in ("mean", "median"):
            ci = bootstrap_interval(xs, gate.aggregate, gate.confidence)
            v.interval = list(ci) if ci is not None else None
    if gate.test != "none":
        neutral = 0.0 if gate.compare == "difference" else 1.0
        sign = 1.0 if gate.min is not None else -1.0  # oriented so that worse is negative
        v.p_value = TESTS[gate.test]([sign * (x - neutral) for x in xs])
    stat = f"{gate.aggregate} of {_what(gate)} = {_fmt(v.value)}{where}, bound {_bounds(gate)}"
    if v.interval is not None:
        stat += f", {gate.confidence:.0%} interval [{v.interval[0]:+.4g}, {v.interval[1]:+.4g}]"
    ptxt = f"; {gate.test} test p = {v.p_value:.3g} over {len(xs)} seed(s)" if v.p_value is not None else ""
    within = f"; {len(failed)} seed(s) failing within {limit}: {_seed_list(failed)}" if failed else ""
    within += f"; left out: {_seed_list(ignored)}" if ignored else ""
    if gate.decide_by == "interval":
        lo, hi = v.interval if v.interval is not None else (v.value, v.value)
        inside = _margin(lo, gate) >= 0 and _margin(hi, gate) >= 0
        outside = (gate.min is not None and hi < gate.min) or (gate.max is not None and lo > gate.max)
        v.verdict = "pass" if inside else "fail" if outside else "inconclusive"
        what = {"pass": "interval inside", "fail": "interval outside",
                "inconclusive": "interval straddles the bound"}[v.verdict]
        v.reason = f"{stat}: {what}{ptxt}{within}"
        return v
    if gate.aggregate == "all":  # judged seed by seed above: the failing ones are within the limit
        v.verdict = "pass"
        v.reason = f"{stat}: {'inside' if not failed else 'passes'}{within}"
        return v
    crossed = _margin(v.value, gate) < 0
    if crossed and gate.alpha is not None and v.p_value is not None and v.p_value >= gate.alpha:
        v.verdict = "pass"
        v.reason = f"{stat}: crossed, but not significant (p >= alpha {gate.alpha:g}){ptxt}{within}"
    elif crossed:
        v.verdict = "fail"
        extra = "; ".join(f"seed {s}: {notes[s]}" for s in kept if s in notes)
        v.reason = f"{stat}: outside{ptxt}" + (f" ({extra})" if extra else "") + within
    else:
        v.verdict = "pass"
        v.reason = f"{stat}: inside{ptxt}{within}"
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
