"""Experience collection: acting in the environment and filling the replay buffer.

Two collectors with one interface, chosen by the device:

* :class:`HostCollector` — the NumPy environment on the CPU. Actions come from the agent (on
  whichever array module it runs), drawn by per-branch Boltzmann with uniforms from a NumPy
  generator; transitions go to :class:`~foxhunt_core.replay.ReplayBuffer`, sampled with a NumPy
  generator. Every generator state is checkpointed, so runs resume bit-identically.
* :class:`DeviceCollector` — everything on the GPU: market, environment state
  (:class:`~foxhunt_core.gpu.env.GpuTradingEnv`), replay (:class:`~foxhunt_core.gpu.replay.GpuReplay`),
  and Boltzmann draws from counter-based Philox streams whose counters live on the device. One
  collection timestep (forward, Q pipeline, action draw, environment step, replay add) has no
  host round trip, so it is captured once as a CUDA graph and replayed; the temperatures and
  ``iqn_readiness`` are device scalars the trainer updates between replays.

Both expose ``replay`` (with ``sample``), ``collect(random)``, ``env_steps`` and a checkpoint
state (``state()`` -> ``(arrays, meta)``; ``load(arrays, meta)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import backend
from .agent import Agent
from .config import RunSettings
from .env import TradingEnv
from .explore import boltzmann_select
from .market.data import MarketData
from .replay import ReplayBuffer


def gen_state(g: np.random.Generator) -> dict[str, Any]:
    return g.bit_generator.state


def set_gen_state(g: np.random.Generator, s: dict[str, Any]) -> None:
    g.bit_generator.state = s


class HostCollector:
    """The CPU environment; see the module docstring."""

    def __init__(self, agent: Agent, split: MarketData, settings: RunSettings,
                 rngs: dict[str, np.random.Generator]) -> None:
        self.agent, self.settings, self.xp = agent, settings, agent.xp
        self.rng_env, self.rng_replay, self.rng_explore = rngs["env"], rngs["replay"], rngs["explore"]
        self.env = TradingEnv(split, settings.env, self.rng_env)
        self.replay = ReplayBuffer(settings.train.replay_capacity, settings.net.state_dim,
                                   agent.num_branches, self.xp)
        self.obs, _ = self.env.reset()
        self.env_steps = 0
        self.temps = np.ones(agent.num_branches)
        self.readiness = 0.0

    def set_exploration(self, temps: np.ndarray, readiness: float) -> None:
        self.temps, self.readiness = np.asarray(temps, dtype=np.float64), float(readiness)

    def _random_actions(self, n: int) -> np.ndarray:
        sizes = np.asarray(self.settings.net.branch_sizes)
        return (self.rng_explore.random((n, len(sizes))) * sizes).astype(np.int64)

    def _policy_actions(self, obs: np.ndarray) -> np.ndarray:
        xp = self.xp
        values = self.agent.act_values(xp.asarray(obs, dtype=xp.float32), self.readiness)
        u = xp.asarray(self.rng_explore.random((obs.shape[0], self.agent.num_branches)), dtype=xp.float32)
        temps = xp.asarray(self.temps, dtype=xp.float32)
        return backend.to_numpy(boltzmann_select(values, self.agent.offsets, temps, u))

    def collect(self, random: bool = False) -> None:
        obs = self.obs
        actions = self._random_actions(obs.shape[0]) if random else self._policy_actions(obs)
        nxt, reward, terminated, _, info = self.env.step(actions)
        xp = self.xp
        self.replay.add(
            xp.asarray(obs), xp.asarray(actions), xp.asarray(reward, dtype=xp.float32),
            xp.asarray(info["final_obs"]),  # the pre-reset observation where truncated
            xp.asarray(terminated.astype(np.float32)),
        )
        self.obs = nxt
        self.env_steps += obs.shape[0]

    def sample(self, batch_size: int) -> dict[str, Any]:
        return self.replay.sample(batch_size, self.rng_replay)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        env = self.env.state_dict()
        arrays = {f"env/{k}": v for k, v in env.items() if isinstance(v, np.ndarray)}
        rstate = self.replay.state_dict()
        arrays.update(rstate["arrays"])
        arrays["obs"] = np.asarray(self.obs)
        meta = {
            "kind": "host",
            "env": {k: v for k, v in env.items() if not isinstance(v, np.ndarray)},
            "replay": rstate["meta"],
            "rng": {"env": gen_state(self.rng_env), "replay": gen_state(self.rng_replay),
                    "explore": gen_state(self.rng_explore)},
            "env_steps": self.env_steps,
        }
        return arrays, meta

    def load(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        self.replay.load_state_dict(arrays, meta["replay"])
        env_state = dict(meta["env"])
        env_state.update({k[len("env/"):]: v for k, v in arrays.items() if k.startswith("env/")})
        self.env.load_state_dict(env_state)
        self.obs = arrays["obs"]
        set_gen_state(self.rng_env, meta["rng"]["env"])
        set_gen_state(self.rng_replay, meta["rng"]["replay"])
        set_gen_state(self.rng_explore, meta["rng"]["explore"])
        self.env_steps = int(meta["env_steps"])


class DeviceCollector:
    """GPU-resident collection with a captured timestep; see the module docstring."""

    RANDOM_TEMPERATURE = 1e6  # warm-up: Boltzmann this hot is uniform to float32 precision

    def __init__(self, agent: Agent, split: MarketData, settings: RunSettings, seed: int,
                 use_graph: bool = True) -> None:
        import cupy as cp

        from .gpu.env import GpuTradingEnv
        from .gpu.replay import GpuReplay

        self.cp, self.agent, self.settings = cp, agent, settings
        ss = np.random.SeedSequence([seed, 0xC011EC7])
        s_env, s_replay, s_select = (int(x) for x in ss.generate_state(3, dtype=np.uint64))
        self.env = GpuTradingEnv(split, settings.env, seed=s_env)
        self.replay = GpuReplay(settings.train.replay_capacity, settings.net.state_dim,
                                agent.num_branches, seed=s_replay, batch_size=settings.train.batch_size)
        self.select_seed = s_select
        self.select_counter = cp.zeros(1, dtype=cp.uint64)
        self.temps = cp.ones(agent.num_branches, dtype=cp.float32)
        self.readiness = cp.zeros((), dtype=cp.float32)
        self.actions = cp.zeros((self.env.num_envs, agent.num_branches), dtype=cp.int32)
        self.env.reset()
        self.env_steps = 0
        self.use_graph = use_graph
        self.graph: Any = None
        self.stream: Any = None  # the trainer's stream, shared with the update graph

    def set_exploration(self, temps: np.ndarray, readiness: float) -> None:
        self.temps[...] = self.cp.asarray(np.asarray(temps, dtype=np.float32))
        self.readiness.fill(float(readiness))

    def _step(self) -> None:
        from .gpu.kernels import boltzmann_select as select

        values = self.agent.act_values(self.env.obs, self.readiness)
        select(values, self.agent.offsets, self.temps, self.select_seed, self.select_counter, actions=self.actions)
        env = self.env
        env.step(self.actions)
        self.replay.add(env.prev_obs, self.actions, env.reward, env.final_obs, env.terminated)

    def collect(self, random: bool = False) -> None:
        if random:  # warm-up steps run eagerly at an infinite temperature
            saved = self.temps.copy()
            self.temps.fill(self.RANDOM_TEMPERATURE)
            self._step()
            self.temps[...] = saved
        elif not self.use_graph:
            self._step()
        else:
            if self.graph is None:
                self._capture()
            self.graph.launch(stream=self.stream)
        self.env_steps += self.env.num_envs

    def _capture(self) -> None:
        cp = self.cp
        if getattr(self, "stream", None) is None:
            self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self._prepare()
        cp.cuda.get_current_stream().synchronize()
        with self.stream, cp.cuda.using_allocator(self.pool.malloc):
            self.stream.begin_capture()
            try:
                self._step()
            finally:
                self.graph = self.stream.end_capture()
        self.stream.synchronize()

    def _prepare(self) -> None:
        """Everything a capture may not do, done beforehand without changing any state: compile
        and load the kernels, create the cuBLAS handle and the network's device constants (a
        resumed run captures before it has stepped once)."""
        from .gpu.kernels import boltzmann_select as select

        cp = self.cp
        values = self.agent.act_values(self.env.obs, self.readiness)  # pure: no state changes
        scratch = cp.zeros(1, dtype=cp.uint64)
        select(values, self.agent.offsets, self.temps, self.select_seed, scratch, actions=cp.empty_like(self.actions))
        self.env._kernel("env_step", self.actions.dtype)
        self.env._kernel("env_advance_counter")
        self.replay._module(self.actions.dtype, self.env.terminated.dtype)
        cp.cuda.get_current_stream().synchronize()

    def sync(self) -> None:
        """Make the current stream wait for collection replays (before an update reads the replay)."""
        if self.graph is not None:
            self.cp.cuda.get_current_stream().wait_event(self.stream.record())

    def sample(self, batch_size: int) -> dict[str, Any]:
        return self.replay.sample(batch_size)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        self.cp.cuda.Device().synchronize()
        env = self.env.state_dict()
        arrays = {f"env/{k}": v for k, v in env.items() if isinstance(v, np.ndarray)}
        rstate = self.replay.state_dict()
        arrays.update(rstate["arrays"])
        arrays["obs"] = self.env.obs.get()
        meta = {
            "kind": "device",
            "env": {k: v for k, v in env.items() if not isinstance(v, np.ndarray)},
            "replay": rstate["meta"],
            "select": {"seed": self.select_seed, "counter": int(self.select_counter.get()[0])},
            "env_steps": self.env_steps,
        }
        return arrays, meta

    def load(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        if meta.get("kind") != "device":
            raise ValueError("checkpoint was written by a CPU run; resume it with --device cpu")
        self.replay.load_state_dict(arrays, meta["replay"])
        env_state = dict(meta["env"])
        env_state.update({k[len("env/"):]: v for k, v in arrays.items() if k.startswith("env/")})
        self.env.load_state_dict(env_state)
        self.env.obs[...] = self.cp.asarray(arrays["obs"])
        self.select_seed = int(meta["select"]["seed"])
        self.select_counter[...] = self.cp.asarray(np.array([meta["select"]["counter"]], dtype=np.uint64))
        self.env_steps = int(meta["env_steps"])
