"""Typed launch wrappers of ``kernels/kan_gate.cu`` (CuPy float32, C-contiguous arrays).

The grid (range, basis count) is compiled in as ``#define``s, one module per grid and device
(:func:`foxhunt_core.backend.load_module` caches it). The backward reduces the parameter
gradients over the rows in two passes, both in a fixed order: per block, over its row chunk
(``kan_gate_backward_partial``), then over the chunks (``kan_gate_param_reduce``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .spline import Grid, knot_power_map

KERNEL_FILE = Path(__file__).parent / "kernels" / "kan_gate.cu"
FRAGMENT_FILE = Path(__file__).parent / "kernels" / "kan_gate.cuh"
KERNEL_FUNCTIONS = ("kan_gate_forward", "kan_gate_backward_partial", "kan_gate_param_reduce", "kan_power")
UNIT_TILE = 32  # units per block (a warp reads 32 consecutive floats of a row)
ROW_THREADS = 8  # rows a block works on at once
MIN_CHUNK_ROWS = 64  # fewest rows one backward block sums
TARGET_BLOCKS = 1024  # backward blocks to aim for (several per SM on an H100/H200)
FORWARD_ROW_BLOCKS = 512  # most blocks along the rows in the forward (each then strides)
REDUCE_THREADS = 256

Array = Any


POWER_SETS = 8  # branches one kan_power launch takes (KG_POWER_SETS)
POWER_ARGS = np.dtype([("coeff", np.uint64, (POWER_SETS,)), ("power", np.uint64, (POWER_SETS,))])


def defines(grid: Grid) -> dict[str, str]:
    """The ``#define``s that compile ``grid`` into the kernels (the knot-power map included)."""
    m = knot_power_map(grid)
    return {
        "KG_NUM_BASES": str(grid.num_bases),
        "KG_GRID_LO": f"({float(grid.lo)!r}f)",
        "KG_GRID_HI": f"({float(grid.hi)!r}f)",
        "KG_UNIT_TILE": str(UNIT_TILE),
        "KG_ROW_THREADS": str(ROW_THREADS),
        "KG_POWER_SETS": str(POWER_SETS),
        "KG_POWER_MAP": "{" + ", ".join(repr(float(v)) for v in m.reshape(-1)) + "}",
    }


