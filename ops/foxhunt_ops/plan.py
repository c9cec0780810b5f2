"""Rollout plans: ordered stages, seeds, budgets and health gates, validated like flag files.

::

    version: 1
    name: smoke                     # names the default rollout directory, runs/rollout-<name>
    description: three stages, tiny budgets
    device: cpu                     # auto | cpu | cuda, passed to every trial
    seeds: [0, 1, 2]                # every stage's seeds unless a stage says otherwise
    steps: 100                      # gradient updates per trial (default: the flag file's)
    run:                            # merged into every stage flag file's run: block
      net: {shared_h1: 16, shared_h2: 16, adv_h: 16}
    gates:                          # patches of the default gates, by name, or new gates
      - {name: throughput, dry_run: true}
    stages:
      - flags: ../../flags/stage-00-baseline.yaml     # relative to this file
      - stage: 1                    # or a stage number: `foxhunt flags stage 1`
        pause: true                 # wait for `foxhunt rollout promote` once the gates pass
        gates: [{name: eval_return, min: -0.02}]

Gates merge by ``name`` in three layers: the defaults of DESIGN.md (:data:`DEFAULT_GATES`), the
plan's ``gates:`` and a stage's ``gates:``; a later layer may give only the fields it changes
(``{name: raw_q_drift, dry_run: true}``), a new name must be a whole gate, ``enabled: false``
removes a gate. Every problem is one line, ``file:line: path.to.field: message``, like flag
files (:mod:`foxhunt_core.flags`), and a plan with any problem is refused before anything runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from foxhunt_core.config import RunSettings
from foxhunt_core.flagyaml import MAX_BYTES, YamlDoc, YamlProblem, read_yaml
from foxhunt_core.safeio import FileProblem, read_regular

from .errors import PlanError
from .metrics import METRICS

__all__ = ["DEFAULT_GATES", "Gate", "Plan", "PlanError", "PlanFile", "StageSpec", "load_plan", "parse_plan", "problem"]

PLAN_VERSION = 1
NAME = r"^[a-z0-9][a-z0-9_.-]{0,63}$"

DEFAULT_GATES: tuple[dict[str, Any], ...] = (
    {"name": "value_bias", "metric": "value_bias", "aggregate": "all", "min": -1.0, "max": 1.0,
     "description": "DESIGN.md: value bias — mean predicted Q of the actions taken minus the realized discounted "
                    "return from those states, over the return's standard deviation, on the test split's "
                    "evaluation walk — within ±1 in every seed: the value estimates neither run away from nor lag "
                    "far behind the returns they predict."},
    {"name": "raw_q_drift", "metric": "raw_q_drift", "aggregate": "all", "min": -0.1, "max": 0.1, "dry_run": True,
     "description": "Reported, never blocking: raw Q-mean drift (before any pre_attention stage). A rising mean Q "
                    "is what a policy that learns to profit shows; value_bias is the health signal."},
    {"name": "atom_utilization", "metric": "atom_utilization", "aggregate": "all", "min": 0.5,
     "description": "DESIGN.md: atom utilization at least 50 % in every seed."},
    {"name": "finite", "metric": "non_finite", "aggregate": "max", "max": 0,
     "description": "DESIGN.md: no NaN/Inf in loss, Q-statistics, evaluation or parameters."},
    {"name": "eval_return", "metric": "eval_return", "compare": "difference", "aggregate": "mean",
     "min": -0.05, "test": "sign", "decide_by": "interval",
     "description": "DESIGN.md: test-split return not worse than the last good stage (paired by seed) by more than "
                    "0.05: the bootstrap interval of the mean paired difference above -0.05 passes, wholly below "
                    "fails, straddling it is inconclusive."},
    {"name": "throughput", "metric": "steady_updates_per_second", "compare": "ratio", "aggregate": "median",
     "min": 0.85, "description": "DESIGN.md: throughput at least 85 % of the last good stage's (paired by seed); "
                                 "after each run's first update, so one-off compilation and GEMM tuning do not count."},
)


def problem(path: str, line: int, loc: tuple[Any, ...], msg: str) -> str:
    """One problem line in the flag-file style: ``file:line: dotted.path: message``."""
    where = ".".join(str(p) for p in loc) or "<root>"
    return f"{path}:{line}: {where}: {' '.join(str(msg).split())}"


# ----------------------------------------------------------------------------- gates
class Gate(BaseModel):
    """One health gate: a metric, how it is aggregated over seeds, and its bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,47}$", description="Gate name (unique in a stage).")
    metric: str = Field(description=f"Per-trial metric the gate reads: {', '.join(METRICS)}.")
    compare: Literal["absolute", "difference", "ratio"] = Field(
        "absolute", description="absolute: the stage's own value; difference / ratio: the stage's value minus / "
        "over the last good stage's, paired by seed (skipped when there is no good stage yet).")
    aggregate: Literal["mean", "median", "min", "max", "all"] = Field(
        "mean", description="How per-seed values become one: mean, median, min, max, or all (every seed must "
        "pass; the value shown is the seed closest to or furthest past a bound).")
    min: float | None = Field(None, description="Lowest passing value (inclusive).")
    max: float | None = Field(None, description="Highest passing value (inclusive).")
    test: Literal["none", "sign", "wilcoxon"] = Field(
        "none", description="Paired one-sided test across seeds that the stage is worse than the last good one "
        "(sign test or exact Wilcoxon signed-rank); its p-value is reported (comparisons only).")
    alpha: float | None = Field(
        None, gt=0, lt=1, description="When set, a bound crossed blocks only if the test's p-value is below alpha.")
    dry_run: bool = Field(False, description="Evaluate and report the gate, never block on it.")
    enabled: bool = Field(True, description="false removes the gate (e.g. a default one) from the stage.")
    on_no_data: Literal["fail", "ignore"] = Field(
        "fail", description="A seed without a value (failed trial, metric absent): fail the gate, or leave the "
        "seed out (no seed left: the gate is skipped).")
    on_nan: Literal["fail", "ignore"] = Field(
        "fail", description="A seed whose value is NaN/Inf: fail the gate, or leave the seed out.")
    failure_limit: int = Field(
        0, ge=0, description="Seeds that may fail the gate without failing it (Argo Rollouts' failureLimit): a "
        "seed fails when its value is outside the bounds (aggregate: all), or is missing / NaN under on_no_data / "
        "on_nan: fail.")
    min_seeds: int = Field(
        1, ge=1, description="Seeds with a finite value needed to judge; fewer makes the gate inconclusive (the "
        "stage pauses for an operator).")
    decide_by: Literal["value", "interval"] = Field(
        "value", description="value: the aggregate against the bounds (with alpha, a crossed bound blocks only when "
        "the test is significant); interval: the bootstrap interval of the aggregate (mean or median) inside the "
        "bounds passes, wholly outside fails, straddling a bound is inconclusive.")
    confidence: float = Field(0.9, gt=0.5, lt=1, description="Confidence level of the bootstrap interval reported "
                              "(and, with decide_by: interval, decided by).")
    description: str = Field("", description="Why the gate exists (shown in reports).")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        if v not in METRICS:
            raise ValueError(f"unknown metric {v!r} (known: {', '.join(METRICS)})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Gate:
        if self.min is None and self.max is None:
            raise ValueError("a gate needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        if self.test != "none" and self.compare == "absolute":
            raise ValueError("a statistical test needs compare: difference or ratio (a pairing with the good stage)")
        if self.test != "none" and self.min is not None and self.max is not None:
            raise ValueError("a statistical test needs one bound (min: worse is lower; max: worse is higher)")
        if self.alpha is not None and self.test == "none":
            raise ValueError("alpha needs a test (sign or wilcoxon)")
        if self.decide_by == "interval" and self.aggregate not in ("mean", "median"):
            raise ValueError("decide_by: interval needs aggregate: mean or median (the statistic the interval is of)")
        if self.decide_by == "interval" and self.alpha is not None:
            raise ValueError("alpha decides by the test's p-value; with decide_by: interval the interval decides")
        return self

    @property
    def volatile(self) -> bool:
        return METRICS[self.metric].volatile


# ----------------------------------------------------------------------------- the file
class StageSpec(BaseModel):
    """One stage of the plan: a flag file or a stage number, and what differs from the plan."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, pattern=NAME, description="Stage id (default stage-<N>, N from stage: or the "
                                                           "flag file's stage:).")
    stage: int | None = Field(None, ge=0, description="Rollout stage number: positions 1..N of the rollout order.")
    flags: str | None = Field(None, min_length=1, description="Flag file, relative to the plan file.")
    seeds: list[int] | None = Field(None, min_length=1, description="Seeds of this stage (default: the plan's).")
    steps: int | None = Field(None, ge=1, description="Gradient updates per trial (default: the plan's).")
    pause: bool = Field(False, description="After the gates pass, wait for `foxhunt rollout promote`.")
    retries: int | None = Field(None, ge=0, le=10, description="Reruns of a trial that died (default: the plan's).")
    gates: list[dict[str, Any]] = Field(default_factory=list, description="Gate patches for this stage.")
    init_from: Literal["scratch", "good"] | None = Field(
        None, description="scratch: fresh parameters; good: each seed's trial starts from the last promoted stage's "
        "final checkpoint for that seed (default: the plan's).")
    note: str = Field("", description="Free text shown in status and reports.")

    @model_validator(mode="after")
    def _one_source(self) -> StageSpec:
        if (self.stage is None) == (self.flags is None):
            raise ValueError("a stage needs exactly one of stage: N or flags: FILE")
        return self


class PlanFile(BaseModel):
    """A foxhunt rollout plan."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(description=f"Schema version of the plan; this foxhunt reads {PLAN_VERSION}.")
    name: str = Field(pattern=NAME, description="Plan name (names the default rollout directory).")
    description: str = Field("", description="What the rollout is for.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Device of every trial.")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="Seeds of every stage.")
    steps: int | None = Field(None, ge=1, description="Gradient updates per trial (default: the flag file's).")
    workers: int | None = Field(None, ge=1, description="Trials at once with the local backend (default: CPU count).")
    workers_per_gpu: int = Field(1, ge=1, description="CUDA trials at once on each GPU (local backend: each trial "
                                 "process sees one GPU; Ray: each trial asks for 1/workers_per_gpu of a GPU).")
    gpu_memory_fraction: float | None = Field(
        None, gt=0, le=1, description="Share of its GPU's memory a CUDA trial may allocate (CuPy's pool limit); "
        "default 0.9 / workers_per_gpu.")
    trial_timeout_s: float | None = Field(None, gt=0, description="A trial running longer is killed and failed.")
    init_from: Literal["scratch", "good"] = Field(
        "scratch", description="Every stage's default: scratch (fresh parameters) or good (warm start from the last "
        "promoted stage's final checkpoint of the same seed; the new plugins' parameters at their init).")
    on_no_data: Literal["fail", "ignore"] | None = Field(
        None, description="The no-data policy of every gate that does not set its own: a failed or killed trial "
        "fails the gate (fail, the default) or is left out (ignore).")
    retries: int = Field(1, ge=0, le=10, description="Reruns of a trial that died without a verdict (killed, crashed, "
                                                     "timed out; not one that refused its input, exit 2).")
    run: dict[str, Any] = Field(default_factory=dict, description="Run settings merged into every stage's flag file.")
    gates: list[dict[str, Any]] = Field(default_factory=list, description="Patches of the default gates, by name.")
    stages: list[StageSpec] = Field(min_length=1, description="The stages, in rollout order.")

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != PLAN_VERSION:
            raise ValueError(f"unsupported plan version {v} (this foxhunt reads version {PLAN_VERSION})")
        return v

    @field_validator("seeds")
    @classmethod
    def _unique(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be unique")
        return v


@dataclass
class Plan:
    """A validated plan: the file, its hash, and the effective gates of each stage."""

    path: str
    text: str
    sha256: str
    spec: PlanFile
    stage_gates: list[list[Gate]] = field(default_factory=list)
    doc: YamlDoc | None = field(default=None, repr=False)
    """The parsed YAML (lines of every key, for later problems)."""

    @property
    def base_dir(self) -> Path:
        return Path(self.path).resolve().parent

    def seeds_of(self, i: int) -> list[int]:
        return list(self.spec.stages[i].seeds or self.spec.seeds)


def retries_of(plan: Plan, index: int) -> int:
    """How often a trial of stage ``index`` that died is run again."""
    own = plan.spec.stages[index].retries if index < len(plan.spec.stages) else None
    return plan.spec.retries if own is None else own


def _message(err: dict[str, Any]) -> str:
    """A pydantic error as an operator reads it (unknown keys list the known ones)."""
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        model = StageSpec if len(loc) == 3 and loc[0] == "stages" else PlanFile if len(loc) == 1 else None
        if model is not None:
            return f"unknown key (expected one of: {', '.join(model.model_fields)})"
    return str(err["msg"]).removeprefix("Value error, ")


def _gate_problems(layers: list[tuple[list[Any], tuple[Any, ...]]], doc: YamlDoc, path: str,
                   problems: list[str], fill: dict[str, Any] | None = None) -> list[Gate]:
    """Merge gate layers by name and validate the result; problems point at the layer's lines.
    ``fill`` holds plan-wide defaults for the fields no layer sets."""
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[str, dict[str, tuple[Any, ...]]] = {}
    entry: dict[str, tuple[Any, ...]] = {}
    for items, base in layers:
        for i, raw in enumerate(items):
            loc = base + (i,)
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                problems.append(problem(path, doc.line_of(loc), loc, "a gate is a mapping with a name"))
                continue
            unknown = [k for k in raw if k not in Gate.model_fields]
            for k in unknown:
                problems.append(problem(path, doc.line_of(loc + (k,)), loc + (k,),
                                        f"unknown key (expected one of: {', '.join(Gate.model_fields)})"))
            if unknown:
                continue
            name = raw["name"]
            merged.setdefault(name, {}).update(raw)
            origin.setdefault(name, {}).update({k: loc + (k,) for k in raw})
            entry[name] = loc
    gates = []
    for name, data in merged.items():
        data = {**(fill or {}), **data}
        try:
            g = Gate.model_validate(data)
        except ValidationError as exc:
            for e in exc.errors():
                key = e["loc"][0] if e["loc"] else None
                loc = origin[name].get(key, entry[name]) if key is not None else entry[name]
                problems.append(problem(path, doc.line_of(loc), loc, str(e["msg"]).removeprefix("Value error, ")))
            continue
        if g.enabled:
            gates.append(g)
    return gates


def _run_problems(run: dict[str, Any], doc: YamlDoc, path: str) -> list[str]:
    try:
        RunSettings.model_validate(run)
    except ValidationError as exc:
        return [problem(path, doc.line_of(("run",) + tuple(e["loc"])), ("run",) + tuple(e["loc"]),
                        str(e["msg"]).removeprefix("Value error, ")) for e in exc.errors()]
    return []


def parse_plan(text: str, path: str = "<plan>") -> Plan:
    """Validate plan text (schema, gates, run overrides); raises :class:`PlanError`."""
    try:
        doc = read_yaml(text)
    except YamlProblem as exc:
        raise PlanError([problem(path, exc.line, exc.path, exc.message)]) from None
    if not isinstance(doc.data, dict):
        what = "empty plan" if doc.data is None else f"expected a mapping, got {type(doc.data).__name__}"
        raise PlanError([problem(path, 1, (), what)])
    from .plan_checks import run_bound_problems, spec_problems, written_problems

    said = dict(written_problems(doc.data, PlanFile, Gate))
    written = [problem(path, doc.line_of(loc), loc, msg) for loc, msg in said.items()]
    try:
        spec = PlanFile.model_validate(doc.data)
    except ValidationError as exc:
        raise PlanError(list(dict.fromkeys(
            [problem(path, doc.line_of(tuple(e["loc"])), tuple(e["loc"]), said.pop(tuple(e["loc"]), None)
                     or _message(e)) for e in exc.errors()]
            + [problem(path, doc.line_of(loc), loc, msg) for loc, msg in said.items()]))) from None
    problems = written + _run_problems(spec.run, doc, path)
    problems += [problem(path, doc.line_of(loc), loc, msg)
                 for loc, msg in run_bound_problems(spec.run) + spec_problems(spec)]
    plan = Plan(path=path, text=text, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(), spec=spec, doc=doc)
    for i, st in enumerate(spec.stages):
        layers = [(list(DEFAULT_GATES), ()), (spec.gates, ("gates",)), (st.gates, ("stages", i, "gates"))]
        fill = {"on_no_data": spec.on_no_data} if spec.on_no_data else None
        plan.stage_gates.append(_gate_problems(layers, doc, path, problems, fill))
        if st.seeds is not None and len(set(st.seeds)) != len(st.seeds):
            loc = ("stages", i, "seeds")
            problems.append(problem(path, doc.line_of(loc), loc, "seeds must be unique"))
    if problems:
        # a value refused as written is not reported again by the schema check at the same place
        places = tuple(f"{path}:{doc.line_of(loc)}: {'.'.join(map(str, loc)) or '<root>'}: " for loc in said)
        problems = [p for p in problems if p in written or not p.startswith(places)]
        raise PlanError(list(dict.fromkeys(problems)))
    return plan


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file (see :func:`parse_plan`)."""
    p = Path(path)
    try:
        raw = read_regular(p, MAX_BYTES)
    except FileProblem as exc:
        raise PlanError([problem(str(p), 1, (), str(exc))]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PlanError([problem(str(p), line, (), f"not UTF-8 text (byte {exc.start}: {exc.reason})")]) from None
    return parse_plan(text, str(p))
