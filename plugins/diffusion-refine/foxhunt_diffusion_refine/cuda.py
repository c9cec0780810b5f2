"""Typed launch wrappers of ``kernels/diffusion_refine.cu`` (CuPy float32, C-contiguous arrays).

======================  ======================================  ===================  =========================
wrapper                 kernels                                 NumPy twin           thread mapping
======================  ======================================  ===================  =========================
``forward_cuda``        diffusion_refine_forward                ``refine.forward``   thread per sample
``backward_cuda``       diffusion_refine_backward,              ``refine.backward``  thread per sample, tiles of
                        diffusion_refine_grad_reduce                                 ``rows``; block partials,
                                                                                     then a lane per entry
======================  ======================================  ===================  =========================

The step count K, the hidden width H and the action count A are compile-time sizes; the kernels
exist for the sizes where their shared memory (static, at most 48 KiB) and the backward's per-thread
gradient entries fit (:func:`backward_rows`; the .cu's static_asserts say the same). The wrappers
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
THREADS = 128  # DR_THREADS: the forward's block
ROW_CHOICES = (128, 64, 32)  # DR_ROWS: the backward's block (and tile), the largest that fits
MAX_ACC = 256  # DR_MAX_ACC
SMEM_LIMIT = 48 * 1024
FORWARD_BLOCKS_PER_SM = 8
BACKWARD_BLOCKS_PER_SM = 5  # 40 KiB of shared memory and 136 registers x 64 threads (ptxas, sm_90, defaults)
REDUCE_THREADS = 1024
_FUNCS: dict[tuple[Any, ...], Any] = {}

Array = Any


def step_entries(actions: int, hidden: int) -> int:
    """One step's parameters: ``2 H A + H + A H + A``."""
    return 3 * hidden * actions + hidden + actions


def backward_smem(actions: int, steps: int, hidden: int, rows: int) -> int:
    """Static shared memory of diffusion_refine_backward (bytes; the .cu's DR_BACKWARD_SMEM)."""
    P = steps * step_entries(actions, hidden)
    return 4 * (P + rows * ((steps + 2) * (actions + 1) + 2 * (hidden + 1)) + 1)


def backward_rows(actions: int, steps: int, hidden: int) -> int | None:
    """The backward's tile (threads per block) for these sizes, or None where no kernel fits."""
    E = step_entries(actions, hidden)
    if 4 * steps * E > SMEM_LIMIT:
        return None
    for rows in ROW_CHOICES:
        if backward_smem(actions, steps, hidden, rows) <= SMEM_LIMIT and steps * -(-E // rows) <= MAX_ACC:
            return rows
    return None


def defines(actions: int, steps: int, hidden: int) -> dict[str, str]:
    rows = backward_rows(actions, steps, hidden)
    if rows is None:
        raise ValueError(f"diffusion_refine: no kernel for {actions} actions, {steps} steps, hidden {hidden} "
                         "(shared memory or registers)")
    return {"NUM_ACTIONS": str(actions), "DR_STEPS": str(steps), "DR_HIDDEN": str(hidden),
            "DR_THREADS": str(THREADS), "DR_ROWS": str(rows)}


def _kernel(name: str, sizes: tuple[int, int, int]) -> Any:
    import cupy

    defs = defines(*sizes)
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
                 out: Array | None = None) -> Array:
    """Refined Q [B, A] from Q and Var[Q] [B, A] (``refine.forward``); ``out`` aliases neither input."""
    k = "diffusion_refine_forward"
    B, sizes, tensors = _setup(k, q, var, params)
    out = output(k, "out", out, tuple(q.shape))
    if out.data.ptr in (q.data.ptr, var.data.ptr):
        raise ValueError(f"{k}: out must alias neither q nor var")
    grid = blocks_for(B, THREADS, FORWARD_BLOCKS_PER_SM * sm_count())
    _kernel(k, sizes)((grid,), (THREADS,), (q, var, out, i32(B), f32(step_scale), *tensors))
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
) -> tuple[Array, dict[str, Array]]:
    """``(dQ, grads)`` from ``dy`` [B, A] (``refine.backward``; the forward is recomputed from ``q``
    and ``var``). ``grads`` may hold preallocated outputs (float32, the parameters' shapes); the
    missing ones are allocated. ``dq`` must alias none of the inputs."""
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
    rows = int(defines(*sizes)["DR_ROWS"])
    grid = reduction_blocks(B, rows, blocks_per_sm=BACKWARD_BLOCKS_PER_SM)
    _kernel(k, sizes)((grid,), (rows,), (q, var, dy, dq, workspace, i32(B), f32(step_scale), *tensors))
    _kernel("diffusion_refine_grad_reduce", sizes)(
        (blocks_for(P, 32),), (REDUCE_THREADS,), (workspace, i32(grid), *(outs[n] for n in NAMES))
    )
    return dq, outs
