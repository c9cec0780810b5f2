"""The trading environment on the device: :class:`GpuTradingEnv` (CuPy, ``kernels/env_step.cu``).

The same transition as :class:`foxhunt_core.env.TradingEnv` (the NumPy function
:func:`foxhunt_core.env.transition` is its oracle), with everything on the device: the split's
feature matrix and per-bar columns, the per-episode state, the outputs (preallocated, written in
place by each step) and a step counter that keys the Philox4x32-10 draws of fills and restarts.
A :meth:`GpuTradingEnv.step` therefore makes two kernel launches, allocates nothing and never
synchronizes, so it can be captured in a CUDA graph and replayed.

Dtypes: features and observations float32; prices, per-bar columns, positions, order targets
and prices, PnL, costs and the running PnL float64 — the fill rules compare prices within half
a tick and the PnL adds per-bar returns of order 1e-4, so float64 keeps every episode
bit-identical to the NumPy twin (H200 float64 throughput is no limit for this memory-bound
kernel); bar indices, step counts, holding times, order kinds and lifetimes int32; flags bool.
Rewards float32, like the NumPy environment.

Randomness: draw ``(fill u, reset u)`` of episode ``i`` at step counter ``c`` is
:func:`philox_uniforms` ``(seed, c, n, STREAM_STEP)[i]``; a restart of every episode
(:meth:`GpuTradingEnv.reset`) uses ``STREAM_RESET``. Tests pass explicit uniforms instead, so
that NumPy and CUDA consume identical draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core import backend
from foxhunt_core.config import EnvSettings
from foxhunt_core.env import (
    HOLDING_SCALE_BARS,
    MARKET_COLUMNS,
    PASSIVE_DECAY,
    PRESSURE_CAP,
    STATE_FIELDS,
    STATE_VERSION,
    UNREALIZED_CLIP,
    UNREALIZED_SCALE_BPS,
    EnvParams,
    MarketArrays,
    State,
    check_state,
    identity,
)
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.schema import INDEX, STATE_DIM

KERNEL_PATH = Path(__file__).resolve().parent.parent / "kernels" / "env_step.cu"
BLOCK = 128  # threads (episodes) per block of env_step / env_reset; a multiple of 32
STREAM_STEP, STREAM_RESET = 0, 1  # Philox stream words of env_step.cu
NULL = np.uintp(0)  # a null device pointer argument
BAD_ACTION = 1  # bit of the device flags word: an action entry was outside 0..2

#: Device dtype of each state array (see the module docstring); the checkpoint keeps NumPy's.
DEVICE_DTYPES: dict[str, Any] = {
    "cursor": np.int32, "start": np.int32, "steps": np.int32, "position": np.float64,
    "open_pnl_bps": np.float64, "hold": np.int32, "order_active": np.bool_,
    "order_target": np.float64, "order_price": np.float64, "order_kind": np.int32,
    "order_ttl": np.int32,
}
_ACTION_TYPES = {np.dtype(np.int64): "long long", np.dtype(np.int32): "int"}


# ---------------------------------------------------------------------------- Philox (host twin)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LO = np.uint64(0xFFFFFFFF)


def philox4x32_10(ctr: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 (Salmon et al. 2011) of uint32 counters ``[m, 4]`` and keys ``[m, 2]``."""
    c = [np.asarray(ctr, dtype=np.uint32)[:, w].astype(np.uint64) for w in range(4)]
    k0, k1 = (np.asarray(key, dtype=np.uint32)[:, w].copy() for w in range(2))
    for r in range(10):
        if r:
            k0, k1 = k0 + _W0, k1 + _W1  # uint32 wrap-around
        p0, p1 = _M0 * c[0], _M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0.astype(np.uint64), p1 & _LO,
             (p0 >> np.uint64(32)) ^ c[3] ^ k1.astype(np.uint64), p0 & _LO]
    return np.stack(c, axis=1).astype(np.uint32)


