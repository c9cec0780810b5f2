"""The engine's CUDA path: custom kernels for the elementwise and reduction work of a training
update, so that an update is cuBLAS GEMMs plus a few fused kernels, capturable as a CUDA graph.

- :mod:`.kernels` — every launch wrapper (typed, checked, ``out=`` buffers, no host sync) in one
  namespace; they live by kernel family in :mod:`.dueling`, :mod:`.c51_loss`, :mod:`.elementwise`
  (with :mod:`.arrays`, their shared checks), :mod:`.tc` (the tensor-core GEMMs), :mod:`.qkernels`
  (attention, Q-statistics, Boltzmann) and :mod:`.optim` (Adam).
- :mod:`.defines` — the one table of constants the kernels and the wrappers share.
- :mod:`.launch` — kernel loading (``backend.load_module``), branch layouts, grids.
- :mod:`.cublas` / :mod:`.cublaslt` — GEMMs through ctypes bindings usable inside a stream
  capture: ``cublasGemmEx`` (batched, float64) and cuBLASLt (float32, bias/ReLU epilogues);
  :mod:`.cudalib` opens the libraries.
- :mod:`.flat` — :class:`FlatTree`, one flat buffer per parameter tree with per-tensor views.
- :mod:`.philox` — Philox4x32-10 in NumPy, the twin of the kernels' generator.
- :mod:`.reference` — the NumPy twins that the parity tests in ``tests/gpu`` compare against.

CUDA sources live in ``foxhunt_core/kernels/*.cu``. Importing this package never imports CuPy.
"""

from .flat import FlatTree

__all__ = ["FlatTree"]
