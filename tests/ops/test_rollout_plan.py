"""Rollout plans: the shipped plans validate; a malformed plan is refused, line by line, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from rollout_helpers import FLAGS, ROOT, SMOKE, TINY_RUN, invoke

from foxhunt_core.plugins import discover
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
    reg = discover()
    order = reg.rollout_order()
    gap = next((i for i, n in enumerate(order) if n not in reg.plugins), None)  # positions 1..gap are installed
    if gap is None:  # every documented position installed: no stage is skipped
        assert [s.skip_reason for s in stages] == [None] * 10
    else:
        assert [s.skip_reason is None for s in stages] == [True] * (gap + 1) + [False] * (9 - gap)
        assert f"stage {gap + 1} needs {order[gap]} (position {gap + 1}), not installed" in stages[gap + 1].skip_reason
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
        ("  - {name: finite, dry_run: maybe}\n", 6, "gates.0.dry_run: expected true or false, got the text 'maybe'"),
        ("  - just a string\n", 6, "gates.0: Input should be a valid dictionary"),
        ("  - {name: finite, decide_by: interval}\n", 6, "gates.0: decide_by: interval needs aggregate: mean"),
        ("  - {name: eval_return, alpha: 0.05}\n", 6, "gates.0: alpha decides by the test's p-value; with "
                                                   "decide_by: interval the interval decides"),
        ("  - {name: finite, failure_limit: -1}\n", 6, "gates.0.failure_limit: Input should be greater than"),
        ("  - {name: finite, min_seeds: 0}\n", 6, "gates.0.min_seeds: Input should be greater than or equal to 1"),
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
        ("init_from: warm\nstages:\n  - stage: 0\n", "p.yaml:5: init_from: Input should be 'scratch' or 'good'"),
        ("stages:\n  - {stage: 0, init_from: hot}\n", "p.yaml:6: stages.0.init_from: Input should be 'scratch'"),
        ("workers_per_gpu: 0\nstages:\n  - stage: 0\n", "p.yaml:5: workers_per_gpu: Input should be greater"),
        ("gpu_memory_fraction: 1.5\nstages:\n  - stage: 0\n", "p.yaml:5: gpu_memory_fraction: Input should be less"),
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
    reg = discover()
    order = reg.rollout_order()
    gap = next((i for i, n in enumerate(order) if n not in reg.plugins), None)  # stages 0..gap run, 5 seeds each
    runs = 10 if gap is None else gap + 1
    assert f"10 stage(s), {5 * runs} trial(s), device auto, 5 trial(s) per GPU" in res.output
    assert "seeds 0,1,2,3,4  3000 updates\n" in res.output  # stage 0: nothing to warm-start from
    assert "3000 updates  warm start from the good stage" in res.output
    assert "value_bias        value_bias (absolute, all) min -1 max 1\n" in res.output
    assert "raw_q_drift       raw_q_drift (absolute, all) min -0.1 max 0.1  [dry run]" in res.output
    if gap is None:
        assert "SKIP:" not in res.output
    else:
        assert f"SKIP: stage 9 needs {order[gap]} (position {gap + 1}), " in res.output
    assert "eval_return       eval_return (difference, mean) min -0.05, sign test, decided by its interval" \
        in res.output
    assert list(tmp_path.iterdir()) == []


def test_init_from_and_the_plan_wide_no_data_policy_reach_every_stage():
    text = (HEAD + "init_from: good\non_no_data: ignore\ngates:\n  - {name: finite, on_no_data: fail}\n"
            + "stages:\n  - stage: 0\n  - stage: 1\n    init_from: scratch\n"
            + "    gates: [{name: value_bias, on_no_data: fail}]\n")
    plan = parse_plan(text, "p.yaml")
    assert [st.init_from for st in plan.spec.stages] == [None, "scratch"]
    stages = resolve_stages(plan)
    assert [s.init_from for s in stages] == ["good", "scratch"]
    policy = [{g.name: g.on_no_data for g in gates} for gates in plan.stage_gates]
    assert (policy[0]["finite"], policy[0]["value_bias"], policy[0]["eval_return"]) == ("fail", "ignore", "ignore")
    assert policy[1]["value_bias"] == "fail" and policy[1]["atom_utilization"] == "ignore"
    assert {g.name for g in plan.stage_gates[0]} == {d["name"] for d in DEFAULT_GATES}


def test_a_data_file_named_relative_to_the_plan_or_flag_file_resolves_for_the_trials(tmp_path: Path):
    """Trials run generated flag files in the rollout directory: relative data paths must not
    move with them (the plan's run: block against the plan, a flag file's against the flag file)."""
    data = ROOT / "tests" / "data" / "sp500_daily_2011_2018.csv"
    (tmp_path / "flags").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bars.csv").write_bytes(data.read_bytes())
    (tmp_path / "flags" / "own.yaml").write_text(
        "version: 1\nstage: 0\nrun:\n  market: {source: file, path: ../data/bars.csv}\nplugins: {}\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text(HEAD + "stages:\n  - flags: flags/own.yaml\n  - {stage: 0, id: by-plan}\n"
                    "run:\n  market: {source: file, path: data/bars.csv}\n")
    stages = resolve_stages(load_plan(plan))
    want = str((tmp_path / "data" / "bars.csv").resolve())
    for s in stages:
        assert f"path: {want}" in s.flags_text, s.flags_text
    # without the plan's block the flag file's own relative path is rewritten as well
    plan.write_text(HEAD + "stages:\n  - flags: flags/own.yaml\n")
    (only,) = resolve_stages(load_plan(plan))
    assert f"path: {want}" in only.flags_text
