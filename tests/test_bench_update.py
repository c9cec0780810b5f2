"""benchmarks/bench_update.py's variants and flag sets, checked where no GPU is needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from foxhunt_core.config import RunSettings
from foxhunt_core.explain import plan_for
from foxhunt_core.net.fused import ExecutionPlan
from foxhunt_core.plugins import PluginSet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_update  # noqa: E402


@pytest.mark.parametrize("variant", list(bench_update.FOXHUNT_VARIANTS))
def test_each_variant_is_a_plan_the_engine_builds(variant):
    """Every variant's overrides are knobs of the execution plan, and each switches off what it
    says (a typo would only fail on the GPU, in the middle of a benchmark run)."""
    overrides = bench_update.plan_overrides(bench_update.FOXHUNT_VARIANTS[variant].get("plan"))
    base = plan_for(RunSettings(), PluginSet(), {}, "90:132").but(batch=65536)
    plan = ExecutionPlan.build(_net(), base.device, True, 65536, **overrides)
    for name, value in overrides.items():
        assert getattr(plan.knobs, name) == value
    off = [k for k, v in overrides.items() if v is False]
    for name in off:
        assert not getattr(plan, name), name


def _net():
    from foxhunt_core.net import BranchingC51

    return BranchingC51(RunSettings().net)


def _run(*args):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_update.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_a_bad_flag_file_stops_the_benchmark_before_it_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nplugins: {no_such_plugin: {enabled: true}}\n")
    res = _run("--flags", bad, "--skip-torch")
    assert res.returncode == 2 and "bad.yaml" in res.stderr and "Traceback" not in res.stderr
    res = _run("--flags", tmp_path / "missing.yaml", "--skip-torch")
    assert res.returncode == 2 and "missing.yaml" in res.stderr and "Traceback" not in res.stderr
