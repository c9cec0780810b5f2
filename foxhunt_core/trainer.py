"""The training run: collection, updates, Q-statistics, checkpoints, evaluation.

A run directory holds::

    run.json          settings, flag file text and hash, plugin set (written at start)
    checkpoint.safetensors   the latest checkpoint (atomic, hashed), every train.checkpoint_every
                      updates and every train.checkpoint_minutes; see foxhunt_core.checkpoint
    metrics.json      Q-statistics and training scalars every stats interval (atomic)
    log.jsonl         structlog JSON event log
    eval.json         evaluation table on the held-out (test) split (atomic), for the parameters
                      selected on the validation split (foxhunt_core.selection)
    events.out.tfevents.*  TensorBoard event files (foxhunt_core.tboard; train.tensorboard)
    .foxhunt.lock     the flock of the process writing the directory (foxhunt_core.runlock)
    gpu_plan.json     on the GPU: the execution plan of the update, every kernel choice and why
                      (foxhunt_core.net.fused.record; `foxhunt train --explain` prints the same)
    gemm_tuning.json  on the GPU with train.gemm_autotune: the GEMM algorithms chosen (atomic,
                      beside each checkpoint); a run started in this directory again (resume)
                      reads it back before its first GEMM, so it repeats the same algorithms.
                      A fresh run starts from the machine's cache instead (foxhunt_core.gpu.
                      tuning_cache), and adds its choices to it beside each checkpoint.

Collection runs on the CPU environment (:class:`~foxhunt_core.collector.HostCollector`) or, on
a GPU, entirely on the device (:class:`~foxhunt_core.collector.DeviceCollector`); on a GPU the
update is a CUDA-graph replay (:mod:`foxhunt_core.graphs`) on the same stream.

Randomness on the CPU comes from four generators spawned from the run seed (initialisation,
environment, replay sampling, exploration); all their states are in the checkpoint, so a run
trained in pieces with ``resume`` ends with exactly the parameters of an uninterrupted run
(``tests/test_trainer.py``). On the GPU the draws come from Philox streams whose counters are
checkpointed likewise.

Exploration temperatures ``tau_t * liquid_mod[d]`` and ``iqn_readiness`` are pushed to the
collector once per stats interval (on the GPU they are device scalars read by the captured step),
so ``tau_t``'s linear annealing proceeds in steps of ``stats_every`` updates.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, backend, checkpoint_meta
from .agent import Agent, tree_copy
from .baselines import FittedBaselines, fit_baselines
from .checkpoint import (
    CheckpointError,
    atomic_write_text,
    flatten,
    load_checkpoint,
    save_checkpoint,
    unflatten,
)
from .collector import DeviceCollector, HostCollector
from .config import RunSettings
from .edge import edge_bounds
from .evaluate import baseline_policies, pnl_metrics, walk
from .explore import LiquidTau, annealed_tau, iqn_readiness
from .hookspecs import RunContext
from .logs import RunLog, Stopwatch, jsonable
from .market.source import check_fingerprint, load_market
from .net.network import split_widened_rows
from .plugins import PluginSet
from .qpipe import branch_argmax
from .selection import Selection
from .signals import Signals
from .tboard import Board

CHECKPOINT = "checkpoint.safetensors"
GEMM_TUNING = "gemm_tuning.json"
EVAL_COLUMNS = ("total_return", "sharpe", "volatility", "max_drawdown", "turnover")
GPU_PLAN = "gpu_plan.json"


class Trainer:
    """One run: build everything from settings and a plugin set, then ``train`` / ``evaluate``."""

    def __init__(
        self,
        settings: RunSettings,
        plugins: PluginSet | None = None,
        out_dir: Path | str | None = None,
        flags_text: str = "",
        flags_sha256: str = "",
        options: dict[str, Any] | None = None,
        console: bool = False,
    ) -> None:
        self.settings = settings
        self.plugins = plugins or PluginSet()
        self.options = options or {}
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.flags_text, self.flags_sha256 = flags_text, flags_sha256
        self.source = load_market(settings)  # bars, splits, interval, costs; read before anything is written
        self.xp, self.device = backend.select(settings.device, settings.train.tf32, settings.train.gemm_autotune)
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.log = RunLog(self.out_dir / "log.jsonl" if self.out_dir else None, console=console)
        self._load_gemm_tuning()

        ss = np.random.SeedSequence(settings.seed)
        g_init, g_env, g_replay, g_explore = (np.random.Generator(np.random.PCG64(s)) for s in ss.spawn(4))

        self.market, self.splits = self.source.data, self.source.splits
        acting = settings.model_copy(update={"env": self.source.env})  # with the market's costs
        self.agent = Agent(settings, self.plugins, self.xp, g_init, options=self.options)
        self._record_plan()
        nb = self.agent.num_branches
        t = settings.train
        sel = settings.select
        self.selection = Selection(sel.every if len(self.splits.val) >= 2 else 0, sel.fallback,
                                   sel.edge_test, sel.confidence)
        self._reference_pnl: dict[str, np.ndarray] | None = None  # the edge test's, on validation
        self.board = Board(self.out_dir, t.tensorboard)
        self._baselines: FittedBaselines | None = None
        self.stream: Any = None
        if self.device == "cuda" and t.gpu_collection:
            import cupy

            self.stream = cupy.cuda.Stream(non_blocking=True)  # collection and updates, in order
            with self.stream:
                self.collector: Any = DeviceCollector(self.agent, self.splits.train, acting, settings.seed,
                                                      use_graph=t.cuda_graphs)
            self.collector.stream = self.stream
        else:
            self.collector = HostCollector(self.agent, self.splits.train, acting,
                                           {"env": g_env, "replay": g_replay, "explore": g_explore})
        self.liquid = LiquidTau(nb, t.liquid_init, t.liquid_tau_min, t.liquid_tau_max, t.liquid_dt)
        self.ctx = RunContext(
            step=0, total_steps=t.steps, iqn_readiness=0.0,
            base_entropy_coeff=t.entropy_coeff, entropy_coeff=t.entropy_coeff, options=self.options,
            signals=Signals.of_plugins((p.name, p.manifest) for p in self.plugins.plugins),
        )
        self.step = 0
        self.first_raw_q_mean: float | None = None
        self.history: list[dict[str, float]] = []
        self.train_seconds = 0.0
        self.steady_updates_per_second: float | None = None  # of the last train() call (see there)
        self.graphed: Any = None
        self._clock: Stopwatch | None = None  # while train() runs

    def _record_plan(self) -> None:
        """The GPU step's execution plan into the run directory, and each plugin stage on its slow
        path said once in the log."""
        plan = self.agent.plan
        if plan is None:
            return
        from .net.fused.record import to_dict

        if self.out_dir is not None:
            atomic_write_text(self.out_dir / GPU_PLAN, json.dumps(jsonable(to_dict(plan)), indent=1))
        for st in plan.stages:
            if st.path == "slow":
                self.log.event("slow_path", hook=st.hook, stage=st.name, why=st.why)

    @property
    def env_steps(self) -> int:
        return self.collector.env_steps

    @property
    def replay(self) -> Any:
        return self.collector.replay

    # ------------------------------------------------------------------ acting
    def _exploration(self) -> None:
        """Push this interval's temperatures ``tau_t * liquid_mod[d]`` and iqn_readiness to the
        collector (once per stats interval: on the GPU they are device scalars)."""
        t = self.settings.train
        # the schedules are read at the last interval's boundary, so that a run resumed between two
        # boundaries explores as the uninterrupted run did since that boundary
        at = self.step - self.step % t.stats_every
        tau = annealed_tau(at, t.steps, t.tau, t.tau_min, t.tau_decay_fraction)
        self.collector.set_exploration(tau * self.liquid.mod, iqn_readiness(at, t.steps, t.iqn_ramp_fraction))

    def _act(self, obs: np.ndarray, params: Any = None) -> np.ndarray:
        """Greedy actions for observations on the host (evaluation), of ``params`` (default: online)."""
        xp = self.xp
        values = self.agent.act_values(xp.asarray(obs, dtype=xp.float32), 1.0, params, evaluation=True)
        return backend.to_numpy(branch_argmax(values, self.agent.offsets))

    # ------------------------------------------------------------------ training
    def train(self, until_step: int | None = None, progress: Callable[[int, int], None] | None = None) -> None:
        """Train until ``until_step`` updates (default: ``train.steps``), checkpointing on the way.

        ``train_seconds`` adds this call's wall time (the replay's warm-up collection and the first
        update's one-off work included); ``steady_updates_per_second`` is this call's rate after
        its first update: on the GPU that update captures the CUDA graph, compiles the update's
        kernels and times the GEMM candidates, seconds that would otherwise dominate a short run."""
        t = self.settings.train
        until = t.steps if until_step is None else min(int(until_step), t.steps)
        clock = Stopwatch()
        self._clock, last_save = clock, 0.0
        start_step = self.step
        steady_from: tuple[float, int] | None = None  # (clock, step) once the first update is done
        select_s = 0.0
        with self.stream if self.stream is not None else contextlib.nullcontext():
            while len(self.replay) < min(t.warmup_steps, t.replay_capacity):
                self.collector.collect(random=True)
            self.log.event("train_start", step=self.step, until=until, device=self.device,
                           plugins=self.plugins.names)
            self._exploration()
            while self.step < until:
                for _ in range(t.collect_per_update):
                    self.collector.collect()
                scalars, out, q = self._update()
                self.step += 1
                if steady_from is None:
                    self._synchronize()
                    steady_from = (clock.seconds(), self.step)
                if self.step % t.target_sync_every == 0:
                    self.agent.sync_target()
                if self.step % t.stats_every == 0:
                    self._interval(scalars, self.agent.statistics(out, q))
                    self._exploration()
                if self.selection.due(self.step):
                    select_s += self._select()
                due = t.checkpoint_minutes > 0 and clock.seconds() - last_save >= 60.0 * t.checkpoint_minutes
                if (self.step % t.checkpoint_every == 0 or due) and self.step < until:
                    self.save()
                    last_save = clock.seconds()
                if progress is not None:
                    progress(self.step, until)
            if self.selection.active and self.step > start_step and not self.selection.due(self.step):
                select_s += self._select()  # the final parameters are candidates too
            self._synchronize()
        seconds = clock.seconds() - select_s  # training time: validation evaluations left out
        self.train_seconds += seconds
        self._clock = None
        done = self.step - start_step
        steady = self.step - steady_from[1] if steady_from is not None else 0
        self.steady_updates_per_second = (steady / (seconds - steady_from[0])
                                          if steady_from is not None and steady and seconds > steady_from[0] else None)
        self.log.event("train_end", step=self.step, updates=done, seconds=round(seconds, 3),
                       steady_updates_per_second=self.steady_updates_per_second)
        self.save()

    def _synchronize(self) -> None:
        """Wait for the device's queued work (nothing to wait for on the CPU)."""
        if self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()

    def _update(self) -> tuple[dict[str, Any], Any, Any]:
        """One gradient step: a CUDA-graph replay on the GPU, eager otherwise."""
        t = self.settings.train
        if self.device == "cuda" and t.cuda_graphs:
            if self.graphed is None:
                from .graphs import GraphedUpdate

                device_replay = isinstance(self.collector, DeviceCollector)
                sampler = (lambda: self.collector.sample(t.batch_size)) if device_replay else None
                self.graphed = GraphedUpdate(self.agent, t.batch_size, stream=self.stream, sampler=sampler)
                self.log.event("graph_captured", what="update", batch_size=t.batch_size)
            if self.graphed.sampler is None:
                self.graphed.load_batch(self.collector.sample(t.batch_size))
            return self.graphed.replay(self.ctx.entropy_coeff)
        return self.agent.update(self.collector.sample(t.batch_size), self.ctx.entropy_coeff)

    def _interval(self, scalars: dict[str, Any], stats: dict[str, float]) -> None:
        """Once per stats interval: record, hooks, liquid tau, entropy coefficient."""
        t = self.settings.train
        record = {"step": self.step, **{k: float(backend.to_numpy(v)) for k, v in scalars.items()}, **stats}
        if self.first_raw_q_mean is None:
            self.first_raw_q_mean = stats["raw_q_mean"]
        record["raw_q_drift"] = stats["raw_q_mean"] - self.first_raw_q_mean
        record["env_steps"] = self.env_steps
        ctx = self.ctx
        ctx.step, ctx.last_stats = self.step, record
        ctx.iqn_readiness = iqn_readiness(self.step, t.steps, t.iqn_ramp_fraction)
        self.plugins.broadcast("q_stats", ctx=ctx, record=record)

        gaps = np.array([stats[f"q_gap_{d}"] for d in range(self.agent.num_branches)])
        tau_d = self.liquid.time_constants(gaps, float(np.sqrt(max(stats["q_var"], 0.0))))
        new = self.plugins.first("tau_update", ctx=ctx, mod=self.liquid.mod.copy(), tau=tau_d, dt=self.liquid.dt)
        if new is None:
            from .explore import liquid_exact_step

            new = liquid_exact_step(self.liquid.mod, tau_d, self.liquid.dt)
        self.liquid.mod = np.clip(np.asarray(new, dtype=np.float64), 0.1, 2.0)

        coeff = self.plugins.first("entropy_coefficient", ctx=ctx, base=t.entropy_coeff)
        ctx.entropy_coeff = float(t.entropy_coeff if coeff is None else coeff)
        record["entropy_coeff"] = ctx.entropy_coeff
        record["liquid_mod"] = self.liquid.mod.tolist()
        record["iqn_readiness"] = ctx.iqn_readiness
        ctx.signals.write_into(record)
        self.history.append(record)
        self.board.stats(record)
        self.log.event("q_stats", **record)
        if not np.isfinite([v for v in record.values() if isinstance(v, float)]).all():
            self.log.event("non_finite", step=self.step)

    # ------------------------------------------------------------------ evaluation
    def policy(self) -> Callable[[np.ndarray], np.ndarray]:
        """The deployed policy: the parameters selected on validation (foxhunt_core.selection),
        flat when selection found no edge and ``select.fallback`` is flat, else the last ones."""
        if self.selection.deploys_flat:
            return baseline_policies(np.random.default_rng(0))["flat"]
        best = self.selection.params
        return self._act if best is None else (lambda obs: self._act(obs, best))

    def _walk(self, data: Any, pol: Callable) -> tuple[np.ndarray, np.ndarray]:
        return walk(data, self.source.env, pol, np.random.default_rng(self.settings.seed + 2))

    def _evaluate_policy(self, data: Any, pol: Callable) -> dict[str, float]:
        res = pnl_metrics(*self._walk(data, pol), periods_per_year=self.source.interval.bars_per_year)
        return {k: float(v) for k, v in res.items()}

    def _edge_bounds(self, pnl: np.ndarray) -> dict[str, float] | None:
        """The bootstrap lower bounds of a validation PnL series over the edge test's reference
        policies (their validation PnL walked once), or None when the test is off."""
        sel = self.settings.select
        if sel.edge_test != "bootstrap":
            return None
        if self._reference_pnl is None:
            pols = {**baseline_policies(np.random.default_rng(0)), **self.baselines().policies}
            self._reference_pnl = {name: self._walk(self.splits.val, pols[name])[0] for name in sel.edge_over}
        return edge_bounds(pnl, self._reference_pnl, sel.confidence, sel.block_bars)

    def _select(self) -> float:
        """Evaluate the current parameters on the validation split; keep them when best.
        Returns the seconds it took (they do not count as training time)."""
        clock = Stopwatch()
        pnl, turnover = self._walk(self.splits.val, self._act)
        metrics = {k: float(v) for k, v in pnl_metrics(pnl, turnover,
                                                       periods_per_year=self.source.interval.bars_per_year).items()}
        kept = self.selection.offer(self.step, metrics, lambda: tree_copy(self.agent.online),
                                    self._edge_bounds(pnl))
        self.board.evaluation("val", {"policy": metrics}, self.step)
        self.log.event("selection", step=self.step, val_return=metrics["total_return"], kept=kept)
        return clock.seconds()

    def baselines(self) -> FittedBaselines:
        """``linear`` (fitted on train) and ``momentum`` (lookback chosen on validation), once."""
        if self._baselines is None:
            s = self.splits
            self._baselines = fit_baselines(s.train, s.val, self.source.env, s.scaler, self.settings.seed + 2)
        return self._baselines

    def evaluate(self, split: str = "test") -> dict[str, dict[str, float]]:
        """The deployed policy and the baselines on a split (fresh, seeded RNG per policy)."""
        data = getattr(self.splits, split)
        pols: dict[str, Callable] = {"policy": self.policy()}
        pols.update(baseline_policies(np.random.default_rng(self.settings.seed + 1)))
        pols.update(self.baselines().policies)
        table = {name: self._evaluate_policy(data, pol) for name, pol in pols.items()}
        self.board.evaluation(split, table, self.step)
        return table

    def evaluation_notes(self) -> dict[str, Any]:
        """What an evaluation table needs beside its rows: market, interval, costs, selection."""
        return {"market": self.source.describe(), "interval": self.source.interval.to_dict(),
                "costs": self.source.costs, "selection": self.selection.report(),
                "baselines": self.baselines().info()}

    # ------------------------------------------------------------------ checkpoints
    def _meta(self) -> dict[str, Any]:
        return {
            "foxhunt_version": __version__,
            "settings": self.settings.model_dump(mode="json"),
            "flags_text": self.flags_text,
            "flags_sha256": self.flags_sha256,
            "plugins": self.plugins.names,
            "step": self.step,
            "adam_t": self.agent.opt.t,
            "liquid": self.liquid.state(),
            "ctx": {"entropy_coeff": self.ctx.entropy_coeff, "stash": self.ctx.stash,
                    "signals": self.ctx.signals.snapshot()},
            "first_raw_q_mean": self.first_raw_q_mean,
            # this train() call's time so far included, so that a resumed run's rate is right
            "train_seconds": self.train_seconds + (self._clock.seconds() if self._clock is not None else 0.0),
            "history_records": len(self.history),
            "selection": self.selection.state(),
            "market_fingerprint": self.source.fingerprint,
        }

    def save(self) -> Path | None:
        if self.out_dir is None:
            return None
        meta = self._meta()
        arrays, meta["collector"] = self.collector.state()
        tensors = dict(arrays)
        tensors.update(flatten("online", self.agent.online))
        tensors.update(flatten("target", self.agent.target))
        tensors.update(flatten("adam.m", self.agent.opt.m))
        tensors.update(flatten("adam.v", self.agent.opt.v))
        if self.selection.params is not None:
            tensors.update(flatten("best", self.selection.params))
        path = self.out_dir / CHECKPOINT
        # the history first: a crash between the two writes leaves records the checkpoint does not
        # count yet (load drops them), never a checkpoint whose history is missing
        atomic_write_text(self.out_dir / "metrics.json", json.dumps(jsonable(self.history), indent=1))
        save_checkpoint(path, tensors, jsonable(meta))
        if self._tuned_gemms():
            from .gpu import cublaslt

            record = cublaslt.tuning_record()
            atomic_write_text(self.out_dir / GEMM_TUNING, json.dumps(record, indent=1))
            self._add_to_gemm_cache(record)
        self.log.event("checkpoint", step=self.step, path=str(path))
        return path

    def _gemm_cache_file(self) -> Path | None:
        from .gpu import cublaslt, tuning_cache

        root = tuning_cache.cache_dir()
        return tuning_cache.cache_file(root, cublaslt.device_tag()) if root is not None else None

    def _add_to_gemm_cache(self, record: dict[str, Any]) -> None:
        """Merge this run's GEMM choices into the machine's cache (a failure to write is logged:
        the cache only saves time)."""
        from .gpu import tuning_cache

        path = self._gemm_cache_file()
        if path is None or not record["plans"]:
            return
        try:
            n = tuning_cache.add(path, record)
        except OSError as exc:
            self.log.event("gemm_cache_not_written", path=str(path), problem=str(exc))
            return
        self.log.event("gemm_cache_written", path=str(path), plans=n)

    def _tuned_gemms(self) -> bool:
        return self.device == "cuda" and self.settings.train.gemm_autotune

    def _load_gemm_tuning(self) -> None:
        """Read the run directory's GEMM tuning record, when there is one (a resumed run), else the
        machine's cache, before anything runs a GEMM; a record for another GPU or cuBLASLt is set
        aside (the log says so), an unreadable cache too (an unreadable run record is an error)."""
        if not self._tuned_gemms():
            return
        path = self.out_dir / GEMM_TUNING if self.out_dir is not None else None
        if path is None or not path.is_file():
            self._load_gemm_cache()
            return
        from .gpu import cublaslt

        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: unreadable GEMM tuning record ({exc})") from None
        try:
            taken = cublaslt.load_tuning_record(record, str(path))
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        self.log.event("gemm_tuning_loaded" if taken else "gemm_tuning_skipped", path=str(path),
                       recorded_for=record.get("device"))

    def _load_gemm_cache(self) -> None:
        from .gpu import cublaslt, tuning_cache

        path = self._gemm_cache_file()
        if path is None or not path.is_file():
            return
        try:
            record = tuning_cache.read(path)
        except ValueError as exc:
            self.log.event("gemm_cache_unreadable", path=str(path), problem=str(exc))
            return
        taken = cublaslt.load_tuning_record(record, str(path))
        self.log.event("gemm_tuning_loaded" if taken else "gemm_tuning_skipped", path=str(path), source="machine cache",
                       plans=len(record["plans"]), recorded_for=record["device"])

    def load(self, path: Path, history: bool = True) -> None:
        """Restore everything from a checkpoint written by a run with the same settings (and, with
        ``history``, its training history, which must then be in the run directory's metrics.json)."""
        tensors, meta = load_checkpoint(path)
        tensors = split_widened_rows(tensors, self.agent.net)  # (checkpoints written before the split)
        checkpoint_meta.check_meta(meta, path)
        if _without_steps(meta["settings"]) != _without_steps(self.settings.model_dump(mode="json")):
            raise CheckpointError(f"{path}: settings in the checkpoint differ from this run's")
        if meta["plugins"] != self.plugins.names:
            raise CheckpointError(f"{path}: checkpoint plugins {meta['plugins']} differ from {self.plugins.names}")
        self._check_layout(tensors, meta, path)
        try:
            check_fingerprint(meta.get("market_fingerprint"), self.settings, str(path))
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        for prefix, tree in (("online", self.agent.online), ("target", self.agent.target),
                             ("adam.m", self.agent.opt.m), ("adam.v", self.agent.opt.v)):
            saved = unflatten(prefix, tensors)
            for o, sub in tree.items():
                for k, v in sub.items():
                    if o not in saved or k not in saved[o] or saved[o][k].shape != tuple(v.shape):
                        raise CheckpointError(f"{path}: tensor {prefix}/{o}/{k} is missing or misshapen")
                    v[...] = self.xp.asarray(saved[o][k])
        self.agent.opt.load_state(self.agent.opt.m, self.agent.opt.v, int(meta["adam_t"]))
        try:
            self.collector.load(tensors, meta["collector"])
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"{path}: collector state: {exc}") from None
        self.liquid.load(meta["liquid"])
        self.ctx.entropy_coeff = float(meta["ctx"]["entropy_coeff"])
        self.ctx.stash = meta["ctx"]["stash"]
        try:
            self.ctx.signals.load(meta["ctx"].get("signals", {}), str(path))
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        self.step = int(meta["step"])
        self.first_raw_q_mean = meta["first_raw_q_mean"]
        self.train_seconds = float(meta["train_seconds"])
        self.history = checkpoint_meta.read_history(path.parent, self.step, meta["history_records"], path, history)
        best = unflatten("best", tensors)
        self.selection.load(meta.get("selection"), {o: {k: self.xp.asarray(v) for k, v in sub.items()}
                                                    for o, sub in best.items()} if best else None)
        self.log.event("resumed", step=self.step, path=str(path))

    def _check_layout(self, tensors: dict[str, np.ndarray], meta: dict[str, Any], path: Path) -> None:
        """The checkpoint's tensors are exactly the ones this run saves (see checkpoint_meta)."""
        expected, _ = self.collector.state()
        expected = dict(expected)
        for prefix, tree in (("online", self.agent.online), ("target", self.agent.target),
                             ("adam.m", self.agent.opt.m), ("adam.v", self.agent.opt.v)):
            expected.update(flatten(prefix, tree))
        if any(k.startswith("best/") for k in tensors):  # the parameters selected on validation
            expected.update(flatten("best", self.agent.online))
        size = meta["collector"].get("replay", {}).get("size") if isinstance(meta["collector"], dict) else None
        if not isinstance(size, int) or not 0 <= size <= self.settings.train.replay_capacity:
            raise CheckpointError(f"{path}: metadata: collector.replay.size {size!r} is not a fill level of a "
                                  f"replay of {self.settings.train.replay_capacity}")
        checkpoint_meta.check_tensor_layout(tensors, expected, size, path)


def _without_steps(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as compared on load: through the schema (a setting added since the checkpoint was
    written compares at its default), without the step total (it may grow when a run is
    extended)."""
    try:
        out = RunSettings.model_validate(settings).model_dump(mode="json")
    except ValueError:  # not valid settings: compared as they are, so they differ
        out = json.loads(json.dumps(settings))
    out.get("train", {}).pop("steps", None)
    return out
