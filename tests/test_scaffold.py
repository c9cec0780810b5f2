"""``foxhunt plugins new``: every hook's template becomes a plugin that the core discovers, a flag file
enables and a few updates train, whose own tests pass as generated; bad names, hooks and directories
are refused in one line with nothing written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from foxhunt_core import scaffold, stages
from foxhunt_core.backend import cuda_available
from foxhunt_core.cli import app
from foxhunt_core.flags import parse_flags
from foxhunt_core.manifest import DOCUMENTED_ORDER, kernel_problems
from foxhunt_core.plugins import ENTRY_POINT_GROUP, discover
from foxhunt_core.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
HOOKS = list(scaffold.HOOKS)
# The post_attention template is written for the protocol in which stages receive Var[Q] beside Q
# (stages.PostInputs); on a core without it that case cannot run.
needs_post_inputs = pytest.mark.skipif(not hasattr(stages, "PostInputs"),
                                       reason="this core's post_attention stages receive Q alone (no PostInputs)")
TINY = """\
version: 1
out_of_order: "a new plugin, tried alone"
run:
  seed: 2
  device: cpu
  market: {bars: 4000}
  env: {num_envs: 8, episode_len: 64}
  net: {shared_h1: 16, shared_h2: 16, adv_h: 12, num_atoms: 11, attn_dim: 4}
  train: {steps: 20, batch_size: 32, warmup_steps: 128, stats_every: 10, checkpoint_every: 1000}
plugins:
  NAME:
    enabled: true
