"""A second stream for work that may run beside the current stream's (CuPy).

The backward's weight gradients are leaves: nothing in the step reads them before the optimizer.
Queued on a side stream, after the inputs they read, they overlap the chain of input gradients
on the main stream (a GEMM's last partial wave, or a memory-bound kernel beside a compute-bound
GEMM, leaves the device room). Inside a stream capture the event edges become the graph's
dependencies, so a captured update keeps the overlap.

Usage::

    streams = SideStream()
    with streams.beside():   # ordered after everything queued so far on the current stream
        ...                  # work for the side stream
    streams.join()           # the current stream's later work waits for the side stream's

A buffer that the side stream reads must not be written by the main stream before :meth:`SideStream.join`
(the callers keep that). The side stream is one per device, made at first use (the update's
warm-up runs before its capture), with its own cuBLAS workspaces (:mod:`.cublas`,
:mod:`.cublaslt`).

A second lane (``SideStream(lane=1)``, a third stream) takes the update's Q pipeline at s: the
attention, the post-attention stages, the auxiliary loss and their backward read only the
forward's E[Q] and Var[Q] and the loss kernel's E[m], so the chain of small kernels runs beside the
network's backward (whose own side stream, lane 0, keeps the weight gradients); the pipeline's
forward forks earlier still, beside the bootstrap's chain at s' (two ``beside`` blocks on the lane:
the second waits for the loss kernel).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_side: dict[tuple[int, int], Any] = {}
LANES = 2  # side streams per device: 0 the network's weight gradients, 1 the Q pipeline


def side_stream(lane: int = 0) -> Any:
    """The current device's side stream ``lane``."""
    import cupy

    if not 0 <= lane < LANES:
        raise ValueError(f"side stream lane {lane} outside 0..{LANES - 1}")
    key = (cupy.cuda.Device().id, lane)
    s = _side.get(key)
    if s is None:
        s = _side[key] = cupy.cuda.Stream(non_blocking=True)
    return s


class SideStream:
    """The side stream as the fused network uses it; ``enabled=False`` queues its work in line on
    the current stream (the execution plan's ``side_stream``, off for comparison:
    ``benchmarks/bench_update.py``'s ``foxhunt 1 stream``)."""

    def __init__(self, enabled: bool = True, lane: int = 0) -> None:
        self.enabled = bool(enabled)
        self.lane = int(lane)

    @contextmanager
    def beside(self) -> Iterator[Any]:
        """Run the body's launches on the side stream, after the current stream's queued work."""
        import cupy

        main = cupy.cuda.get_current_stream()
        if not self.enabled:
            yield main
            return
        side = side_stream(self.lane)
        side.wait_event(main.record())
        with side:
            yield side

    def join(self) -> None:
        """Make the current stream's later work wait for everything queued on the side stream."""
        import cupy

        if self.enabled:
            cupy.cuda.get_current_stream().wait_event(side_stream(self.lane).record())
