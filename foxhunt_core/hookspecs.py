"""Every hook of foxhunt, typed and documented, in one place (pluggy project ``"foxhunt"``).

Two kinds of hooks:

* **hot-path hooks** (``pre_attention``, ``post_attention``, ``gate_activation``,
  ``action_select``, ``branch_inputs``) are called once, when the engine *builds* its step for a
  flag set, and return stage objects (:mod:`foxhunt_core.stages`). The step runs those objects
  directly; nothing is dispatched per step, so the step can be captured as a CUDA graph.
  Where several plugins answer, the engine orders their stages by the plugins' rollout position
  (never by pluggy's registration order).
* **interval hooks** (``q_stats``, ``tau_update``, ``entropy_coefficient``) run on the host once
  per Q-statistics interval (``train.stats_every`` updates).

Plugins keep their state on :class:`RunContext` (``ctx.stash[plugin_name]``), never in module
globals; the stash is saved in checkpoints, so it must hold JSON-serialisable values. The stash
is a plugin's own: interval plugins talk to each other through typed **signals** instead
(``ctx.signals``, :mod:`foxhunt_core.signals`): a manifest declares the floats it ``provides``
and ``consumes``, the core checks before the run that each consumed signal has an enabled
provider earlier in the rollout order, a provider calls
``ctx.signals.publish(its_name, signal, value)`` and a consumer ``ctx.signals.read(its_name,
signal)``. Values are checkpointed and written into every Q-statistics record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pluggy

from .signals import Signals
from .stages import (
    ActionSelectStage,
    BranchInputStage,
    BuildContext,
    GateActivation,
    PostAttentionStage,
    PreAttentionStage,
)

PROJECT = "foxhunt"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

if TYPE_CHECKING:
    from .manifest import PluginManifest


@dataclass
class RunContext:
    """What interval hooks see: the run's counters and the plugins' own state."""

    step: int
    total_steps: int
    iqn_readiness: float
    base_entropy_coeff: float
    entropy_coeff: float
    stash: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_stats: dict[str, float] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    """Validated options of every enabled plugin, by plugin name (read-only by convention)."""
    signals: Signals = field(default_factory=Signals)
    """The typed channel between interval plugins (declared in manifests; checkpointed)."""

    def options_for(self, plugin: str) -> Any:
        return self.options.get(plugin)

    def state_of(self, plugin: str) -> dict[str, Any]:
        """The plugin's own (checkpointed, JSON-serialisable) state dict, created on first use."""
        return self.stash.setdefault(plugin, {})


# ----------------------------------------------------------------------------- registration
@hookspec
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    """Declare the plugin: call ``register(manifest)`` exactly once.

    Called once per installed plugin at discovery (:func:`foxhunt_core.plugins.discover`),
    before any flag file is validated. The core checks every claim of the
    :class:`~foxhunt_core.manifest.PluginManifest` (name = entry-point name, position against
    the documented rollout order, hooks against the implementations, options model, kernels,
    core version) and owns naming, duplicates and ordering. Every plugin must implement it.
    """


# ----------------------------------------------------------------------------- hot path
@hookspec
def pre_attention(ctx: BuildContext) -> PreAttentionStage | None:
    """Return a stage that transforms expected Q [B, A] before the cross-branch attention.

    Runs after the raw expected Q is computed (the raw Q-mean drift is read before it) and
    before attention, in plugin order. Not differentiated. Used by: Q-mean centering.
    """


@hookspec
def post_attention(ctx: BuildContext) -> PostAttentionStage | None:
    """Return a differentiable stage applied to coordinated Q [B, A] after attention.

    Stages run in plugin order; each receives :class:`~foxhunt_core.stages.PostInputs`: the Q of
    the stage before it (the attention's output for the first) and, beside it, Var[Q] [B, A] of
    the raw atom distributions. Var is a constant of the stage (no gradient flows through it; the
    network learns from the C51 loss). Their parameters are trained by the auxiliary
    coordinated-Q loss; ``backward`` returns the gradient of its input Q and of its parameters.
    Used by: graph message passing, then diffusion refinement.
    """


@hookspec(firstresult=True)
def gate_activation(ctx: BuildContext) -> GateActivation | None:
    """Return the gate that replaces the sigmoid inside every branch's GLU (first result wins).

    The stage provides forward, backward and its own parameters (one set per branch), and for the
    fused GPU path a CUDA fragment (``fragment``: :class:`~foxhunt_core.stages.GateFragment`; the
    contract is ``foxhunt_core/kernels/gate.cuh``). Used by: KAN spline gate.
    """


@hookspec(firstresult=True)
def action_select(ctx: BuildContext) -> ActionSelectStage | None:
    """Return the stage that supplies the values actions are chosen by (first result wins).

    Collection's Boltzmann draws use the stage's values; greedy evaluation uses them only where
    the stage's ``in_evaluation`` is true, coordinated Q otherwise. Without a stage both use
    coordinated Q. Used by: quantile Q-select.
    """


@hookspec
def branch_inputs(ctx: BuildContext) -> BranchInputStage | tuple[BranchInputStage, ...] | None:
    """Return a stage (or a tuple of stages, e.g. other columns for other branches) that widens
    some branches' inputs with columns from the observation.

    The engine widens those branches' GLU layers accordingly (the rows reading the columns are the
    core's tensors ``branch<d>.w_gate_in`` / ``w_val_in``); a stage whose ``zero_init_rows`` is
    true gets the rows that read its columns initialised at zero. Used by: TLOB / OFI injection.
    """


# ----------------------------------------------------------------------------- intervals
@hookspec
def q_stats(ctx: RunContext, record: dict[str, float]) -> None:
    """Receive every Q-statistics record (see :func:`foxhunt_core.qpipe.q_statistics`).

    All implementations are called, in rollout order. ``record`` also holds ``step`` and
    ``raw_q_drift``. A plugin that provides signals publishes them here or in a later hook of the
    interval; the trainer adds the signals' values to the record after the interval's hooks.
    Used by: xLSTM context (provides ``context_norm``, ``context_divergence``), atom-utilization EMA.
    """


@hookspec(firstresult=True)
def tau_update(ctx: RunContext, mod: np.ndarray, tau: np.ndarray, dt: float) -> np.ndarray | None:
    """Advance ``liquid_mod`` [num_branches] over ``dt`` with time constants ``tau``.

    Return the new ``liquid_mod`` (first result wins); ``None`` keeps the core's exact step
    ``1 - (1 - mod) exp(-dt / tau)``. The core clamps the result to [0.1, 2]. Runs after every
    ``q_stats``, so it reads the signals published there this interval. Used by: RK4 adaptive step
    (consumes ``context_norm``).
    """


@hookspec(firstresult=True)
def entropy_coefficient(ctx: RunContext, base: float) -> float | None:
    """Return the loss's entropy coefficient for the next interval (first result wins).

    ``None`` keeps ``base``. Called after ``q_stats``. Used by: adaptive atom entropy.
    """


HOT_PATH_HOOKS = ("pre_attention", "post_attention", "gate_activation", "action_select", "branch_inputs")
INTERVAL_HOOKS = ("q_stats", "tau_update", "entropy_coefficient")
ALL_HOOKS = HOT_PATH_HOOKS + INTERVAL_HOOKS
REGISTRATION_HOOK = "register_plugin"
