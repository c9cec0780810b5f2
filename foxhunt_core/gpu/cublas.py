"""GEMMs through cuBLAS, callable inside a CUDA-graph capture.

CuPy refuses every cuBLAS call while a stream is capturing (its ``setStream`` guard raises),
although cuBLAS itself supports stream capture when it is given its own workspace. So the
GEMMs of the training step go through this small ctypes binding of ``cublasGemmEx`` and
``cublasGemmStridedBatchedEx`` on the same ``libcublas`` that CuPy loaded, with one handle per
device, a fixed workspace (no allocation during capture) and the stream set only when it
changes. TF32 tensor cores are used for float32 when enabled (:func:`set_tf32`; the default follows
``CUPY_TF32``).

Layout: arrays are row-major; an operand may be C-contiguous or the transpose view of a
C-contiguous array (``w.T``); anything else is copied to contiguous first. The product of
row-major ``A [M, K]`` and ``B [K, N]`` is computed as the column-major ``C^T = B^T A^T``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from . import cublaslt
from .cudalib import open_library

OP_N, OP_T = 0, 1
R_32F, R_64F = 0, 1
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70
GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20

_lib: Any = None
_handles: dict[int, _Handle] = {}
_tf32 = os.environ.get("CUPY_TF32", "0") == "1"


def set_tf32(enabled: bool) -> None:
    """Use TF32 tensor cores for float32 GEMMs from now on (the run's ``train.tf32``)."""
    global _tf32
    _tf32 = bool(enabled)


def tf32_enabled() -> bool:
    return _tf32


class CublasError(RuntimeError):
    pass


def _load() -> Any:
    global _lib
    if _lib is None:
        import cupy  # noqa: F401 - makes sure CuPy's libcublas is loaded first
        from cupy_backends.cuda.libs import cublas as _cupy_cublas  # noqa: F401

        _lib = open_library("cublas", CublasError)
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        _lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
        _lib.cublasSetStream_v2.argtypes = [vp, vp]
        _lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
        _lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        _lib.cublasGemmStridedBatchedEx.argtypes = [
            vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i]
    return _lib


class _Handle:
    def __init__(self) -> None:
        lib = _load()
        h = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        self.ptr = h
        self.stream = None
        # One workspace per stream: GEMMs on two streams may run at once. Made at a stream's first
        # GEMM (the update's warm-up runs before its capture) and kept.
        self.workspaces: dict[int, Any] = {}

    def bind(self, stream_ptr: int) -> None:
        if stream_ptr != self.stream:
            import cupy

            lib = _load()
            ws = self.workspaces.get(stream_ptr)
            if ws is None:
                ws = self.workspaces[stream_ptr] = cupy.cuda.memory.alloc(WORKSPACE_BYTES)
            _check(lib.cublasSetStream_v2(self.ptr, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
            # Setting the stream resets the workspace to cuBLAS's own pool: give the stream's back.
            _check(lib.cublasSetWorkspace_v2(self.ptr, ctypes.c_void_p(ws.ptr), WORKSPACE_BYTES),
                   "cublasSetWorkspace")
            self.stream = stream_ptr


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} failed with cuBLAS status {status}")


def _handle() -> _Handle:
    import cupy

    dev = cupy.cuda.Device().id
    h = _handles.get(dev)
    if h is None:
        h = _handles[dev] = _Handle()
    h.bind(cupy.cuda.get_current_stream().ptr)
    return h


def _operand(x: Any) -> tuple[Any, int, int]:
    """``(array, op, ld)`` of a row-major 2-D operand (or per-matrix layout of a 3-D one)."""
    isz = x.itemsize
    r, c = x.strides[-2] // isz, x.strides[-1] // isz
    rows, cols = x.shape[-2], x.shape[-1]
    if c == 1 and (r >= max(cols, 1) or rows == 1):
        return x, OP_N, max(r, cols, 1)
    if r == 1 and (c >= max(rows, 1) or cols == 1):
        return x, OP_T, max(c, rows, 1)
    import cupy

    y = cupy.ascontiguousarray(x)
    return y, OP_N, max(cols, 1)


def _types(dtype: Any) -> tuple[int, int, Any]:
    import numpy as np

    if dtype == np.float32:
        return R_32F, (COMPUTE_32F_FAST_TF32 if _tf32 else COMPUTE_32F), ctypes.c_float
    if dtype == np.float64:
        return R_64F, COMPUTE_64F, ctypes.c_double
    raise TypeError(f"cublas gemm: unsupported dtype {dtype}")


def _out_operand(out: Any, M: int, N: int, dtype: Any, who: str) -> int:
    """Leading dimension of a row-major output view ``out`` [M, N] (unit column stride)."""
    if out.dtype != dtype:
        raise TypeError(f"{who}: out has dtype {out.dtype}, expected {dtype}")
    if out.ndim != 2 or tuple(out.shape) != (M, N):
        raise ValueError(f"{who}: out has shape {tuple(out.shape)}, expected {(M, N)}")
    isz = out.itemsize
    ld = out.strides[0] // isz
    if out.strides[1] != isz or ld < N or out.strides[0] % isz:
        raise ValueError(f"{who}: out must be a row-major view with unit column stride")
    return max(ld, 1)


def matmul(a: Any, b: Any, out: Any = None, beta: float = 0.0, *, bias: Any = None, relu: bool = False,
           stack: tuple[int, int] | None = None, batch: tuple[int, int, int, int] | None = None) -> Any:
    """``a @ b`` for 2-D/2-D, 3-D/2-D and 3-D/3-D (batched) float32/float64 CuPy arrays.

    For 2-D operands ``out`` may be given: a row-major view (any row stride, e.g. a column block
    of a wider buffer), which receives ``a @ b + beta * out``. Also for 2-D operands,
    ``bias`` [N] is added to every row and ``relu`` applied after it: ``relu(a @ b + bias)``.

    ``stack = (count, stride)`` (2-D operands): ``b`` and ``bias`` belong to the first of
    ``count`` parameter trees that share one allocation at a constant stride
    (:meth:`foxhunt_core.gpu.flat.FlatTree.stacked`), and the rows of ``a`` and ``out`` fall into
    ``count`` equal parts: part ``i`` is multiplied by the weights ``stride * i`` elements after
    ``b`` (its bias as far after ``bias``) — one strided-batched GEMM. The caller vouches that
    that memory holds the same layout as ``b``; ``stride = 0`` is the plain product.

    ``batch = (count, stride_a, stride_b, stride_out)`` (2-D operands, no epilogue): ``a``, ``b``
    and ``out`` are the first of ``count`` products whose operands lie those many elements apart
    (e.g. the column blocks of several branches side by side) — one strided-batched GEMM. The
    caller vouches for that memory.

    float32 products go through cuBLASLt (:mod:`.cublaslt`), which fuses the bias and the ReLU
    into the GEMM where it can; otherwise, and for float64, ``cublasGemmEx`` and separate passes.
    """
    import cupy

    if a.dtype != b.dtype:
        raise TypeError(f"cublas matmul: dtypes differ ({a.dtype}, {b.dtype})")
    extras = bias is not None or relu
    count, wstride = (1, 0) if stack is None or stack[1] == 0 else (int(stack[0]), int(stack[1]))
    if count > 1 and (a.ndim != 2 or b.ndim != 2 or a.shape[0] % count):
        raise ValueError(f"cublas matmul: stack {stack} needs 2-D operands and rows of a divisible by {count}")
    strided = batch if batch is not None and batch[0] > 1 else None
    if strided is not None and (count > 1 or extras or out is None or a.ndim != 2 or b.ndim != 2):
        raise ValueError("cublas matmul: batch needs 2-D operands, out, and no stack, bias or relu")
    if a.ndim == 3 and b.ndim == 2:
        if out is not None or extras:
            raise ValueError("cublas matmul: out, bias and relu need 2-D operands")
        a2 = a if a.flags.c_contiguous else cupy.ascontiguousarray(a)
        return matmul(a2.reshape(-1, a.shape[2]), b).reshape(a.shape[0], a.shape[1], b.shape[1])
    if a.ndim != b.ndim or a.ndim not in (2, 3):
        raise ValueError(f"cublas matmul: unsupported shapes {a.shape} @ {b.shape}")
    M, K = a.shape[-2], a.shape[-1]
    N = b.shape[-1]
    if b.shape[-2] != K or (a.ndim == 3 and a.shape[0] != b.shape[0]):
        raise ValueError(f"cublas matmul: shapes {a.shape} and {b.shape} do not align")
    if a.ndim == 3 and (out is not None or extras):
        raise ValueError("cublas matmul: out, bias and relu need 2-D operands")
    if bias is not None and (bias.dtype != a.dtype or bias.shape != (N,) or not bias.flags.c_contiguous):
        raise ValueError(f"cublas matmul: bias must be a contiguous [{N}] {a.dtype} vector, "
                         f"got {bias.shape} {bias.dtype}")
    batch = a.shape[0] if a.ndim == 3 else 1
    if out is None:
        if beta != 0.0:
            raise ValueError("cublas matmul: beta needs out")
        out = cupy.empty(((batch,) if a.ndim == 3 else ()) + (M, N), dtype=a.dtype)
        ldc = N
    else:
        ldc = _out_operand(out, M, N, a.dtype, "cublas matmul")
    if M == 0 or N == 0 or batch == 0 or K == 0:
        if K == 0 and beta == 0.0:
            out.fill(0)
        if extras:
            _epilogue_passes(out, bias, relu)
        return out
    dtype_id, compute, scalar = _types(a.dtype)
    a, op_a, lda = _operand(a)
    b, op_b, ldb = _operand(b)
    Mp = M // count  # rows per part of a stacked product
    if strided is not None:  # (count, stride of our b, of our a, of out, of the bias) in cuBLASLt's order
        nb, sa, sb, sc = (int(x) for x in strided)
        lt_batch = (nb, sb, sa, sc, 0)
    else:
        nb, sa, sb, sc = count, Mp * (lda if op_a == OP_N else 1), wstride, Mp * ldc
        lt_batch = (nb, sb, sa, sc, wstride)
    if a.ndim == 2 and a.dtype == cupy.float32 and cublaslt.enabled():
        stream = cupy.cuda.get_current_stream().ptr
        epi, vec = cublaslt.EPI_DEFAULT, 0
        if bias is not None:
            epi, vec = (cublaslt.EPI_RELU_BIAS if relu else cublaslt.EPI_BIAS), bias.data.ptr
        elif relu:
            epi = cublaslt.EPI_RELU
        args = (compute, op_b, op_a, N, Mp, K, b.data.ptr, ldb, a.data.ptr, lda, out.data.ptr, ldc, beta, stream)
        if cublaslt.matmul(*args, epilogue=epi, bias_ptr=vec, batch=lt_batch):
            return out
        if epi != cublaslt.EPI_DEFAULT and cublaslt.matmul(*args, batch=lt_batch):
            _stacked_epilogues(out, bias, relu, count, wstride)
            return out
    h = _handle()
    alpha, cbeta = scalar(1.0), scalar(beta)
    lib = _load()
    if a.ndim == 2 and nb == 1:
        st = lib.cublasGemmEx(
            h.ptr, op_b, op_a, N, M, K, ctypes.byref(alpha), ctypes.c_void_p(b.data.ptr), dtype_id, ldb,
            ctypes.c_void_p(a.data.ptr), dtype_id, lda, ctypes.byref(cbeta), ctypes.c_void_p(out.data.ptr),
            dtype_id, ldc, compute, GEMM_DEFAULT)
        _check(st, "cublasGemmEx")
        if extras:
            _epilogue_passes(out, bias, relu)
    elif a.ndim == 2:  # a stacked or batched product
        st = lib.cublasGemmStridedBatchedEx(
            h.ptr, op_b, op_a, N, Mp, K, ctypes.byref(alpha), ctypes.c_void_p(b.data.ptr), dtype_id, ldb,
            sb, ctypes.c_void_p(a.data.ptr), dtype_id, lda, sa,
            ctypes.byref(cbeta), ctypes.c_void_p(out.data.ptr), dtype_id, ldc, sc, nb, compute,
            GEMM_DEFAULT)
        _check(st, "cublasGemmStridedBatchedEx")
        if extras:
            _stacked_epilogues(out, bias, relu, count, wstride)
    else:
        isz = a.itemsize
        st = lib.cublasGemmStridedBatchedEx(
            h.ptr, op_b, op_a, N, M, K, ctypes.byref(alpha), ctypes.c_void_p(b.data.ptr), dtype_id, ldb,
            b.strides[0] // isz, ctypes.c_void_p(a.data.ptr), dtype_id, lda, a.strides[0] // isz,
            ctypes.byref(cbeta), ctypes.c_void_p(out.data.ptr), dtype_id, N, M * N, batch, compute,
            GEMM_DEFAULT)
        _check(st, "cublasGemmStridedBatchedEx")
    return out


def _stacked_epilogues(out: Any, bias: Any, relu: bool, count: int, stride: int) -> None:
    """The epilogues of a stacked product as separate passes, part by part (each its own bias)."""
    import cupy

    rows = out.shape[0] // count
    for i in range(count):
        b = None
        if bias is not None:
            b = cupy.ndarray(bias.shape, bias.dtype, bias.data + i * stride * bias.itemsize)
        _epilogue_passes(out[i * rows:(i + 1) * rows], b, relu)


_ONES: dict[tuple[int, int, str], Any] = {}


def ones_row(rows: int, dtype: Any) -> Any:
    """A cached [1, rows] row of ones (column sums as a GEMM; made once, outside any capture)."""
    import cupy

    key = (cupy.cuda.Device().id, rows, str(dtype))
    ones = _ONES.get(key)
    if ones is None:
        ones = _ONES[key] = cupy.ones((1, rows), dtype=dtype)
    return ones


def _epilogue_passes(out: Any, bias: Any, relu: bool) -> None:
    """The epilogues as separate passes (where the GEMM could not fuse them)."""
    import cupy

    if bias is not None and relu and out.dtype == cupy.float32 and out.flags.c_contiguous:
        from .kernels import bias_relu_forward

        bias_relu_forward(out, bias, out=out)  # one pass
        return
    if bias is not None:
        out += bias
    if relu:
        cupy.maximum(out, 0, out=out)
