"""Helpers of the kernel parity tests: NaN-poisoned outputs, float64 copies, relative errors."""

from __future__ import annotations

from typing import Any

import numpy as np


def nan_like(cp: Any, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
    """A device array filled with NaN, so that an element the kernel does not write fails the test."""
    return cp.full(shape, np.nan, dtype=dtype)


def host64(a: Any) -> np.ndarray:
    """A float64 NumPy copy of a NumPy or CuPy array."""
    return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)


def rel_err(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 (NaN in ``out`` gives NaN, which fails any ``<``)."""
    o, r = host64(out), host64(ref)
    assert o.shape == r.shape, f"shape {o.shape} != {r.shape}"
    den = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (den if den > 0 else 1.0))


def assert_close(name: str, out: Any, ref: Any, tol: float) -> None:
    err = rel_err(out, ref)
    assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


def to_dev(cp: Any, a: np.ndarray, dtype: Any = np.float32) -> Any:
    return cp.asarray(np.ascontiguousarray(a, dtype=dtype))
