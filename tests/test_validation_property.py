"""Property: `flags validate` and `train` agree on every flag file generated from the schema.

Flag files are generated from the flag-file model of the installed plugins: a small valid run,
then one to three of its leaves (every run setting, every plugin option and switch) mutated to
values drawn for the field's type — near the default, at and beyond bounds, huge, negative,
non-finite, or of another type. For each file:

* validate refuses it => train refuses it with exactly the same lines, exit 2, and leaves no
  run directory;
* validate accepts it => train runs it: the market, environment, network and optimizer are
  built with those settings, collection and the first two updates run, a checkpoint is written
  and the policy is evaluated (on the first 200 bars of the test split: the full walk costs about
  a millisecond a bar), exit 0, no exception.

``run.device`` is not mutated: whether a GPU is present is checked when the run starts (one
line, exit 2), not by validation, so that a flag file for a GPU run validates on any machine.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from typing import Any, Literal, Union, get_args, get_origin

import pytest
import yaml
from corpus_helpers import TINY, invoke
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from foxhunt_core.checkpoint import load_checkpoint
from foxhunt_core.flags import flag_model
from foxhunt_core.plugins import discover
from foxhunt_core.trainer import CHECKPOINT, Trainer

BASE = yaml.safe_load(TINY)
SKIP = {("run", "device")}


def _unwrap(ann: Any) -> Any:
    if get_origin(ann) in (Union, types.UnionType):
        inner = [a for a in get_args(ann) if a is not type(None)]
        return inner[0] if len(inner) == 1 else ann
    return ann


def leaves(model: type[BaseModel], loc: tuple = ()) -> list[tuple[tuple, Any, Any]]:
    """(location, annotation, default) of every scalar or tuple field under ``model``."""
    out = []
    for name, f in model.model_fields.items():
        ann = _unwrap(f.annotation)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += leaves(ann, loc + (name,))
        elif ann in (int, float, bool) or get_origin(ann) in (tuple, Literal):
            default = f.get_default(call_default_factory=True)
            out.append((loc + (name,), ann, default))
    return out


LEAVES = [(loc, ann, d) for loc, ann, d in leaves(flag_model(discover()))
          if loc[0] in ("run", "plugins") and loc not in SKIP]


def _wrong_type() -> st.SearchStrategy:
    return st.one_of(st.booleans(), st.text(max_size=4), st.none(), st.just([1, 2]), st.just({"a": 1}))


def _ints(default: Any) -> st.SearchStrategy:
    d = abs(default) if isinstance(default, int) and not isinstance(default, bool) else 10
    near = st.integers(d // 2, 2 * d + 1)  # plausible: the same order as the default
    wild = st.one_of(st.integers(-(d + 5), 4 * d + 5), st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64]),
                     st.integers(-(2**70), 2**70))
    return st.one_of(near, near, wild)


def _floats(default: Any) -> st.SearchStrategy:
    d = float(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else 1.0
    near = st.floats(0.5, 2.0).map(lambda k: d * k)
    wild = st.one_of(st.floats(-4 * abs(d) - 1, 4 * abs(d) + 1), st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([0.0, 1e-300, 1e-30, 1e-9, 1e9, 1e30, 1e300, -1e300]), st.integers(-5, 5),
                     st.floats(0.5, 2.0).map(lambda k: d * k * 1e3), st.floats(0.5, 2.0).map(lambda k: d * k * 1e-3))
    return st.one_of(near, near, wild)


def value_for(ann: Any, default: Any) -> st.SearchStrategy:
    origin, args = get_origin(ann), get_args(ann)
    if ann is bool:
        base = st.booleans()
    elif ann is int:
        base = _ints(default)
    elif ann is float:
        base = _floats(default)
    elif origin is Literal:
        base = st.sampled_from(list(args) + ["other"])
    elif origin is tuple:
        item = args[0] if args else float
        items = [value_for(item, x) for x in (default or ())] or [value_for(item, None)]
        exact = st.tuples(*items).map(list)
        base = st.one_of(exact, exact, st.lists(value_for(item, default[0] if default else None), max_size=5))
    else:
        base = st.nothing()
    return st.one_of(base, base, base, base, _wrong_type())  # mostly the field's own type


@st.composite
def flag_files(draw: st.DrawFn) -> dict:
    doc = yaml.safe_load(TINY)
    if draw(st.booleans()):
        doc["plugins"] = {"q_mean_center": {"enabled": True}, "atom_entropy": {"enabled": draw(st.booleans())}}
    picked = draw(st.sets(st.integers(0, len(LEAVES) - 1), min_size=1, max_size=3))
    for loc, ann, default in (LEAVES[i] for i in sorted(picked)):
        d = doc
        for part in loc[:-1]:
            d = d.setdefault(part, {}) if isinstance(d.get(part, {}), dict) else {}
        d[loc[-1]] = draw(value_for(ann, default))
    return doc


@pytest.fixture()
def quick_runs(monkeypatch):
    """Train: collection (at most one step of warm-up per environment) and two updates; evaluation
    on the first 200 bars of the split."""
    real_train, real_evaluate = Trainer.train, Trainer.evaluate

    def train(self, until_step=None, progress=None):
        t = self.settings.train
        t.warmup_steps = min(t.warmup_steps, self.settings.env.num_envs)
        return real_train(self, min(t.steps, 2), progress)

    def evaluate(self, split="test"):
        full = self.splits
        part = getattr(full, split)
        self.splits = dataclasses.replace(full, **{split: part.slice(0, min(len(part), 200))})
        try:
            return real_evaluate(self, split)
        finally:
            self.splits = full

    monkeypatch.setattr(Trainer, "train", train)
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    monkeypatch.setenv("FOXHUNT_MEMORY_LIMIT", "128M")


def _finite_doc(x: Any) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, dict):
        return all(_finite_doc(v) for v in x.values())
    if isinstance(x, list):
        return all(_finite_doc(v) for v in x)
    return True


EXAMPLES = int(os.environ.get("FOXHUNT_PROPERTY_EXAMPLES", "40"))  # 500: a longer search, about a second each


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=flag_files())
def test_validate_and_train_agree(doc, quick_runs, tmp_path_factory):
    d = tmp_path_factory.mktemp("prop")
    path = d / "flags.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    validated = invoke(["flags", "validate", path])
    out = d / "run"
    trained = invoke(["train", "--flags", path, "--out", out, "--quiet"])
    assert trained.exception is None or isinstance(trained.exception, SystemExit), (path.read_text(),
                                                                                     repr(trained.exception))
    event("accepted" if validated.exit_code == 0 else "refused")
    if validated.exit_code == 0:
        assert trained.exit_code == 0, (path.read_text(), trained.stderr)
        load_checkpoint(out / CHECKPOINT)  # what it wrote verifies: every tensor finite, features included
    else:
        assert validated.exit_code == 2, validated.output
        assert trained.exit_code == 2, (path.read_text(), trained.output)
        assert trained.stderr == validated.stderr
        assert not out.exists()
        if not _finite_doc(doc):
            assert "must be a finite number" in validated.stderr


def test_the_generator_reaches_every_part_of_the_schema():
    parts = {loc[:2] for loc, _, _ in LEAVES}
    assert {("run", "market"), ("run", "env"), ("run", "net"), ("run", "train"), ("plugins", "q_mean_center"),
            ("plugins", "atom_entropy")} <= parts
    assert len(LEAVES) >= 60
