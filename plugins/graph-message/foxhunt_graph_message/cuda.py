"""Typed launch wrappers of ``kernels/graph_message.cu`` (CuPy float32, C-contiguous arrays).

======================  ==========================================  ===============  ========================
wrapper                 kernels                                     NumPy twin       thread mapping
======================  ==========================================  ===============  ========================
``forward_cuda``        graph_message_forward                       ``graph.forward``   thread per sample
``backward_cuda``       graph_message_backward,                     ``graph.backward``  thread per sample; block
                        graph_message_grad_reduce                                       partials, then a lane
                                                                                        per gradient entry
======================  ==========================================  ===============  ========================

The wrappers check dtype, shape and contiguity (errors name the kernel), accept preallocated
outputs and then neither allocate nor synchronize with the host, so they can run inside a captured
CUDA graph. The backward's workspace (``MAX_PARTIALS`` rows of float64 partial sums) comes from
:func:`new_workspace`: allocate it once, before capture. Nothing here imports CuPy at import time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core.backend import check_array, load_module
from foxhunt_core.gpu.launch import (
    MAX_PARTIALS,
    blocks_for,
    i32,
    output,
    reduction_blocks,
    sm_count,
    validate_offsets,
)

from .graph import EDGES, param_names, param_shapes

KERNEL_FILE = Path(__file__).parent / "kernels" / "graph_message.cu"
KERNEL_FUNCTIONS = ("graph_message_forward", "graph_message_backward", "graph_message_grad_reduce")
THREADS = 128  # GM_THREADS
# Blocks resident on an SM at the defaults (ptxas, sm_90; the parameters in every thread's registers):
BACKWARD_BLOCKS_PER_SM = 3  # 168 registers x 128 threads
FORWARD_BLOCKS_PER_SM = 4  # 110 registers x 128 threads
REDUCE_THREADS = 1024  # GM_REDUCE_WARPS x 32
_FUNCS: dict[tuple[Any, ...], Any] = {}

Array = Any


def defines(offsets: Sequence[int]) -> dict[str, str]:
    """Compile-time sizes of the kernels for branch boundaries ``offsets``."""
    offs = tuple(int(o) for o in offsets)
    sizes = [b - a for a, b in zip(offs[:-1], offs[1:])]
    return {
        "NUM_ACTIONS": str(offs[-1]),
        "NUM_BRANCHES": str(len(sizes)),
        "BRANCH_OFFSETS": "{" + ",".join(map(str, offs)) + "}",
        "MAX_BRANCH_SIZE": str(max(sizes)),
        "GM_THREADS": str(THREADS),
    }


def packed_size(offsets: Sequence[int]) -> int:
    """Entries of one row of partial sums: every parameter once (60 for four branches of 3)."""
    sizes = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    return sum(int(np.prod(s)) for s in param_shapes(sizes).values())


def _kernel(name: str, offsets: Sequence[int]) -> Any:
    import cupy

    defs = defines(offsets)
    key = (cupy.cuda.Device().id, name, tuple(sorted(defs.items())))
    fn = _FUNCS.get(key)
    if fn is None:
        fn = _FUNCS[key] = load_module(str(KERNEL_FILE), defs).get_function(name)
    return fn


def _setup(k: str, q: Array, params: Mapping[str, Array], offsets: Sequence[int]) -> tuple[int, tuple, list]:
    check_array(k, "q", q, np.float32, (None, None))
    B, A = q.shape
    if len(offsets) != 5:
        raise ValueError(f"{k}: the graph joins four branches, got offsets {tuple(offsets)}")
    offs = validate_offsets(k, offsets, A)
    if (B + 1) * A >= 2**31:
        raise ValueError(f"{k}: {B} samples of {A} actions are too many for the kernel's indices")
    sizes = [b - a for a, b in zip(offs[:-1], offs[1:])]
    shapes = param_shapes(sizes)
    tensors = []
    for name in param_names():
        if name not in params:
            raise KeyError(f"{k}: parameter {name!r} is missing")
        check_array(k, name, params[name], np.float32, shapes[name])
        tensors.append(params[name])
    return B, offs, tensors


def forward_cuda(q: Array, params: Mapping[str, Array], offsets: Sequence[int], *, out: Array | None = None) -> Array:
    """``Q'`` [B, A] from Q [B, A] (``graph.forward``); ``out`` must not alias ``q``."""
    k = "graph_message_forward"
    B, offs, tensors = _setup(k, q, params, offsets)
    out = output(k, "out", out, tuple(q.shape))
    if out.data.ptr == q.data.ptr:
        raise ValueError(f"{k}: out must not alias q")
    grid = blocks_for(B, THREADS, FORWARD_BLOCKS_PER_SM * sm_count())
    _kernel(k, offs)((grid,), (THREADS,), (q, out, i32(B), *tensors))
    return out


def new_workspace(offsets: Sequence[int]) -> Array:
    """The backward's workspace: ``MAX_PARTIALS`` rows of :func:`packed_size` float64 partial sums."""
    import cupy

    return cupy.empty((MAX_PARTIALS, packed_size(offsets)), dtype=np.float64)


def backward_cuda(
    q: Array,
    dy: Array,
    params: Mapping[str, Array],
    offsets: Sequence[int],
    *,
    dq: Array | None = None,
    grads: Mapping[str, Array] | None = None,
    workspace: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """``(dQ, grads)`` from ``dY`` [B, A] (``graph.backward``; the forward is recomputed from ``q``).

    ``grads`` may hold preallocated outputs (float32, the parameters' shapes; e.g. views of a flat
    gradient buffer); the missing ones are allocated. ``dq`` must alias neither ``q`` nor ``dy``.
    """
    k = "graph_message_backward"
    B, offs, tensors = _setup(k, q, params, offsets)
    check_array(k, "dy", dy, np.float32, tuple(q.shape))
    dq = output(k, "dq", dq, tuple(q.shape))
    if dq.data.ptr in (q.data.ptr, dy.data.ptr):
        raise ValueError(f"{k}: dq must alias neither q nor dy")
    P = packed_size(offs)
    if workspace is None:
        workspace = new_workspace(offs)
    check_array(k, "workspace", workspace, np.float64, (MAX_PARTIALS, P))
    sizes = [b - a for a, b in zip(offs[:-1], offs[1:])]
    shapes = param_shapes(sizes)
    outs = {name: output(k, f"grads[{name!r}]", (grads or {}).get(name), shapes[name]) for name in param_names()}
    grid = reduction_blocks(B, THREADS, blocks_per_sm=BACKWARD_BLOCKS_PER_SM)
    _kernel(k, offs)((grid,), (THREADS,), (q, dy, dq, workspace, i32(B), *tensors))
    _kernel("graph_message_grad_reduce", offs)(
        (blocks_for(P, 32),), (REDUCE_THREADS,), (workspace, i32(grid), *(outs[n] for n in param_names()))
    )
    return dq, outs


__all__ = ["EDGES", "KERNEL_FILE", "KERNEL_FUNCTIONS", "backward_cuda", "forward_cuda", "new_workspace", "packed_size"]