def u01(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 in [0, 1) from two uint32 words (53 bits), as the kernels compute it."""
    hi = (np.asarray(a, dtype=np.uint32) >> np.uint32(5)).astype(np.float64)
    lo = (np.asarray(b, dtype=np.uint32) >> np.uint32(6)).astype(np.float64)
    return (hi * 67108864.0 + lo) * (1.0 / 9007199254740992.0)


def philox_words(seed: int, counter: int, n: int, stream: int) -> np.ndarray:
    """uint32 ``[n, 4]``: the Philox block of items ``0..n-1`` at ``counter`` in ``stream``."""
    ctr = np.zeros((n, 4), dtype=np.uint32)
    ctr[:, 0], ctr[:, 1] = counter & 0xFFFFFFFF, (counter >> 32) & 0xFFFFFFFF
    ctr[:, 2], ctr[:, 3] = np.arange(n, dtype=np.uint32), stream
    key = np.tile(np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], dtype=np.uint32), (n, 1))
    return philox4x32_10(ctr, key)


def philox_uniforms(seed: int, counter: int, n: int, stream: int = STREAM_STEP) -> np.ndarray:
    """float64 ``[n, 2]``: the ``(fill, reset)`` uniforms env_step draws at ``counter``."""
    w = philox_words(seed, counter, n, stream)
    return np.stack([u01(w[:, 0], w[:, 1]), u01(w[:, 2], w[:, 3])], axis=1)


# ---------------------------------------------------------------------------- the environment
class GpuTradingEnv:
    """``num_envs`` parallel training episodes on one split, on the current CUDA device.

    Attributes written by every :meth:`step` (fixed device buffers): ``obs``, ``final_obs``,
    ``prev_obs`` (the observation the actions were chosen on, so a collector can add
    ``(prev_obs, actions, reward, final_obs, terminated)`` to the replay without a copy; only
    with ``keep_prev_obs``), ``reward``, ``terminated``, ``truncated`` and :attr:`info`.
    """

    def __init__(self, split: MarketData, settings: EnvSettings, num_envs: int | None = None,
                 seed: int = 0, *, episode_len: int | None = None, keep_prev_obs: bool = True) -> None:
        import cupy as cp

        self.split, self.settings = split, settings
        self.num_envs = settings.num_envs if num_envs is None else int(num_envs)
        self.episode_len = settings.episode_len if episode_len is None else int(episode_len)
        t_len = len(split)
        if self.num_envs < 1 or self.episode_len < 1:
            raise ValueError("num_envs and episode_len must be at least 1")
        if t_len < self.episode_len + 1:
            raise ValueError(f"split has {t_len} bars; an episode of {self.episode_len} steps "
                             f"needs {self.episode_len + 1}")
        if t_len >= 2**31 or self.num_envs >= 2**31:
            raise ValueError("bars and episodes must each fit in int32")
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.market = MarketArrays.from_split(split)
        self.params = EnvParams.from_settings(settings, self.episode_len, t_len)
        m = self.market
        self._features = cp.asarray(np.ascontiguousarray(m.features, dtype=np.float32))
        self._columns = {c: cp.asarray(np.ascontiguousarray(getattr(m, c), dtype=np.float64))
                         for c in MARKET_COLUMNS}
        self._sizes = cp.asarray(self.params.sizes, dtype=cp.float64)
        self._urgency = cp.asarray(self.params.urgency, dtype=cp.int32)
        n = self.num_envs
        self.state = {k: cp.zeros(n, dtype=d) for k, d in DEVICE_DTYPES.items()}
        self.obs = cp.zeros((n, STATE_DIM), dtype=cp.float32)
        self.final_obs = cp.zeros((n, STATE_DIM), dtype=cp.float32)
        self.prev_obs = cp.zeros((n, STATE_DIM), dtype=cp.float32) if keep_prev_obs else None
        self.reward = cp.zeros(n, dtype=cp.float32)
        self.terminated = cp.zeros(n, dtype=cp.bool_)
        self.truncated = cp.zeros(n, dtype=cp.bool_)
        self.info = {k: cp.zeros(n, dtype=cp.float64)
                     for k in ("pnl_bps", "cost_bps", "turnover", "position")}
        self.counter = cp.zeros(1, dtype=cp.uint64)  # Philox step counter (device)
        self.flags = cp.zeros(1, dtype=cp.int32)  # BAD_ACTION when an action was out of range
        self._ready = False
        self._grid = ((n + BLOCK - 1) // BLOCK,)
        p = self.params
        self._consts = (
            self._features, *self._columns.values(),
            np.float64(m.tick),
            self._sizes, self._urgency, np.float64(p.taker), np.float64(p.maker),
            np.float64(p.lam0), np.float64(p.reward_scale_bps), np.int32(p.episode_len),
            np.int32(p.num_starts), np.float64(PASSIVE_DECAY), np.float64(PRESSURE_CAP),
            np.float64(UNREALIZED_SCALE_BPS), np.float64(UNREALIZED_CLIP),
            np.float64(np.log1p(HOLDING_SCALE_BARS)), *self._obs_cols(),
        )

    # ------------------------------------------------------------------ kernels
    @staticmethod
    def _obs_cols() -> tuple[np.int32, ...]:
        """obs_dim and the account columns, by name from the schema (defect 9)."""
        return tuple(np.int32(v) for v in (STATE_DIM, INDEX["position"], INDEX["unrealized_pnl"],
                                           INDEX["holding_time"], INDEX["working_order"]))

    @staticmethod
    def _kernel(name: str, action_dtype: Any = np.int64) -> Any:
        ctype = _ACTION_TYPES.get(np.dtype(action_dtype))
        if ctype is None:
            raise TypeError(f"{name}: actions must be int64 or int32, got {np.dtype(action_dtype)}")
        mod = backend.load_module(str(KERNEL_PATH), {"ENV_BLOCK": BLOCK, "ENV_ACTION_T": ctype})
        return mod.get_function(name)

    def _state_args(self) -> tuple[Any, ...]:
        return tuple(self.state[k] for k in STATE_FIELDS)

    def _advance(self) -> None:
        self._kernel("env_advance_counter")((1,), (1,), (self.counter,))

    # ------------------------------------------------------------------ episodes
    def reset(self, uniforms: Any = None) -> Any:
        """Start every episode afresh; returns ``obs`` (float32 ``[N, 50]``, device).

        ``uniforms``: optional float64 ``[N]`` device array mapped to start bars by
        :func:`foxhunt_core.env.start_bars`; by default Philox draws (``STREAM_RESET``).
        """
        n = self.num_envs
        if uniforms is not None:
            backend.check_array("env_reset", "uniforms", uniforms, np.float64, (n,))
        self._kernel("env_reset")(self._grid, (BLOCK,), (
            self._features, np.int32(self.params.num_starts), *self._obs_cols(),
            *self._state_args(), NULL if uniforms is None else uniforms,
            np.uint64(self.seed), self.counter, self.obs, np.int32(n)))
        self._advance()
        self._ready = True
        return self.obs

    def step(self, actions: Any, uniforms: Any = None) -> tuple[Any, Any, Any, Any, Any]:
        """Apply int64 or int32 ``[N, 4]`` device actions; returns device arrays
        ``(obs, reward, terminated, truncated, final_obs)`` (this env's buffers, overwritten by
        the next step). No sync: out-of-range actions are clamped and flagged (:meth:`check`).

        ``uniforms``: optional float64 ``[N, 2]`` device array of ``(fill, reset)`` draws used
        instead of Philox (parity tests).
        """
        if not self._ready:
            raise RuntimeError("call reset() before step()")
        n = self.num_envs
        backend.check_array("env_step", "actions", actions, actions.dtype, (n, 4))
        if uniforms is not None:
            backend.check_array("env_step", "uniforms", uniforms, np.float64, (n, 2))
        self._kernel("env_step", actions.dtype)(self._grid, (BLOCK,), (
            *self._consts, *self._state_args(), actions,
            NULL if uniforms is None else uniforms, np.uint64(self.seed), self.counter,
            self.obs, NULL if self.prev_obs is None else self.prev_obs, self.final_obs,
            self.reward, self.terminated, self.truncated, self.info["pnl_bps"],
            self.info["cost_bps"], self.info["turnover"], self.info["position"], self.flags,
            np.int32(n)))
        self._advance()
        return self.obs, self.reward, self.terminated, self.truncated, self.final_obs

    def check(self) -> None:
        """Synchronize and raise ``ValueError`` if any step saw an action outside 0..2."""
        if int(self.flags.get()[0]) & BAD_ACTION:
            self.flags.fill(0)
            raise ValueError("env_step: an action entry was outside 0..2 (clamped)")

    # ------------------------------------------------------------------ state
    def host_state(self) -> State:
        """The per-episode state as NumPy arrays of :data:`foxhunt_core.env.STATE_FIELDS` dtypes."""
        return {k: self.state[k].get().astype(d) for k, d in STATE_FIELDS.items()}

    def set_state(self, state: State) -> None:
        """Upload per-episode arrays (NumPy, any dtype that converts) and rebuild ``obs`` from
        them; the environment is then ready to step."""
        for k, d in DEVICE_DTYPES.items():
            arr = np.asarray(state[k]).astype(d)
            if arr.shape != (self.num_envs,):
                raise ValueError(f"state {k!r} has shape {arr.shape}, expected ({self.num_envs},)")
            self.state[k].set(arr)
        self._kernel("env_observe")(self._grid, (BLOCK,), (
            self._features, *self._obs_cols(), *self._state_args(), np.float64(UNREALIZED_SCALE_BPS),
            np.float64(UNREALIZED_CLIP), np.float64(np.log1p(HOLDING_SCALE_BARS)), self.obs,
            np.int32(self.num_envs)))
        self._ready = True

    @property
    def step_counter(self) -> int:
        return int(self.counter.get()[0])

    def state_dict(self) -> dict[str, Any]:
        """:meth:`TradingEnv.state_dict`'s format (NumPy arrays, JSON-able scalars) with the
        Philox ``philox_seed`` / ``philox_counter`` in place of a generator state."""
        state: dict[str, Any] = {"version": STATE_VERSION, **identity("random", self.num_envs, self.episode_len,
                                                          self.split), "ready": self._ready}
        for k, v in self.host_state().items():
            state[k] = v.astype(np.int8) if v.dtype == np.bool_ else v
        state["philox_seed"], state["philox_counter"] = self.seed, self.step_counter
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, or the episode state of a CPU
        :class:`TradingEnv` checkpoint (whose generator state does not apply: the Philox
        seed and counter are then kept)."""
        self.set_state(check_state(state, identity("random", self.num_envs, self.episode_len,
                                                   self.split)))
        if "philox_counter" in state:
            self.seed = int(state["philox_seed"])
            self.counter.set(np.array([int(state["philox_counter"])], dtype=np.uint64))
        self._ready = bool(state["ready"])
