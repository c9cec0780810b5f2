"""Rollout plans: the shipped plans validate; a malformed plan is refused, line by line, before anything runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rollout_helpers import FLAGS, ROOT, SMOKE, TINY_RUN, invoke

from foxhunt_ops.plan import DEFAULT_GATES, PlanError, load_plan, parse_plan
from foxhunt_ops.stages import resolve_stages

HEAD = "version: 1\nname: t\nseeds: [0, 1]\nsteps: 50\n"


def test_the_smoke_plan_resolves_to_the_repository_flag_files_with_its_run_block():
    plan = load_plan(SMOKE)
    stages = resolve_stages(plan)
    assert [s.stage_id for s in stages] == ["stage-0", "stage-1", "stage-2"]
    assert [s.plugins for s in stages] == [[], ["q_mean_center"], ["q_mean_center", "atom_entropy"]]
    assert all("shared_h1: 16" in s.flags_text and s.steps == 100 for s in stages)
    gates = {g.name: g for g in plan.stage_gates[0]}
    assert gates["finite"].dry_run is False and gates["eval_return"].dry_run is False
    assert gates["throughput"].dry_run and gates["raw_q_drift"].dry_run and gates["atom_utilization"].dry_run


def test_the_default_plan_walks_stages_0_to_9_and_skips_what_is_not_installed():
    stages = resolve_stages(load_plan(ROOT / "ops" / "plans" / "default.yaml"))
    assert [s.number for s in stages] == list(range(10))
    assert [s.skip_reason is None for s in stages] == [True] * 3 + [False] * 7
    assert "stage 3 needs quantile_select (position 3), not installed" in stages[3].skip_reason
    gates = {g.name: g.model_dump() for g in load_plan(ROOT / "ops" / "plans" / "default.yaml").stage_gates[0]}
    for d in DEFAULT_GATES:  # the default plan writes DESIGN.md's gates out, unchanged
        assert {k: gates[d["name"]][k] for k in d if k != "description"} == {k: v for k, v in d.items()
                                                                           if k != "description"}


@pytest.mark.parametrize(
    "gates, line, message",
    [
        ("  - {name: drift2, metric: raw_q_drfit, max: 0.1}\n", 6, "gates.0.metric: unknown metric 'raw_q_drfit'"),
        ("  - {name: raw_q_drift, min: 0.5}\n", 6, "gates.0: min 0.5 is above max 0.1"),
        ("  - {name: finite, maximum: 0}\n", 6, "gates.0.maximum: unknown key (expected one of: name, metric"),
        ("  - {name: new_gate, metric: loss}\n", 6, "gates.0: a gate needs min, max or both"),
        ("  - {name: finite, test: sign}\n", 6, "gates.0: a statistical test needs compare: difference"),
        ("  - {name: eval_return, alpha: 0.05, test: none}\n", 6, "gates.0: alpha needs a test"),
        ("  - {name: eval_return, aggregate: average}\n", 6, "gates.0.aggregate: Input should be 'mean'"),
        ("  - {name: finite, dry_run: maybe}\n", 6, "gates.0.dry_run: Input should be a valid boolean"),
        ("  - just a string\n", 6, "gates.0: Input should be a valid dictionary"),
    ],
)
def test_a_malformed_gate_is_refused_with_file_line_and_path(gates, line, message):
    text = HEAD + "gates:\n" + gates + "stages:\n  - stage: 0\n"
    with pytest.raises(PlanError) as exc:
        parse_plan(text, "p.yaml")
    assert any(p.startswith(f"p.yaml:{line}: ") and message in p for p in exc.value.problems), exc.value.problems


def test_stage_level_gate_patches_point_at_the_stage():
    text = HEAD + "stages:\n  - stage: 0\n  - stage: 1\n    gates:\n      - {name: throughput, max: 0.5}\n"
    with pytest.raises(PlanError) as exc:
        parse_plan(text, "p.yaml")
    assert exc.value.problems == ["p.yaml:9: stages.1.gates.0: min 0.85 is above max 0.5"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ("stages: []\n", "p.yaml:5: stages: List should have at least 1 item"),
        ("stages:\n  - {stage: 0, flags: x.yaml}\n", "p.yaml:6: stages.0: a stage needs exactly one of"),
        ("colour: red\nstages:\n  - stage: 0\n", "p.yaml:5: colour: unknown key (expected one of: version"),
        ("run:\n  train: {stepz: 3}\nstages:\n  - stage: 0\n", "p.yaml:6: run.train.stepz: Extra inputs"),
        ("stages:\n  - {stage: 0, seeds: [1, 1]}\n", "p.yaml:6: stages.0.seeds: seeds must be unique"),
    ],
)
def test_other_plan_problems(body, expected):
    with pytest.raises(PlanError) as exc:
        parse_plan(HEAD + body, "p.yaml")
    assert any(p.startswith(expected) for p in exc.value.problems), exc.value.problems


def test_a_bad_flag_file_is_reported_at_its_own_line(tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("version: 1\nplugins:\n  q_mean_centre: {enabled: true}\n")
    (tmp_path / "p.yaml").write_text(HEAD + "stages:\n  - flags: bad.yaml\n")
    with pytest.raises(PlanError) as exc:
        resolve_stages(load_plan(tmp_path / "p.yaml"))
    lines = exc.value.problems
    assert lines[0].endswith("p.yaml:6: stages.0.flags: invalid flag file bad.yaml")
    assert any("bad.yaml:3: plugins.q_mean_centre: unknown plugin 'q_mean_centre'" in p for p in lines)


def test_run_refuses_a_malformed_plan_before_anything_runs(tmp_path: Path):
    plan = tmp_path / "bad.yaml"
    plan.write_text(HEAD + TINY_RUN + "gates:\n  - {name: finite, max: -1, min: 0}\n"
                    f"stages:\n  - flags: {FLAGS / 'stage-00-baseline.yaml'}\n")
    res = invoke("rollout", "run", plan, "--dir", tmp_path / "rollout")
    assert res.exit_code == 2
    assert f"{plan}:11: gates.0: min 0.0 is above max -1.0" in res.output
    assert not (tmp_path / "rollout").exists()


def test_dry_run_prints_the_stages_and_gates_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("rollout", "run", ROOT / "ops" / "plans" / "default.yaml", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "10 stage(s), 9 trial(s)" in res.output
    # (the missing plugins are listed in order; which ones depends on what the checkout installs)
    assert re.search(r"SKIP: stage 9 needs .*rk4_tau \(position 9\), not installed", res.output), res.output
    assert "eval_return       eval_return (difference, mean) min -0.05, sign test" in res.output
    assert list(tmp_path.iterdir()) == []
