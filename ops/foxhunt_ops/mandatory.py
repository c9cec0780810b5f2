"""The check no plan can disable: a stage whose results hold NaN/Inf is never promoted.

The ``finite`` gate of :data:`foxhunt_ops.plan.DEFAULT_GATES` can be patched like any gate
(made a dry run, told to ignore NaN, removed with ``enabled: false``). DESIGN.md makes the
no-NaN/Inf rule mandatory, so the controller adds this verdict to every stage's own gates: it
fails when a finished trial counted non-finite values (loss, Q-statistics, evaluation or the
online parameters, the ``non_finite`` metric) or reports a non-finite final metric, and when no
trial of the stage finished at all (there is nothing to judge a promotion on).
"""

from __future__ import annotations

import math

from .gates import Results, Verdict
from .metrics import metric_value

NAME = "finite_mandatory"


def _bad(result: dict) -> list[str]:
    out = []
    n = metric_value(result, "non_finite")
    if n is None or not math.isfinite(n) or n > 0:
        out.append(f"{n:g} non-finite value(s)" if n is not None else "no non-finite count")
    for key, value in (result.get("final") or {}).items():
        if value is not None and key != "non_finite" and not math.isfinite(float(value)):
            out.append(f"{key} = {value}")
    return out


def finite_verdict(cur: Results) -> Verdict:
    """The mandatory non-finite verdict on a stage's results (never a dry run)."""
    v = Verdict(gate=NAME, metric="non_finite", compare="absolute", aggregate="max", min=None, max=0.0,
                dry_run=False, verdict="pass", reason="")
    bad = {s: _bad(r) for s, r in sorted(cur.items()) if r}
    v.per_seed = {str(s): metric_value(r, "non_finite") if r else None for s, r in sorted(cur.items())}
    bad = {s: why for s, why in bad.items() if why}
    if not any(cur.values()):
        v.verdict, v.reason = "fail", "no trial of the stage finished (mandatory: nothing to promote on)"
    elif bad:
        v.verdict = "fail"
        v.reason = "NaN/Inf in the results (mandatory, no plan can disable it): " + "; ".join(
            f"seed {s}: {', '.join(why)}" for s, why in bad.items())
    else:
        v.reason = "no NaN/Inf in any finished trial (mandatory)"
    return v
