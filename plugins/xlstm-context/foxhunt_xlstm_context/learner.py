"""The online learner: normalizer, stabilized mLSTM cell, prediction head and their own Adam.

Every Q-statistics record is one reading of the 11 statistics of :data:`INPUT_KEYS`. A reading
with a NaN or infinite value (or a missing key) is skipped and counted, nothing else changes.
A finite reading ``x_t``:

1. is normalized online (:mod:`.normalizer`) to ``z_t``;
2. trains the cell (self-supervised): from the previous step (its forward from ``z_{t-1}`` and
   the state before it, under the current weights: kept from step 3 of the last reading, or
   recomputed after a restore, which gives the same floats) the head predicts the change
   ``z_t - z_{t-1}``, and one Adam step (its own optimizer, gradient norm clipped) follows the
   gradient of ``0.5 * mean((y - (z_t - z_{t-1}))^2)``, truncated at the previous state
   (:func:`.cell.step_backward`). The learner also tracks (EMA) that loss beside the losses of
   two fixed forecasts, "no change" (``z_t = z_{t-1}``) and "the running mean" (``z_t = 0``);
3. advances the memory with ``z_t`` and the updated weights: the new context ``h_t``.

``context_norm = |h_t|`` and ``context_divergence = |h_t - h_{t-1}|`` (L2) are what the plugin
publishes. Everything (weights, Adam moments and step, memory, the state before it, the last
input, normalizer, counters) is in :meth:`ContextLearner.state_dict`, a JSON-able dict whose
round trip is exact, so a run resumed from a checkpoint continues bit-identically.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from foxhunt_core.optim import Adam

from .cell import Cache, Layout, State, init_params, predict, prediction_loss, step, step_backward
from .normalizer import OnlineNormalizer
from .options import XlstmContextOptions

INPUT_KEYS: tuple[str, ...] = (
    "avg_max_q", "q_min", "q_max", "q_mean", "q_var", "atom_entropy", "atom_utilization",
    "q_gap_0", "q_gap_1", "q_gap_2", "q_gap_3",
)
"""The Q-statistics the cell reads, in the plan's order (foxhunt_core.qpipe.q_statistics)."""

LOSS_EMA_RATE = 0.05
STATE_VERSION = 1