def power_cuda(grid: Grid, coeffs: list[Array], out: list[Array] | None = None) -> list[Array]:
    """Each coefficient array's knot-power floats (:func:`.spline.knot_power_map`; [width, K]
    float32 each, into ``out`` when given), up to :data:`POWER_SETS` arrays of one width a launch:
    no host synchronisation and no copy to the device, so that it runs inside a captured step."""
    import cupy

    from foxhunt_core.backend import check_array

    if not coeffs:
        return []
    width = int(coeffs[0].shape[0]) if coeffs[0].ndim == 2 else -1
    for i, c in enumerate(coeffs):
        check_array("kan_power", f"coeff[{i}]", c, np.float32, (width, grid.num_bases))
    if out is None:
        out = [cupy.empty_like(c) for c in coeffs]
    for i, o in enumerate(out):
        check_array("kan_power", f"out[{i}]", o, np.float32, (width, grid.num_bases))
    fn = _module(grid).get_function("kan_power")
    n = width * grid.num_bases
    for s0 in range(0, len(coeffs), POWER_SETS):
        part = range(s0, min(len(coeffs), s0 + POWER_SETS))
        args = np.zeros(1, dtype=POWER_ARGS)
        for j, i in enumerate(part):
            args["coeff"][0, j], args["power"][0, j] = coeffs[i].data.ptr, out[i].data.ptr
        if n:
            fn((-(-n // REDUCE_THREADS), len(part)), (REDUCE_THREADS,), (args, np.int32(width)))
    return out


def backward_shape(rows: int, width: int) -> tuple[int, int, int]:
    """``(unit tiles, row chunks, rows per chunk)`` of the backward's first pass."""
    tiles = -(-width // UNIT_TILE)
    chunks = max(1, min(rows // MIN_CHUNK_ROWS, -(-TARGET_BLOCKS // tiles)))
    per = max(1, -(-rows // chunks))
    return tiles, -(-rows // per) if rows else 1, per


def _module(grid: Grid) -> Any:
    from foxhunt_core.backend import load_module

    return load_module(str(KERNEL_FILE), defines(grid))


def _check(kernel: str, grid: Grid, coeff: Array, residual: Array, pre: Array, **more: Array) -> tuple[int, int]:
    from foxhunt_core.backend import check_array

    check_array(kernel, "pre", pre, np.float32, (None, None))
    rows, width = (int(n) for n in pre.shape)
    check_array(kernel, "coeff", coeff, np.float32, (width, grid.num_bases))
    check_array(kernel, "residual", residual, np.float32, (width,))
    for name, a in more.items():
        check_array(kernel, name, a, np.float32, (rows, width))
    return rows, width


def forward_cuda(grid: Grid, coeff: Array, residual: Array, pre: Array, out: Array | None = None) -> Array:
    """Gate values [rows, width] (into ``out`` when given, which must not alias ``pre``)."""
    import cupy

    rows, width = _check("kan_gate_forward", grid, coeff, residual, pre)
    if out is None:
        out = cupy.empty_like(pre)
    else:
        _check("kan_gate_forward", grid, coeff, residual, pre, out=out)
        if out.data.ptr == pre.data.ptr:
            raise ValueError("kan_gate_forward: out must not alias pre")
    if rows and width:
        fn = _module(grid).get_function("kan_gate_forward")
        grid_dims = (-(-width // UNIT_TILE), min(FORWARD_ROW_BLOCKS, -(-rows // ROW_THREADS)))
        fn(grid_dims, (UNIT_TILE, ROW_THREADS), (pre, coeff, residual, out, np.int32(rows), np.int32(width)))
    return out


def backward_cuda(grid: Grid, coeff: Array, residual: Array, pre: Array, dgate: Array, dpre: Array | None = None,
                  dcoeff: Array | None = None, dresidual: Array | None = None) -> tuple[Array, Array, Array]:
    """``(dpre [rows, width], dcoeff [width, K], dresidual [width])`` from ``dgate``; each goes
    into the given array when there is one (``dpre`` must not alias ``pre``)."""
    import cupy

    from foxhunt_core.backend import check_array

    kernel = "kan_gate_backward"
    rows, width = _check(kernel, grid, coeff, residual, pre, dgate=dgate)
    if dpre is None:
        dpre = cupy.empty_like(pre)
    else:
        _check(kernel, grid, coeff, residual, pre, dpre=dpre)
        if dpre.data.ptr in (pre.data.ptr, dgate.data.ptr):
            raise ValueError("kan_gate_backward: dpre must not alias pre or dgate")
    if dcoeff is None:
        dcoeff = cupy.empty((width, grid.num_bases), dtype=cupy.float32)
    else:
        check_array(kernel, "dcoeff", dcoeff, np.float32, (width, grid.num_bases))
    if dresidual is None:
        dresidual = cupy.empty(width, dtype=cupy.float32)
    else:
        check_array(kernel, "dresidual", dresidual, np.float32, (width,))
    if not width:
        return dpre, dcoeff, dresidual
    if not rows:
        dcoeff.fill(0)
        dresidual.fill(0)
        return dpre, dcoeff, dresidual
    mod = _module(grid)
    tiles, chunks, per = backward_shape(rows, width)
    terms = grid.num_bases + 1
    partial = cupy.empty((chunks, terms, width), dtype=cupy.float32)
    mod.get_function("kan_gate_backward_partial")(
        (tiles, chunks), (UNIT_TILE, ROW_THREADS),
        (pre, dgate, coeff, residual, dpre, partial, np.int32(rows), np.int32(width), np.int32(per)))
    n = terms * width
    mod.get_function("kan_gate_param_reduce")(
        (-(-n // REDUCE_THREADS),), (REDUCE_THREADS,), (partial, np.int32(chunks), np.int32(width), dcoeff, dresidual))
    return dpre, dcoeff, dresidual
