"""What every launch wrapper shares: the kernel directory, the default compile-time sizes, the
cached kernel lookup, output checks and grid sizes.

Nothing here imports CuPy at import time. The constants shared with the kernels come from the
table in :mod:`.defines`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..backend import check_array, load_module
from .defines import DEFAULT_DEFINES, value

KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"

THREADS = value("BLOCK_THREADS")  # threads per block of the grid-stride kernels
MAX_PARTIALS = 1024  # most blocks of a multi-block reduction (rows of its partial sums)

_FUNCS: dict[tuple[Any, ...], Any] = {}
_SM_COUNT: dict[int, int] = {}


def get_kernel(cu_file: str, name: str, defines: dict[str, Any] | None = None, include: tuple[str, ...] = ()) -> Any:
    """The ``RawKernel`` ``name`` of ``kernels/<cu_file>`` compiled with ``defines`` and headers also
    searched for in ``include`` (cached per device)."""
    import cupy

    defs = tuple(sorted((str(k), str(v)) for k, v in (defines or {}).items()))
    key = (cupy.cuda.Device().id, cu_file, defs, tuple(include), name)
    fn = _FUNCS.get(key)
    if fn is None:
        fn = load_module(str(KERNEL_DIR / cu_file), dict(defs), tuple(include)).get_function(name)
        _FUNCS[key] = fn
    return fn


def sm_count() -> int:
    """Streaming multiprocessors of the current device (cached)."""
    import cupy

    dev = cupy.cuda.Device()
    n = _SM_COUNT.get(dev.id)
    if n is None:
        n = int(dev.attributes["MultiProcessorCount"])
        _SM_COUNT[dev.id] = n
    return n


def validate_offsets(kernel: str, offsets: Sequence[int], num_actions: int, min_size: int = 1) -> tuple[int, ...]:
    """Branch boundaries as a tuple, checked: start at 0, end at ``num_actions``, sizes >= ``min_size``."""
    offs = tuple(int(o) for o in offsets)
    sizes = [b - a for a, b in zip(offs[:-1], offs[1:])]
    if len(offs) < 2 or offs[0] != 0 or offs[-1] != num_actions or min(sizes) < min_size:
        raise ValueError(
            f"{kernel}: offsets {offs} must rise from 0 to {num_actions} in steps of at least {min_size}"
        )
    return offs


HEAD_ALIGN = 4  # floats: cuBLAS runs a GEMM on its aligned kernels when its extents are multiples of 4


def padded(n: int, align: int = HEAD_ALIGN) -> int:
    """``n`` rounded up to a multiple of ``align``."""
    return -(-int(n) // align) * align


def head_columns(offsets: Sequence[int], num_atoms: int, align: int = 1) -> tuple[int, ...]:
    """Where each branch's block of advantages starts in an advantage row, and the row's width
    last: branch ``d`` holds its actions' atoms (``(o_{d+1} - o_d) N`` floats, action-major) in
    a block padded to a multiple of ``align`` floats (1: packed, the [B, A, N] layout)."""
    cols = [0]
    for a, b in zip(offsets[:-1], offsets[1:]):
        cols.append(cols[-1] + padded((b - a) * num_atoms, align))
    return tuple(cols)


def branch_defines(offsets: tuple[int, ...], num_atoms: int | None = None, head_align: int = 1) -> dict[str, str]:
    """Compile-time sizes for a branch layout (and an atom count, with the advantage and value
    rows' layout: blocks padded to ``head_align`` floats)."""
    sizes = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    defs = {
        "NUM_ACTIONS": str(offsets[-1]),
        "NUM_BRANCHES": str(len(sizes)),
        "BRANCH_OFFSETS": "{" + ",".join(str(o) for o in offsets) + "}",
        "MAX_BRANCH_SIZE": str(max(sizes)),
        "BRANCH_OF_ACTION": "{" + ",".join(str(d) for d, n in enumerate(sizes) for _ in range(n)) + "}",
    }
    if num_atoms is not None:
        defs["NUM_ATOMS"] = str(int(num_atoms))
    n = int(defs.get("NUM_ATOMS", DEFAULT_DEFINES["NUM_ATOMS"]))  # the layout must fit the branches
    defs["ADV_COLUMNS"] = "{" + ",".join(str(c) for c in head_columns(offsets, n, head_align)) + "}"
    defs["V_COLUMNS"] = str(padded(n, head_align))
    defs["DUELING_BLOCKS_PER_SM"] = str(dueling_blocks_per_sm(n, offsets))
    return defs


def dueling_blocks_per_sm(num_atoms: int, offsets: Sequence[int]) -> int:
    """Blocks of the two dueling row kernels (dueling.cu) resident per SM, which their
    ``__launch_bounds__`` guarantee (DUELING_BLOCKS_PER_SM): from the floats a lane keeps per row
    (a row's logits, exponentials and the next row's inputs, the sums of up to ten actions), so
    that the registers this leaves each thread hold them without spilling."""
    size = max(int(b) - int(a) for a, b in zip(offsets[:-1], offsets[1:]))
    lane_floats = 3 * -(-int(num_atoms) // 32) * size + 3 * min(size, 10)
    return 4 if lane_floats <= 27 else 3 if lane_floats <= 36 else 2 if lane_floats <= 60 else 1


def output(kernel: str, name: str, a: Any, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
    """``a`` checked against ``shape``/``dtype``, or a new uninitialized array when ``a`` is None."""
    if a is None:
        import cupy

        return cupy.empty(shape, dtype=dtype)
    check_array(kernel, name, a, dtype, shape)
    return a


def check_vector(kernel: str, name: str, a: Any, size: int, dtype: Any = np.float32) -> None:
    check_array(kernel, name, a, dtype, (size,))


def blocks_for(work_items: int, per_block: int, cap: int | None = None) -> int:
    """Blocks to cover ``work_items`` at ``per_block`` each, at least 1, at most ``cap``."""
    n = max(1, -(-int(work_items) // per_block))
    return min(n, cap) if cap is not None else n


def reduction_blocks(work_items: int, per_block: int, blocks_per_sm: int) -> int:
    """Blocks of a grid-stride multi-block reduction: as many as the device holds at once
    (``blocks_per_sm``, from the kernel's registers and shared memory), at most ``MAX_PARTIALS``."""
    return blocks_for(work_items, per_block, min(MAX_PARTIALS, blocks_per_sm * sm_count()))


def f32(x: float) -> np.float32:
    return np.float32(x)


def i32(x: int) -> np.int32:
    if not -(2**31) <= int(x) < 2**31:
        raise ValueError(f"{x} does not fit a 32-bit int")
    return np.int32(x)


def i64(x: int) -> np.int64:
    return np.int64(x)
