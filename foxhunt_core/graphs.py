"""CUDA-graph capture of the training update (CuPy only).

The update of :class:`foxhunt_core.agent.Agent` is a fixed sequence of GEMMs and kernels with
no host synchronisation on the GPU (the optimizer keeps its step counter on the device, the
projection scatters on the device, the entropy coefficient is a device scalar). So it is
captured once, per flag set, into a CUDA graph and replayed every step:

* inputs are fixed device buffers (the batch, the entropy coefficient) that the trainer fills
  before each replay;
* every temporary of the step is allocated from a memory pool private to the graph, so the
  addresses baked into the graph are never handed to anything else;
* before capture the step runs twice (compiles kernels, creates cuBLAS workspaces) on a
  snapshot of the parameters and optimizer state, which is restored afterwards — capture
  itself changes nothing, so a graphed run follows the same trajectory as an eager one.

The hot-path stage objects of the plugins (their forward and backward) are called during
capture like the core's own code, so they are inside the graph. A new flag set means a new
:class:`~foxhunt_core.agent.Agent`, hence a new graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .agent import Agent, tree_copy

BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "terminal")


class GraphedUpdate:
    """One captured training update for a fixed batch size."""

    def __init__(self, agent: Agent, batch_size: int, warmup: int = 2, stream: Any = None,
                 sampler: Callable[[], dict[str, Any]] | None = None) -> None:
        """``sampler``, when given, fills fixed batch buffers on the device (the GPU replay's
        draw) and becomes the first part of the graph; otherwise :meth:`load_batch` fills them."""
        import cupy as cp

        if agent.xp is not cp:
            raise ValueError("CUDA graphs need the CuPy backend")
        self.cp = cp
        self.agent = agent
        self.sampler = sampler
        S = agent.settings.net.state_dim
        D = agent.num_branches
        dt = agent.dtype
        if sampler is not None:
            self.batch = sampler()  # allocates the buffers outside the capture
        else:
            self.batch = {
                "obs": cp.zeros((batch_size, S), dt),
                "next_obs": cp.zeros((batch_size, S), dt),
                "action": cp.zeros((batch_size, D), cp.int64),
                "reward": cp.zeros(batch_size, dt),
                "terminal": cp.zeros(batch_size, dt),
            }
        self.entropy_coeff = cp.zeros((), dt)
        self.stream = stream if stream is not None else cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self._capture(warmup)

    def _body(self, sample: bool = True) -> tuple[dict[str, Any], Any, Any]:
        if sample and self.sampler is not None:
            self.sampler()
        return self.agent.update(self.batch, self.entropy_coeff)

    def _capture(self, warmup: int) -> None:
        cp, agent = self.cp, self.agent
        saved = (tree_copy(agent.online), tree_copy(agent.opt.m), tree_copy(agent.opt.v),
                 agent.opt.t, agent.opt.t_dev.copy())
        with self.stream, cp.cuda.using_allocator(self.pool.malloc):
            for _ in range(warmup):
                self._body(sample=False)  # no draw: the replay's sampling counter is untouched
            self.stream.synchronize()
            _restore(agent, saved)
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                self.scalars, self.out, self.q = self._body()
            finally:
                self.graph = self.stream.end_capture()
        agent.opt.t -= 1  # the capture ran the Python side once without executing the step
        self.stream.synchronize()

    def load_batch(self, batch: dict[str, Any]) -> None:
        """Copy a sampled batch into the graph's input buffers (device to device)."""
        for k in BATCH_FIELDS:
            self.batch[k][...] = batch[k]

    def replay(self, entropy_coeff: float | None = None) -> tuple[dict[str, Any], Any, Any]:
        """Run one update; returns the graph's (persistent) scalars, net output and Q output."""
        if entropy_coeff is not None:
            self.entropy_coeff.fill(entropy_coeff)
        self.stream.wait_event(self.cp.cuda.get_current_stream().record())
        self.graph.launch(stream=self.stream)
        self.cp.cuda.get_current_stream().wait_event(self.stream.record())
        self.agent.opt.t += 1
        return self.scalars, self.out, self.q


def _restore(agent: Agent, saved: tuple) -> None:
    online, m, v, t, t_dev = saved
    for tree, src in ((agent.online, online), (agent.opt.m, m), (agent.opt.v, v)):
        for o, sub in tree.items():
            for k, arr in sub.items():
                arr[...] = src[o][k]
    agent.opt.t = t
    agent.opt.t_dev[...] = t_dev
