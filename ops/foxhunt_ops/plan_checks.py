"""Checks of a plan's text beyond its schema: written types, finite numbers, sizes of run overrides.

A gate threshold of ``.nan`` compares false with everything (a gate that can never fail) and
cannot be written to the ledger's strict JSON; ``"0.5"`` or ``true`` would be coerced by
pydantic. These run on the YAML data as read, with the same rules as flag files
(:mod:`foxhunt_core.validation`); the run overrides get the per-field bounds here and every
cross-field rule once they are merged into each stage's flag file (:mod:`foxhunt_ops.stages`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from foxhunt_core import validation
from foxhunt_core.config import RunSettings

Problem = tuple[tuple[Any, ...], str]


def written_problems(data: dict[str, Any], plan_model: Any, gate_model: Any) -> list[Problem]:
    """Types and non-finite numbers anywhere in the plan, gates and run overrides included."""
    out = validation.non_finite_problems(data) + validation.scalar_problems(plan_model, data)
    run = data.get("run")
    if isinstance(run, dict):
        out += validation.scalar_problems(RunSettings, run, ("run",))
    gate_lists = [(("gates",), data.get("gates"))]
    stages = data.get("stages")
    if isinstance(stages, list):
        gate_lists += [(("stages", i, "gates"), st.get("gates")) for i, st in enumerate(stages) if isinstance(st, dict)]
    for base, gates in gate_lists:
        if isinstance(gates, list):
            for i, g in enumerate(gates):
                out += validation.scalar_problems(gate_model, g, base + (i,))
    return out


def run_bound_problems(run: dict[str, Any]) -> list[Problem]:
    """Per-field bounds of the run overrides (cross-field rules wait for the merged stage files)."""
    try:
        settings = RunSettings.model_validate(run)
    except ValidationError:
        return []  # reported by the schema check
    written = {tuple(loc) for loc in _paths(run)}
    return [(("run",) + loc, msg) for loc, msg in validation.bound_problems(settings) if loc in written]


def _paths(data: Any, loc: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _paths(v, loc + (k,))]
    return [loc]


def spec_problems(spec: Any) -> list[Problem]:
    """Seeds and step budgets a trial's ``foxhunt train --seed S --steps N`` would refuse."""
    lo, hi = validation.BOUNDS[("seed",)]
    top = validation.BOUNDS[("train", "steps")][1]
    out: list[Problem] = []
    places = [((), spec.seeds, spec.steps)] + [(("stages", i), st.seeds, st.steps) for i, st in enumerate(spec.stages)]
    for base, seeds, steps in places:
        for j, seed in enumerate(seeds or []):
            if not lo <= seed <= hi:
                out.append((base + ("seeds", j), f"a seed must be between 0 and 2^63-1, not {seed}"))
        if steps is not None and top is not None and steps > top:
            out.append((base + ("steps",), f"must be at most {top:.0f}"))
    return out
