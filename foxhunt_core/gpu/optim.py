"""Launch wrapper of the Adam step over flat buffers (``kernels/adam.cu``), graph-replayable.

NumPy twin: :class:`foxhunt_core.optim.Adam` (``step``: global-norm clipping, bias-corrected
Adam). The parameters, gradients and both moments are each one flat float32 buffer with the same
layout (:class:`foxhunt_core.gpu.flat.FlatTree`), so the whole update is three launches:

1. ``grad_sumsq_partial`` — multi-block grid-stride sum of ``g^2``, one float64 row per block;
2. ``adam_prepare`` — one warp adds the rows in a fixed order, increments the step counter
   *on the device* and writes ``[norm, clip scale, lr / (1 - b1^t), 1 - b2^t]`` to ``scalars``;
3. ``adam_update`` — one thread per element reads those scalars from device memory.

Nothing is read back to the host, so the three launches can be captured in a CUDA graph and
replayed step after step (the counter advances with each replay).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import check_array
from .launch import MAX_PARTIALS, THREADS, blocks_for, f32, i32, i64, output, reduction_blocks, sm_count
from .launch import get_kernel as _kernel

Array = Any
F32 = np.float32


def adam_workspace() -> Array:
    """The float64 partial sums of the gradient norm (``MAX_PARTIALS`` entries)."""
    import cupy

    return cupy.empty((MAX_PARTIALS,), dtype=np.float64)


def adam_step(
    params: Array,
    grads: Array,
    m: Array,
    v: Array,
    step: Array,
    lr: float,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    clip_norm: float | None = None,
    *,
    lr_device: Array | None = None,
    scalars: Array | None = None,
    workspace: Array | None = None,
) -> Array:
    """One Adam update in place on flat float32 buffers; returns ``scalars`` [4] on the device.

    Args:
        params, grads, m, v: [n] flat buffers of the same layout.
        step: int32 [1], Adam's ``t`` (0 before the first step); incremented on the device.
        lr, b1, b2, eps: Adam's hyper-parameters (``lr_device`` [1] float32, when given,
            overrides ``lr`` so that a schedule can be replayed in a graph).
        clip_norm: clip the global gradient norm to this (``None`` or <= 0: no clipping).

    Returns:
        ``scalars`` = ``[grad norm before clipping, clip scale, lr / (1 - b1^t), 1 - b2^t]``
        (float32, device).
    """
    k = "adam_step"
    check_array(k, "params", params, F32, (None,))
    n = params.shape[0]
    for name, a in (("grads", grads), ("m", m), ("v", v)):
        check_array(k, name, a, F32, (n,))
    check_array(k, "step", step, np.int32, (1,))
    if lr_device is not None:
        check_array(k, "lr_device", lr_device, F32, (1,))
    scalars = output(k, "scalars", scalars, (4,))
    if workspace is None:
        workspace = adam_workspace()
    else:
        check_array(k, "workspace", workspace, np.float64, (MAX_PARTIALS,))
    clip = -1.0 if clip_norm is None else float(clip_norm)
    grid = reduction_blocks(n, THREADS, blocks_per_sm=4)
    _kernel("adam.cu", "grad_sumsq_partial")((grid,), (THREADS,), (grads, i64(n), workspace))
    _kernel("adam.cu", "adam_prepare")(
        (1,), (32,),
        (workspace, i32(grid), step, np.float64(lr), lr_device, np.float64(b1), np.float64(b2),
         np.float64(clip), scalars),
    )
    _kernel("adam.cu", "adam_update")(
        (blocks_for(n, THREADS, 32 * sm_count()),), (THREADS,),
        (params, grads, m, v, i64(n), f32(b1), f32(1.0 - b1), f32(b2), f32(1.0 - b2), f32(eps), scalars),
    )
    return scalars
