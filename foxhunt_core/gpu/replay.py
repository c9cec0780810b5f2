"""The replay ring buffer on the device: :class:`GpuReplay` (CuPy, ``kernels/replay.cu``).

The same buffer as :class:`foxhunt_core.replay.ReplayBuffer` — same arrays, dtypes and
checkpoint format, so a checkpoint written by either loads into the other — with the write
cursor, the fill level and the sampling counter on the device. :meth:`GpuReplay.add` and
:meth:`GpuReplay.sample` each make two kernel launches, allocate nothing (once the batch buffers
of a batch size exist) and never synchronize, so they can be captured in a CUDA graph.

Sampling is uniform with replacement: index ``b`` of the draw at counter ``c`` is
``floor(u * size)`` with ``u`` the 53-bit uniform of Philox4x32-10 on counter
``(c, b, STREAM_SAMPLE)`` and key ``seed`` (:func:`sample_indices` is the host twin).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core import backend
from foxhunt_core.gpu.env import NULL, philox_words, u01
from foxhunt_core.replay import FIELDS

KERNEL_PATH = Path(__file__).resolve().parent.parent / "kernels" / "replay.cu"
STREAM_SAMPLE = 2  # Philox stream word of replay_sample (env_step uses 0 and 1)
_ADD_THREADS = 256
_WARPS_PER_BLOCK = 8  # replay_sample: one warp per sampled transition
_ACTION_TYPES = {np.dtype(np.int64): "long long", np.dtype(np.int32): "int"}
_TERMINAL_TYPES = {np.dtype(np.bool_): "bool", np.dtype(np.float32): "float"}


def sample_indices(seed: int, counter: int, batch: int, size: int) -> np.ndarray:
    """int64 ``[batch]``: the indices replay_sample draws at ``counter`` from ``size`` rows."""
    w = philox_words(seed, counter, batch, STREAM_SAMPLE)
    idx = (u01(w[:, 0], w[:, 1]) * size).astype(np.int64)
    return np.clip(idx, 0, max(size - 1, 0))


class GpuReplay:
    """Uniform replay of ``capacity`` transitions on the current CUDA device.

    Arrays as :class:`~foxhunt_core.replay.ReplayBuffer`: ``obs``/``next_obs`` float32
    ``[C, obs_dim]``, ``action`` int64 ``[C, branches]``, ``reward``/``terminal`` float32 ``[C]``;
    ``cursor`` int64 ``[2]`` = (write position, fill level) and ``counter`` uint64 ``[1]`` (the
    sampling draw counter), both on the device.
    """

    def __init__(self, capacity: int, obs_dim: int, num_branches: int, seed: int = 0,
                 batch_size: int | None = None) -> None:
        import cupy as cp

        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if not 1 <= num_branches <= min(32, obs_dim):
            raise ValueError("num_branches must be in 1..min(32, obs_dim)")
        self.capacity, self.obs_dim, self.num_branches = int(capacity), int(obs_dim), int(num_branches)
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.obs = cp.zeros((capacity, obs_dim), dtype=cp.float32)
        self.next_obs = cp.zeros((capacity, obs_dim), dtype=cp.float32)
        self.action = cp.zeros((capacity, num_branches), dtype=cp.int64)
        self.reward = cp.zeros(capacity, dtype=cp.float32)
        self.terminal = cp.zeros(capacity, dtype=cp.float32)
        self.cursor = cp.zeros(2, dtype=cp.int64)
        self.counter = cp.zeros(1, dtype=cp.uint64)
        self._batches: dict[int, dict[str, Any]] = {}
        if batch_size is not None:
            self.batch_buffers(batch_size)

    # ------------------------------------------------------------------ kernels
    @staticmethod
    def _module(action_dtype: Any = np.int64, terminal_dtype: Any = np.bool_) -> Any:
        a = _ACTION_TYPES.get(np.dtype(action_dtype))
        t = _TERMINAL_TYPES.get(np.dtype(terminal_dtype))
        if a is None:
            raise TypeError(f"replay_add: action must be int64 or int32, got {np.dtype(action_dtype)}")
        if t is None:
            raise TypeError(f"replay_add: terminal must be bool or float32, got {np.dtype(terminal_dtype)}")
        return backend.load_module(str(KERNEL_PATH), {"REPLAY_ACTION_T": a, "REPLAY_TERMINAL_T": t})

    # ------------------------------------------------------------------ add and sample
    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminal: Any) -> None:
        """Append ``n`` transitions (device arrays: float32 ``[n, obs_dim]`` obs and next_obs,
        int64/int32 ``[n, branches]`` actions, float32 ``[n]`` rewards, bool/float32 ``[n]``
        terminal flags) at the device cursor, overwriting the oldest when full."""
        n = obs.shape[0]
        d, b = self.obs_dim, self.num_branches
        backend.check_array("replay_add", "obs", obs, np.float32, (n, d))
        backend.check_array("replay_add", "next_obs", next_obs, np.float32, (n, d))
        backend.check_array("replay_add", "action", action, action.dtype, (n, b))
        backend.check_array("replay_add", "reward", reward, np.float32, (n,))
        backend.check_array("replay_add", "terminal", terminal, terminal.dtype, (n,))
        if n > self.capacity:
            raise ValueError(f"replay_add: {n} transitions exceed the capacity {self.capacity}")
        if n * d >= 2**31:
            raise ValueError(f"replay_add: {n} x {d} elements exceed one launch (2**31)")
        mod = self._module(action.dtype, terminal.dtype)
        blocks = min((n * d + _ADD_THREADS - 1) // _ADD_THREADS, 65535)
        mod.get_function("replay_add")((max(blocks, 1),), (_ADD_THREADS,), (
            self.obs, self.next_obs, self.action, self.reward, self.terminal, self.cursor,
            obs, action, reward, next_obs, terminal,
            np.int32(n), np.int32(d), np.int32(b), np.int64(self.capacity)))
        mod.get_function("replay_commit")((1,), (1,), (self.cursor, np.int64(n), np.int64(self.capacity)))

    def batch_buffers(self, batch: int) -> dict[str, Any]:
        """The preallocated output arrays of :meth:`sample` for ``batch`` (created on first use:
        call once before capturing a graph)."""
        import cupy as cp

        buf = self._batches.get(batch)
        if buf is None:
            buf = {
                "obs": cp.zeros((batch, self.obs_dim), dtype=cp.float32),
                "action": cp.zeros((batch, self.num_branches), dtype=cp.int64),
                "reward": cp.zeros(batch, dtype=cp.float32),
                "next_obs": cp.zeros((batch, self.obs_dim), dtype=cp.float32),
                "terminal": cp.zeros(batch, dtype=cp.float32),
                "index": cp.zeros(batch, dtype=cp.int64),
            }
            self._batches[batch] = buf
        return buf

    def sample(self, batch: int, indices: Any = None) -> dict[str, Any]:
        """Gather ``batch`` transitions drawn uniformly (Philox, device counter) into the batch
        buffers; returns them by field name (:data:`foxhunt_core.replay.FIELDS` plus ``index``).

        ``indices``: optional int64 ``[batch]`` device array used instead of the draw (tests).
        An empty buffer yields row 0 (zeros): there is no host check without a sync.
        """
        if indices is not None:
            backend.check_array("replay_sample", "indices", indices, np.int64, (batch,))
        out = self.batch_buffers(batch)
        mod = self._module()
        threads = 32 * _WARPS_PER_BLOCK
        blocks = (batch + _WARPS_PER_BLOCK - 1) // _WARPS_PER_BLOCK
        mod.get_function("replay_sample")((blocks,), (threads,), (
            self.obs, self.next_obs, self.action, self.reward, self.terminal, self.cursor,
            np.uint64(self.seed), self.counter, NULL if indices is None else indices,
            out["index"], out["obs"], out["action"], out["reward"], out["next_obs"], out["terminal"],
            np.int32(batch), np.int32(self.obs_dim), np.int32(self.num_branches)))
        mod.get_function("replay_advance_counter")((1,), (1,), (self.counter,))
        return out

    # ------------------------------------------------------------------ state
    @property
    def pos(self) -> int:
        return int(self.cursor.get()[0])

    @property
    def size(self) -> int:
        return int(self.cursor.get()[1])

    def __len__(self) -> int:
        return self.size

    def state_dict(self) -> dict[str, Any]:
        """:meth:`ReplayBuffer.state_dict`'s format (host arrays of the filled part), plus the
        sampling seed and counter in ``meta``."""
        pos, size = (int(v) for v in self.cursor.get())
        arrays = {f"replay.{f}": getattr(self, f)[:size].get() for f in FIELDS}
        meta = {"pos": pos, "size": size, "capacity": self.capacity,
                "philox_seed": self.seed, "philox_counter": int(self.counter.get()[0])}
        return {"arrays": arrays, "meta": meta}

    def load_state_dict(self, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` or :meth:`ReplayBuffer.state_dict` output (the latter
        carries no sampling counter: this buffer's is kept)."""
        if int(meta["capacity"]) != self.capacity:
            raise ValueError(f"replay capacity {meta['capacity']} in checkpoint differs from {self.capacity}")
        n = int(meta["size"])
        for f in FIELDS:
            dst = getattr(self, f)
            src = np.asarray(backend.to_numpy(arrays[f"replay.{f}"]), dtype=dst.dtype)
            if src.shape != (n, *dst.shape[1:]):
                raise ValueError(f"replay.{f} has shape {src.shape}, expected {(n, *dst.shape[1:])}")
            if n:
                dst[:n].set(src)
        self.cursor.set(np.array([int(meta["pos"]), n], dtype=np.int64))
        if "philox_counter" in meta:
            self.seed = int(meta["philox_seed"])
            self.counter.set(np.array([int(meta["philox_counter"])], dtype=np.uint64))
