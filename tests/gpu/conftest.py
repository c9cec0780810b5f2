"""Fixtures of the kernel parity tests: CuPy (imported only when a test runs) and fresh inputs.

Tests marked ``gpu`` are skipped by ``tests/conftest.py`` unless CuPy and a CUDA GPU are present,
so nothing here may import CuPy at collection time.
"""

from __future__ import annotations

import pytest

from foxhunt_core.testing.gpu import fresh_rng


@pytest.fixture
def cp():
    """The CuPy module."""
    return pytest.importorskip("cupy")


@pytest.fixture
def rng(request):
    """A generator with a fresh seed each run; the seed is printed (shown when the test fails)."""
    return fresh_rng(request)


@pytest.fixture(autouse=True)
def _own_gemm_cache(tmp_path, monkeypatch):
    """Every GPU test with its own (empty) machine GEMM tuning cache: no test reads or writes the
    machine's real one."""
    monkeypatch.setenv("FOXHUNT_CACHE_DIR", str(tmp_path / "foxhunt-cache"))