"""


def _case(hook: str) -> list:
    return [pytest.param(hook, marks=needs_post_inputs)] if hook == "post_attention" else [hook]


@pytest.fixture
def generated(tmp_path, monkeypatch, request):
    """``(name, directory)`` of a freshly generated plugin for ``request.param``, importable (its
    directory on sys.path); its modules are forgotten afterwards."""
    hook = request.param
    name = f"scaffolded_{hook}"
    path, position = scaffold.new_plugin(name, hook, tmp_path / "dist")
    assert path == tmp_path / "dist" and position == scaffold.next_position(
        p.position for p in discover(environ={}).plugins.values())
    monkeypatch.syspath_prepend(str(path))
    yield name, path
    for mod in [m for m in sys.modules if m == f"foxhunt_{name}" or m.startswith(f"foxhunt_{name}.")]:
        del sys.modules[mod]


@pytest.mark.parametrize("generated", [c for h in HOOKS for c in _case(h)], indirect=True)
def test_generated_plugin_loads_trains_and_passes_its_own_tests(generated):
    name, path = generated
    package = path / f"foxhunt_{name}"
    hook = next(h for h in HOOKS if name.endswith(h))
    reg = discover(eps=[EntryPoint(name, f"foxhunt_{name}.plugin", ENTRY_POINT_GROUP)], environ={})
    assert reg.problems == {}
    m = reg.plugins[name].manifest
    assert m.hooks == (hook,) and m.position > len(DOCUMENTED_ORDER)
    assert (m.kernels != ()) == scaffold.HOOKS[hook].kernels
    for k in m.kernels:
        assert k.path.parent == package / "kernels" and kernel_problems(k) == []
    pyproject = (path / "pyproject.toml").read_text()
    assert f'[project.entry-points."{ENTRY_POINT_GROUP}"]\n{name} = "foxhunt_{name}.plugin"' in pyproject
    assert f'foxhunt_{name} = ["kernels/*.cu", "kernels/*.cuh"]' in pyproject  # the kernels ship in the wheel

    f = parse_flags(TINY.replace("NAME", name), "<flags>", reg)
    tr = Trainer(f.settings, reg.plugin_set(f.enabled), None, options=f.option_models)
    tr.train()
    assert tr.step == 20 and len(tr.history) == 2
    assert all(np.isfinite(v) for rec in tr.history for v in rec.values() if isinstance(v, float))
    if hook != "q_stats":
        assert tr.agent.stage_owners[hook] == [name]

    pythonpath = os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "OPENBLAS_NUM_THREADS": "1"}
    env.pop("FOXHUNT_PLUGINS", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rs", str(path)],
                         cwd=path, env=env, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "error" not in summary, summary
    skips = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", out, flags=re.M)
    assert set(skips) <= {"needs CuPy and a CUDA GPU", "nvcc is not on PATH"}, skips
    if shutil.which("nvcc") and scaffold.HOOKS[hook].kernels:  # the kernels were compiled for sm_90
        assert re.search(r"test_kernels_compile_for_sm90\[\S+\.cu\] PASSED", out), out[-4000:]
    if not cuda_available():
        assert "needs CuPy and a CUDA GPU" in skips  # the gpu-marked tests were collected (and skipped)
    if hook != "q_stats":  # a gpu-marked parity module
        assert "pytestmark = pytest.mark.gpu" in (path / "tests" / f"test_{name}_gpu.py").read_text()


@pytest.mark.parametrize("hook", HOOKS)
def test_every_template_renders_to_lint_clean_code(hook, tmp_path):
    files = scaffold.render("lint_check", hook, 12)
    assert "lint_check/plugin.py" not in files and "foxhunt_lint_check/plugin.py" in files
    assert not [p for p, text in files.items() if "$" in text and p.endswith((".py", ".cu", ".cuh"))]
    assert {f"tests/test_lint_check_{s}.py" for s in ("plugin", "training")} <= set(files)
    scaffold.write_tree(files, tmp_path / "lint")
    if RUFF is None:
        pytest.skip("ruff is not installed")
    cmd = [RUFF, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(tmp_path / "lint")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_positions_follow_the_documented_order():
    assert scaffold.next_position([]) == len(DOCUMENTED_ORDER) + 1 == 10
    assert scaffold.next_position([1, 2, 10, 11, 13]) == 12
    assert scaffold.position_for("tlob_inject", [10]) == 7  # a documented component keeps its place
    assert scaffold.position_for("my_extension", [10]) == 11
    assert scaffold.core_spec("0.1.0") == ">=0.1,<0.2" and scaffold.core_spec("1.12.3") == ">=1.12,<1.13"


@pytest.mark.parametrize(("args", "message"), [
    (["Bad"], "plugin name 'Bad' does not match"),
    (["x"], "plugin name 'x' does not match"),
    (["core"], "plugin name 'core' is reserved by the core"),
    (["model_dump"], "clashes with the flag-file schema"),
    (["q_mean_center"], "plugin name 'q_mean_center' is taken by an installed plugin"),
    (["rk4_tau"], "plugin name 'rk4_tau' is taken by an installed plugin"),
    (["fine_name", "--hook", "branch_inputs"], "hook 'branch_inputs' has no template (choose one of: post_attention"),
    (["a" * 46, "--hook", "q_stats"], "gives the signal name"),
    (["fine_name", "--dir", "missing/parent/dir"], "parent directory missing/parent does not exist"),
    (["fine_name", "--dir", "full"], "full: directory exists and is not empty"),
    (["fine_name", "--dir", "a_file"], "a_file: exists and is not a directory"),
])
def test_bad_arguments_are_refused_in_one_line_and_nothing_is_written(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "a_file").write_text("mine")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    res = CliRunner().invoke(app, ["plugins", "new", *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_command_fills_an_empty_directory_or_makes_the_default_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["plugins", "new", "my_thing", "--hook", "q_stats", "--dir", "empty"])
    assert res.exit_code == 0, res.output
    assert re.search(r"plugin 'my_thing' \(q_stats, rollout position 1\d\)", res.stdout), res.stdout
    assert (tmp_path / "empty" / "foxhunt_my_thing" / "plugin.py").is_file()
    res = CliRunner().invoke(app, ["plugins", "new", "other_thing", "--hook", "pre_attention"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "other-thing" / "foxhunt_other_thing" / "kernels" / "other_thing.cu").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "other-thing"]  # no temporary left


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    files = scaffold.render("half_written", "gate_activation", 10)
    calls = []
    real = Path.write_text

    def fail_third(self, *a, **k):
        calls.append(self)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", fail_third)
    with pytest.raises(scaffold.ScaffoldError, match="cannot write the plugin .No space left on device"):
        scaffold.write_tree(files, tmp_path / "half")
    assert list(tmp_path.iterdir()) == []
