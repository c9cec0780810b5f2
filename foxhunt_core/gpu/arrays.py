"""The argument checks and grid sizes every launch wrapper shares (kernels of a thread per element,
views of wider arrays, outputs given or made)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import check_array
from .launch import THREADS, blocks_for, output, sm_count

Array = Any
F32 = np.float32
MAX_ELEMENTWISE = 1 << 30  # elementwise.cu indexes with 32-bit integers


def elementwise_grid(total: int) -> int:
    return blocks_for(total, THREADS, 32 * sm_count())


def matrix(k: str, name: str, a: Array) -> tuple[int, int]:
    check_array(k, name, a, F32, (None, None))
    if a.size >= MAX_ELEMENTWISE:
        raise ValueError(f"{k}: {name} has {a.size} elements; the elementwise kernels take fewer than 2^30")
    return a.shape


def rows_view(k: str, name: str, a: Array, shape: tuple[int, int]) -> int:
    """Row pitch (floats) of ``a``: a [rows, cols] float32 view with unit column stride (e.g. a
    column block of a wider array)."""
    import cupy

    if not isinstance(a, cupy.ndarray):
        raise TypeError(f"{k}: {name} must be a CuPy array, got {type(a).__name__}")
    if a.dtype != F32:
        raise TypeError(f"{k}: {name} must be float32, got {a.dtype}")
    if a.ndim != 2 or tuple(a.shape) != tuple(shape):
        raise ValueError(f"{k}: {name} must be a {list(shape)} float32 matrix, got {list(a.shape)}")
    ld = a.strides[0] // 4
    if a.strides[1] != 4 or ld < shape[1] or a.strides[0] % 4:
        raise ValueError(f"{k}: {name} must have unit column stride and a row pitch of at least {shape[1]}")
    return ld


def augmented(k: str, name: str, out: Array | None, rows: int, cols: int, width: int | None) -> Array:
    """An output of ``rows`` rows and ``width`` (>= ``cols``) columns: given (checked) or new."""
    width = cols if width is None else int(width)
    if width < cols:
        raise ValueError(f"{k}: width {width} is less than the layer's {cols} columns")
    if width * max(rows, 1) >= MAX_ELEMENTWISE:
        raise ValueError(f"{k}: {name} would have {rows * width} elements; "
                         "the elementwise kernels take fewer than 2^30")
    return output(k, name, out, (rows, width))


def aligned16(*arrays: Array | None) -> bool:
    return all(a is None or a.data.ptr % 16 == 0 for a in arrays)


def view_out(k: str, name: str, out: Array | None, shape: tuple[int, int]) -> tuple[Array, int]:
    """An output view (any row pitch, unit column stride) of ``shape``, or a new array; and its pitch."""
    if out is None:
        import cupy

        out = cupy.empty(shape, dtype=F32)
    return out, rows_view(k, name, out, shape)


def glu_blocks(k: str, pv: Array, blocks: int) -> tuple[int, int, int]:
    """``(B, H, ld_pv)`` of the GLU's input: ``blocks`` joint [gate | value] blocks per row."""
    import cupy

    if not isinstance(pv, cupy.ndarray) or pv.ndim != 2:
        raise ValueError(f"{k}: pv must be a 2-D CuPy array")
    B, cols = pv.shape
    if blocks < 1 or cols % (2 * blocks):
        raise ValueError(f"{k}: pv has {cols} columns; {blocks} joint blocks [gate | value] need a multiple of "
                         f"{2 * blocks}")
    ld = rows_view(k, "pv", pv, (B, cols))
    if ld * max(B, 1) >= MAX_ELEMENTWISE:
        raise ValueError(f"{k}: pv spans {ld * B} elements; the elementwise kernels take fewer than 2^30")
    return B, cols // (2 * blocks), ld



def glu_output(k: str, pv: Array, blocks: int, width: int | None, h: Array | None) -> tuple:
    """``(B, H, ld_pv, W, h, ld_h)`` of a GLU forward over ``pv`` (:func:`glu_blocks`): ``h``
    [B, blocks W], given (checked) or new, ``W`` the augmented width (at least H; H if None)."""
    B, H, ld_pv = glu_blocks(k, pv, blocks)
    W = H if width is None else int(width)
    if W < H:
        raise ValueError(f"{k}: width {W} is less than the layer's {H} columns")
    h, ld_h = view_out(k, "h", h, (B, blocks * W))
    return B, H, ld_pv, W, h, ld_h
