"""Uniform experience replay in preallocated arrays (a ring buffer).

A transition is ``(obs, action[4], reward, next_obs, terminal)``. ``next_obs`` of a truncated
episode is the observation before the reset, so bootstrapping continues across time limits.
Everything in the buffer, plus the write cursor and fill level, is part of a checkpoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FIELDS = ("obs", "action", "reward", "next_obs", "terminal")


class ReplayBuffer:
    def __init__(self, capacity: int, obs_dim: int, num_branches: int, xp: Any = np) -> None:
        self.capacity = int(capacity)
        self.xp = xp
        self.obs = xp.zeros((capacity, obs_dim), dtype=xp.float32)
        self.next_obs = xp.zeros((capacity, obs_dim), dtype=xp.float32)
        self.action = xp.zeros((capacity, num_branches), dtype=xp.int64)
        self.reward = xp.zeros(capacity, dtype=xp.float32)
        self.terminal = xp.zeros(capacity, dtype=xp.float32)
        self.pos = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminal: Any) -> None:
        """Append a batch of transitions (first axis), overwriting the oldest when full."""
        n = obs.shape[0]
        idx = (self.pos + self.xp.arange(n)) % self.capacity
        self.obs[idx] = obs
        self.action[idx] = action
        self.reward[idx] = reward
        self.next_obs[idx] = next_obs
        self.terminal[idx] = terminal
        self.pos = int((self.pos + n) % self.capacity)
        self.size = int(min(self.size + n, self.capacity))

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = rng.integers(0, self.size, size=batch_size)
        idx = self.xp.asarray(idx)
        return {f: getattr(self, f)[idx] for f in FIELDS}

    def state_dict(self) -> dict[str, Any]:
        """Arrays (only the filled part) and cursors."""
        n = self.size
        arrays = {f"replay.{f}": getattr(self, f)[:n] for f in FIELDS}
        return {"arrays": arrays, "meta": {"pos": self.pos, "size": self.size, "capacity": self.capacity}}

    def load_state_dict(self, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
        if int(meta["capacity"]) != self.capacity:
            raise ValueError(
                f"replay capacity {meta['capacity']} in checkpoint differs from {self.capacity}"
            )
        n = int(meta["size"])
        for f in FIELDS:
            getattr(self, f)[:n] = self.xp.asarray(arrays[f"replay.{f}"])
        self.pos, self.size = int(meta["pos"]), n
