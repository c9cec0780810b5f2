"""Typed launch wrappers of ``kernels/diffusion_refine.cu`` (CuPy float32, C-contiguous arrays).

======================  ======================================  ===================  =========================
wrapper                 kernels                                 NumPy twin           thread mapping
======================  ======================================  ===================  =========================
``forward_cuda``        diffusion_refine_forward                ``refine.forward``   8 or 4 lanes per sample
                                                                                     (by batch size), the
                                                                                     hidden units split over
                                                                                     them; 1 or 2 samples a
                                                                                     thread (by batch size)
``backward_cuda``       diffusion_refine_backward,              ``refine.backward``  the same, tiles of
                        diffusion_refine_grad_reduce                                 ``rows``; 4 x 4 gradient
                                                                                     tiles per thread, block
                                                                                     partials, then a lane
                                                                                     per entry
======================  ======================================  ===================  =========================

The step count K, the hidden width H and the action count A are compile-time sizes; the kernels
exist for the sizes where their shared memory (static, at most 48 KiB) and the backward's gradient
tiles per thread fit (:func:`backward_rows`; the .cu's static_asserts say the same). The lanes a
sample takes are compile-time too (a module per choice); the result's bits do not depend on them
(the .cu's header says why), so the wrappers choose them by batch size (:func:`forward_lanes`,
:func:`backward_lanes`), and so the samples a forward thread takes at once (:func:`forward_rows`;
the figures behind both choices are in BENCHMARKS.md). The wrappers
check dtype, shape and contiguity (errors name the kernel), accept preallocated outputs and then
neither allocate nor synchronize, so they run inside a captured CUDA graph. The backward's workspace
comes from :func:`new_workspace` (allocate once, before capture). No CuPy import at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core.backend import check_array, load_module
from foxhunt_core.gpu.launch import MAX_PARTIALS, blocks_for, f32, i32, output, reduction_blocks, sm_count

from .refine import NAMES, param_shapes

KERNEL_FILE = Path(__file__).parent / "kernels" / "diffusion_refine.cu"
KERNEL_FUNCTIONS = ("diffusion_refine_forward", "diffusion_refine_backward", "diffusion_refine_grad_reduce")
SPLIT = 8  # DR_SPLIT: the parts of a sample's hidden units (they fix the order of its sums)
LANES = 8  # DR_LANES at small batches: the lanes of a sample
FEW_LANES = 4  # and where the batch fills the device (kernels/diffusion_refine.cu's header)
# The batch sizes from which each kernel takes FEW_LANES (the H200's figures: BENCHMARKS.md);
# None: never.
FORWARD_FEW_LANES_FROM: int | None = 16384
BACKWARD_FEW_LANES_FROM: int | None = 16384
# The batch size from which a forward thread takes two samples (DR_RPT: each weight it loads then
# serves both), None: never.
FORWARD_TWO_ROWS_FROM: int | None = 16384
THREADS = 256  # DR_THREADS: the forward's block
ROW_CHOICES = (32, 16, 8)  # DR_ROWS: the backward's tile (blocks of rows x lanes threads), the largest that fits
MAX_TILES = 8  # DR_MAX_MT: 4 x 4 gradient tiles per backward thread (16 sums each, in registers)
SMEM_LIMIT = 48 * 1024
# The backward's blocks resident on an SM (its launch bound) at the defaults (ptxas, sm_90): 46 KiB
# of shared memory each; 256 threads of 122 registers at 8 lanes, 128 of 207 at 4. The forward's:
# forward_blocks_per_sm
BACKWARD_BLOCKS_PER_SM = 2
REDUCE_THREADS = 1024
_FUNCS: dict[tuple[Any, ...], Any] = {}

Array = Any


def step_entries(actions: int, hidden: int) -> int:
    """One step's parameters: ``2 H A + H + A H + A``."""
    return 3 * hidden * actions + hidden + actions


