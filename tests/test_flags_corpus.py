"""The malformed flag-file corpus (tests/flags/bad): each file exits 2 with one line per problem.

Every line has the form ``file:line: path.to.field: message``; nothing is written and no
traceback is printed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_fixtures import install_stand_ins
from typer.testing import CliRunner

from foxhunt_core.cli import app

BAD = Path(__file__).parent / "flags" / "bad"

# file -> [(line, path, fragment of the message)], one entry per expected line
EXPECTED: dict[str, list[tuple[int, str, str]]] = {
    "syntax-unclosed-brace.yaml": [(3, "<root>", "invalid YAML: expected ',' or '}'")],
    "syntax-bad-indent.yaml": [(4, "<root>", "mapping values are not allowed here")],
    "tab-indent.yaml": [(3, "<root>", "found character '\\t' that cannot start any token")],
    "unknown-top-key.yaml": [(1, "version", "Field required"),
                             (1, "verison", "unknown key (expected one of: version, stage")],
    "unknown-run-key.yaml": [(4, "run.train.stepz", "unknown key (expected one of: steps, batch_size")],
    "unknown-option.yaml": [(7, "plugins.atom_entropy.base_coef", "expected one of: base_coefficient")],
    "wrong-type-steps.yaml": [(4, "run.train.steps", "expected an integer, got the text 'many'")],
    "wrong-type-enabled.yaml": [(4, "plugins.q_mean_center.enabled",
                            "expected true or false, got the text 'perhaps'")],
    "wrong-type-plugins-list.yaml": [(2, "plugins", "Input should be a valid dictionary")],
    "wrong-case-key.yaml": [(4, "plugins.q_mean_center.Enabled", "unknown key (expected one of: use_cuda_kernel")],
    "option-out-of-range.yaml": [(7, "plugins.atom_entropy.utilization_threshold", "less than or equal to 1")],
    "options-inconsistent.yaml": [(4, "plugins.atom_entropy", "alpha_min must not exceed alpha_max")],
    "support-inverted.yaml": [(3, "run.net", "v_min must be below v_max")],
    "negative-steps.yaml": [(4, "run.train.steps", "greater than or equal to 1")],
    "bad-device.yaml": [(3, "run.device", "Input should be 'auto', 'cpu' or 'cuda'")],
    "unknown-plugin.yaml": [(4, "plugins.kan_gat", "unknown plugin 'kan_gat' (installed: atom_entropy, ")],
    "out-of-order.yaml": [(6, "plugins.atom_entropy.enabled",
                           "atom_entropy is enabled before q_mean_center in the documented rollout order")],
    "out-of-order-empty-reason.yaml": [(2, "out_of_order", "at least 1 character")],
    "missing-requirement.yaml": [(8, "plugins.rk4_tau.enabled",
                                  "rk4_tau requires plugin 'xlstm_context', which is not enabled")],
    "duplicate-key.yaml": [(4, "run.seed", "duplicate key 'seed' (first on line 3)")],
    "duplicate-plugin.yaml": [(4, "plugins.q_mean_center", "duplicate key 'q_mean_center' (first on line 3)")],
    "alias-bomb.yaml": [(4, "c.2.2", "more than 32 alias uses")],
    "recursive-alias.yaml": [(4, "run.loop", "recursive alias")],
    "deep-nesting.yaml": [(2, "run." + ".".join(["0"] * 32), "nested deeper than 32 levels")],
    "deeper-than-the-parser.yaml": [(1, "<root>", "nested too deeply")],
    "empty.yaml": [(1, "<root>", "empty flag file")],
    "comment-only.yaml": [(1, "<root>", "empty flag file")],
    "binary-garbage.yaml": [(1, "<root>", "not UTF-8 text (byte 0")],
    "nul-byte.yaml": [(2, "<root>", "special characters are not allowed (character #x0000)")],
    "not-a-mapping.yaml": [(1, "<root>", "expected a mapping, got list")],
    "version-2.yaml": [(1, "version", "unsupported flag-file version 2")],
    "missing-version.yaml": [(1, "version", "Field required")],
    "python-tag.yaml": [(2, "run", "tag !!python/object/apply:os.system is not allowed")],
    "two-documents.yaml": [(2, "<root>", "expected a single document")],
}


def _oversize(tmp: Path) -> Path:
    p = tmp / "oversize.yaml"
    p.write_text("version: 1\n" + "# padding padding padding padding padding padding padding\n" * 5000)
    return p


@pytest.fixture
def stand_ins(monkeypatch):
    install_stand_ins(monkeypatch, "xlstm_context", "rk4_tau")


def _check(path: Path, expected: list[tuple[int, str, str]]) -> None:
    res = CliRunner().invoke(app, ["flags", "validate", str(path)])
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == len(expected), lines
    shape = re.compile(rf"^{re.escape(str(path))}:(\d+): (\S+): (.+)$")
    for line, (want_line, want_loc, fragment) in zip(lines, expected):
        m = shape.match(line)
        assert m is not None, line
        assert (int(m.group(1)), m.group(2)) == (want_line, want_loc), line
        assert fragment in m.group(3), line


def test_the_corpus_is_complete():
    files = sorted(p.name for p in BAD.iterdir())
    assert files == sorted(EXPECTED)
    assert len(files) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_file_exits_2_with_one_line_per_problem(name, stand_ins):
    _check(BAD / name, EXPECTED[name])


def test_oversize_file(tmp_path, stand_ins):
    p = _oversize(tmp_path)
    _check(p, [(1, "<root>", f"file is {p.stat().st_size} bytes, larger than the limit of 262144")])


def test_several_files_report_every_problem(stand_ins):
    paths = [BAD / "empty.yaml", Path(__file__).parents[1] / "flags" / "stage-00-baseline.yaml", BAD / "version-2.yaml"]
    res = CliRunner().invoke(app, ["flags", "validate", *map(str, paths)])
    assert res.exit_code == 2
    assert res.stdout.splitlines() == [f"{paths[1]}: ok (stage 0; plugins: none)"]
    assert len(res.stderr.splitlines()) == 2


@pytest.mark.parametrize("name", ["binary-garbage.yaml", "alias-bomb.yaml", "unknown-plugin.yaml"])
def test_train_refuses_without_traceback_and_writes_nothing(name, tmp_path):
    """The real entry point, in a fresh process: exit 2, one line, no run directory."""
    exe = Path(sys.executable).with_name("foxhunt")
    out = tmp_path / "run"
    res = subprocess.run([str(exe), "train", "--flags", str(BAD / name), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith(f"{BAD / name}:")
    assert not out.exists()
