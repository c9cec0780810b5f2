"""Where trials run: a local pool of trial processes, or Ray tasks.

Both backends offer the same calls to the controller: ``submit`` a trial, ``wait`` up to a
timeout for finished ones, ``cancel`` what is still running, ``close``. Trials are processes
(:mod:`foxhunt_ops.trial`), so the results do not depend on the backend: the same plan gives the
same ledger with either (timings and the GPU that ran each trial aside).

* ``local``: trial processes that are children of the controller (they die with it, see
  :mod:`foxhunt_ops.trial`). CPU trials: at most ``workers`` at once (default: the CPU count).
  CUDA trials: each one is placed on one GPU of the host by its process's
  ``CUDA_VISIBLE_DEVICES`` (every trial has a CUDA context of its own, on the one GPU it sees),
  at most ``workers_per_gpu`` per GPU, on the least loaded GPU first (:class:`GpuSlots`), so
  every visible GPU is used. The GPUs are those of ``CUDA_VISIBLE_DEVICES`` when it is set,
  else the ones ``nvidia-smi -L`` lists, and none without CuPy (:func:`visible_gpus`);
  tests inject them.
* ``ray``: each trial is a Ray task (``num_cpus=1``; ``num_gpus=1/workers_per_gpu`` for CUDA
  trials, 0 on the CPU; Ray sets the task's ``CUDA_VISIBLE_DEVICES``) that runs the trial
  process on whichever node Ray picks and returns its outcome, so the ledger never needs the
  worker's files. Without ``address`` it joins the Ray instance this process already started,
  or starts a local one (and shuts it down at ``close``).

Either way a CUDA trial's CuPy memory pools are limited to ``gpu_memory_fraction`` of its GPU's
memory (``CUPY_GPU_MEMORY_LIMIT``; default ``0.9 / workers_per_gpu``): a trial that needs more
fails with CuPy's out-of-memory error instead of starving the trials beside it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from .trial import TrialOutcome, TrialSpec, kill, launch, outcome, trial_env, trial_gpu


class Backend(Protocol):
    name: str
    capacity: int

    def device_for(self, device: str) -> str: ...

    def submit(self, spec: TrialSpec) -> None: ...

    def running(self) -> int: ...

    def wait(self, timeout: float) -> list[TrialOutcome]: ...

    def cancel(self) -> list[TrialSpec]: ...

    def close(self) -> None: ...


def parse_visible_devices(value: str) -> list[str]:
    """The GPU ids of a ``CUDA_VISIBLE_DEVICES`` value, up to the first invalid entry (CUDA ignores
    that one and every one after it)."""
    ids: list[str] = []
    for g in (x.strip() for x in value.split(",")):
        if not g or g.startswith("-"):
            break
        ids.append(g)
    return ids


def ray_resources(device: str, workers_per_gpu: int) -> dict[str, float]:
    """What a trial's Ray task asks for: one CPU, and ``1 / workers_per_gpu`` of a GPU on CUDA."""
    return {"num_cpus": 1, "num_gpus": 1.0 / workers_per_gpu if device == "cuda" else 0}


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPUs local CUDA trials can be placed on (ids as ``CUDA_VISIBLE_DEVICES`` takes them).

    ``CUDA_VISIBLE_DEVICES`` when set (its comma-separated entries; empty: none), else one id per
    GPU that ``nvidia-smi -L`` lists; none when CuPy is not installed (trials could not use them)
    or ``nvidia-smi`` is absent. The controller never creates a CUDA context itself.
    """
    env = os.environ if environ is None else environ
    if importlib.util.find_spec("cupy") is None:
        return []
    if "CUDA_VISIBLE_DEVICES" in env:
        return parse_visible_devices(env["CUDA_VISIBLE_DEVICES"])
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def memory_fraction(workers_per_gpu: int, fraction: float | None) -> float:
    """A CUDA trial's share of its GPU's memory: ``fraction``, or 0.9 split over the trials of a GPU."""
    return fraction if fraction is not None else 0.9 / workers_per_gpu


class GpuSlots:
    """``per_gpu`` trial slots on each of ``gpus``; a trial takes the least loaded GPU (the first of
    equally loaded ones) and gives its slot back when it ends."""

    def __init__(self, gpus: list[str], per_gpu: int) -> None:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU ids must be unique: {gpus}")
        self.gpus, self.per_gpu = list(gpus), int(per_gpu)
        self.load = {g: 0 for g in self.gpus}

    @property
    def capacity(self) -> int:
        return len(self.gpus) * self.per_gpu

    def take(self) -> str:
        free = [g for g in self.gpus if self.load[g] < self.per_gpu]
        if not free:
            raise RuntimeError("no free GPU slot (the controller submits at most `capacity` trials at once)")
        gpu = min(free, key=lambda g: self.load[g])
        self.load[gpu] += 1
        return gpu

    def give(self, gpu: str) -> None:
        self.load[gpu] -= 1


class LocalBackend:
    """Trial processes on this machine: a bounded pool on the CPU, GPU slots on CUDA."""

    name = "local"

    def __init__(self, workers: int | None = None, *, device: str = "cpu", gpus: list[str] | None = None,
                 workers_per_gpu: int = 1, gpu_memory_fraction: float | None = None,
                 launcher: Callable[..., Any] | None = None) -> None:
        self.gpus = visible_gpus() if gpus is None else list(gpus)
        self.device = self.device_for(device)
        self.slots = GpuSlots(self.gpus, workers_per_gpu) if self.device == "cuda" and self.gpus else None
        self.memory = memory_fraction(workers_per_gpu, gpu_memory_fraction)
        if self.slots is not None:
            self.capacity = min(workers, self.slots.capacity) if workers else self.slots.capacity
        else:
            self.capacity = max(1, workers or os.cpu_count() or 1)
        self.launcher = launcher if launcher is not None else launch
        self.procs: dict[tuple[str, int], tuple[TrialSpec, Any, float, str | None]] = {}

    def device_for(self, device: str) -> str:
        if device == "auto":
            return "cuda" if self.gpus else "cpu"
        return device

    def placement(self, spec: TrialSpec) -> str | None:
        """The GPU a trial submitted now would run on (``None``: a CPU trial, or no GPU known)."""
        if spec.device != "cuda" or self.slots is None:
            return None
        return self.slots.take()

    def submit(self, spec: TrialSpec) -> None:
        if spec.device == "cuda":
            spec = replace(spec, gpu_memory_fraction=spec.gpu_memory_fraction or self.memory)
        gpu = self.placement(spec)
        env = trial_env(spec, gpu)
        self.procs[spec.key] = (spec, self.launcher(spec, env), time.perf_counter(), trial_gpu(spec, env))

    def running(self) -> int:
        return len(self.procs)

    def _release(self, gpu: str | None) -> None:
        if self.slots is not None and gpu in self.slots.load:
            self.slots.give(gpu)

    def wait(self, timeout: float) -> list[TrialOutcome]:
        deadline = time.perf_counter() + timeout
        while True:
            done = []
            for key, (spec, proc, t0, gpu) in list(self.procs.items()):
                elapsed = time.perf_counter() - t0
                code = proc.poll()
                timed_out = code is None and spec.timeout_s is not None and elapsed > spec.timeout_s
                if timed_out:
                    kill(proc)
                    code = proc.returncode
                if code is not None:
                    del self.procs[key]
                    self._release(gpu)
                    done.append(outcome(spec, code, elapsed, timed_out, gpu))
            if done or not self.procs or time.perf_counter() >= deadline:
                return done
            time.sleep(0.05)

    def cancel(self) -> list[TrialSpec]:
        specs = []
        for spec, proc, _, gpu in self.procs.values():
            kill(proc)
            self._release(gpu)
            specs.append(spec)
        self.procs.clear()
        return specs

    def close(self) -> None:
        self.cancel()


class RayBackend:
    """Trials as Ray tasks (one CPU each; one GPU each for CUDA trials)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, *, workers_per_gpu: int = 1,
                 gpu_memory_fraction: float | None = None) -> None:
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
        self.workers_per_gpu = workers_per_gpu
        self.memory = memory_fraction(workers_per_gpu, gpu_memory_fraction)

    def device_for(self, device: str) -> str:
        if device == "auto":
            return "cuda" if self.gpus else "cpu"
        return device

    def submit(self, spec: TrialSpec) -> None:
        if spec.device == "cuda":
            spec = replace(spec, gpu_memory_fraction=spec.gpu_memory_fraction or self.memory)
        task = self._task.options(**ray_resources(spec.device, self.workers_per_gpu))
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


def make_backend(name: str, *, workers: int | None = None, address: str | None = None, device: str = "cpu",
                 workers_per_gpu: int = 1, gpu_memory_fraction: float | None = None) -> Backend:
    """The backend called ``name`` (``local`` or ``ray``) for trials on ``device`` (the plan's)."""
    if name == "local":
        return LocalBackend(workers, device=device, workers_per_gpu=workers_per_gpu,
                            gpu_memory_fraction=gpu_memory_fraction)
    if name == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("the ray backend needs Ray: pip install 'foxhunt-core[ray]'") from None
        try:
            return RayBackend(address, num_cpus=workers, workers_per_gpu=workers_per_gpu,
                              gpu_memory_fraction=gpu_memory_fraction)
        except Exception as exc:  # noqa: BLE001 - Ray raises many types; the operator needs one line
            where = f" at {address}" if address else ""
            raise ValueError(f"cannot start the ray backend{where}: {' '.join(str(exc).split())}") from None
    raise ValueError(f"unknown backend {name!r} (local or ray)")
