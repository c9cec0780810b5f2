"""What the TF32 tensor-core kernels' wrappers share (tc_gemm.cuh's kernels: glu_gemm, linear_gemm,
glu_backward_gemm, wgrad_gemm): the tile, shared-memory arithmetic, the operand checks, the
weights transposed and rounded as the kernels read them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..arrays import rows_view, view_out
from ..defines import value
from ..launch import get_kernel as _kernel
from ..launch import i32

Array = Any
GLU_GEMM_ROWS, GLU_GEMM_COLS, GLU_GEMM_THREADS = value("TC_BM"), value("GW_BH"), value("TC_THREADS")
GLU_GEMM_BOX_K = value("TC_BK")  # columns of K per TMA box (one 128-byte swizzle row)
GLU_GEMM_STAGES = value("GW_STAGES")
# h's boxes (32 columns x 128 rows, 16 KiB) glu_gemm.cu's staging buffer holds, and how many of them
# a hand-off to the TMA unit takes (GW_STAGED_BOXES, GW_STORE_BOXES): the tile's four at once take
# 64 KiB, which leaves room for three stages only; two used in turn, one at a time, make room for a
# fourth.
GLU_GEMM_STAGED_BOXES, GLU_GEMM_STORE_BOXES = value("GW_STAGED_BOXES"), value("GW_STORE_BOXES")
GLU_GEMM_CLUSTER = value("GW_CLUSTER")  # CTAs per cluster, sharing their weight loads (TMA multicast)
BIG_SMEM: set[int] = set()  # (ids of) the kernels given their shared memory limit
SMEM_LIMIT = 227 * 1024  # a Hopper block's shared memory, at most
TILE_A = GLU_GEMM_ROWS * GLU_GEMM_BOX_K * 4  # a stage's rows of A (TC_TILE_A): 16 KiB
BOX = GLU_GEMM_ROWS * 128  # a box of 32 columns x 128 rows: 16 KiB


def opt_in_smem(fn: Any, smem: int) -> None:
    """Give a compiled kernel ``smem`` bytes of dynamic shared memory (more than 48 KiB needs the
    opt-in; once per compiled kernel)."""
    if id(fn) not in BIG_SMEM:
        fn.max_dynamic_shared_size_bytes = smem
        BIG_SMEM.add(id(fn))


def glu_gemm_supported(H: int | None = None) -> bool:
    """Whether :func:`glu_gemm` runs on the current device (Hopper's wgmma and TMA: compute
    capability 9.0) and, given ``H``, GLUs of that width (a multiple of its 128-column tile)."""
    from ...backend import compute_capability

    return compute_capability() == "90" and (H is None or H % GLU_GEMM_COLS == 0)


def tc_operands(k: str, names: str, arrays: Sequence[Any]) -> None:
    """The checks every tensor-core kernel's wrapper starts with: ``arrays`` (called ``names`` in
    the message) are 2-D CuPy arrays, and the device has wgmma (:func:`glu_gemm_supported`)."""
    import cupy

    if not all(isinstance(x, cupy.ndarray) and x.ndim == 2 for x in arrays):
        raise ValueError(f"{k}: {names} must be 2-D CuPy arrays")
    if not glu_gemm_supported():
        raise RuntimeError(f"{k}: needs a compute capability 9.0 GPU (wgmma)")


def transpose(w: Array, *, out: Array | None = None) -> Array:
    """``w.T`` rounded to TF32 (to nearest, as cuBLAS rounds its TF32 operands) as a new row-major
    array (``out`` [N, K] may be a view with any row pitch): the weights as :func:`glu_gemm`
    reads them."""
    k = "transpose_tile"
    if getattr(w, "ndim", 0) != 2:
        raise ValueError(f"{k}: w must be a 2-D CuPy array")
    K, N = w.shape
    ld_w = rows_view(k, "w", w, (K, N))
    out, ld_out = view_out(k, "out", out, (N, K))
    if K and N:
        _kernel("glu_gemm.cu", k)((-(-N // 32), -(-K // 32)), (32, 8), (w, i32(ld_w), out, i32(ld_out), i32(K), i32(N)))
    return out

