"""TMA tensor maps (``CUtensorMap``) for kernels that load tiles with the Hopper tensor memory
accelerator: encoded by the driver (``cuTensorMapEncodeTiled``, through ctypes) and passed to a
kernel by value as a 128-byte NumPy record (a ``const __grid_constant__`` parameter), so that a
captured CUDA graph keeps its own copy."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..backend import BackendError

# The driver's enums (cuda.h): CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion.
FLOAT32 = 7
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
TENSOR_MAP = np.dtype([("opaque", np.uint64, (16,))])  # sizeof(CUtensorMap), 64-byte aligned in C
CUDA_SUCCESS = 0

_encode: Any = None


def _encoder() -> Any:
    """``cuTensorMapEncodeTiled`` of the driver library the process already holds."""
    global _encode
    if _encode is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BackendError(f"TMA tensor maps: cannot load libcuda.so.1 ({exc})") from None
        fn = lib.cuTensorMapEncodeTiled
        u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        _encode = fn
    return _encode


def matrix_map(kernel: str, name: str, a: Any, box_cols: int, box_rows: int) -> np.ndarray:
    """The tensor map of the float32 matrix ``a`` ([rows, cols], unit column stride, any row
    pitch that is a multiple of 16 bytes, 16-byte aligned) for boxes of ``box_cols`` x
    ``box_rows`` elements with the 128-byte swizzle (``box_cols`` x 4 bytes must be 128 at most).
    Elements of a box past the matrix read as zeros. Returns a one-element record array: a kernel
    argument passed by value."""
    rows, cols = a.shape
    pitch = a.strides[0]
    if a.dtype != np.float32 or a.strides[1] != 4 or pitch % 16 or a.data.ptr % 16:
        raise ValueError(f"{kernel}: {name} must be float32 with unit column stride, its row pitch a multiple "
                         "of 16 bytes and its address 16-byte aligned")
    if not (0 < box_cols * 4 <= 128 and 0 < box_rows <= 256 and rows > 0 and cols > 0):
        raise ValueError(f"{kernel}: {name}: box {box_cols} x {box_rows} over a {rows} x {cols} matrix")
    raw = np.zeros(2 * TENSOR_MAP.itemsize // 8, dtype=np.uint64)  # room to align to 64 bytes
    off = (-raw.ctypes.data) % 64 // 8
    buf = raw[off : off + 16]
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    res = _encoder()(
        ctypes.c_void_p(buf.ctypes.data), FLOAT32, 2, ctypes.c_void_p(a.data.ptr),
        (u64 * 2)(cols, rows), (u64 * 1)(pitch), (u32 * 2)(box_cols, box_rows), (u32 * 2)(1, 1),
        0, SWIZZLE_128B, L2_PROMOTION_256B, 0)
    if res != CUDA_SUCCESS:
        raise BackendError(f"{kernel}: cuTensorMapEncodeTiled failed for {name} ({rows} x {cols}, pitch {pitch} "
                           f"bytes): CUresult {res}")
    return np.frombuffer(buf.tobytes(), dtype=TENSOR_MAP)


class _LaunchConfig(ctypes.Structure):
    """The driver's CUlaunchConfig."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


_CLUSTERS: dict[tuple[int, int, int, int], int] = {}


def max_active_clusters(kernel: str, fn: Any, threads: int, smem: int, cluster: int) -> int:
    """How many clusters of the compiled kernel ``fn`` (its cluster size ``cluster`` fixed at compile
    time by ``__cluster_dims__``) the device can hold at once with ``threads`` threads and ``smem``
    bytes of dynamic shared memory per block (``cuOccupancyMaxActiveClusters``): the grid of a
    persistent kernel, every block of which must be resident together. Cached per function."""
    ptr = int(getattr(fn, "kernel", fn).ptr)  # (a RawKernel's CUfunction)
    key = (ptr, threads, smem, cluster)
    n = _CLUSTERS.get(key)
    if n is None:
        _encoder()
        lib = ctypes.CDLL("libcuda.so.1")
        query = lib.cuOccupancyMaxActiveClusters
        query.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
        query.restype = ctypes.c_int
        cfg = _LaunchConfig(cluster * 1024, 1, 1, threads, 1, 1, smem, None, None, 0)
        out = ctypes.c_int(0)
        res = query(ctypes.byref(out), ctypes.c_void_p(ptr), ctypes.byref(cfg))
        if res != CUDA_SUCCESS or out.value < 1:
            raise BackendError(f"{kernel}: cuOccupancyMaxActiveClusters failed (CUresult {res}, {out.value} clusters "
                               f"of {cluster} blocks of {threads} threads and {smem} bytes)")
        n = _CLUSTERS[key] = int(out.value)
    return n
