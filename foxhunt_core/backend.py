"""Array backend: NumPy on the CPU, CuPy on a CUDA GPU (``--device auto|cpu|cuda``).

CuPy is optional (extras ``[cuda12]`` / ``[cuda13]``); nothing here imports it unless the CUDA
backend is asked for or probed.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class BackendError(RuntimeError):
    """The requested device cannot be used; the message says why."""


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - missing CuPy, driver or device all mean "no"
        return False


def select(device: str) -> tuple[Any, str]:
    """``(xp, name)`` for ``auto``, ``cpu`` or ``cuda``."""
    if device == "cpu":
        return np, "cpu"
    if device in ("cuda", "auto"):
        if cuda_available():
            import cupy

            return cupy, "cuda"
        if device == "cuda":
            raise BackendError("device 'cuda' requested but CuPy or a CUDA GPU is not available")
        return np, "cpu"
    raise BackendError(f"unknown device {device!r} (expected auto, cpu or cuda)")


def to_numpy(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)
