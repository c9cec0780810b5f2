"""The fused network: the branching C51 network's forward and backward on the GPU for one plan."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import layout
from .backward import Backward
from .forward import ALL_OUTPUTS, Segment, forward_segments
from .plan import ExecutionPlan

Array = Any


class FusedNetwork:
    """Forward and backward of ``net`` (a :class:`~foxhunt_core.net.BranchingC51`) with the fused
    kernels, every kernel choice taken from ``plan``.

    ``kernels`` (the launch wrappers, :mod:`foxhunt_core.gpu.kernels`), ``blas`` (GEMMs,
    :mod:`foxhunt_core.gpu.cublas`), ``streams`` (the side stream, :class:`foxhunt_core.gpu.streams.
    SideStream`) and ``xp`` (CuPy) are what the arrangement runs on; a test passes NumPy twins of
    them to check the arrangement on the CPU (``tests/net/test_fused_arrangement.py``)."""

    def __init__(self, net: Any, plan: ExecutionPlan, *, kernels: Any = None, blas: Any = None, streams: Any = None,
                 xp: Any = None) -> None:
        self.net, self.plan = net, plan
        if kernels is None:
            from ...gpu import kernels
        if blas is None:
            from ...gpu import cublas as blas
        if streams is None:
            from ...gpu.streams import SideStream

            streams = SideStream(enabled=bool(plan.side_stream))
        if xp is None:
            import cupy as xp
        self.K, self.blas, self.streams, self.xp = kernels, blas, streams, xp
        self.masks: dict[tuple, Array] = {}  # the backward's constant masks (Backward.extra_rows_mask)

    def mm(self, a: Array, b: Array, out: Array | None = None, beta: float = 0.0, **kw: Any) -> Array:
        """``a @ b`` through the GEMMs' ``matmul`` (``bias`` and ``relu`` fused into the GEMM where
        cuBLASLt can; ``stack`` for stacked parameter trees, ``batch`` for column blocks)."""
        return self.blas.matmul(a, b, out=out, beta=beta, **kw)

    def colsum(self, x: Array, out: Array) -> Array:
        """Column sums of ``x`` [B, H] (any row stride) into ``out`` [H]: a GEMM with a ones row,
        which cuBLAS runs as a gemv (for the two trunk layers whose input has no ones column)."""
        return self.mm(self.blas.ones_row(x.shape[0], x.dtype), x, out=out.reshape(1, -1))

    def storage_shapes(self) -> dict[str, Any]:
        """How this network wants the core's weights stored (:func:`.layout.storage_shapes`)."""
        return layout.storage_shapes(self.net)

    def forward(self, params: dict, obs: Array, keep_cache: bool = False, outputs: Sequence[str] = ALL_OUTPUTS,
                next_obs: Array | None = None) -> Any:
        """The forward for ``obs`` [B, S]: a :class:`~foxhunt_core.net.network.NetOutput` with the
        ``outputs`` asked for (every one with ``keep_cache``). With ``next_obs`` [B', S] (where the
        plan pairs forwards) the rows of ``next_obs`` ride along in the same GEMMs and kernels and
        only their E[Q] is written (``NetOutput.q_next``); the cache keeps the rows of ``obs``."""
        if next_obs is None or not self.plan.pairs:
            return self.forward_segments([(params, obs, outputs)], keep_cache)[0]
        out, nxt = self.forward_segments([(params, obs, outputs), (params, next_obs, ("q",))], keep_cache)
        out.q_next = nxt.q
        return out

    def forward_segments(self, segments: Sequence[Segment], keep_cache: bool) -> list:
        """Several forwards ``(params, obs, outputs)`` as few as the plan allows
        (:func:`.forward.forward_segments`)."""
        return forward_segments(self, segments, keep_cache)

    def backward(self, params: dict, out: Any, dlogits: Array, grads_into: dict | None = None) -> dict:
        """Gradients of every parameter from ``dlogits`` [B, A, N] and ``out`` (a forward kept with
        its cache, consumed: once per forward); ``grads_into`` (a tree of views, e.g. the
        optimizer's flat gradient buffer) receives the core's weight gradients in place."""
        if out.cache is None or not out.cache.get("fused"):
            raise ValueError("the fused backward needs a fused forward run with keep_cache=True")
        return Backward(self, params, out, dlogits, grads_into).run()
