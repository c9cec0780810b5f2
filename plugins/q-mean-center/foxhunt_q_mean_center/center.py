"""Q-mean centering: ``Q_c = Q - mean(Q)`` over every expected Q-value of the batch.

Plan Task 10 (component 8). Subtracting one constant from all B x A values leaves every
per-branch argmax (and every Boltzmann probability) unchanged and removes the common drift that
bootstrapping accumulates. The raw Q-mean drift statistic is *not* affected: the core reads it
from expected Q before any ``pre_attention`` stage runs (DESIGN.md, defect 6).

Three implementations of one function:

* :func:`center_reference` — the NumPy oracle (mean taken in float64);
* :func:`center_xp` — array operations on any backend (NumPy or CuPy);
* :func:`center_cuda` — the typed launch wrapper of ``kernels/q_mean_center.cu``, a multi-block
  reduction (defect 8 of the plan: one block of 256 threads does not scale with the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KERNEL_FILE = Path(__file__).parent / "kernels" / "q_mean_center.cu"
KERNEL_FUNCTIONS = ("q_mean_partial", "q_mean_subtract")
THREADS = 256
ITEMS_PER_THREAD = 8
MAX_PARTIALS = 512
MAX_BLOCKS = 4096

Array = Any
_KERNELS: dict[int, tuple[Any, Any]] = {}


def center_reference(q: np.ndarray) -> np.ndarray:
    """NumPy oracle: ``q - mean(q)`` with the mean in float64, returned in ``q``'s dtype."""
    q = np.asarray(q)
    return (q.astype(np.float64) - q.mean(dtype=np.float64)).astype(q.dtype)


def center_xp(xp: Any, q: Array) -> Array:
    """``q - mean(q)`` with the backend's array operations (mean accumulated in float64)."""
    return (q - q.mean(dtype=xp.float64)).astype(q.dtype, copy=False)


def launch_shape(total: int) -> tuple[int, int]:
    """``(partial blocks, subtract blocks)`` for ``total`` values (both at least 1)."""
    parts = max(1, min(MAX_PARTIALS, -(-total // (THREADS * ITEMS_PER_THREAD))))
    blocks = max(1, min(MAX_BLOCKS, -(-total // THREADS)))
    return parts, blocks


def _kernels() -> tuple[Any, Any]:
    """``(q_mean_partial, q_mean_subtract)`` compiled for the current device (cached per device)."""
    import cupy

    from foxhunt_core.backend import load_module

    dev = cupy.cuda.runtime.getDevice()
    fns = _KERNELS.get(dev)
    if fns is None:
        mod = load_module(str(KERNEL_FILE), {"QMC_THREADS": THREADS})
        fns = _KERNELS[dev] = (mod.get_function(KERNEL_FUNCTIONS[0]), mod.get_function(KERNEL_FUNCTIONS[1]))
    return fns


def center_cuda(q: Array, out: Array | None = None) -> Array:
    """Center ``q`` [B, A] (float32, C-contiguous CuPy array) with the CUDA kernels.

    ``out`` (same shape and dtype, must not alias ``q``) receives the result; a new array when
    ``None``. The input is not modified: the core keeps the raw expected Q for its statistics.
    """
    import cupy

    from foxhunt_core.backend import check_array

    check_array("q_mean_center", "q", q, np.float32, (None, None))
    if out is None:
        out = cupy.empty_like(q)
    else:
        check_array("q_mean_center", "out", out, np.float32, tuple(q.shape))
        if out.data.ptr == q.data.ptr:
            raise ValueError("q_mean_center: out must not alias q")
    total = int(q.size)
    if total == 0:
        return out
    partial_kernel, subtract_kernel = _kernels()
    parts, blocks = launch_shape(total)
    partial = cupy.empty(parts, dtype=cupy.float64)
    partial_kernel((parts,), (THREADS,), (q, partial, np.int64(total)))
    subtract_kernel((blocks,), (THREADS,), (q, partial, np.int32(parts), out, np.int64(total)))
    return out


@dataclass(frozen=True)
class QMeanCenterStage:
    """The ``pre_attention`` stage: expected Q [B, A] -> centred Q [B, A] (a new array)."""

    use_cuda_kernel: bool = True
    name: str = "q_mean_center"

    def forward(self, xp: Any, q: Array) -> Array:
        on_gpu = getattr(xp, "__name__", "") == "cupy"
        if on_gpu and self.use_cuda_kernel and q.dtype == np.float32 and q.ndim == 2 and q.flags.c_contiguous:
            return center_cuda(q)
        return center_xp(xp, q)
