"""The ``post_attention`` stage: picks the CUDA kernels or the array twin per call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from foxhunt_core.stages import Params, PostInputs

from . import graph

Array = Any


def _kernel_ready(a: Any, shape: tuple[int, ...] | None = None) -> bool:
    return (type(a).__module__.startswith("cupy") and a.dtype == np.float32 and a.flags.c_contiguous
            and (shape is None or tuple(a.shape) == shape))


class GraphMessageStage:
    """Gated message passing between the branches' Q-values (:mod:`.graph`), trained by the
    auxiliary coordinated-Q loss. Var[Q] is not read. On CuPy float32 arrays the forward and the
    backward are one kernel each (the backward's parameter gradients in a second, small one);
    anywhere else the array twin runs."""

    name = "graph_message"

    def __init__(self, sizes: Sequence[int], msg_init: float = 0.1, trainable: bool = True,
                 use_cuda_kernel: bool = True) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.sizes)]))
        self.shapes = graph.param_shapes(self.sizes)
        self.msg_init = float(msg_init)
        self.trainable = bool(trainable)
        self.use_cuda_kernel = bool(use_cuda_kernel)
        self._workspaces: dict[int, Any] = {}

    def init_params(self, rng: np.random.Generator) -> Params:
        return graph.init_params(self.sizes, self.msg_init)

    def _fast(self, q: Array, params: Mapping[str, Array]) -> bool:
        return (self.use_cuda_kernel and _kernel_ready(q) and q.ndim == 2
                and all(_kernel_ready(params.get(k), s) for k, s in self.shapes.items() if k in params)
                and set(params) >= set(self.shapes))

    def forward(self, xp: Any, params: Params, inputs: PostInputs) -> tuple[Array, Any]:
        q = inputs.q
        if self._fast(q, params):
            from .cuda import forward_cuda

            return forward_cuda(q, params, self.offsets), {"kernel": True, "q": q}
        return graph.forward(xp, params, q, self.offsets)

    def _workspace(self) -> Array:
        import cupy

        from .cuda import new_workspace

        dev = cupy.cuda.Device().id
        ws = self._workspaces.get(dev)
        if ws is None:
            ws = self._workspaces[dev] = new_workspace(self.offsets)
        return ws

    def backward(self, xp: Any, params: Params, cache: Any, dq: Array,
                 grads_into: Params | None = None) -> tuple[Array, Params]:
        if cache.get("kernel"):
            from .cuda import backward_cuda

            slots = {k: v for k, v in (grads_into or {}).items()
                     if k in self.shapes and _kernel_ready(v, self.shapes[k])}
            dq_in, grads = backward_cuda(cache["q"], xp.ascontiguousarray(dq), params, self.offsets, grads=slots,
                                         workspace=self._workspace())
        else:
            dq_in, grads = graph.backward(xp, params, cache, dq, self.offsets)
        if not self.trainable:  # frozen: the gradient still flows to the attention below
            grads = {k: xp.zeros_like(v) for k, v in grads.items()}
        return dq_in, grads