def _up4(n: int) -> int:
    return -(-n // 4) * 4


def backward_smem(actions: int, steps: int, hidden: int, rows: int) -> int:
    """Static shared memory of diffusion_refine_backward (bytes; the .cu's DR_BACKWARD_SMEM): the
    packed parameters and, per step and tile row, the staged factors of the gradient products."""
    A, K, H = actions, steps, hidden
    per_row = _up4(H) + _up4(2 * A + 1) + _up4(A) + _up4(H + 1)
    return 4 * (K * step_entries(A, H) + K * rows * per_row)


def gradient_tiles(actions: int, steps: int, hidden: int) -> int:
    """The backward's 4 x 4 tiles of the parameter gradients (the .cu's DR_TILES)."""
    A, K, H = actions, steps, hidden
    return K * (_up4(H) // 4 * (_up4(2 * A + 1) // 4) + _up4(A) // 4 * (_up4(H + 1) // 4))


def backward_rows(actions: int, steps: int, hidden: int, lanes: int = LANES) -> int | None:
    """The backward's tile (rows; its blocks have rows x ``lanes`` threads) for these sizes, or None
    where no kernel fits."""
    if 4 * steps * step_entries(actions, hidden) > SMEM_LIMIT:
        return None
    tiles = gradient_tiles(actions, steps, hidden)
    for rows in ROW_CHOICES:
        if (backward_smem(actions, steps, hidden, rows) <= SMEM_LIMIT
                and -(-tiles // (rows * lanes)) <= MAX_TILES):
            return rows
    return None


def forward_blocks_per_sm(hidden: int, lanes: int = LANES, rows: int = 1) -> int:
    """The forward's launch bound (the .cu's DR_FORWARD_BLOCKS): three blocks of 80 registers where
    a lane takes at most 3 hidden units of one sample, else two."""
    return 3 if SPLIT // lanes * -(-hidden // SPLIT) <= 3 and rows == 1 else 2


def _lanes(batch: int, few_from: int | None, sizes: tuple[int, int, int]) -> int:
    if few_from is not None and batch >= few_from and backward_rows(*sizes, FEW_LANES) is not None:
        return FEW_LANES
    return LANES


def forward_lanes(batch: int, sizes: tuple[int, int, int] = (12, 3, 24)) -> int:
    """The forward's lanes per sample at this batch size (sizes: actions, steps, hidden)."""
    return _lanes(batch, FORWARD_FEW_LANES_FROM, sizes)


def backward_lanes(batch: int, sizes: tuple[int, int, int] = (12, 3, 24)) -> int:
    """The backward's lanes per sample at this batch size."""
    return _lanes(batch, BACKWARD_FEW_LANES_FROM, sizes)


def forward_rows(batch: int) -> int:
    """The samples a forward thread takes at once at this batch size (1 or 2)."""
    return 2 if FORWARD_TWO_ROWS_FROM is not None and batch >= FORWARD_TWO_ROWS_FROM else 1


def defines(actions: int, steps: int, hidden: int, lanes: int = LANES, rows: int = 1) -> dict[str, str]:
    """The .cu's compile-time sizes; ``rows``: the samples a forward thread takes (DR_RPT)."""
    if lanes not in (LANES, FEW_LANES):
        raise ValueError(f"diffusion_refine: lanes must be {LANES} or {FEW_LANES}, not {lanes}")
    if rows not in (1, 2):
        raise ValueError(f"diffusion_refine: a forward thread takes 1 or 2 samples, not {rows}")
    tile = backward_rows(actions, steps, hidden, lanes)
    if tile is None:
        raise ValueError(f"diffusion_refine: no kernel for {actions} actions, {steps} steps, hidden {hidden} "
                         f"at {lanes} lanes a sample (shared memory or registers)")
    return {"NUM_ACTIONS": str(actions), "DR_STEPS": str(steps), "DR_HIDDEN": str(hidden), "DR_SPLIT": str(SPLIT),
            "DR_LANES": str(lanes), "DR_THREADS": str(THREADS), "DR_ROWS": str(tile), "DR_RPT": str(rows)}


def _kernel(name: str, sizes: tuple[int, int, int], lanes: int = LANES, rows: int = 1) -> Any:
    import cupy

    defs = defines(*sizes, lanes, rows)
    key = (cupy.cuda.Device().id, name, tuple(sorted(defs.items())))
    fn = _FUNCS.get(key)
    if fn is None:
        fn = _FUNCS[key] = load_module(str(KERNEL_FILE), defs).get_function(name)
    return fn


def _setup(k: str, q: Array, var: Array, params: Mapping[str, Array]) -> tuple[int, tuple[int, int, int], list]:
    check_array(k, "q", q, np.float32, (None, None))
    B, A = q.shape
    check_array(k, "var", var, np.float32, (B, A))
    if "w_q" not in params or getattr(params["w_q"], "ndim", 0) != 3:
        raise KeyError(f"{k}: parameter 'w_q' [K, H, A] is missing")
    K, H = int(params["w_q"].shape[0]), int(params["w_q"].shape[1])
    if (B + 128) * A >= 2**31:
        raise ValueError(f"{k}: {B} samples of {A} actions are too many for the kernel's indices")
    shapes = param_shapes(K, H, A)
    tensors = []
    for name in NAMES:
        if name not in params:
            raise KeyError(f"{k}: parameter {name!r} is missing")
        check_array(k, name, params[name], np.float32, shapes[name])
        tensors.append(params[name])
    return B, (A, K, H), tensors


def forward_cuda(q: Array, var: Array, params: Mapping[str, Array], step_scale: float, *,
                 out: Array | None = None, lanes: int | None = None, rows: int | None = None) -> Array:
    """Refined Q [B, A] from Q and Var[Q] [B, A] (``refine.forward``); ``out`` aliases neither input.
    ``lanes`` per sample and ``rows`` (samples a thread takes): :func:`forward_lanes` and
    :func:`forward_rows` where not given (the same bits either way)."""
    k = "diffusion_refine_forward"
    B, sizes, tensors = _setup(k, q, var, params)
    out = output(k, "out", out, tuple(q.shape))
    if out.data.ptr in (q.data.ptr, var.data.ptr):
        raise ValueError(f"{k}: out must alias neither q nor var")
    lanes = forward_lanes(B, sizes) if lanes is None else lanes
    rows = forward_rows(B) if rows is None else rows
    fn = _kernel(k, sizes, lanes, rows)
    fn((blocks_for(B, THREADS // lanes * rows, forward_blocks_per_sm(sizes[2], lanes, rows) * sm_count()),),
       (THREADS,),
       (q, var, out, i32(B), f32(step_scale), *tensors))
    return out


def new_workspace(actions: int, steps: int, hidden: int) -> Array:
    """The backward's workspace: ``MAX_PARTIALS`` rows of every parameter's partial sum (float64)."""
    import cupy

    return cupy.empty((MAX_PARTIALS, steps * step_entries(actions, hidden)), dtype=np.float64)


def backward_cuda(
    q: Array,
    var: Array,
    dy: Array,
    params: Mapping[str, Array],
    step_scale: float,
    *,
    dq: Array | None = None,
    grads: Mapping[str, Array] | None = None,
    workspace: Array | None = None,
    lanes: int | None = None,
) -> tuple[Array, dict[str, Array]]:
    """``(dQ, grads)`` from ``dy`` [B, A] (``refine.backward``; the forward is recomputed from ``q``
    and ``var``). ``grads`` may hold preallocated outputs (float32, the parameters' shapes); the
    missing ones are allocated. ``dq`` must alias none of the inputs. ``lanes``: per sample,
    :func:`backward_lanes` where not given (the same bits either way)."""
    k = "diffusion_refine_backward"
    B, sizes, tensors = _setup(k, q, var, params)
    A, K, H = sizes
    check_array(k, "dy", dy, np.float32, (B, A))
    dq = output(k, "dq", dq, (B, A))
    if dq.data.ptr in (q.data.ptr, var.data.ptr, dy.data.ptr):
        raise ValueError(f"{k}: dq must alias none of q, var, dy")
    P = K * step_entries(A, H)
    if workspace is None:
        workspace = new_workspace(A, K, H)
    check_array(k, "workspace", workspace, np.float64, (MAX_PARTIALS, P))
    shapes = param_shapes(K, H, A)
    outs = {n: output(k, f"grads[{n!r}]", (grads or {}).get(n), shapes[n]) for n in NAMES}
    lanes = backward_lanes(B, sizes) if lanes is None else lanes
    rows = int(defines(*sizes, lanes)["DR_ROWS"])
    grid = reduction_blocks(B, rows, blocks_per_sm=BACKWARD_BLOCKS_PER_SM)
    _kernel(k, sizes, lanes)((grid,), (rows * lanes,),
                             (q, var, dy, dq, workspace, i32(B), f32(step_scale), *tensors))
    _kernel("diffusion_refine_grad_reduce", sizes)(
        (blocks_for(P, 32),), (REDUCE_THREADS,), (workspace, i32(grid), *(outs[n] for n in NAMES))
    )
    return dq, outs
