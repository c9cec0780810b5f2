"""Collection throughput: environment steps per second, GPU-resident against the NumPy peer.

For each number of parallel episodes (default 4096, 16384, 65536) on the synthetic market:

* ``env eager``  — :meth:`GpuTradingEnv.step` launched from Python each step;
* ``env graph``  — the same step replayed from a captured CUDA graph;
* ``collect graph`` — a full collection timestep from a captured CUDA graph: Boltzmann selection
  on given Q-values (``gpu.kernels.boltzmann_select``, Philox keyed by a device counter), the
  environment step, and the replay add of ``(prev_obs, actions, reward, final_obs, terminated)``;
* ``collect policy graph`` — the trainer's own timestep (``collector.DeviceCollector``): the same
  plus the network's forward pass and Q pipeline on every episode to get the Q-values (stage 0,
  or with ``--flags FILE`` the stages that flag file enables, with its plugin options; the run
  settings stay the benchmark's);

plus, in the same run, the NumPy environment on the CPU (:class:`TradingEnv`, and the same
timestep with ``explore.boltzmann_select`` and ``ReplayBuffer.add``) at 4096 episodes.

A graph holds ``--unroll`` consecutive timesteps (fixed buffers, so they chain), so that a
Python ``graph.launch`` is not what is measured. GPU times are ``cupy.cuda.Event`` intervals
on one non-blocking stream; each figure is the median over ``--repeats``. Issue 5's target:
>= 20 M environment steps/s at 65536 episodes.

Usage: ``python benchmarks/bench_collect.py [--episodes 4096 16384 65536] [--flags FILE] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

OFFSETS = (0, 3, 6, 9, 12)
TARGET = 20e6  # env steps/s at 65536 episodes


def _gpu_rate(cp: Any, stream: Any, fn: Callable[[], None], steps_per_call: int, episodes: int,
              calls: int, repeats: int) -> float:
    """Median environment steps per second of ``calls`` launches of ``fn``, by CUDA events."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    rates = []
    for _ in range(repeats):
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
        end.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, end) / 1e3
        rates.append(episodes * steps_per_call * calls / seconds)
    return statistics.median(rates)


def _capture(stream: Any, body: Callable[[], None], unroll: int) -> Any:
    body()  # compile and allocate outside the capture
    stream.synchronize()
    stream.begin_capture()
    for _ in range(unroll):
        body()
    return stream.end_capture()


def bench_gpu(split: Any, episodes: int, args: argparse.Namespace) -> dict[str, float]:
    import cupy as cp

    from foxhunt_core.config import EnvSettings
    from foxhunt_core.gpu.env import GpuTradingEnv
    from foxhunt_core.gpu.kernels import boltzmann_select
    from foxhunt_core.gpu.replay import GpuReplay
    from foxhunt_core.market.schema import STATE_DIM

    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    out: dict[str, float] = {"episodes": episodes}
    with stream:
        env = GpuTradingEnv(split, EnvSettings(), episodes, seed=1)
        env.reset()
        actions = cp.asarray(rng.integers(0, 3, size=(episodes, 4)).astype(np.int32))
        q = cp.asarray(rng.normal(size=(episodes, OFFSETS[-1])).astype(np.float32))
        temps = cp.asarray(np.full(len(OFFSETS) - 1, 0.5, dtype=np.float32))
        select_counter = cp.zeros(1, dtype=cp.uint64)
        replay = GpuReplay(max(args.replay_capacity, episodes), STATE_DIM, len(OFFSETS) - 1, seed=2)

        def env_step() -> None:
            env.step(actions)

        def collect() -> None:
            boltzmann_select(q, OFFSETS, temps, 3, select_counter, actions=actions)
            env.step(actions)
            replay.add(env.prev_obs, actions, env.reward, env.final_obs, env.terminated)

        env_step()
        out["env_eager"] = _gpu_rate(cp, stream, env_step, 1, episodes, args.calls * args.unroll,
                                     args.repeats)
        g_env = _capture(stream, env_step, args.unroll)
        out["env_graph"] = _gpu_rate(cp, stream, lambda: g_env.launch(stream), args.unroll,
                                     episodes, args.calls, args.repeats)
        g_collect = _capture(stream, collect, args.unroll)
        out["collect_graph"] = _gpu_rate(cp, stream, lambda: g_collect.launch(stream), args.unroll,
                                         episodes, args.calls, args.repeats)
        stream.synchronize()
        env.check()
        if not bool(cp.isfinite(env.obs).all()) or len(replay) == 0:
            raise RuntimeError("collection produced non-finite observations or an empty replay")
    return out


