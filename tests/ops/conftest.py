"""Fixtures of the rollout tests: tiny plans, the fault-injection plugin, one Ray instance per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rollout_helpers import SMOKE, invoke


@pytest.fixture(scope="session")
def nan_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that, on sys.path, installs the fault-injection plugins (nan_probe, kill_probe)
    through real entry points."""
    site = tmp_path_factory.mktemp("nan_site")
    for name in ("nan_probe", "kill_probe"):
        shutil.copy(Path(__file__).parent / "fixtures" / f"foxhunt_{name}.py", site / f"foxhunt_{name}.py")
        info = site / f"foxhunt_{name}-0.0.1.dist-info"
        info.mkdir()
        dist = name.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: foxhunt-{dist}\nVersion: 0.0.1\n")
        (info / "entry_points.txt").write_text(f"[foxhunt.plugins]\n{name} = foxhunt_{name}\n")
    return site


@pytest.fixture()
def with_nan_plugin(nan_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make the fault-injection plugins discoverable here and in every trial process started by this test."""
    monkeypatch.syspath_prepend(str(nan_site))
    monkeypatch.setenv("PYTHONPATH", str(nan_site))
    monkeypatch.delenv("FOXHUNT_PLUGINS", raising=False)
    return nan_site


@pytest.fixture(scope="session")
def smoke_local(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """The smoke plan, run once on the local backend (shared by the tests that compare with it)."""
    out = tmp_path_factory.mktemp("smoke") / "local"
    res = invoke("rollout", "run", SMOKE, "--dir", out, "--workers", "2")
    return out, res


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance (2 CPUs) for the whole test session, shut down at its end."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
