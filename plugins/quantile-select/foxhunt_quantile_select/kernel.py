"""The typed launch wrapper of ``kernels/quantile_select.cu`` (twin: :func:`.quantile.quantile_select_xp`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

KERNEL_FILE = Path(__file__).parent / "kernels" / "quantile_select.cu"
KERNEL_FUNCTIONS = ("quantile_select",)
TILE = 128  # distributions (threads) per block; QS_TILE in the kernel

Array = Any
_KERNELS: dict[tuple[int, int], Any] = {}


def _kernel(num_atoms: int) -> Any:
    """``quantile_select`` compiled for the current device and atom count (cached)."""
    import cupy

    from foxhunt_core.backend import load_module

    key = (cupy.cuda.runtime.getDevice(), int(num_atoms))
    fn = _KERNELS.get(key)
    if fn is None:
        mod = load_module(str(KERNEL_FILE), {"NUM_ATOMS": int(num_atoms), "QS_TILE": TILE})
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
    if N < 2:
        raise ValueError(f"{k}: probs needs at least 2 atoms, got {N}")
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
    grid = -(-rows // TILE)
    _kernel(N)((grid,), (TILE,), (probs, support, r_dev, r_host, np.float64(lower), np.float64(upper), out,
                                  np.int64(rows)))
    return out
