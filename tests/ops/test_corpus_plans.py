"""Malformed rollout plans: `rollout run --dry-run` and `rollout run` refuse each alike, before anything runs.

Each case names the line, the path and a fragment of the message of its one problem (a flag
file's problem inside a stage adds the stage's own line before it: two lines). ``rollout run``
must then leave no rollout directory behind.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foxhunt_core.cli import app

HEAD = "version: 1\nname: t\ndevice: cpu\nseeds: [0]\nsteps: 20\n"  # a case's own lines start at line 6
STAGE = "stages:\n  - stage: 0\n"


def P(body: str, stages: str = STAGE) -> str:
    return HEAD + body + stages


GATE = "gates:\n  - {name: eval_return, %s}\n"

# id -> (text, line, dotted path, fragment)
CASES: dict[str, tuple[str, int, str, str]] = {
    "gate-min-nan": (P(GATE % "min: .nan"), 7, "gates.0.min", "must be a finite number, not nan"),
    "gate-max-inf": (P("gates:\n  - {name: finite, max: .inf}\n"), 7, "gates.0.max", "not inf"),
    "gate-min-neg-inf": (P("gates:\n  - {name: atom_utilization, min: -.inf}\n"), 7, "gates.0.min", "not -inf"),
    "gate-alpha-nan": (P(GATE % "alpha: .nan"), 7, "gates.0.alpha", "not nan"),
    "gate-min-text": (P(GATE % "min: '-0.05'"), 7, "gates.0.min", "expected a number, got the text '-0.05'"),
    "gate-dry-run-yes": (P(GATE % "dry_run: yes"), 7, "gates.0.dry_run", "'yes' is ambiguous"),
    "gate-dry-run-int": (P(GATE % "dry_run: 1"), 7, "gates.0.dry_run", "expected true or false, got int"),
    "stage-gate-nan": (P("", "stages:\n  - stage: 0\n    gates: [{name: eval_return, min: .nan}]\n"), 8,
                       "stages.0.gates.0.min", "not nan"),
    "timeout-inf": (P("trial_timeout_s: .inf\n"), 6, "trial_timeout_s", "must be a finite number, not inf"),
    "retries-negative": (P("retries: -1\n"), 6, "retries", "greater than or equal to 0"),
    "retries-huge": (P("retries: 11\n"), 6, "retries", "less than or equal to 10"),
    "retries-text": (P("retries: '1'\n"), 6, "retries", "expected an integer, got the text '1'"),
    "stage-retries-bool": (P("", "stages:\n  - stage: 0\n    retries: true\n"), 8, "stages.0.retries",
                           "expected an integer, got true"),
    "seed-negative": ("version: 1\nname: t\nseeds: [-1]\n" + STAGE, 3, "seeds.0",
                      "a seed must be between 0 and 2^63-1, not -1"),
    "seed-octal": ("version: 1\nname: t\nseeds: [010]\n" + STAGE, 3, "seeds.0", "'010' is ambiguous"),
    "stage-seed-huge": (P("", "stages:\n  - stage: 0\n    seeds: [18446744073709551616]\n"), 8, "stages.0.seeds.0",
                        "a seed must be between 0 and 2^63-1"),
    "steps-huge": ("version: 1\nname: t\nsteps: 100000000000\n" + STAGE, 3, "steps", "must be at most 10000000000"),
    "steps-sexagesimal": ("version: 1\nname: t\nsteps: 1:40\n" + STAGE, 3, "steps", "base-60 number 100"),
    "workers-float": (P("workers: 2.0\n"), 6, "workers", "expected an integer, got the number 2.0"),
    "version-true": ("version: true\nname: t\n" + STAGE, 1, "version", "expected an integer, got true"),
    "run-lr-inf": (P("run:\n  train: {lr: .inf}\n"), 7, "run.train.lr", "must be a finite number, not inf"),
    "run-width-huge": (P("run:\n  net: {shared_h1: 1000000000}\n"), 7, "run.net.shared_h1", "must be at most 16_384"),
    "run-steps-text": (P("run:\n  train: {steps: '5'}\n"), 7, "run.train.steps", "expected an integer, got the text"),
    "run-seed-binary": (P("run:\n  seed: !!binary MTIz\n"), 7, "run.seed", "tag !!binary is not allowed"),
    "two-merge-keys": (P("x: &a {seed: 1}\ny: &b {device: cpu}\nrun:\n  <<: *a\n  <<: *b\n"), 10, "run",
                       "a second merge key '<<' in one mapping"),
    "name-traversal": ("version: 1\nname: ../../x\n" + STAGE, 2, "name", "should match pattern"),
    "stage-id-traversal": (P("", "stages:\n  - stage: 0\n    id: ../../../x\n"), 8, "stages.0.id",
                           "should match pattern"),
}

# id -> (plan text, stage flag file text or None, [(line, fragment)] of the two lines)
STAGE_CASES: dict[str, tuple[str, str | None, list[tuple[str, str]]]] = {
    "flag-file-rule-broken": (P("", "stages:\n  - flags: bad.yaml\n"), "version: 1\nrun:\n  train: {tau: 0.01}\n",
                              [("p.yaml:7: stages.0.flags", "invalid flag file bad.yaml"),
                               ("bad.yaml:3: run.train.tau_min", "must not exceed tau")]),
    "merged-run-breaks-a-rule": (P("run:\n  train: {tau_min: 3.0}\n"), None,
                                 [("p.yaml:9: stages.0", "the stage's flag file with the plan's run: block merged in"),
                                  ("stage-0.yaml (generated):", "run.train.tau_min: must not exceed tau")]),
    "merged-run-episode-too-long": (P("run:\n  market: {bars: 2000}\n  env: {episode_len: 5000}\n"), None,
                                    [("p.yaml:10: stages.0", "merged in is invalid"),
                                     ("stage-0.yaml (generated):", "run.env.episode_len: 2000 bars split 0.7/0.1/rest "
                                                                   "leave 1400 bars for training")]),
}


def _refused(args: list, tmp_path: Path, want: int) -> list[str]:
    """Exit 2, ``want`` lines on stderr, no traceback."""
    res = _invoke(args)
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.splitlines()
    assert len(lines) == want, lines
    assert "Traceback" not in res.output
    return lines


def _invoke(args: list):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_malformed_plan_is_refused_before_anything_runs(name, tmp_path):
    text, line, loc, fragment = CASES[name]
    plan = tmp_path / "p.yaml"
    plan.write_text(text)
    (got,) = _refused(["rollout", "run", plan, "--dry-run"], tmp_path, 1)
    m = re.fullmatch(rf"{re.escape(str(plan))}:(\d+): (\S+): (.+)", got)
    assert m is not None, got
    assert (int(m.group(1)), m.group(2)) == (line, loc), got
    assert fragment in m.group(3), got
    out = tmp_path / "rollout"
    assert _refused(["rollout", "run", plan, "--dir", out], tmp_path, 1) == [got]
    assert not out.exists()


@pytest.mark.parametrize("name", sorted(STAGE_CASES))
def test_a_stage_that_would_not_run_is_refused(name, tmp_path, monkeypatch):
    text, flags, want = STAGE_CASES[name]
    monkeypatch.chdir(tmp_path)
    Path("p.yaml").write_text(text)
    if flags is not None:
        Path("bad.yaml").write_text(flags)
    lines = _refused(["rollout", "run", "p.yaml", "--dry-run"], tmp_path, 2)
    for got, (start, fragment) in zip(lines, want):
        assert start in got and fragment in got, got
    assert _refused(["rollout", "run", "p.yaml", "--dir", "rollout"], tmp_path, 2) == lines
    assert not Path("rollout").exists()


@pytest.mark.parametrize("kind, fragment", [
    ("fifo", "not a regular file (a named pipe (FIFO))"),
    ("dev-zero", "not a regular file (a character device)"),
    ("directory", "not a regular file (a directory)"),
])
def test_only_regular_plan_files_are_read(tmp_path, kind, fragment):
    plan = tmp_path / "p.yaml"
    if kind == "fifo":
        os.mkfifo(plan)
    elif kind == "dev-zero":
        plan.symlink_to("/dev/zero")
    else:
        plan.mkdir()
    assert _refused(["rollout", "run", plan, "--dry-run"], tmp_path, 1) == [f"{plan}:1: <root>: {fragment}"]


def test_the_base_plan_is_valid(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(P(""))
    res = _invoke(["rollout", "run", plan, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "finite_mandatory" not in res.output  # the mandatory check is the controller's, beside these
