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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_side: dict[int, Any] = {}


def side_stream() -> Any:
    """The current device's side stream."""
    import cupy

    dev = cupy.cuda.Device().id
    s = _side.get(dev)
    if s is None:
        s = _side[dev] = cupy.cuda.Stream(non_blocking=True)
    return s


class SideStream:
    """The side stream as the fused network uses it; ``enabled=False`` queues its work in line on
    the current stream (the execution plan's ``side_stream``, off for comparison:
    ``benchmarks/bench_update.py``'s ``foxhunt 1 stream``)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)

    @contextmanager
    def beside(self) -> Iterator[Any]:
        """Run the body's launches on the side stream, after the current stream's queued work."""
        import cupy

        main = cupy.cuda.get_current_stream()
        if not self.enabled:
            yield main
            return
        side = side_stream()
        side.wait_event(main.record())
        with side:
            yield side

    def join(self) -> None:
        """Make the current stream's later work wait for everything queued on the side stream."""
        import cupy

        if self.enabled:
            cupy.cuda.get_current_stream().wait_event(side_stream().record())
