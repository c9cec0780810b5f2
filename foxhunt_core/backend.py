"""Array backend: NumPy on the CPU, CuPy on a CUDA GPU (``--device auto|cpu|cuda``).

CuPy is optional (extras ``[cuda12]`` / ``[cuda13]``); nothing here imports it unless the CUDA
backend is asked for or probed.
"""

from __future__ import annotations

import os
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


def select(device: str, tf32: bool = True, gemm_autotune: bool = False) -> tuple[Any, str]:
    """``(xp, name)`` for ``auto``, ``cpu`` or ``cuda``.

    ``tf32`` lets cuBLAS use TF32 tensor cores for float32 GEMMs (CuPy reads ``CUPY_TF32`` when it
    is first imported, so this must run before anything imports CuPy); ``gemm_autotune`` switches
    on cuBLASLt's algorithm timing (:func:`foxhunt_core.gpu.cublaslt.set_autotune`).
    """
    if device == "cpu":
        return np, "cpu"
    if device in ("cuda", "auto"):
        if tf32:
            os.environ.setdefault("CUPY_TF32", "1")
        if cuda_available():
            import cupy

            from .gpu import cublas, cublaslt

            cublas.set_tf32(tf32)
            cublaslt.set_autotune(gemm_autotune)
            return cupy, "cuda"
        if device == "cuda":
            raise BackendError("device 'cuda' requested but CuPy or a CUDA GPU is not available")
        return np, "cpu"
    raise BackendError(f"unknown device {device!r} (expected auto, cpu or cuda)")


def to_numpy(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def scatter_add(idx: Any, values: Any, size: int) -> Any:
    """``out[idx[i]] += values[i]`` over a zero vector of ``size`` (repeated indices add up), on the
    array module of ``values``: NumPy's bincount; on CuPy an unbuffered add, which keeps the
    operation on the device without a host sync."""
    if isinstance(values, np.ndarray):
        return np.bincount(idx, weights=values, minlength=size)
    import cupy

    out = cupy.zeros(size, dtype=values.dtype)
    cupy.add.at(out, idx, values)
    return out


# ----------------------------------------------------------------------------- CUDA kernels
_MODULE_CACHE: dict[tuple[int, str, tuple[tuple[str, str], ...]], Any] = {}
# A kernel source carrying this line uses instructions of its architecture's "a" variant (wgmma on
# sm_90a): it is compiled for sm_<cc>a.
ARCH_SPECIFIC = "// foxhunt: arch-specific"


def compute_capability() -> str:
    """``"90"`` for an sm_90 device (the current CuPy device)."""
    import cupy

    return str(cupy.cuda.Device().compute_capability)


def load_module(cu_path: str, defines: dict[str, Any] | None = None, include: tuple[str, ...] = ()) -> Any:
    """Compile a ``.cu`` file with NVRTC for the current device and cache it per device.

    ``defines`` become a ``#define NAME VALUE`` preamble (compile-time constants such as the
    atom count). The source is read from disk, so kernels live in real ``.cu`` files next to
    the Python that launches them. ``include``: directories searched for headers after the
    file's own (a plugin's gate fragment).
    """
    from pathlib import Path

    import cupy

    path = Path(cu_path)
    defs = tuple(sorted((str(k), str(v)) for k, v in (defines or {}).items()))
    dirs = tuple(str(Path(d).resolve()) for d in include)
    key = (cupy.cuda.Device().id, str(path.resolve()), defs, dirs)
    mod = _MODULE_CACHE.get(key)
    if mod is None:
        try:
            src = path.read_text()
        except OSError as exc:
            raise BackendError(f"{path}: cannot read kernel source ({exc.strerror})") from None
        preamble = "".join(f"#define {k} {v}\n" for k, v in defs)
        arch = f"-arch=sm_{compute_capability()}" + ("a" if ARCH_SPECIFIC in src else "")
        try:
            # -I: a kernel may include headers that sit beside it (philox.cuh)
            mod = cupy.RawModule(code=preamble + src, options=(arch, "-std=c++17", f"-I{path.parent.resolve()}",
                                                               *(f"-I{d}" for d in dirs)))
            mod.compile()
        except Exception as exc:  # noqa: BLE001 - NVRTC errors carry the compiler log
            raise BackendError(f"{path}: compilation failed: {exc}") from None
        _MODULE_CACHE[key] = mod
    return mod


def check_array(kernel: str, name: str, a: Any, dtype: Any, shape: tuple[int | None, ...]) -> None:
    """Raise a ``TypeError``/``ValueError`` naming ``kernel`` unless ``a`` fits (``None`` = any size)."""
    import cupy

    if not isinstance(a, cupy.ndarray):
        raise TypeError(f"{kernel}: {name} must be a CuPy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype):
        raise TypeError(f"{kernel}: {name} must be {np.dtype(dtype)}, got {a.dtype}")
    if len(a.shape) != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)):
        raise ValueError(f"{kernel}: {name} has shape {a.shape}, expected {shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{kernel}: {name} must be C-contiguous")