class ContextLearner:
    """The cell, its head and optimizer, the normalizer and the counters of one run."""

    def __init__(self, opts: XlstmContextOptions) -> None:
        self.opts = opts
        self.layout = Layout(len(INPUT_KEYS), opts.context_dim)
        d = opts.context_dim
        self.theta = init_params(self.layout, np.random.default_rng(opts.init_seed), opts.forget_bias)
        self.params = self.layout.views(self.theta)
        self.adam = Adam({"cell": {"theta": self.theta}}, opts.learning_rate, clip_norm=opts.clip_norm)
        self.normalizer = OnlineNormalizer(self.layout.inputs, opts.normalizer_rate, opts.input_clip, opts.z_clip)
        self.state = State.zeros(d)
        self.before = State.zeros(d)  # the state the last step started from (the backward's input)
        self.z_last: np.ndarray | None = None
        self.context = np.zeros(d)
        self.divergence = 0.0
        self.readings = self.skipped = self.updates = self.unfinished_updates = 0
        self.loss: float | None = None
        self.loss_ema: dict[str, float | None] = {"model": None, "mean": None, "last": None}
        self._cache: Cache | None = None  # the last step's forward: what the next update recomputes

    # ------------------------------------------------------------------ one reading
    @property
    def context_norm(self) -> float:
        return float(np.sqrt(self.context @ self.context))

    def observe(self, reading: Sequence[float]) -> bool:
        """Take one reading; ``False`` when it was skipped (not finite, or the wrong width)."""
        x = np.asarray(reading, dtype=np.float64)
        if x.shape != (self.layout.inputs,) or not np.isfinite(x).all():
            self.skipped += 1
            self.divergence = 0.0
            return False
        self.readings += 1
        z = self.normalizer.update(x)
        if self.z_last is not None:
            self._train(self.z_last, z)
        h, new, self._cache = step(self.params, z, self.state)
        self.before, self.state = self.state, new
        self.divergence = float(np.sqrt((h - self.context) @ (h - self.context)))
        self.context, self.z_last = h, z
        return True

    def _train(self, z_last: np.ndarray, target: np.ndarray) -> None:
        """One Adam step on predicting ``target`` (this reading) from the context of ``z_last``."""
        g_flat = np.zeros_like(self.theta)
        grads = self.layout.views(g_flat)
        change = target - z_last
        cache = self._cache
        if cache is None:  # restored from a state dict: the same inputs and weights give the same floats
            _, _, cache = step(self.params, z_last, self.before)
        loss, dh = prediction_loss(self.params, cache.h, change, grads)
        step_backward(self.params, cache, dh, grads)
        self._track("mean", 0.5 * float(target @ target) / target.size)  # forecast: the running mean
        self._track("last", 0.5 * float(change @ change) / change.size)  # forecast: no change
        if not (math.isfinite(loss) and np.isfinite(g_flat).all()):
            self.unfinished_updates += 1  # never seen; kept so that a bad step cannot poison the weights
            return
        self.adam.step({"cell": {"theta": self.theta}}, {"cell": {"theta": g_flat}})
        self.updates += 1
        self.loss = loss
        self._track("model", loss)

    def _track(self, key: str, value: float) -> None:
        old = self.loss_ema[key]
        self.loss_ema[key] = value if old is None else (1.0 - LOSS_EMA_RATE) * old + LOSS_EMA_RATE * value

    def prediction(self) -> np.ndarray:
        """The head's estimate of the next normalized reading, from the current context."""
        last = self.z_last if self.z_last is not None else np.zeros(self.layout.inputs)
        return last + predict(self.params, self.context)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything the learner holds, as JSON-able values (exact round trip)."""
        return {
            "version": STATE_VERSION,
            "theta": self.theta.tolist(),
            "adam_m": self.adam.m["cell"]["theta"].tolist(),
            "adam_v": self.adam.v["cell"]["theta"].tolist(),
            "adam_t": self.adam.t,
            "memory": _state_json(self.state),
            "before": _state_json(self.before),
            "z_last": None if self.z_last is None else self.z_last.tolist(),
            "context": self.context.tolist(),
            "divergence": self.divergence,
            "normalizer": self.normalizer.state(),
            "readings": self.readings, "skipped": self.skipped, "updates": self.updates,
            "unfinished_updates": self.unfinished_updates,
            "loss": self.loss, "loss_ema": dict(self.loss_ema),
        }

    @classmethod
    def from_state(cls, opts: XlstmContextOptions, s: Mapping[str, Any]) -> ContextLearner:
        """The learner a :meth:`state_dict` describes; ``ValueError`` names what does not fit."""
        out = cls(opts)
        if s.get("version") != STATE_VERSION:
            raise ValueError(f"xlstm_context state version {s.get('version')!r}, this plugin reads {STATE_VERSION}")
        d, size = opts.context_dim, out.layout.size
        out.theta[...] = _array(s["theta"], (size,), "theta")
        out.adam.m["cell"]["theta"][...] = _array(s["adam_m"], (size,), "adam_m")
        out.adam.v["cell"]["theta"][...] = _array(s["adam_v"], (size,), "adam_v")
        out.adam.t = int(s["adam_t"])
        out.state, out.before = _state_from(s["memory"], d, "memory"), _state_from(s["before"], d, "before")
        out.z_last = None if s["z_last"] is None else _array(s["z_last"], (out.layout.inputs,), "z_last")
        out.context = _array(s["context"], (d,), "context")
        out.divergence = float(s["divergence"])
        for key in ("mean", "var"):
            _array(s["normalizer"][key], (out.layout.inputs,), f"normalizer.{key}")
        out.normalizer.load(s["normalizer"])
        out.readings, out.skipped = int(s["readings"]), int(s["skipped"])
        out.updates, out.unfinished_updates = int(s["updates"]), int(s["unfinished_updates"])
        out.loss = None if s["loss"] is None else float(s["loss"])
        out.loss_ema = {k: (None if s["loss_ema"][k] is None else float(s["loss_ema"][k])) for k in out.loss_ema}
        return out


def _array(values: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.shape != shape:
        raise ValueError(f"xlstm_context state: {what} has shape {a.shape}, expected {shape} "
                         "(were the options changed since the checkpoint?)")
    return a


def _state_json(s: State) -> dict[str, Any]:
    return {"c": s.c.ravel().tolist(), "n": s.n.tolist(), "m": s.m}


def _state_from(j: Mapping[str, Any], d: int, what: str) -> State:
    return State(_array(j["c"], (d * d,), f"{what}.c").reshape(d, d), _array(j["n"], (d,), f"{what}.n"),
                 float(j["m"]))