def bench_policy(split: Any, episodes: int, args: argparse.Namespace) -> float:
    """The trainer's whole GPU collection timestep (:class:`foxhunt_core.collector.DeviceCollector`):
    the network's forward and Q pipeline on every episode (the stages of ``--flags``, if given),
    Boltzmann draw, environment step and replay add, replayed from its captured graph;
    environment steps per second."""
    import cupy as cp

    from foxhunt_core import backend
    from foxhunt_core.agent import Agent
    from foxhunt_core.collector import DeviceCollector
    from foxhunt_core.config import RunSettings
    from foxhunt_core.plugins import PluginSet

    settings = RunSettings.model_validate({"env": {"num_envs": episodes},
                                           "train": {"replay_capacity": max(args.replay_capacity, episodes)}})
    backend.select("cuda", settings.train.tf32)  # GEMM precision as the trainer sets it (TF32)
    plugins, options = args.stages if args.stages is not None else (PluginSet(), {})
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        agent = Agent(settings, plugins, cp, np.random.default_rng(0), options=options)
        col = DeviceCollector(agent, split, settings, seed=4)
        col.stream = stream
        col.collect(random=True)
        col.collect()  # captures the graph
        rate = _gpu_rate(cp, stream, col.collect, 1, episodes, args.calls, args.repeats)
        col.env.check()
    return rate


def bench_cpu(split: Any, episodes: int, args: argparse.Namespace) -> dict[str, float]:
    from foxhunt_core.config import EnvSettings
    from foxhunt_core.env import TradingEnv
    from foxhunt_core.explore import boltzmann_select
    from foxhunt_core.market.schema import STATE_DIM
    from foxhunt_core.replay import ReplayBuffer

    rng = np.random.default_rng(0)
    env = TradingEnv(split, EnvSettings(), np.random.default_rng(1), num_envs=episodes)
    obs, _ = env.reset()
    actions = rng.integers(0, 3, size=(episodes, 4))
    q = rng.normal(size=(episodes, OFFSETS[-1])).astype(np.float32)
    temps = np.full(len(OFFSETS) - 1, 0.5)
    replay = ReplayBuffer(max(args.replay_capacity, episodes), STATE_DIM, len(OFFSETS) - 1)

    def collect() -> None:
        nonlocal obs
        a = boltzmann_select(q, OFFSETS, temps, rng.random((episodes, len(OFFSETS) - 1)))
        nxt, reward, term, _, info = env.step(a)
        replay.add(obs, a, reward, info["final_obs"], term.astype(np.float32))
        obs = nxt

    out: dict[str, float] = {"episodes": episodes}
    for key, fn in (("env_eager", lambda: env.step(actions)), ("collect_eager", collect)):
        rates = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(args.cpu_calls):
                fn()
            rates.append(episodes * args.cpu_calls / (time.perf_counter() - t0))
        out[key] = statistics.median(rates)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--cpu-episodes", type=int, default=4096)
    p.add_argument("--bars", type=int, default=60_000, help="bars of the synthetic market")
    p.add_argument("--unroll", type=int, default=8, help="timesteps per captured graph")
    p.add_argument("--calls", type=int, default=50, help="graph launches per timing")
    p.add_argument("--cpu-calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--replay-capacity", type=int, default=1 << 20)
    p.add_argument("--flags", default=None, help="flag file whose stages the policy timestep runs (default: stage 0)")
    p.add_argument("--json", default=None, help="write the results here too")
    args = p.parse_args()
    args.stages = None
    if args.flags is not None:  # a bad flag file stops here, before any GPU work, with its problems
        from foxhunt_core.flags import FlagError, load_flags
        from foxhunt_core.plugins import PluginError

        try:
            f = load_flags(args.flags)
            args.stages = (f.registry.plugin_set(f.enabled), f.option_models)
        except (FlagError, PluginError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    from foxhunt_core.config import MarketSettings
    from foxhunt_core.market.splits import synthetic_splits

    split = synthetic_splits(MarketSettings(bars=args.bars, seed=7)).train
    rows: list[dict[str, Any]] = []
    try:
        import cupy as cp

        device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
        for n in args.episodes:
            row = {"device": device, **bench_gpu(split, n, args)}
            row["collect_policy_graph"] = bench_policy(split, n, args)
            rows.append(row)
    except ImportError:
        print("CuPy is not installed: GPU rows skipped")
    rows.append({"device": "cpu (NumPy)", **bench_cpu(split, args.cpu_episodes, args)})

    print(f"\nenvironment steps per second, millions (median of {args.repeats}; "
          f"graphs hold {args.unroll} timesteps; {len(split)} bars; policy stages: {args.flags or 'stage 0'})")
    cols = ("env_eager", "env_graph", "collect_eager", "collect_graph", "collect_policy_graph")
    print(f"{'device':<24}{'episodes':>10}" + "".join(f"{c:>22}" for c in cols) + f"{'us/timestep':>13}")
    for r in rows:
        cells = "".join(f"{r[c] / 1e6:>22.2f}" if c in r else f"{'-':>22}" for c in cols)
        best = r.get("collect_graph", r.get("collect_eager"))
        print(f"{r['device'][:23]:<24}{r['episodes']:>10}" + cells + f"{1e6 * r['episodes'] / best:>13.1f}")
    big = [r for r in rows if r["episodes"] == 65536 and "collect_policy_graph" in r]
    if big:  # judged on the trainer's whole timestep, the policy forward included
        rate = big[0]["collect_policy_graph"]
        verdict = "met" if rate >= TARGET else "NOT met"
        print(f"target >= {TARGET / 1e6:.0f} M env steps/s at 65536 episodes (the trainer's "
              f"timestep, policy forward included): {verdict} ({rate / 1e6:.1f} M)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
