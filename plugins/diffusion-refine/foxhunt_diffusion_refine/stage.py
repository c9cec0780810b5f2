"""The ``post_attention`` stage: picks the CUDA kernels or the array twin per call."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from foxhunt_core.stages import Params, PostInputs

from . import refine

Array = Any


def _kernel_ready(a: Any, shape: tuple[int, ...] | None = None) -> bool:
    return (type(a).__module__.startswith("cupy") and a.dtype == np.float32 and a.flags.c_contiguous
            and (shape is None or tuple(a.shape) == shape))


class DiffusionRefineStage:
    """K variance-conditioned FC-SiLU-FC refinement steps on coordinated Q (:mod:`.refine`),
    trained by the auxiliary coordinated-Q loss. On CuPy float32 arrays the forward and the backward
    are one kernel each (the backward's parameter gradients in a second, small one), where the sizes
    fit the kernels (:func:`.cuda.backward_rows`); anywhere else the array twin runs."""

    name = "diffusion_refine"

    def __init__(self, actions: int, steps: int = 3, hidden: int = 24, step_scale: float = 0.1,
                 zero_init_output: bool = True, trainable: bool = True, use_cuda_kernel: bool = True) -> None:
        from .cuda import backward_rows

        self.actions, self.steps, self.hidden = int(actions), int(steps), int(hidden)
        self.step_scale = float(step_scale)
        self.zero_init_output = bool(zero_init_output)
        self.trainable = bool(trainable)
        self.shapes = refine.param_shapes(self.steps, self.hidden, self.actions)
        self.kernel_fits = backward_rows(self.actions, self.steps, self.hidden) is not None
        self.use_cuda_kernel = bool(use_cuda_kernel)
        self._workspaces: dict[int, Any] = {}
        self._warned = False

    def init_params(self, rng: np.random.Generator) -> Params:
        return refine.init_params(self.steps, self.hidden, self.actions, rng, self.zero_init_output)

    def _fast(self, q: Array, var: Array, params: Mapping[str, Array]) -> bool:
        if not (self.use_cuda_kernel and _kernel_ready(q) and q.ndim == 2):
            return False
        if not self.kernel_fits:
            if not self._warned:
                warnings.warn(f"diffusion_refine: no CUDA kernel for {self.steps} steps of hidden width "
                              f"{self.hidden} over {self.actions} actions (shared memory); CuPy array "
                              "operations run instead (slower)", RuntimeWarning, stacklevel=3)
                self._warned = True
            return False
        return (var.dtype == np.float32 and set(params) >= set(self.shapes)
                and all(_kernel_ready(params[k], s) for k, s in self.shapes.items()))

    def forward(self, xp: Any, params: Params, inputs: PostInputs) -> tuple[Array, Any]:
        q, var = inputs.q, inputs.var
        if self._fast(q, var, params):
            from .cuda import forward_cuda

            var = xp.ascontiguousarray(var)
            return forward_cuda(q, var, params, self.step_scale), {"kernel": True, "q": q, "var": var}
        return refine.forward(xp, params, q, var, self.step_scale)

    def _workspace(self) -> Array:
        import cupy

        from .cuda import new_workspace

        dev = cupy.cuda.Device().id
        ws = self._workspaces.get(dev)
        if ws is None:
            ws = self._workspaces[dev] = new_workspace(self.actions, self.steps, self.hidden)
        return ws

    def backward(self, xp: Any, params: Params, cache: Any, dq: Array,
                 grads_into: Params | None = None) -> tuple[Array, Params]:
        if cache.get("kernel"):
            from .cuda import backward_cuda

            slots = {k: v for k, v in (grads_into or {}).items()
                     if k in self.shapes and _kernel_ready(v, self.shapes[k])}
            dq_in, grads = backward_cuda(cache["q"], cache["var"], xp.ascontiguousarray(dq), params,
                                         self.step_scale, grads=slots, workspace=self._workspace())
        else:
            dq_in, grads = refine.backward(xp, params, cache, dq)
        if not self.trainable:  # frozen: the gradient still flows to the stages below
            grads = {k: xp.zeros_like(v) for k, v in grads.items()}
        return dq_in, grads
