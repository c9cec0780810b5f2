"""The ``rk4_tau`` plugin: manifest and hook implementation.

Entry point ``foxhunt.plugins: rk4_tau = foxhunt_rk4_tau.plugin`` (this module). Every stats
interval, after ``q_stats``, the core asks ``tau_update`` for the next ``liquid_mod``. While the
``context_norm`` signal of ``xlstm_context`` (read through ``ctx.signals``, the plugin consumes
it) exceeds the ``threshold`` option, the plugin integrates the liquid-tau ODE with sub-stepped
RK4 (:mod:`.integrate`: stable, within 1e-6 of the exact solution); otherwise it returns
``None`` and the core takes its exact step. It publishes ``rk4_substeps`` (the most sub-steps of
any branch this interval, 0 for the exact step) and counts its choices on the run context
(``ctx.state_of("rk4_tau")``: ``rk4_intervals``, ``exact_intervals``, ``capped_intervals``).

Host-side only: four scalars per interval, no kernel, no parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from foxhunt_core.hookspecs import RunContext, hookimpl
from foxhunt_core.manifest import PluginManifest, Requires
from foxhunt_core.signals import SignalSpec

from . import __version__
from .integrate import rk4_substepped, substeps
from .options import Rk4TauOptions

NAME = "rk4_tau"

MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=9,
    hooks=("tau_update",),
    options=Rk4TauOptions,
    parameters=(),
    kernels=(),
    requires=Requires(plugins=("xlstm_context",), core=">=0.1,<0.2"),
    consumes=("context_norm",),
    provides=(SignalSpec(name="rk4_substeps",
                         description="Most RK4 sub-steps of any branch this interval (0: the core's exact step)."),),
    description="Sub-stepped RK4 liquid-tau step while the xLSTM context norm is above a threshold; host-side "
    "only (plan Task 8).",
)


def options(ctx: RunContext) -> Rk4TauOptions:
    """The validated options from the run context (a model, a dict or ``None``)."""
    return Rk4TauOptions.model_validate(ctx.options_for(NAME) or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


def _count(ctx: RunContext, key: str) -> None:
    state = ctx.state_of(NAME)
    state[key] = int(state.get(key, 0)) + 1


@hookimpl
def tau_update(ctx: RunContext, mod: np.ndarray, tau: np.ndarray, dt: float) -> np.ndarray | None:
    opts = options(ctx)
    norm = ctx.signals.read(NAME, "context_norm")
    if not norm > opts.threshold:  # a NaN norm takes the exact step too
        _count(ctx, "exact_intervals")
        ctx.signals.publish(NAME, "rk4_substeps", 0.0)
        return None
    if max(substeps(dt, float(t), opts.max_step_ratio) for t in tau) > opts.max_substeps:
        _count(ctx, "capped_intervals")
        ctx.signals.publish(NAME, "rk4_substeps", 0.0)
        return None
    new, ns = rk4_substepped(np.asarray(mod, dtype=np.float64), np.asarray(tau, dtype=np.float64), dt,
                             opts.max_step_ratio)
    _count(ctx, "rk4_intervals")
    ctx.signals.publish(NAME, "rk4_substeps", float(max(ns)))
    return new
