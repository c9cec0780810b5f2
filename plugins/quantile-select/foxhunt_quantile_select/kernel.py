"""The typed launch wrapper of ``kernels/quantile_select.cu`` (twin: :func:`.quantile.quantile_select_xp`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

KERNEL_FILE = Path(__file__).parent / "kernels" / "quantile_select.cu"
KERNEL_FUNCTIONS = ("quantile_select",)
TILES = (128, 64, 32)  # distributions (threads) per block, QS_TILE in the kernel: the largest that fits
SHARED_BYTES = 48 * 1024  # a block's static shared memory

Array = Any
_KERNELS: dict[tuple[int, int], Any] = {}


def tile_for(num_atoms: int) -> int | None:
    """Distributions per block for ``num_atoms``: the block's rows (each at an odd stride) must fit
    static shared memory; ``None`` past 383 atoms (the stage then runs the array twin)."""
    stride = int(num_atoms) | 1
    return next((t for t in TILES if t * stride * 4 <= SHARED_BYTES), None)


def _kernel(num_atoms: int, tile: int) -> Any:
    """``quantile_select`` compiled for the current device, atom count and tile (cached)."""
    import cupy

    from foxhunt_core.backend import load_module

    key = (cupy.cuda.runtime.getDevice(), int(num_atoms))
    fn = _KERNELS.get(key)
    if fn is None:
        mod = load_module(str(KERNEL_FILE), {"NUM_ATOMS": int(num_atoms), "QS_TILE": tile})
        fn = _KERNELS[key] = mod.get_function(KERNEL_FUNCTIONS[0])
    return fn


def quantile_select_cuda(probs: Array, support: Array, iqn_readiness: Any, lower: float, upper: float,
                         out: Array | None = None) -> Array:
    """``Q_select`` [B, A] (float32) from the atom probabilities ``probs`` [B, A, N].

    ``probs`` float32 C-contiguous, ``support`` float32 [N] (uniform atoms); ``iqn_readiness`` a
    CuPy float32 scalar array of shape () (read on the device when the kernel runs, so a captured
    graph follows its updates) or a Python float. ``out`` (float32 [B, A]) receives the result; a
    new array when ``None``. Never synchronizes with the host.
    """
    import cupy

    from foxhunt_core.backend import check_array

    k = "quantile_select"
    check_array(k, "probs", probs, np.float32, (None, None, None))
    B, A, N = probs.shape
    tile = tile_for(N)
    if N < 2 or tile is None:
        raise ValueError(f"{k}: probs needs 2 to 383 atoms, got {N}")
    check_array(k, "support", support, np.float32, (N,))
    if not 0.0 < lower <= upper < 1.0:
        raise ValueError(f"{k}: quantile levels must satisfy 0 < lower <= upper < 1, got {lower}, {upper}")
    if isinstance(iqn_readiness, cupy.ndarray):
        check_array(k, "iqn_readiness", iqn_readiness, np.float32, ())
        r_dev, r_host = iqn_readiness, np.float32(0.0)
    else:
        r_dev, r_host = None, np.float32(float(iqn_readiness))
    if out is None:
        out = cupy.empty((B, A), dtype=cupy.float32)
    else:
        check_array(k, "out", out, np.float32, (B, A))
    rows = B * A
    if rows == 0:
        return out
    grid = -(-rows // tile)
    _kernel(N, tile)((grid,), (tile,), (probs, support, r_dev, r_host, np.float64(lower), np.float64(upper), out,
                                  np.int64(rows)))
    return out
