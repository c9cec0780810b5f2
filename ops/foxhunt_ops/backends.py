"""Where trials run: a local pool of trial processes, or Ray tasks.

Both backends offer the same four calls to the controller: ``submit`` a trial, ``wait`` up to a
timeout for finished ones, ``cancel`` what is still running, ``close``. Trials are processes
(:mod:`foxhunt_ops.trial`), so the results do not depend on the backend: the same plan gives the
same ledger with either (timings aside).

* ``local``: at most ``workers`` trial processes at once, children of the controller (so they
  die with it, see :mod:`foxhunt_ops.trial`); ``workers`` defaults to the CPU count.
* ``ray``: each trial is a Ray task (``num_cpus=1``; ``num_gpus=1`` for CUDA trials, 0 on the
  CPU) that runs the trial process on whichever node Ray picks and returns its outcome, so the
  ledger never needs the worker's files. Without ``address`` it joins the Ray instance this
  process already started, or starts a local one (and shuts it down at ``close``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from .trial import TrialOutcome, TrialSpec, kill, launch, outcome


class Backend(Protocol):
    name: str
    capacity: int

    def device_for(self, device: str) -> str: ...

    def submit(self, spec: TrialSpec) -> None: ...

    def running(self) -> int: ...

    def wait(self, timeout: float) -> list[TrialOutcome]: ...

    def cancel(self) -> list[TrialSpec]: ...

    def close(self) -> None: ...


class LocalBackend:
    """A bounded pool of trial processes on this machine."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.capacity = max(1, workers or os.cpu_count() or 1)
        self.procs: dict[tuple[str, int], tuple[TrialSpec, Any, float]] = {}

    def device_for(self, device: str) -> str:
        return device

    def submit(self, spec: TrialSpec) -> None:
        self.procs[spec.key] = (spec, launch(spec), time.perf_counter())

    def running(self) -> int:
        return len(self.procs)

    def wait(self, timeout: float) -> list[TrialOutcome]:
        deadline = time.perf_counter() + timeout
        while True:
            done = []
            for key, (spec, proc, t0) in list(self.procs.items()):
                elapsed = time.perf_counter() - t0
                code = proc.poll()
                timed_out = code is None and spec.timeout_s is not None and elapsed > spec.timeout_s
                if timed_out:
                    kill(proc)
                    code = proc.returncode
                if code is not None:
                    del self.procs[key]
                    done.append(outcome(spec, code, elapsed, timed_out))
            if done or not self.procs or time.perf_counter() >= deadline:
                return done
            time.sleep(0.05)

    def cancel(self) -> list[TrialSpec]:
        specs = []
        for spec, proc, _ in self.procs.values():
            kill(proc)
            specs.append(spec)
        self.procs.clear()
        return specs

    def close(self) -> None:
        self.cancel()


class RayBackend:
    """Trials as Ray tasks (one CPU each; one GPU each for CUDA trials)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        import ray

        from .trial import run_blocking

        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kw: dict[str, Any] = {"address": address, "log_to_driver": False}
            if address is None:
                kw.update(num_cpus=num_cpus, include_dashboard=False)
            ray.init(**kw)
            self.started = True
        res = ray.cluster_resources()
        self.gpus = int(res.get("GPU", 0))
        self.capacity = 1 << 30  # Ray queues tasks by resources; submit them all
        self._task = ray.remote(num_cpus=1, num_gpus=0, max_retries=0)(run_blocking)
        self.refs: dict[Any, TrialSpec] = {}

    def device_for(self, device: str) -> str:
        if device == "auto":
            return "cuda" if self.gpus else "cpu"
        return device

    def submit(self, spec: TrialSpec) -> None:
        task = self._task.options(num_gpus=1 if spec.device == "cuda" else 0)
        self.refs[task.remote(spec)] = spec

    def running(self) -> int:
        return len(self.refs)

    def wait(self, timeout: float) -> list[TrialOutcome]:
        if not self.refs:
            return []
        ready, _ = self.ray.wait(list(self.refs), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        out = []
        for ref in ready:
            spec = self.refs.pop(ref)
            try:
                out.append(self.ray.get(ref))
            except self.ray.exceptions.RayError as exc:
                msg = " ".join(str(exc).split())[:300]
                out.append(TrialOutcome(stage_id=spec.stage_id, seed=spec.seed, status="failed", exit_code=None,
                                        wall_s=0.0, error=f"ray task failed: {msg}"))
        return out

    def cancel(self) -> list[TrialSpec]:
        specs = list(self.refs.values())
        for ref in self.refs:
            self.ray.cancel(ref, force=True)
        self.refs.clear()
        return specs

    def close(self) -> None:
        self.cancel()
        if self.started:
            self.ray.shutdown()


def make_backend(name: str, *, workers: int | None = None, address: str | None = None) -> Backend:
    """The backend called ``name`` (``local`` or ``ray``)."""
    if name == "local":
        return LocalBackend(workers)
    if name == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("the ray backend needs Ray: pip install 'foxhunt-core[ray]'") from None
        try:
            return RayBackend(address, num_cpus=workers)
        except Exception as exc:  # noqa: BLE001 - Ray raises many types; the operator needs one line
            where = f" at {address}" if address else ""
            raise ValueError(f"cannot start the ray backend{where}: {' '.join(str(exc).split())}") from None
    raise ValueError(f"unknown backend {name!r} (local or ray)")
